#!/usr/bin/env python3
"""The README's package map, checked against the include graph.

README.md holds the map between the lines `<!-- package map begin -->` and
`<!-- package map end -->`: one line per layer, top layer first,

    PACKAGE [PACKAGE ...] -> INCLUDED [INCLUDED ...]

where the packages of a line may include only packages of the lines below
it (never one of their own line, nor one above), and the list after `->` is
every package that the product sources (not the tests) of that line include,
as the sources say. This script derives the include graph from every `#include
"..."` of the repository's .h and .cc files (a file belongs to the package of
the nearest folder with a BUILD file) and reports:
  - an include from a package to one on its line or a line above (tests
    included: a test may include only what its package could);
  - a package with sources that no line lists, or a line listing a package
    that does not exist;
  - a line whose `->` list is not what its sources include.

  tools/package_map.py [ROOT]          check; exit 1 with one line per problem
  tools/package_map.py --print [ROOT]  the map block with the `->` lists the
                                       sources give (to paste into README.md)
"""
import os
import re
import sys

SKIP = {"third_party", ".git"}
BEGIN, END = "<!-- package map begin -->", "<!-- package map end -->"


def packages(root):
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP and not d.startswith(("bazel-", "."))]
        rel = os.path.relpath(dirpath, root)
        if rel != "." and "BUILD" in filenames:
            out.add(rel)
    return out


def package_of(path, pkgs):
    d = os.path.dirname(path)
    while d and d not in pkgs:
        d = os.path.dirname(d)
    return d


def include_graph(root, pkgs):
    """{package: {included package: [(file, line)]}} for product and test files."""
    product, tests, with_sources = {}, {}, set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP and not d.startswith(("bazel-", "."))]
        for f in filenames:
            if not f.endswith((".cc", ".h")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            src = package_of(rel, pkgs)
            if not src:
                continue
            with_sources.add(src)
            graph = tests if f.endswith("_test.cc") else product
            for n, line in enumerate(open(os.path.join(root, rel), encoding="utf-8", errors="replace"), 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                inc = m.group(1)
                # System headers and the protobuf headers Bazel generates
                # (proto/ucp.pb.h belongs to proto/) are not in the tree.
                if not os.path.exists(os.path.join(root, inc)) and not inc.endswith(".pb.h"):
                    continue
                dst = package_of(inc, pkgs)
                if dst and dst != src:
                    graph.setdefault(src, {}).setdefault(dst, []).append(f"{rel}:{n}")
    return product, tests, with_sources


def read_map(readme):
    text = open(readme, encoding="utf-8").read()
    if BEGIN not in text or END not in text:
        return None, text
    block = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    lines = []
    for raw in block.splitlines():
        s = raw.strip().strip("`")
        if not s or "->" not in s and not re.match(r"^[\w/]+( [\w/]+)*$", s):
            continue
        left, _, right = s.partition("->")
        lines.append((left.split(), right.split()))
    return lines, text


def canonical(deps, order):
    rank = {p: i for i, line in enumerate(order) for p in line}
    return sorted(deps, key=lambda p: (rank.get(p, -1), p))


def render(lines, product):
    order = [pkgs for pkgs, _ in lines]
    out = []
    width = max(len(" ".join(p)) for p in order) + 1
    for pkgs in order:
        deps = set()
        for p in pkgs:
            deps |= set(product.get(p, {}))
        deps -= set(pkgs)
        left = " ".join(pkgs)
        out.append(f"    {left:<{width}}" + ("-> " + " ".join(canonical(deps, order)) if deps else "").rstrip())
    return "\n".join(line.rstrip() for line in out)


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pkgs = packages(root)
    product, tests, with_sources = include_graph(root, pkgs)
    for graph in (product, tests):
        for deps in graph.values():
            with_sources |= set(deps)  # included packages (proto/) are on the map too
    lines, _ = read_map(os.path.join(root, "README.md"))
    if lines is None:
        print(f"README.md: no package map between {BEGIN} and {END}")
        return 1
    if "--print" in argv:
        print(render(lines, product))
        return 0
    problems = []
    level = {}
    for i, (line_pkgs, _) in enumerate(lines):
        for p in line_pkgs:
            if p in level:
                problems.append(f"README.md map: {p} is on two lines")
            level[p] = len(lines) - i  # the top line has the highest level
            if p not in pkgs:
                problems.append(f"README.md map: {p} is not a package (no {p}/BUILD)")
    for p in sorted(with_sources - set(level)):
        problems.append(f"README.md map: package {p} has sources but is on no line")
    for kind, graph in (("", product), (" (test)", tests)):
        for src in sorted(graph):
            for dst, where in sorted(graph[src].items()):
                if src not in level or dst not in level:
                    continue
                if level[dst] >= level[src]:
                    rel = "its own line" if level[dst] == level[src] else "a line above it"
                    problems.append(f"{where[0]}: {src} includes {dst}, on {rel} in the README map{kind}")
    order = [pkgs for pkgs, _ in lines]
    for line_pkgs, listed in lines:
        deps = set()
        for p in line_pkgs:
            deps |= set(product.get(p, {}))
        deps -= set(line_pkgs)
        want = canonical(deps, order)
        if listed != want:
            problems.append(f"README.md map: '{' '.join(line_pkgs)} -> {' '.join(listed)}' but the sources include "
                            f"'{' '.join(want)}' (tools/package_map.py --print draws the map)")
    for p in problems:
        print(p)
    print(f"{len(pkgs)} packages, {sum(len(v) for v in product.values())} package includes: "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
