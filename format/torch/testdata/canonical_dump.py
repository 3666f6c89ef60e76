"""Canonical text dump of torch.save files, from Python's torch.load.

The reference side of ucp's interop tests: format/torch/dump.h documents the
format and the C++ reader must print the identical text. Run with Debian's
/usr/bin/python3 (python3-torch 1.13 + numpy):

  canonical_dump.py OUT FILE...        dumps each FILE into OUT
  canonical_dump.py OUT @LIST          the same for the paths listed in LIST

OUT receives, per file, a line `=== <path>` followed by the dump, or by
`!error <type>: <message>` when torch.load fails.

Nothing from a checkpoint is executed beyond torch/numpy/collections
constructors on an allowlist: every other global (deepspeed.*,
argparse.Namespace, getattr, ...) becomes a stub class whose calls, NEWOBJ,
BUILD, APPEND(S) and SETITEM(S) are recorded as data, so deepspeed need not
be installed.
"""
import _compat_pickle
import collections
import hashlib
import importlib
import math
import pickle
import struct
import sys
import types

import numpy as np
import torch

# Globals built for real: the data constructors the C++ reader decodes
# itself, and the objects dump.h renders specially.
REAL = {
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("collections", "OrderedDict"),
    ("torch", "Size"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "bytes"),
    ("builtins", "bytearray"),
    ("_codecs", "encode"),
}


class StubObject:
    """The result of calling or constructing a stub: data, never behaviour."""

    def __init__(self, func, how, args, kwargs):
        self.func = func
        self.how = how
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.state = None
        self.has_state = False
        self.listitems = []
        self.dictitems = []

    def __setstate__(self, state):  # BUILD
        self.state = state
        self.has_state = True

    def append(self, item):  # APPEND
        self.listitems.append(item)

    def extend(self, items):  # APPENDS
        self.listitems.extend(items)

    def __setitem__(self, key, value):  # SETITEM(S)
        self.dictitems.append((key, value))

    def __call__(self, *args, **kwargs):  # a stub object used as a callable
        return StubObject(self, "reduce", args, kwargs)


class StubMeta(type):
    """Metaclass of stub classes: calling one (REDUCE) records the call."""

    def __call__(cls, *args, **kwargs):
        return StubObject(cls, "reduce", args, kwargs)


_stub_classes = {}


def stub_class(module, name):
    key = (module, name)
    if key not in _stub_classes:
        def __new__(cls, *args, **kwargs):  # NEWOBJ / NEWOBJ_EX
            return StubObject(cls, "newobj_ex" if kwargs else "newobj", args, kwargs)
        _stub_classes[key] = StubMeta(name, (), {
            "__new__": __new__, "stub_module": module, "stub_name": name})
    return _stub_classes[key]


def newobj_ex(cls, args, kwargs):  # copyreg.__newobj_ex__ (protocol 2 NEWOBJ_EX)
    return cls.__new__(cls, *args, **kwargs)


class Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        # CPython's fix_imports renames (the C++ reader applies them too).
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        if (module, name) in REAL:
            return getattr(importlib.import_module(module), name)
        if (module, name) == ("copyreg", "__newobj_ex__"):
            return newobj_ex
        return stub_class(module, name)


pickle_module = types.ModuleType("ucp_stub_pickle")
pickle_module.Unpickler = Unpickler
pickle_module.load = pickle.load
pickle_module.__version__ = "ucp"


# ---- rendering (mirrors format/torch/dump.cc) ----

def quote(b):
    out = ['"']
    for c in b:
        if 0x20 <= c < 0x7F and c not in (0x22, 0x5C):
            out.append(chr(c))
        else:
            out.append("\\x%02x" % c)
    out.append('"')
    return "".join(out)


def utf8(s):
    return s.encode("utf-8", "surrogatepass")


def float_repr(x):
    if math.isnan(x):
        return "nan:0x%016x" % struct.unpack("<Q", struct.pack("<d", x))[0]
    return repr(x)


def global_name(obj):
    if isinstance(obj, StubMeta):
        return "%s.%s" % (obj.stub_module, obj.stub_name)
    return "%s.%s" % (obj.__module__, obj.__qualname__)


def is_global(v):
    return isinstance(v, (StubMeta, type, types.FunctionType, types.BuiltinFunctionType))


def key_repr(v):
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return float_repr(v)
    if isinstance(v, str):
        return quote(utf8(v))
    if isinstance(v, bytes):
        return "b" + quote(v)
    if isinstance(v, tuple):
        parts = [key_repr(x) for x in v]
        return "(" + ", ".join(parts) + (",)" if len(parts) == 1 else ")")
    if isinstance(v, frozenset):
        return "frozenset({" + ", ".join(sorted(key_repr(x) for x in v)) + "})"
    if is_global(v):
        return global_name(v)
    if isinstance(v, StubObject):
        if is_global(v.func):
            return "<object %s>" % global_name(v.func)
        return "<object .>"
    return "<%s>" % type(v).__name__


def shape_list(v):
    return "[" + ", ".join(str(int(x)) for x in v) + "]"


