#!/usr/bin/env python3
"""Lists the product functions longer than a limit (default 120 lines).

A rough scan, enough to keep readers and writers in named phases: comments
and string literals are blanked, then braces are matched; a brace whose
preceding text ends in `)` (a parameter list, maybe followed by `const`,
`override`, `noexcept`, a trailing return type or a constructor's
initializer list) opens a function unless that text starts with a control
keyword. Nested lambdas and local classes count towards their enclosing
function. Product code is every .cc file but tests (*_test.cc) and the
test-only packages (conformance, fuzz, interop, testing, bench, lab,
third_party); the pickle VM's opcode loop (format/pickle/reader.cc, Step) is
exempt, as the issue that set the limit says.

  tools/long_functions.py [--limit=120] [--all] [--known=FILE] [ROOT]

prints "LINES FILE:LINE NAME" for each function over the limit, longest
first (--all: every product function), and exits 1 when there is any.
--known=FILE (lines "FILE NAME", # comments): functions known to be over the
limit, still to be split; exits 1 only for a function over the limit that the
file does not list, or a listed one that is no longer over it (take it off
the list), so that the list only shrinks (//tools:long_functions_test).
"""
import os
import re
import sys

EXCLUDED_DIRS = {"conformance", "fuzz", "interop", "testing", "bench", "lab", "third_party", ".git"}
EXEMPT = {("format/pickle/reader.cc", "Step")}
CONTROL = re.compile(r"^(if|for|while|switch|else|do|catch|try)\b")
FUNC_END = re.compile(r"\)\s*(const)?\s*(override)?\s*(noexcept)?\s*(->\s*[\w:<>,\s\*&]+)?\s*$")
INIT_LIST = re.compile(r"\)\s*:\s*[\w:]+\s*[({]")


def blank(src):
    """Comments and literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif src.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', src[i:])
            if m:
                end = src.find(")" + m.group(1) + '"', i)
                j = n if end < 0 else end + len(m.group(1)) + 2
                out.append('""' + re.sub(r"[^\n]", " ", src[i + 2:j]))
                i = j
            else:
                out.append(c)
                i += 1
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path, rel):
    text = blank(open(path, encoding="utf-8", errors="replace").read())
    stack = []  # (is_function, start line, name)
    line = 1
    last_boundary = 0
    for idx, ch in enumerate(text):
        if ch == "\n":
            line += 1
        elif ch == "{":
            head = " ".join(text[last_boundary:idx].split())
            names = re.findall(r"([~\w:]+)\s*\(", head)
            is_func = bool(names) and not CONTROL.match(head) and (FUNC_END.search(head) or INIT_LIST.search(head))
            if re.search(r"\b(namespace|class|struct|enum|union)\b", head.split("(")[0]):
                is_func = False
            if re.search(r"[=(,]\s*\[[^\]]*\]\s*\(", head) or head.startswith("["):
                is_func = False  # a lambda: part of its function
            stack.append((bool(is_func), line, names[0] if names else ""))
            last_boundary = idx + 1
        elif ch == "}":
            if stack:
                is_func, start, name = stack.pop()
                if is_func and not any(f for f, _, _ in stack):
                    yield line - start + 1, start, name
            last_boundary = idx + 1
        elif ch == ";":
            last_boundary = idx + 1


def main(argv):
    limit, show_all, root, known_file = 120, False, None, None
    for a in argv[1:]:
        if a.startswith("--limit="):
            limit = int(a.split("=", 1)[1])
        elif a.startswith("--known="):
            known_file = a.split("=", 1)[1]
        elif a == "--all":
            show_all = True
        else:
            root = a
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        top = rel_dir.split(os.sep)[0]
        dirnames[:] = [d for d in dirnames if not d.startswith("bazel-") and not d.startswith(".")]
        if top in EXCLUDED_DIRS:
            dirnames[:] = []
            continue
        for f in filenames:
            if not f.endswith(".cc") or f.endswith("_test.cc"):
                continue
            rel = os.path.normpath(os.path.join(rel_dir, f))
            for n, start, name in functions(os.path.join(dirpath, f), rel):
                if (rel, name.split("::")[-1]) in EXEMPT:
                    continue
                found.append((n, rel, start, name))
    found.sort(key=lambda x: (-x[0], x[1], x[2]))
    over = [x for x in found if x[0] > limit]
    for n, rel, start, name in (found if show_all else over):
        print(f"{n:5d} {rel}:{start} {name}")
    if not show_all:
        print(f"{len(over)} product function(s) over {limit} lines ({len(found)} scanned)")
    if known_file is not None and not show_all:
        known = set()
        for raw in open(known_file, encoding="utf-8"):
            line = raw.split("#", 1)[0].split()
            if line:
                known.add((line[0], line[1]))
        now = {(rel, name) for _, rel, _, name in over}
        problems = [f"{rel} {name}: over {limit} lines and not in {known_file} (split it into named phases)"
                    for rel, name in sorted(now - known)]
        problems += [f"{rel} {name}: listed in {known_file} but no longer over {limit} lines: remove it from the list"
                     for rel, name in sorted(known - now)]
        for p in problems:
            print(p)
        print(f"{len(known)} known, {len(problems)} problem(s)")
        return 1 if problems else 0
    return 1 if over and not show_all else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
