#!/usr/bin/env python3
"""The layer order of distmuon's folders, checked over every `#include "..."` line.

docs/architecture.md ("Layer order") holds the table: one line per folder, lowest layer first,

    <layer> <folder> [<public header> ...]

where the public headers (include/distmuon/<name>) are those the folder implements. A file belongs
to the deepest folder of the table that holds it; a public header belongs to the folder that names
it. A folder may include its own files and those of folders on a lower layer; a folder on the same
layer (a peer) or above it is a violation. This script prints each violation
(file:line: folder includes folder) and exits 1; it exits 2 when the table does not cover the tree
(a folder or public header without a layer). `--self-test` checks the checker on synthetic trees.
"""

import argparse
import os
import re
import shutil
import sys
import tempfile

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".in")
TOP_FOLDERS = ("src", "include", "apps", "bench", "python", "tests")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(distmuon/[^>]+)>)')
HEADING = "## Layer order"


class TableError(Exception):
    pass


def read_table(doc_path):
    """{folder: layer}, {public header name: folder} from the doc's first fenced block after the
    Layer order heading."""
    with open(doc_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    try:
        start = lines.index(HEADING)
    except ValueError:
        raise TableError(f"{doc_path}: no '{HEADING}' heading")
    fence = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("```")), None)
    if fence is None:
        raise TableError(f"{doc_path}: no fenced block after '{HEADING}'")
    folders, headers = {}, {}
    for i in range(fence + 1, len(lines)):
        line = lines[i]
        if line.startswith("```"):
            return folders, headers
        fields = line.split()
        if not fields or not fields[0].isdigit():
            continue
        if len(fields) < 2:
            raise TableError(f"{doc_path}:{i + 1}: a layer without a folder")
        layer, folder = int(fields[0]), fields[1].rstrip("/")
        if folder in folders:
            raise TableError(f"{doc_path}:{i + 1}: {folder} listed twice")
        folders[folder] = layer
        for name in fields[2:]:
            if name in headers:
                raise TableError(f"{doc_path}:{i + 1}: {name} already belongs to {headers[name]}")
            headers[name] = folder
    raise TableError(f"{doc_path}: the block after '{HEADING}' is not closed")


def source_files(root):
    for top in TOP_FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def folder_of(path, folders):
    """The deepest folder of the table holding path (a relative path with '/'), or None."""
    parts = path.split("/")
    for n in range(len(parts) - 1, 0, -1):
        candidate = "/".join(parts[:n])
        if candidate in folders:
            return candidate
    return None


def resolve(root, including, name, all_files):
    """The project file an include names (relative path), or None for a file outside the project
    (a system or third-party header, a file generated into the build tree)."""
    candidates = [os.path.join(os.path.dirname(including), name), os.path.join("include", name),
                  os.path.join("src", name)]
    for c in candidates:
        c = os.path.normpath(c).replace(os.sep, "/")
        if c in all_files:
            return c
    # Include directories of the top folder itself (tests/support, python/src, ...): a file of the
    # same top folder whose path ends with the name.
    top = including.split("/")[0]
    same_top = [f for f in all_files if f.startswith(top + "/") and f.endswith("/" + name)]
    return same_top[0] if len(same_top) == 1 else None


def check(root, folders, headers):
    """(violations, coverage errors): lists of strings."""
    files = list(source_files(root))
    all_files = set(f.replace(os.sep, "/") for f in files)
    violations, coverage = [], []
    for path in sorted(all_files):
        if path.startswith("include/distmuon/"):
            name = path[len("include/distmuon/"):]
            folder = headers.get(name)
            if folder is None:
                coverage.append(f"{path}: a public header no folder of the table names")
                continue
        else:
            folder = folder_of(path, folders)
            if folder is None:
                coverage.append(f"{path}: in no folder of the table")
                continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                name = m.group(1) or m.group(2)
                target = resolve(root, path, name, all_files)
                if target is None:
                    continue
                if target.startswith("include/distmuon/"):
                    target_folder = headers.get(target[len("include/distmuon/"):])
                else:
                    target_folder = folder_of(target, folders)
                if target_folder is None or target_folder == folder:
                    continue  # an uncovered target is reported as such above
                if folders[target_folder] >= folders[folder]:
                    where = "a peer" if folders[target_folder] == folders[folder] else "above it"
                    violations.append(
                        f"{path}:{lineno}: {folder} (layer {folders[folder]}) includes {name} of "
                        f"{target_folder} (layer {folders[target_folder]}, {where})")
    return violations, coverage