class Dumper:
    def __init__(self):
        self.lines = []
        self.storage_ids = {}

    def line(self, path, text):
        self.lines.append(path + " " + text)

    def storage_id(self, cdata):
        return self.storage_ids.setdefault(cdata, len(self.storage_ids))

    def node(self, path, v):
        if v is None:
            self.line(path, "none")
        elif isinstance(v, bool):
            self.line(path, "bool True" if v else "bool False")
        elif isinstance(v, int):
            self.line(path, "int %d" % v)
        elif isinstance(v, float):
            self.line(path, "float " + float_repr(v))
        elif isinstance(v, str):
            self.line(path, "str " + quote(utf8(v)))
        elif isinstance(v, (bytes, bytearray)):
            kind = "bytes" if isinstance(v, bytes) else "bytearray"
            body = quote(v) if len(v) <= 64 else "sha256=" + hashlib.sha256(v).hexdigest()
            self.line(path, "%s len=%d %s" % (kind, len(v), body))
        elif isinstance(v, torch.Tensor):
            self.tensor(path, v)
        elif isinstance(v, torch.storage.TypedStorage):
            t = torch.tensor([], dtype=v.dtype).set_(v)
            digest = hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            self.line(path, "storage dtype=%s storage=#%d storage_numel=%d sha256=%s" % (
                str(v.dtype)[len("torch."):], self.storage_id(v._storage._cdata), v.size(), digest))
        elif isinstance(v, torch.Size):
            self.line(path, "torch.Size " + shape_list(v))
        elif isinstance(v, np.ndarray):
            fortran = bool(np.isfortran(v)) and v.ndim > 1
            data = v.tobytes(order="F" if fortran else "C")
            self.line(path, "ndarray dtype=%s shape=%s fortran=%s sha256=%s" % (
                v.dtype.str, shape_list(v.shape), fortran, hashlib.sha256(data).hexdigest()))
        elif isinstance(v, np.dtype):
            self.line(path, "numpy.dtype " + v.str)
        elif isinstance(v, (tuple, list)):
            self.line(path, "%s len=%d" % ("tuple" if isinstance(v, tuple) else "list", len(v)))
            for i, item in enumerate(v):
                self.node("%s[%d]" % (path, i), item)
        elif isinstance(v, dict):
            ordered = isinstance(v, collections.OrderedDict)
            self.line(path, "%s len=%d" % ("OrderedDict" if ordered else "dict", len(v)))
            for k, item in v.items():
                self.node("%s[%s]" % (path, key_repr(k)), item)
            if ordered and vars(v):
                self.node(path + ".__dict__", dict(vars(v)))
        elif isinstance(v, (set, frozenset)):
            self.line(path, "%s len=%d" % ("set" if isinstance(v, set) else "frozenset", len(v)))
            for i, item in enumerate(sorted(v, key=key_repr)):
                self.node("%s{%d}" % (path, i), item)
        elif isinstance(v, StubObject):
            self.stub(path, v)
        elif is_global(v):
            self.line(path, "global " + global_name(v))
        else:
            raise TypeError("cannot dump %r at %s" % (type(v), path))

    def tensor(self, path, t):
        kind = "parameter" if isinstance(t, torch.nn.Parameter) else "tensor"
        st = t.storage()
        data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        self.line(path, "%s dtype=%s shape=%s stride=%s offset=%d requires_grad=%s storage=#%d "
                  "storage_numel=%d sha256=%s" % (
                      kind, str(t.dtype)[len("torch."):], shape_list(t.shape), shape_list(t.stride()),
                      t.storage_offset(), t.requires_grad, self.storage_id(st._storage._cdata), st.size(),
                      hashlib.sha256(data).hexdigest()))

    def stub(self, path, o):
        if is_global(o.func):
            self.line(path, "object %s how=%s" % (global_name(o.func), o.how))
        else:
            self.line(path, "object how=%s" % o.how)
            self.node(path + ".callable", o.func)
        self.node(path + ".args", o.args)
        if o.how == "newobj_ex" and o.kwargs:
            self.node(path + ".kwargs", o.kwargs)
        if o.has_state:
            self.node(path + ".state", o.state)
        if o.listitems:
            self.line(path + ".listitems", "list len=%d" % len(o.listitems))
            for i, item in enumerate(o.listitems):
                self.node("%s.listitems[%d]" % (path, i), item)
        if o.dictitems:
            self.line(path + ".dictitems", "dict len=%d" % len(o.dictitems))
            for k, item in o.dictitems:
                self.node("%s.dictitems[%s]" % (path, key_repr(k)), item)


def load(path):
    # torch.load itself: Debian's 1.13.1 torch.load ignores `pickle_module`
    # unless weights_only (it resets it to `pickle`), so call the zip loader
    # it wraps with ours.
    with open(path, "rb") as f:
        with torch.serialization._open_zipfile_reader(f) as zip_file:
            return torch.serialization._load(zip_file, "cpu", pickle_module, encoding="utf-8")


def dump_file(path):
    root = load(path)
    d = Dumper()
    d.node("$", root)
    return "\n".join(d.lines) + "\n"


def main(argv):
    out_path, inputs = argv[1], argv[2:]
    if len(inputs) == 1 and inputs[0].startswith("@"):
        with open(inputs[0][1:]) as f:
            inputs = [line.rstrip("\n") for line in f if line.strip()]
    with open(out_path, "w") as out:
        for path in inputs:
            out.write("=== %s\n" % path)
            try:
                out.write(dump_file(path))
            except Exception as e:  # reported to the C++ test as a mismatch
                out.write("!error %s: %s\n" % (type(e).__name__, str(e).replace("\n", " ")))


if __name__ == "__main__":
    main(sys.argv)
