"""Python side of the format/pickle interop tests (run with Debian's /usr/bin/python3).

  pickle_interop.py canon <dir>        load every <dir>/*.pkl with stub classes, print
                                       "<file>\t<canonical repr>" per file
  pickle_interop.py cases <dir>        write the protocol 0-5 cases of python_interop_test
                                       as <dir>/<case>.p<protocol>.pkl, and print
                                       "<case>\t<canonical repr of the original object>"
  pickle_interop.py numpy <dir>        load every <dir>/*.pkl with the real numpy, print
                                       "<file>\t<dtype.str>\t<shape>\t<fortran>\t<hex data>"
  pickle_interop.py torch <dir>        torch.load every <dir>/*.pkl (zipped with its
                                       <name>.storage.<key> files), print "<file>\t<summary>"

The canonical repr is the one `CanonicalRepr` (test_util.h) computes in C++:
  N T F | i<hex LE two's complement> | f<hex LE double>|fnan | s<hex UTF-8> | b<hex> | B<hex>
  (..) [..] {k:v,..} O{k:v,..}[~<state>] S{sorted..} Z{sorted..} | G<module>:<name>
  @<how>(<callable>;<args>;<kwargs>|-;<state>|-;[<list items>];{<dict items>}) | P(<pid>)
Objects of unknown classes are loaded as `Recorded` stubs that remember how the
pickle built them (REDUCE calls __init__, NEWOBJ does not), so nothing is executed.
"""

import _compat_pickle
import codecs
import collections
import copyreg
import enum
import io
import os
import pickle
import struct
import sys
import types

_MISSING = object()


class Recorded:
    """An instance of a class the pickle names but this script does not have."""

    def __new__(cls, *args, **kwargs):
        self = object.__new__(cls)
        self._how = "newobj_ex" if kwargs else "newobj"
        self._args = args
        self._kwargs = kwargs
        self._state = _MISSING
        self._list = []
        self._dict = []
        return self

    def __init__(self, *args, **kwargs):
        self._how = "reduce"

    def __setstate__(self, state):
        self._state = state

    def append(self, item):
        self._list.append(item)

    def extend(self, items):
        self._list.extend(items)

    def __setitem__(self, key, value):
        self._dict.append((key, value))


class PersistentRef:
    def __init__(self, pid):
        self.pid = pid


REAL_GLOBALS = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "bytes"): bytes,
    ("builtins", "bytearray"): bytearray,
    ("_codecs", "encode"): codecs.encode,
    ("copyreg", "__newobj_ex__"): copyreg.__newobj_ex__,
    ("copyreg", "_reconstructor"): copyreg._reconstructor,
}
REAL_NAMES = {id(v): k for k, v in REAL_GLOBALS.items()}
_stubs = {}


def stub_class(module, name):
    key = (module, name)
    if key not in _stubs:
        _stubs[key] = type(name, (Recorded,), {"_global": key})
    return _stubs[key]


