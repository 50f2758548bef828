#!/usr/bin/env python3
"""Checks that every include of a repository file resolves without a build.

Inside the repository an include of one of its files is written relative to
the including file ("../kernels/engine.h"), so the compiler, a reader, grep
and an editor all find it from the source tree alone. This script fails, one
line per finding, when a C++ source (.h .cpp .cu .cuh, tracked or new)
  - includes "X" and no file X exists beside it, or
  - includes <bigbatch/...>: that is a consumer's spelling of the installed
    headers (README, tests/consumer), which a source tree does not resolve;
    except in examples/, whose programs are consumers, built against the
    installed package or add_subdirectory as a user's are.
Usage: check_includes.py [REPO]   (default: this script's repository)
"""
import os
import re
import subprocess
import sys

UMBRELLA_FOLDERS = ("config", "optimizers", "schedules", "normalization", "noise", "distributed")
INTERNAL = {"optimizers/internal.h", "optimizers/layerwise_optimizer_impl.h", "optimizers/kronecker.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def repo_files(repo):
    """The files of the repository: tracked, and new ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=repo,
                         check=True, capture_output=True, text=True).stdout
    return [f for f in out.split() if os.path.exists(os.path.join(repo, f))]


def sources(repo):
    return [f for f in repo_files(repo) if f.endswith((".h", ".cpp", ".cu", ".cuh"))]


def report(problems, summary):
    """One line per finding, then the summary with their count; the exit code."""
    for p in problems:
        print(p)
    print(f"{summary} {len(problems)} problem(s)")
    return 1 if problems else 0


def quoted_includes(repo, f):
    """The repository files `f` includes, as repository paths."""
    with open(os.path.join(repo, f), encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    out = []
    for kind, name in INCLUDE.findall(text):
        target = os.path.normpath(os.path.join(os.path.dirname(f), name))
        if kind == '"' and os.path.isfile(os.path.join(repo, target)):
            out.append(target)
    return out


def umbrella_problems(repo, files):
    """A public header of bigbatch::bigbatch that bigbatch.h does not reach."""
    reached, todo = set(), ["bigbatch.h"]
    while todo:
        f = todo.pop()
        if f not in reached:
            reached.add(f)
            todo.extend(quoted_includes(repo, f))
    return [f"bigbatch.h: does not reach {f}, a public header of bigbatch::bigbatch"
            for f in sorted(files) if f.endswith(".h") and f.split("/")[0] in UMBRELLA_FOLDERS
            and f.count("/") == 1 and f not in INTERNAL and f not in reached]


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems = []
    files = sources(repo)
    for f in files:
        with open(os.path.join(repo, f), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        for m in INCLUDE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            kind, name = m.groups()
            if kind == "<" and name.startswith("bigbatch/"):
                if f.startswith("examples/"):
                    continue  # a consumer program: the installed spelling is the point
                problems.append(f"{f}:{line}: <{name}>: write the path relative to this file")
            elif kind == '"':
                target = os.path.normpath(os.path.join(os.path.dirname(os.path.join(repo, f)), name))
                if not os.path.isfile(target):
                    problems.append(f"{f}:{line}: \"{name}\": no such file beside it")
                elif not target.startswith(repo + os.sep):
                    problems.append(f"{f}:{line}: \"{name}\": outside the repository")
    problems += umbrella_problems(repo, files)
    return report(problems, f"includes: {len(files)} files,")


if __name__ == "__main__":
    sys.exit(main())
