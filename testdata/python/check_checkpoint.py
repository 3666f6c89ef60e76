"""Checks checkpoints with real torch.load, as an oracle independent of ucp's reader.

usage:
  check_checkpoint.py universal EXPECTED_ROOT UNIVERSAL_FOLDER
      Every trainable tensor of EXPECTED_ROOT/expected.pt (make_ds_checkpoint.py)
      against UNIVERSAL_FOLDER/zero/<name>/{fp32,exp_avg,exp_avg_sq,step}.pt:
      the dict keys ds_to_universal writes for its kind (in order), cat_dim /
      vocab_tensor / param_n_sub_params, the tensor bitwise (dtype, shape,
      values, requires_grad). No zero/<name> folder for frozen params or
      buffers; zero/optimizer_state.pt equal to expected_optimizer_state.pt.
  check_checkpoint.py same FOLDER_A FOLDER_B [--ignore-key KEY ...]
      Two checkpoint folders hold the same files, and each .pt pair loads to
      the same object: container types (dict vs OrderedDict, tuple vs list),
      keys in order, an OrderedDict's attributes (a state dict's _metadata),
      DeepSpeed objects' attributes, tensors bitwise with requires_grad.
      Other files byte for byte. --ignore-key skips a top-level key of every
      file (e.g. job state that cannot survive a change of topology).
      How storages are laid out (views, sharing, storage sizes) is reported as
      notes, not failures: torch.load gives equal tensors either way.
  check_checkpoint.py skeleton FOLDER_A FOLDER_B [--ignore-key KEY ...]
      The same structure, values aside: the files, container types, keys in
      order, object types and attributes, scalars, and for every tensor its
      dtype, shape, stride, storage offset, storage size, requires_grad and
      which tensors of the file share a storage. For checking a writer against
      files real DeepSpeed wrote for the same model.

Several checks can run in one process (torch loads once), separated by "---":
  check_checkpoint.py same A B --- universal ROOT U

Prints one line per problem and exits 1 if there is any.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: F401,E402
import torch  # noqa: E402

MAX_PROBLEMS = 40


class Report:
    def __init__(self):
        self.problems = []
        self.notes = []

    def bad(self, msg):
        self.problems.append(msg)

    def note(self, msg):
        self.notes.append(msg)


def bits(t):
    """The tensor reinterpreted as integers, so that equality is bitwise."""
    t = t.detach().contiguous()
    if t.is_floating_point():
        return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])
    return t


def same_tensor(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad
            and torch.equal(bits(a), bits(b)))


def describe(t):
    return f"{t.dtype}{list(t.shape)} requires_grad={t.requires_grad}"


def layout(t):
    return (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.storage().size(), t.requires_grad)


def compare(a, b, path, rep, values=True):
    if len(rep.problems) >= MAX_PROBLEMS:
        return
    if torch.is_tensor(a) or torch.is_tensor(b):
        if not (torch.is_tensor(a) and torch.is_tensor(b)):
            return rep.bad(f"{path}: {type(a).__name__} vs {type(b).__name__}")
        if not values:
            if layout(a) != layout(b):
                rep.bad(f"{path}: (dtype, shape, stride, offset, storage size, requires_grad) {layout(a)} vs "
                        f"{layout(b)}")
            return
        if not same_tensor(a, b):
            detail = ""
            if a.shape == b.shape and a.dtype == b.dtype and a.is_floating_point():
                detail = f", max |diff| {(a.detach().float() - b.detach().float()).abs().max().item()}"
            return rep.bad(f"{path}: {describe(a)} vs {describe(b)} differ{detail}")
        if a.storage().size() != b.storage().size() or a.storage_offset() != b.storage_offset():
            rep.note(f"{path}: storage {a.storage().size()}@{a.storage_offset()} vs "
                     f"{b.storage().size()}@{b.storage_offset()}")
        return
    if type(a) is not type(b):
        return rep.bad(f"{path}: {type(a).__module__}.{type(a).__qualname__} vs "
                       f"{type(b).__module__}.{type(b).__qualname__}")
    if isinstance(a, dict):
        ka, kb = list(a.keys()), list(b.keys())
        if ka != kb:
            only_a = [k for k in ka if k not in b]
            only_b = [k for k in kb if k not in a]
            rep.bad(f"{path}: keys differ: only in first {only_a}, only in second {only_b}"
                    + ("" if only_a or only_b else " (order)"))
        for k in ka:
            if k in b:
                compare(a[k], b[k], f"{path}.{k}" if path else str(k), rep, values)
        va, vb = getattr(a, "__dict__", {}), getattr(b, "__dict__", {})
        if va or vb:
            compare(va, vb, f"{path}.__dict__", rep, values)
        return
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return rep.bad(f"{path}: length {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{path}[{i}]", rep, values)
        return
    if isinstance(a, (set, frozenset)):
        if a != b:
            rep.bad(f"{path}: {a!r} vs {b!r}")
        return
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return compare(vars(a), vars(b), f"{path}<{type(a).__name__}>", rep, values)
    if type(a).__module__ == "numpy":
        import numpy as np
        if not (a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)):
            rep.bad(f"{path}: numpy arrays differ")
        return
    if isinstance(a, float) and a != a and b != b:
        return
    if a != b:
        rep.bad(f"{path}: {a!r} vs {b!r}")


def storage_sharing(obj):
    """Groups of tensor paths that share a storage, for the notes."""
    groups = {}

    def walk(o, path):
        if torch.is_tensor(o):
            groups.setdefault(o.storage().data_ptr(), []).append(path)
        elif isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{path}.{k}")
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, f"{path}[{i}]")

    walk(obj, "")
    return sorted(sorted(v) for v in groups.values() if len(v) > 1)


def list_files(root):
    out = []
    for dirpath, _, names in os.walk(root):
        for n in names:
            if n == ".ucp_output" and dirpath == root:
                continue  # ucp's output marker (what --overwrite recognizes), not content
            out.append(os.path.relpath(os.path.join(dirpath, n), root))
    return sorted(out)


def cmd_same(a, b, ignore_keys, rep, values=True):
    fa, fb = list_files(a), list_files(b)
    if fa != fb:
        rep.bad(f"files differ: only in {a}: {sorted(set(fa) - set(fb))}, only in {b}: {sorted(set(fb) - set(fa))}")
    for f in fa:
        if f not in fb:
            continue
        pa, pb = os.path.join(a, f), os.path.join(b, f)
        if not f.endswith(".pt"):
            with open(pa, "rb") as x, open(pb, "rb") as y:
                if x.read() != y.read():
                    rep.bad(f"{f}: bytes differ")
            continue
        x, y = torch.load(pa), torch.load(pb)
        if isinstance(x, dict) and isinstance(y, dict) and ignore_keys:
            x = type(x)((k, v) for k, v in x.items() if k not in ignore_keys)
            y = type(y)((k, v) for k, v in y.items() if k not in ignore_keys)
        before = len(rep.problems)
        compare(x, y, "", rep, values)
        sa, sb = storage_sharing(x), storage_sharing(y)
        if sa != sb:
            if values:
                rep.note(f"storage sharing {sa} vs {sb}")
            else:
                rep.bad(f"storage sharing {sa} vs {sb}")
        for i in range(before, len(rep.problems)):
            rep.problems[i] = f"{f}: {rep.problems[i]}"


def cmd_universal(expected_root, folder, rep):
    expected = torch.load(os.path.join(expected_root, "expected.pt"))
    zero = os.path.join(folder, "zero")
    trainable = sorted(n for n, e in expected.items() if e["role"] == "trainable")
    have = sorted(n for n in os.listdir(zero) if os.path.isdir(os.path.join(zero, n)))
    if have != trainable:
        rep.bad(f"zero/ holds {sorted(set(have) - set(trainable))} not expected and lacks "
                f"{sorted(set(trainable) - set(have))}")
    for name in trainable:
        e = expected[name]
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            path = os.path.join(zero, name, f"{state}.pt")
            if not os.path.exists(path):
                rep.bad(f"{name}/{state}.pt: missing")
                continue
            d = torch.load(path)
            where = f"zero/{name}/{state}.pt"
            if not isinstance(d, dict):
                rep.bad(f"{where}: a {type(d).__name__}, expected a dict")
                continue
            if list(d.keys()) != e["keys"]:
                rep.bad(f"{where}: keys {list(d.keys())}, expected {e['keys']} ({e['kind']})")
            for key in ("cat_dim", "param_n_sub_params"):
                if key in e["keys"] and d.get(key) != e.get(key):
                    rep.bad(f"{where}: {key} {d.get(key)!r}, expected {e.get(key)!r}")
            if "vocab_tensor" in e["keys"] and d.get("vocab_tensor") is not True:
                rep.bad(f"{where}: vocab_tensor {d.get('vocab_tensor')!r}, expected True")
            p = d.get("param")
            if not torch.is_tensor(p) or not same_tensor(p, e[state]):
                rep.bad(f"{where}: param {describe(p) if torch.is_tensor(p) else repr(p)} differs from the "
                        f"expected {describe(e[state])}")
        path = os.path.join(zero, name, "step.pt")
        if not os.path.exists(path):
            rep.bad(f"{name}/step.pt: missing")
        else:
            s = torch.load(path)
            if not torch.is_tensor(s) or not same_tensor(s, e["step"]):
                rep.bad(f"zero/{name}/step.pt: {s!r}, expected {e['step']!r}")
    opt = os.path.join(zero, "optimizer_state.pt")
    before = len(rep.problems)
    compare(torch.load(opt), torch.load(os.path.join(expected_root, "expected_optimizer_state.pt")), "", rep)
    for i in range(before, len(rep.problems)):
        rep.problems[i] = f"zero/optimizer_state.pt: {rep.problems[i]}"


def run(args, rep):
    if len(args) >= 3 and args[0] == "universal" and len(args) == 3:
        cmd_universal(args[1], args[2], rep)
    elif len(args) >= 3 and args[0] in ("same", "skeleton"):
        ignore = []
        rest = args[3:]
        while rest:
            if rest[0] != "--ignore-key" or len(rest) < 2:
                raise SystemExit(__doc__)
            ignore.append(rest[1])
            rest = rest[2:]
        cmd_same(args[1], args[2], ignore, rep, values=args[0] == "same")
    else:
        raise SystemExit(__doc__)


def main(argv):
    commands, current = [], []
    for a in argv[1:]:
        if a == "---":
            commands.append(current)
            current = []
        else:
            current.append(a)
    commands.append(current)
    rep = Report()
    for args in commands:
        before = len(rep.problems)
        run(args, rep)
        if len(commands) > 1:
            for i in range(before, len(rep.problems)):
                rep.problems[i] = f"[{args[0]} {args[1]}] {rep.problems[i]}"
    for p in rep.problems[:MAX_PROBLEMS]:
        print(p)
    if rep.notes:
        print(f"{len(rep.notes)} storage layout note(s) (not failures), e.g.:")
        for n in rep.notes[:5]:
            print(f"  note: {n}")
    if rep.problems:
        print(f"{len(rep.problems)} problem(s)")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main(sys.argv)