def self_test():
    """The checker on synthetic trees: a clean one passes, a downward include passes, an upward
    include, a peer include and an uncovered header fail."""
    doc = ("# A\n\n## Layer order\n\n```text\n"
           "1 src/low low.h\n2 src/mid mid.h\n2 src/peer\n3 src/high\n4 tests\n```\n")
    def tree(files):
        d = tempfile.mkdtemp(prefix="check-layers-")
        for path, text in {**files, "doc.md": doc}.items():
            os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(d, path), "w", encoding="utf-8") as f:
                f.write(text)
        return d
    base = {"include/distmuon/low.h": "#pragma once\n",
            "include/distmuon/mid.h": '#include "distmuon/low.h"\n',
            "src/low/low.cpp": '#include "distmuon/low.h"\n#include <vector>\n',
            "src/mid/mid.cpp": '#include "distmuon/mid.h"\n#include "low/private.h"\n',
            "src/low/private.h": "#pragma once\n",
            "src/peer/peer.cpp": '#include "distmuon/low.h"\n',
            "src/high/high.cpp": '#include "distmuon/mid.h"\n#include "peer/p.h"\n',
            "src/peer/p.h": "#pragma once\n",
            "tests/support/util.h": "#pragma once\n",
            "tests/mid/test_mid.cpp": '#include "util.h"\n#include "mid/x.h"\n'}
    cases = [
        ("clean", {}, 0, 0),
        ("upward public header", {"include/distmuon/low.h": '#include "distmuon/mid.h"\n'}, 1, 0),
        ("upward private header", {"src/low/low.cpp": '#include "high/h.h"\n',
                                   "src/high/h.h": ""}, 1, 0),
        ("peer", {"src/peer/peer.cpp": '#include "distmuon/mid.h"\n'}, 1, 0),
        ("angle brackets", {"src/low/x.cpp": "#include <distmuon/mid.h>\n"}, 1, 0),
        ("uncovered header", {"include/distmuon/new.h": "#pragma once\n"}, 0, 1),
        ("uncovered folder", {"src/new/new.cpp": "\n"}, 0, 1),
    ]
    failures = 0
    for name, extra, want_v, want_c in cases:
        d = tree({**base, **extra})
        folders, headers = read_table(os.path.join(d, "doc.md"))
        v, c = check(d, folders, headers)
        shutil.rmtree(d)
        ok = len(v) == want_v and len(c) == want_c
        failures += not ok
        print(f"self-test {name}: {'ok' if ok else 'FAILED'} ({len(v)} violations, "
              f"{len(c)} uncovered; expected {want_v}, {want_c})")
        for line in v + c:
            print("   ", line)
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--doc", help="the table's markdown file (default: ROOT/docs/architecture.md)")
    ap.add_argument("--self-test", action="store_true", help="check the checker, then exit")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    root = os.path.abspath(args.root)
    try:
        folders, headers = read_table(args.doc or os.path.join(root, "docs", "architecture.md"))
    except TableError as e:
        print(f"check-layers: {e}", file=sys.stderr)
        return 2
    violations, coverage = check(root, folders, headers)
    for line in coverage:
        print(f"check-layers: {line}", file=sys.stderr)
    for line in violations:
        print(f"check-layers: {line}", file=sys.stderr)
    if coverage:
        return 2
    if violations:
        print(f"check-layers: {len(violations)} include(s) against the layer order "
              "(docs/architecture.md, Layer order)", file=sys.stderr)
        return 1
    print(f"check-layers: {len(folders)} folders, {len(headers)} public headers: no folder "
          "includes one above it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
