#!/usr/bin/env python3
"""analyze.py REPO HITS.json ROOT_REGEX [--device] [--min-lines N] [-v] [-t]: the reading walk of
the first call of ROOT (scripts/walk.sh; -v: entries per file, -t: the call tree).
A reader starts at ROOT's function, reads each function it calls (depth
first, each function once, in the order the program first enters them) and
returns to the caller after each. Only functions written out in the source
count (lizard finds them): not those a macro or the compiler generates, and
a lambda is read with the function around it. --device: a function entered
with no host caller (a kernel on the SIMT executor's fibers) is read from
the last CUDA launcher entered. Counted: the files visited, the hops (a move
from one file to another, in or out), the returns (hops into a file the walk
had already visited), and the files entered most."""
import json, re, sys, collections, os
sys.path.insert(0, os.environ.get("WALK_LIZARD", ""))
import lizard
repo, hits_path, root_pat = sys.argv[1:4]
device = "--device" in sys.argv
# --min-lines N: a function shorter than N lines (lizard's count) is read
# where it is called, as a reader reads a one-line accessor, not visited.
min_lines = int(sys.argv[sys.argv.index("--min-lines") + 1]) if "--min-lines" in sys.argv else 1
hits = json.load(open(hits_path))
root_re = re.compile(root_pat)
ranges = {}
def written(f):
    if f["file"] not in ranges:
        try:
            info = lizard.analyze_file(os.path.join(repo, f["file"]))
            ranges[f["file"]] = [(fn.start_line, fn.end_line) for fn in info.function_list
                                 if fn.end_line - fn.start_line + 1 >= min_lines]
        except Exception:
            ranges[f["file"]] = []
    return any(s - 3 <= f["line"] <= s + 3 and f["line"] <= e for s, e in ranges[f["file"]])
key = lambda f: (f["fn"], f["file"])
start = next(i for i, h in enumerate(hits) if root_re.search(h[0]["fn"]))
root = key(hits[start][0])
children = collections.defaultdict(list)
known = {root}
launcher = None
for h in hits[start + 1:]:
    stack = [key(f) for f in h]
    orphan = root not in stack[1:]
    if orphan and not (device and launcher and stack[-1][1].startswith("kernels/")):
        continue
    if not written(h[0]):
        continue
    node = stack[0]
    if node in known:
        continue
    parent = next((s for s in stack[1:] if s in known), launcher if orphan else root)
    children[parent].append(node)
    known.add(node)
    if not orphan and "/cuda/" in "/" + node[1]:
        launcher = node
seq = []
def visit(n, depth):
    seq.append(n[1])
    if "-t" in sys.argv:
        print("  " * depth + n[1] + "  " + n[0][:110])
    for c in children[n]:
        visit(c, depth + 1)
        seq.append(n[1])
sys.setrecursionlimit(100000)
visit(root, 0)
hops = returns = 0
seen = {seq[0]}
entries = collections.Counter({seq[0]: 1})
for a, b in zip(seq, seq[1:]):
    if a != b:
        hops += 1
        if b in seen:
            returns += 1
        seen.add(b)
        entries[b] += 1
print(f"functions {len(known)}, files {len(seen)}, hops {hops}, returns {returns}; most entered: "
      + ", ".join(f"{f} {n}" for f, n in entries.most_common(4)))
if "-v" in sys.argv:
    for f, n in sorted(entries.items()):
        print(f"  {n:3d} {f}")
