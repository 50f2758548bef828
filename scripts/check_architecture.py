#!/usr/bin/env python3
"""Checks that docs/architecture.md describes the tree as it is.

- Each table under a heading "### FOLDER/, one job per file" names files
  ("config.h/.cpp" is config.h and config.cpp; "cuda/runner.cuh" is below
  FOLDER): every file it names exists, and every C++ source of FOLDER
  (.h .cpp .cu .cuh, in its subfolders too) has a row.
- The table under "## Folders and targets": every target it names is defined
  (add_library / add_executable) in the CMake file of its folder, and every
  target the library folders, experiments/, cmake/ and the top CMakeLists.txt
  define is in the table.
- Every fuzz target of tests/fuzz/CMakeLists.txt is named ("`NAME`").
- Every path written between backticks that starts with a folder of the
  repository exists (an ALL_CAPS part is a placeholder; #anchors are dropped).
One line per finding; exit 1 when there is one.
Usage: check_architecture.py [REPO]   (default: this script's repository)
"""
import glob
import os
import re
import sys

from check_includes import report, repo_files

SOURCE = (".h", ".cpp", ".cu", ".cuh")
TARGET_FOLDERS = ["compat", "config", "kernels", "optimizers", "schedules", "normalization", "noise",
                  "distributed", "experiments", "python", "cmake", "."]


def tables(text):
    """(heading, [first cells]) for each markdown table, under its last heading."""
    heading, out, rows = "", [], None
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line.strip("# ").strip()
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if rows is None:
                rows = []
                out.append((heading, rows))
            elif not set(cells[0]) <= set("-: "):
                rows.append(cells)
        else:
            rows = None
    return out


def expand(cell):
    """`a.h/.cpp`, `b.h` -> [a.h, a.cpp, b.h]."""
    names = []
    for token in re.findall(r"`([^`]+)`", cell):
        first, *more = token.split("/.")
        names.append(first)
        stem = first.rsplit(".", 1)[0]
        names += [stem + "." + ext for ext in more]
    return names


def defined_targets(repo):
    found = {}
    for folder in TARGET_FOLDERS:
        pattern = "*.cmake" if folder == "cmake" else "CMakeLists.txt"
        paths = glob.glob(os.path.join(repo, folder, pattern))
        if folder not in (".", "cmake"):
            paths += glob.glob(os.path.join(repo, folder, "*", "CMakeLists.txt"))
        for path in paths:
            text = open(path).read()
            for m in re.finditer(r"add_(?:library|executable)\(\s*([A-Za-z0-9_:-]+)\s+([A-Z]+)?", text):
                if m.group(2) in ("IMPORTED", "ALIAS") or "IMPORTED" in text[m.end():m.end() + 20]:
                    continue
                if "ALIAS" in text[m.end() - 6:m.end() + 10]:
                    continue
                found[m.group(1)] = os.path.relpath(path, repo)
    return found


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    doc_path = os.path.join(repo, "docs", "architecture.md")
    text = open(doc_path).read()
    files = repo_files(repo)
    problems = []

    for heading, rows in tables(text):
        m = re.match(r"(\S+)/, one job per file", heading)
        if not m:
            continue
        folder = m.group(1)
        named = set()
        for cells in rows:
            for name in expand(cells[0]):
                path = os.path.join(folder, name)
                named.add(path)
                if not os.path.isfile(os.path.join(repo, path)):
                    problems.append(f"docs/architecture.md: {folder}/ table: {name}: no such file")
        for f in files:
            if f.startswith(folder + "/") and f.endswith(SOURCE) and f not in named:
                problems.append(f"docs/architecture.md: {folder}/ table: no row for {f[len(folder) + 1:]}")

    defined = defined_targets(repo)
    listed = set()
    for heading, rows in tables(text):
        if heading != "Folders and targets":
            continue
        for cells in rows:
            names = re.findall(r"`([^`]+)`", cells[0])
            if not names:
                continue
            target, folder = names[0], cells[1].strip().rstrip("/")
            listed.add(target)
            where = defined.get(target)
            want = "CMakeLists.txt" if folder == "(top)" else folder
            if where is None:
                problems.append(f"docs/architecture.md: target {target}: not defined by any CMake file")
            elif not (where == want or where.startswith(want + "/")):
                problems.append(f"docs/architecture.md: target {target}: defined in {where}, the table says {folder}/")
    for target, where in sorted(defined.items()):
        if target not in listed:
            problems.append(f"docs/architecture.md: target {target} ({where}) is not in the table")

    fuzz = open(os.path.join(repo, "tests", "fuzz", "CMakeLists.txt")).read()
    m = re.search(r"set\(fuzz_names ([^)]*)\)", fuzz)  # the first: every target
    if not m:
        problems.append("tests/fuzz/CMakeLists.txt: no set(fuzz_names ...) listing the fuzz targets")
    for name in (m.group(1).split() if m else []):
        if f"`{name}`" not in text:
            problems.append(f"docs/architecture.md: fuzz target {name} is not named")

    top = {p.split("/")[0] for p in files}
    for token in re.findall(r"`([^`\s]+)`", text):
        path = token.split("#")[0].rstrip(".,:;")
        placeholder = any(re.fullmatch(r"[A-Z_]+", part) for part in path.split("/"))  # tests/fuzz/corpus/NAME
        if "/" in path and path.split("/")[0] in top and not placeholder and not any(c in path for c in "<>*[]"):
            if not os.path.exists(os.path.join(repo, path)):
                problems.append(f"docs/architecture.md: `{token}`: no such path")

    return report(problems, "architecture:")


if __name__ == "__main__":
    sys.exit(main())
