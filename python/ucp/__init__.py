"""ucp: DeepSpeed ZeRO checkpoints -> universal checkpoints, resharding and export, from Python.

The same C++ library as the `ucp` command line, in this process:

    import ucp
    ucp.convert(input_folder="ckpt/global_step4", output_folder="ckpt/global_step4_universal")
    w = ucp.open("ckpt/global_step4_universal").load("2.attention.dense.weight")   # numpy, zero-copy

- `inspect(path)`: what a checkpoint folder or a .pt file holds, as a dict
  (the InspectReport of `ucp inspect --format=textproto`).
- `convert(**flags)`, `reshard(**flags)`, `export(**flags)`: the commands,
  with their command-line flags as keyword arguments (`ucp convert --help`);
  each returns a `Summary` and releases the GIL while it works. `progress=`
  takes a callable (given a `Progress` per event) or a mode of the CLI's
  `--progress` ("never" by default here).
- `open(folder)`: a `Checkpoint` (ZeRO or universal) whose `params` tell each
  tensor's shape, dtype, merge kind and the source of that decision, and
  whose `load(name, state)` gives a numpy array, a read-only view of the
  memory-mapped file where the tensor is stored in one piece.
- Errors raise `ucp.Error` subclasses, one per status code, carrying `code`,
  `code_name` and `message`.
- `python3 -m ucp ds_to_universal --input_folder ... --output_folder ...`:
  a drop-in for DeepSpeed's `ds_to_universal.py` command line.

Nothing is ever unpickled by Python: ucp reads torch files with its own
pickle reader, which executes nothing.
"""

import os as _os

from . import _core
from ._errors import *  # noqa: F401,F403  (the ucp.Error classes)
from ._errors import Error, __all__ as _error_names

Error.__module__ = "ucp"

__version__ = "0.1.0"

__all__ = ["inspect", "convert", "reshard", "export", "open", "Checkpoint", "Param", "Summary", "Progress",
           "Error"] + [n for n in _error_names if n != "Error"]

# Values of these flags may be given as dicts (or lists of pairs).
_DICT_FLAGS = {
    "tied_layers": lambda d: ";".join(f"{k}:{','.join(str(v) for v in vs)}" for k, vs in _items(d)),
    "hf_config": lambda d: ";".join(f"{k}={v}" for k, v in _items(d)),
    "layer_types": lambda d: ",".join(f"{k}:{v}" for k, v in _items(d)),
}


def _items(d):
    return d.items() if isinstance(d, dict) else d


def _flags(command, kwargs):
    """Keyword arguments -> `--name=value` strings for the command's FlagSet."""
    known = set(_core.flag_names(command))
    out = []
    for name, value in kwargs.items():
        if name not in known:
            raise TypeError(f"{command}() got an unexpected keyword argument '{name}' "
                            f"(its flags: {', '.join(sorted(known))})")
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (dict, list, tuple)) and name in _DICT_FLAGS:
            value = _DICT_FLAGS[name](value)
        elif isinstance(value, _os.PathLike):
            value = _os.fspath(value)
        out.append(f"--{name}={value}")
    return out


class Progress:
    """One progress event: the fields of a `--progress=json` line.

    command, phase ("plan", "write", "commit", ...), bytes_done, bytes_total,
    units_done, units_total, elapsed_s (since the operation started),
    mb_per_s (bytes done so far / elapsed), eta_s (-1 when unknown).
    """

    __slots__ = ("command", "phase", "bytes_done", "bytes_total", "units_done", "units_total", "elapsed_s",
                 "mb_per_s", "eta_s")

    def __init__(self, **fields):
        for k in self.__slots__:
            setattr(self, k, fields[k])

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self):
        return "Progress(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


class Summary:
    """What a convert / reshard / export did: its fields as attributes.

    Common: command, output_folder, files, bytes, notes, dry_run, report (the
    text `ucp COMMAND` prints; str(summary) gives it). convert: params,
    rules_summary, explain, plan. reshard: source_kind, source_topology,
    target_topology, zero_stage, partition_method, stage_boundaries, plan.
    export: tensors, architecture.
    """

    def __init__(self, fields):
        self.__dict__.update(fields)

    def as_dict(self):
        return dict(self.__dict__)

    def __str__(self):
        return self.report

    def __repr__(self):
        keys = ("command", "output_folder", "files", "bytes")
        return "Summary(" + ", ".join(f"{k}={self.__dict__[k]!r}" for k in keys if k in self.__dict__) + ")"


def _run(command, kwargs):
    progress = kwargs.pop("progress", None)
    interval = kwargs.pop("progress_interval", 0.1)
    callback = None
    if callable(progress):
        user = progress

        def callback(event):
            user(Progress(**event))

        progress = "never"
    kwargs["progress"] = progress if progress is not None else "never"
    return Summary(_core.run(command, _flags(command, kwargs), callback, float(interval)))


def convert(**flags):
    """DeepSpeed ZeRO checkpoint -> universal checkpoint (`ucp convert`); returns a Summary.

    Keyword arguments are the flags of `ucp convert` (below), e.g.
    input_folder=, output_folder=, preset=, rules=, explain=True,
    num_threads=; `strict=False` is `no_strict=True`. progress= a callable
    taking a Progress (or "auto", "always", "json": printed on stderr like the
    CLI; default "never"); progress_interval= seconds between callbacks within
    a phase (each phase's first and last events always come). The GIL is
    released while the conversion runs.
    """
    if "strict" in flags:
        flags["no_strict"] = not flags.pop("strict")
    return _run("convert", flags)


