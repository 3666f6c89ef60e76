"""Helpers of the Python tests: fixture paths, the ucp CLI, tree comparison, a textproto reader."""

import os
import re
import shutil
import subprocess
import tempfile

FIXTURES = os.environ.get("UCP_FIXTURES", os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../shared/fixtures")))
V14 = os.path.join(FIXTURES, "deepspeed-0.14.4")
V19 = os.path.join(FIXTURES, "deepspeed-0.19.5")
UCP_CLI = os.environ.get("UCP_CLI", "")
PYTHON = "/usr/bin/python3"


def fixture(rel):
    """A folder of the DeepSpeed 0.14.4 fixtures, e.g. fixture("neox-tp2-pp1-dp1/global_step4")."""
    return os.path.join(V14, rel)


def fresh_dir(name):
    """A new empty folder under TEST_TMPDIR."""
    base = os.environ.get("TEST_TMPDIR") or tempfile.gettempdir()
    d = os.path.join(base, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def run_cli(*args, check=True):
    """Runs the ucp binary; returns the CompletedProcess (text)."""
    p = subprocess.run([UCP_CLI] + list(args), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"ucp {' '.join(args)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return p


def tree(root):
    """{relative path: bytes} of every file under root (symlinks followed), and the set of folders."""
    files, dirs = {}, set()
    for d, subdirs, names in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs.add(rel)
        for n in names:
            if n == ".ucp_output":  # the marker of a ucp output (what --overwrite may replace), not a written file
                continue
            with open(os.path.join(d, n), "rb") as f:
                files[os.path.normpath(os.path.join(rel, n))] = f.read()
    return files, dirs


def assert_same_tree(test, a, b):
    """Byte-identical trees: the same folders, the same files, the same bytes."""
    fa, da = tree(a)
    fb, db = tree(b)
    test.assertEqual(sorted(da), sorted(db), f"folders of {a} and {b}")
    test.assertEqual(sorted(fa), sorted(fb), f"files of {a} and {b}")
    test.assertGreater(len(fa), 0)
    for name in fa:
        test.assertTrue(fa[name] == fb[name], f"{name} differs between {a} and {b}")


# ---- textproto (as protobuf's TextFormat prints it) ----

_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|([A-Za-z_][A-Za-z0-9_]*)|(\{)|(\})|(:)|("(?:[^"\\]|\\.)*")|(-?[0-9][0-9.eE+-]*))')


_SIMPLE_ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", '"': b'"', "'": b"'", "\\": b"\\"}


def _unescape(s):
    out = bytearray()
    i = 0
    raw = s.encode("utf-8")
    while i < len(raw):
        c = raw[i]
        if c != 0x5C:
            out.append(c)
            i += 1
            continue
        n = chr(raw[i + 1])
        if n in "01234567":
            j = i + 1
            while j < len(raw) and j < i + 4 and chr(raw[j]) in "01234567":
                j += 1
            out.append(int(raw[i + 1:j], 8))
            i = j
            continue
        if n == "x":
            out.append(int(raw[i + 2:i + 4], 16))
            i += 4
            continue
        out += _SIMPLE_ESCAPES[n]
        i += 2
    return out.decode("utf-8")


def parse_textproto(text):
    """{field: [values]} (a message: another such dict); scalars as int, float, str, bool or enum name."""
    tokens = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ValueError(f"textproto: cannot read at {text[pos:pos + 40]!r}")
        pos = m.end()
        if m.group(1):
            continue
        for kind, g in zip(("ident", "{", "}", ":", "str", "num"), m.groups()[1:]):
            if g is not None:
                tokens.append((kind, g))
                break
    i = 0

    def message(end):
        nonlocal i
        fields = {}
        while i < len(tokens) and tokens[i][0] != end:
            kind, name = tokens[i]
            assert kind == "ident", tokens[i]
            i += 1
            if tokens[i][0] == ":":
                i += 1
            if tokens[i][0] == "{":
                i += 1
                value = message("}")
                i += 1
            else:
                kind, raw = tokens[i]
                i += 1
                if kind == "str":
                    value = _unescape(raw[1:-1])
                    while i < len(tokens) and tokens[i][0] == "str":  # adjacent strings concatenate
                        value += _unescape(tokens[i][1][1:-1])
                        i += 1
                elif kind == "num":
                    value = float(raw) if re.search(r"[.eE]", raw) else int(raw)
                elif raw in ("true", "false"):
                    value = raw == "true"
                else:
                    value = raw  # an enum name
            fields.setdefault(name, []).append(value)
        return fields

    return message(None)
