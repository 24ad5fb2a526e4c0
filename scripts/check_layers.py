#!/usr/bin/python3
"""Checks that the code keeps the documented layer order.

The layers, lowest first, are defined twice on purpose: in CMakeLists.txt
(QF_LAYERS: which folders each layer's library builds) and in the layer table
of docs/architecture.md (what a reader is told). This script fails when

  - the two lists differ (names, order or folders);
  - a folder under src/ holds library sources (*.cpp, not *_test.cpp) but
    belongs to no layer, so no library would build it;
  - a library source or header, or a tools/ file, includes a header of a
    layer above its own (tools/ is the top layer and may include anything).

Tests (*_test.cpp) may include any layer: a test of a low layer often needs a
higher one to build its inputs or to check its outputs.

Usage: scripts/check_layers.py [REPO]   (exit 0: ok, 1: violations, 2: cannot read)
"""
import os
import re
import sys


def fail_read(msg):
    print(f"check_layers: {msg}", file=sys.stderr)
    sys.exit(2)


def cmake_layers(repo):
    path = os.path.join(repo, "CMakeLists.txt")
    text = open(path, encoding="utf-8").read()
    m = re.search(r"set\(QF_LAYERS\s*(.*?)\)", text, re.S)
    if not m:
        fail_read(f"{path}: no set(QF_LAYERS ...)")
    layers = []
    for entry in re.findall(r'"([^"]*)"', m.group(1)):
        name, _, folders = entry.partition(":")
        layers.append((name.strip(), folders.split()))
    if not layers:
        fail_read(f"{path}: QF_LAYERS is empty")
    return layers


def doc_layers(repo):
    """The rows of the first table in docs/architecture.md whose header starts
    with '| layer |': (name, [folders given as `src/...` in the second column])."""
    path = os.path.join(repo, "docs", "architecture.md")
    layers, in_table = [], False
    for line in open(path, encoding="utf-8"):
        if line.startswith("| layer |"):
            in_table = True
            continue
        if in_table:
            if not line.startswith("|"):
                break
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 2 or set(cells[0]) <= set("-: "):
                continue
            folders = [f.strip("/")[len("src/"):] for f in re.findall(r"`(src/[^`]*)`", cells[1])]
            if folders:  # rows without a src/ folder (the CLI) are above every layer
                layers.append((cells[0], folders))
    if not layers:
        fail_read(f"{path}: no layer table ('| layer | ...')")
    return layers


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    src = os.path.join(repo, "src")
    problems = []

    built, documented = cmake_layers(repo), doc_layers(repo)
    if built != documented:
        problems.append("the layers in CMakeLists.txt (QF_LAYERS) and docs/architecture.md differ:\n"
                        f"    CMakeLists.txt:       {built}\n    docs/architecture.md: {documented}")

    rank = {}  # folder under src/ -> (rank, layer name)
    for i, (name, folders) in enumerate(built):
        for f in folders:
            rank[f] = (i, name)

    def layer_of(folder):
        # A folder not listed itself (core/cuda) belongs to its nearest listed parent.
        while folder:
            if folder in rank:
                return rank[folder]
            folder = os.path.dirname(folder)
        return None

    files = []
    for dirpath, _, names in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src)
        for n in sorted(names):
            if not n.endswith((".cpp", ".h", ".cu", ".cuh")):
                continue
            if n.endswith(".cpp") and not n.endswith("_test.cpp") and rel_dir not in rank \
                    and os.path.basename(rel_dir) != "cuda":
                problems.append(f"src/{rel_dir}/{n}: its folder belongs to no layer in QF_LAYERS, so no library builds it")
            files.append((os.path.join(dirpath, n), layer_of(rel_dir)))
    top = (len(built), "tools")
    for n in sorted(os.listdir(os.path.join(repo, "tools"))):
        if n.endswith((".cpp", ".h")):
            files.append((os.path.join(repo, "tools", n), top))

    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    checked = 0
    for path, own in files:
        if path.endswith("_test.cpp"):
            continue
        rel = os.path.relpath(path, repo)
        if own is None:
            problems.append(f"{rel}: belongs to no layer in QF_LAYERS")
            continue
        for lineno, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
            m = include.match(line)
            if not m or not os.path.isfile(os.path.join(src, m.group(1))):
                continue  # system headers, tools/ headers and same-folder includes by bare name
            checked += 1
            target = layer_of(os.path.dirname(m.group(1)))
            if target is None:
                problems.append(f"{rel}:{lineno}: includes {m.group(1)}, which belongs to no layer")
            elif target[0] > own[0]:
                problems.append(f"{rel}:{lineno}: layer '{own[1]}' includes {m.group(1)} of layer '{target[1]}', "
                                f"which is above it (order: {' < '.join(n for n, _ in built)} < tools)")

    if checked == 0:
        problems.append("no #include between layers was found: nothing was checked")
    if problems:
        for p in problems:
            print(f"check_layers: {p}")
        print(f"check_layers: {len(problems)} problem(s)")
        return 1
    print(f"check_layers: {len(built)} layers, {len(files)} files, {checked} includes, all in order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