def reshard(**flags):
    """Any checkpoint -> a DeepSpeed ZeRO checkpoint at a target tp/pp/dp (`ucp reshard`); returns a Summary.

    Keyword arguments are the flags of `ucp reshard` (below), e.g.
    input_folder=, output_folder=, tp=, pp=, dp=; progress= as for convert.
    The GIL is released while it runs.
    """
    return _run("reshard", flags)


def export(**flags):
    """Any checkpoint -> plain weights, safetensors or pytorch_model.bin (`ucp export`); returns a Summary.

    Keyword arguments are the flags of `ucp export` (below), e.g.
    input_folder=, output_folder=, format=, weights=, names=; progress= as
    for convert. The GIL is released while it runs.
    """
    return _run("export", flags)


def inspect(path):
    """What a checkpoint folder (ZeRO or universal) or a single .pt file holds, as a dict.

    The dict is the InspectReport message of `ucp inspect --format=textproto`
    (proto/ucp.proto) field by field: kind, tag, topology, zero_stage,
    optimizer_layout, lp_dtype, pipeline, group (param groups), param (each
    with name, shape, dtype, group, frozen, layer and its fragments: file,
    tp/pp/dp rank, offset, numel), node (a file's object tree), file,
    ds_version. Every field is present (default values included); enums are
    names; an unset message is None.
    """
    return _core.inspect(_os.fspath(path))


class Param:
    """A tensor of a checkpoint, as ucp.open() reads it.

    name; shape (the full, tp-merged shape); dtype (of the module weights,
    the "lp" state; fp32 masters and optimizer states are float32); kind (how
    its tp slices merge: REPLICATED, COLUMN, ROW, VOCAB, SUB_PARAMS, AVERAGE);
    source (what decided it: RULE_FILE, CHECKPOINT_INFO, PRESET, EVIDENCE,
    UNIVERSAL_METADATA); origin (the pattern or evidence); rule (the whole
    MergeRule as a dict); group (optimizer param group, -1 outside it); role
    (trainable, frozen, buffer); layer (pipeline layer, -1 without);
    tied_key.
    """

    __slots__ = ("name", "shape", "dtype", "kind", "source", "origin", "rule", "group", "role", "layer", "tied_key")

    def __init__(self, fields):
        for k in self.__slots__:
            setattr(self, k, fields[k])

    def __repr__(self):
        return (f"Param({self.name!r}, shape={self.shape}, dtype={self.dtype!r}, kind={self.kind!r}, "
                f"source={self.source!r})")


class Checkpoint:
    """A checkpoint folder opened by ucp.open(): its params and their tensors.

    Attributes: path, kind ("zero" or "universal"), params (a dict name ->
    Param, in the checkpoint's order), info (topology, ZeRO stage, optimizer,
    lp dtype, state keys, notes, ...), states (what load() accepts).
    """

    def __init__(self, core):
        self._core = core
        self.path = core.path
        self.kind = core.kind
        self.info = core.info()
        self.params = {p["name"]: Param(p) for p in core.params()}
        self.states = ("fp32",) + tuple(self.info["state_keys"]) + ("lp",)

    def __repr__(self):
        return f"Checkpoint({self.path!r}, kind={self.kind!r}, params={len(self.params)})"

    def __len__(self):
        return len(self.params)

    def __iter__(self):
        return iter(self.params)

    def __contains__(self, name):
        return name in self.params

    def load(self, name, state="fp32", dtype=None, copy=False):
        """The full (tp-merged) tensor of param `name` for `state`, as a numpy array.

        state: "fp32" (the fp32 master weights), an optimizer state
        ("exp_avg", "exp_avg_sq", ...) or "lp" (the module weights in their
        training dtype; a universal checkpoint holds none for trainable
        params: NotFoundError, and load(name, dtype=ckpt.info["lp_dtype"])
        gives the masters rounded as DeepSpeed's optimizers round them). Where the tensor is one contiguous run of a file (a
        universal checkpoint, a ZeRO param in one fragment) the array is a
        read-only view of the memory-mapped file (its base keeps the mapping
        alive); otherwise, or with copy=True, a new writeable array.
        torch.from_numpy() works on it (it warns that a view is read-only).
        bfloat16 comes as int16 bits (numpy has no bfloat16): use
        load_torch(), or torch.from_numpy(a).view(torch.bfloat16).
        dtype= "float32" etc. converts (bitwise as torch's .to()).
        The GIL is released while the tensor is assembled.
        """
        return self._core.load(name, state, dtype or "", bool(copy))[0]

    def load_torch(self, name, state="fp32", dtype=None, copy=False):
        """load() as a torch tensor (bfloat16 included); imports torch."""
        import torch
        a, values_dtype = self._core.load(name, state, dtype or "", bool(copy))
        t = torch.from_numpy(a) if a.flags.writeable else _from_readonly(torch, a)
        if values_dtype == "bfloat16":
            t = t.view(torch.bfloat16)
        return t


def _from_readonly(torch, a):
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(a)


def open(folder, **flags):  # noqa: A001  (ucp.open, as the issue names it)
    """Opens a checkpoint folder (ZeRO tag folder or root with `latest`, or a universal folder).

    For a ZeRO folder every param's tp merge is decided on opening, as
    `ucp convert` decides it; keyword arguments are those flags: rules=,
    preset=, replicated_mismatch=, default_kind=, tied_layers=,
    original_vocab_size=, num_threads=, make_vocab_size_divisible_by=, and
    verify_checksums=True (a ucp universal folder against its manifest).
    Returns a Checkpoint. The GIL is released while it opens.
    """
    return Checkpoint(_core.open(_os.fspath(folder), _flags("open", flags)))


def _add_flag_docs():
    for fn, command in ((convert, "convert"), (reshard, "reshard"), (export, "export"), (open, "open")):
        fn.__doc__ += "\n" + _core.usage(command).split("\n\n", 1)[-1]


_add_flag_docs()