def python3_name(module, name):
    """What pickle.Unpickler.find_class does with fix_imports (the C
    Unpickler does not expose the stream's protocol; the streams here never
    use Python 2 names at protocol 3+, so the mapping is applied always)."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


class StubUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        module, name = python3_name(module, name)
        if (module, name) in REAL_GLOBALS:
            return REAL_GLOBALS[(module, name)]
        return stub_class(module, name)

    def persistent_load(self, pid):
        return PersistentRef(pid)


def twos(x):
    if x == 0:
        return b""
    n = max(1, (x.bit_length() + 8) // 8 - 1)
    while not (-(1 << (8 * n - 1)) <= x < (1 << (8 * n - 1))):
        n += 1
    return x.to_bytes(n, "little", signed=True)


def canon(x):
    if x is None:
        return "N"
    if x is True:
        return "T"
    if x is False:
        return "F"
    t = type(x)
    if t is int:
        return "i" + twos(x).hex()
    if t is float:
        return "fnan" if x != x else "f" + struct.pack("<d", x).hex()
    if t is str:
        return "s" + x.encode("utf-8", "surrogatepass").hex()
    if t is bytes:
        return "b" + x.hex()
    if t is bytearray:
        return "B" + bytes(x).hex()
    if t is tuple:
        return "(" + ",".join(canon(i) for i in x) + ")"
    if t is list:
        return "[" + ",".join(canon(i) for i in x) + "]"
    if t is collections.OrderedDict:
        out = "O{" + ",".join(canon(k) + ":" + canon(v) for k, v in x.items()) + "}"
        if vars(x):
            out += "~" + canon(dict(vars(x)))
        return out
    if t is dict:
        return "{" + ",".join(canon(k) + ":" + canon(v) for k, v in x.items()) + "}"
    if t is set:
        return "S{" + ",".join(sorted(canon(i) for i in x)) + "}"
    if t is frozenset:
        return "Z{" + ",".join(sorted(canon(i) for i in x)) + "}"
    if isinstance(x, type) and issubclass(x, Recorded):
        return "G%s:%s" % x._global
    if id(x) in REAL_NAMES:
        return "G%s:%s" % REAL_NAMES[id(x)]
    if isinstance(x, Recorded):
        return "@%s(G%s:%s;%s;%s;%s;[%s];{%s})" % (
            x._how, type(x)._global[0], type(x)._global[1], canon(x._args),
            canon(x._kwargs) if x._how == "newobj_ex" else "-",
            "-" if x._state is _MISSING else canon(x._state),
            ",".join(canon(i) for i in x._list),
            ",".join(canon(k) + ":" + canon(v) for k, v in x._dict))
    if isinstance(x, PersistentRef):
        return "P(" + canon(x.pid) + ")"
    raise TypeError("no canonical form for %r" % (x,))


def pkl_files(directory):
    return sorted(f for f in os.listdir(directory) if f.endswith(".pkl"))


def cmd_canon(directory):
    for name in pkl_files(directory):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        try:
            text = canon(StubUnpickler(io.BytesIO(data)).load())
        except Exception as e:  # reported to the C++ test, which fails
            text = "ERROR %s: %s" % (type(e).__name__, e)
        print("%s\t%s" % (name, text))


# ---- the cases python_interop_test reads at every protocol ----

class Plain:
    def __init__(self):
        self.a = 1
        self.b = "x"


class WithArgs:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __getnewargs__(self):
        return (self.x, self.y)


class WithKwargs:
    def __init__(self):
        self.z = 3

    def __getnewargs_ex__(self):
        return ((1,), {"k": 2})

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)


class Reduced:
    def __reduce__(self):
        return (Reduced, (1, 2), {"s": 3}, iter([10, 11]), iter([("k", "v")]))


def make_deepspeed_enum():
    """deepspeed.runtime.zero.config.ZeroStageEnum, registered so pickle finds it."""
    for name in ("deepspeed", "deepspeed.runtime", "deepspeed.runtime.zero", "deepspeed.runtime.zero.config"):
        sys.modules.setdefault(name, types.ModuleType(name))

    class ZeroStageEnum(int, enum.Enum):
        disabled = 0
        optimizer_states = 1
        gradients = 2
        weights = 3

    ZeroStageEnum.__module__ = "deepspeed.runtime.zero.config"
    ZeroStageEnum.__qualname__ = "ZeroStageEnum"
    sys.modules["deepspeed.runtime.zero.config"].ZeroStageEnum = ZeroStageEnum
    return ZeroStageEnum


class CallEncodedStage:
    """Pickles as ZeroStageEnum(1), the encoding Python 3.12+ writes."""

    def __init__(self, enum_class, value):
        self.enum_class, self.value = enum_class, value

    def __reduce__(self):
        return (self.enum_class, (self.value,))


class Storage:
    def __init__(self, key):
        self.key = key


class PersistentPickler(pickle.Pickler):
    def __init__(self, file, protocol):
        super().__init__(file, protocol=protocol)
        self.protocol_number = protocol

    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            # protocol 0 (PERSID) needs an ASCII str pid
            return "storage_" + obj.key if self.protocol_number == 0 else ("storage", obj.key, 4)
        return None


def data_cases():
    """Plain data: the C++ result must have the canonical repr of the original."""
    big = 2 ** 2100 + 12345
    shared = [1, 2]
    return {
        "none": None,
        "bools": [True, False],
        "ints": [0, 1, 255, 256, 65535, 65536, -1, -256, 2 ** 31 - 1, -2 ** 31, 2 ** 31, -2 ** 31 - 1,
                 2 ** 63 - 1, -2 ** 63, 2 ** 63, -2 ** 63 - 1, 2 ** 64, 10 ** 100, -10 ** 100],
        "big_ints": [big, -big, 2 ** 2040, -2 ** 2040 - 1],
        "floats": [0.0, -0.0, 1.5, -2.25, 0.1, 1e300, -1e-300, 5e-324, float("inf"), float("-inf"), float("nan")],
        "strs": ["", "a", "h\u00e9llo", "\u65e5\u672c", "\U0001F600", "tab\there", "line\nbreak\\back\rslash",
                 "\x00\x1a", "\ud800", "x" * 300, "\u00ff" * 70],
        "bytes": [b"", b"\x00\xff", b"abc" * 100, b"\x80"],
        "bytearrays": [bytearray(), bytearray(b"\x00\xffab")],
        "tuples": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), ((1, (2,)), ())],
        "lists": [[], [1], list(range(2500)), [[], [[]]]],
        "dicts": [{}, {"a": 1}, {i: str(i) for i in range(1500)},
                  {1: "int", 2.5: "float", (1, 2): "tuple", None: "none", frozenset([3]): "fs", b"k": "bytes"}],
        "ordered_dicts": [collections.OrderedDict(), collections.OrderedDict([("b", 1), ("a", 2)]),
                          collections.OrderedDict([(1, "x"), ((2, 3), [4])])],
        "sets": [set(), {1, 2, 3}, frozenset(), frozenset(["a"]), {frozenset([1, 2]), (3, 4)}],
        "shared": [shared, shared, {"k": shared}],
        "nested": {"a": [1, {"b": (2, [3, {"c": None}])}], "d": collections.OrderedDict([("e", {1, 2})])},
    }


def cmd_cases(directory):
    cases = data_cases()
    enum_class = make_deepspeed_enum()
    objects = {
        "plain_object": Plain(),
        "newobj_args": WithArgs(7, "eight"),
        "newobj_kwargs": WithKwargs(),
        "reduce_items_state": Reduced(),
        "enum_getattr": enum_class.optimizer_states,
        "enum_call": CallEncodedStage(enum_class, 2),
        "persistent": [Storage("0"), Storage("1"), 5],
    }
    for proto in range(0, 6):
        for name, obj in list(cases.items()) + list(objects.items()):
            buf = io.BytesIO()
            PersistentPickler(buf, protocol=proto).dump(obj)
            with open(os.path.join(directory, "%s.p%d.pkl" % (name, proto)), "wb") as f:
                f.write(buf.getvalue())
        # out-of-band buffers (refused by the C++ reader)
        if proto == 5:
            oob = pickle.dumps(pickle.PickleBuffer(b"abc"), protocol=5, buffer_callback=lambda b: False)
            with open(os.path.join(directory, "out_of_band.p5.pkl"), "wb") as f:
                f.write(oob)
    for name, obj in cases.items():
        print("%s\t%s" % (name, canon(obj)))


def cmd_numpy(directory):
    import numpy

    class NumpyUnpickler(pickle.Unpickler):
        def find_class(self, module, name):
            module, name = python3_name(module, name)
            if module.split(".")[0] in ("numpy", "_codecs", "builtins", "copyreg"):
                return super().find_class(module, name)
            raise pickle.UnpicklingError("unexpected global %s.%s" % (module, name))

    for name in pkl_files(directory):
        with open(os.path.join(directory, name), "rb") as f:
            arr = NumpyUnpickler(f).load()
        assert isinstance(arr, numpy.ndarray), type(arr)
        fortran = arr.flags.f_contiguous and not arr.flags.c_contiguous
        print("%s\t%s\t%s\t%d\t%s" % (name, arr.dtype.str, ",".join(map(str, arr.shape)), fortran,
                                      arr.tobytes(order="F" if fortran else "C").hex()))


def cmd_torch(directory):
    """torch.load each <name>.pkl, zipped as torch does with the storages
    <name>.storage.<key> beside it; deepspeed classes are stubs."""
    import torch
    import zipfile

    enum_class = make_deepspeed_enum()

    class TorchStubUnpickler(pickle.Unpickler):
        def find_class(self, module, name):
            module, name = python3_name(module, name)
            if (module, name) == ("deepspeed.runtime.zero.config", "ZeroStageEnum"):
                return enum_class
            if module.startswith("deepspeed"):
                return stub_class(module, name)
            return super().find_class(module, name)

    # Debian's torch 1.13 ignores torch.load's pickle_module (it always uses
    # `pickle`), so the stub unpickler is installed there.
    pickle.Unpickler = TorchStubUnpickler
    for name in pkl_files(directory):
        stem = name[:-len(".pkl")]
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            with open(os.path.join(directory, name), "rb") as f:
                z.writestr("archive/data.pkl", f.read())
            z.writestr("archive/version", "3\n")
            prefix = stem + ".storage."
            for f in sorted(os.listdir(directory)):
                if f.startswith(prefix):
                    with open(os.path.join(directory, f), "rb") as g:
                        z.writestr("archive/data/" + f[len(prefix):], g.read())
        buf.seek(0)
        obj = torch.load(buf)
        print("%s\t%s" % (name, summarize(obj)))


def summarize(x):
    """A deterministic text form of a torch.load result, tensors by value."""
    import torch
    if isinstance(x, torch.Tensor):
        return "tensor(%s,%s,%s)" % (str(x.dtype), list(x.shape), x.flatten().tolist())
    if isinstance(x, torch.Size):
        return "Size%s" % (list(x),)
    if isinstance(x, collections.OrderedDict):
        out = "O{" + ",".join("%s:%s" % (summarize(k), summarize(v)) for k, v in x.items()) + "}"
        return out + ("~" + summarize(dict(vars(x))) if vars(x) else "")
    if isinstance(x, dict):
        return "{" + ",".join("%s:%s" % (summarize(k), summarize(v)) for k, v in x.items()) + "}"
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(summarize(i) for i in x) + "]"
    if isinstance(x, (set, frozenset)):
        return "S{" + ",".join(sorted(summarize(i) for i in x)) + "}"
    if isinstance(x, Recorded):
        return canon(x)
    if type(x).__module__ == "numpy":
        return "ndarray(%s,%s,%s)" % (x.dtype.str, list(x.shape), x.flatten().tolist())
    return repr(x)


if __name__ == "__main__":
    command, directory = sys.argv[1], sys.argv[2]
    {"canon": cmd_canon, "cases": cmd_cases, "numpy": cmd_numpy, "torch": cmd_torch}[command](directory)
