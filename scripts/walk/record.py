# gdb script (scripts/walk.sh): a breakpoint at every function the debug
# information places in a file of the repository (WALK_REPO, but files
# matching WALK_SKIP; WALK_BUILD, the build folder, resolves relative paths),
# each disabled at its first hit; at each first hit the
# repository frames of the stack (function, file, line) are recorded, and
# written to WALK_OUT as JSON when the program exits.
import json
import os
import re

import gdb

REPO = os.environ["WALK_REPO"]
OUT = os.environ["WALK_OUT"]
BUILD = os.environ.get("WALK_BUILD", REPO)  # where the compiler ran: relative paths are from there
SKIP = re.compile(os.environ.get("WALK_SKIP") or r"^$")
hits = []


def place(sal):
    """The repository path of a source location, or None."""
    if sal.symtab is None:
        return None
    path = os.path.realpath(sal.symtab.fullname())
    return os.path.relpath(path, REPO) if path.startswith(REPO + "/") and not SKIP.search(path) else None


def repo_frames():
    out = []
    f = gdb.newest_frame()
    while f is not None:
        where = place(f.find_sal())
        if where is not None:
            fn = f.function()
            out.append({"fn": fn.print_name if fn else str(f.name()), "file": where, "line": fn.line if fn else 0})
        f = f.older()
    return out


def stop(event):
    if not isinstance(event, gdb.BreakpointEvent):
        return
    for bp in event.breakpoints:
        bp.enabled = False
    frames = repo_frames()
    if frames and place(gdb.newest_frame().find_sal()) is not None:
        hits.append(frames)


def arm():
    """A breakpoint at each function line `info functions` lists in the repository."""
    where, spots = None, set()
    for line in gdb.execute("info functions", to_string=True).splitlines():
        m = re.match(r"^File (.*):$", line)
        if m:
            path = os.path.realpath(os.path.join(BUILD, m.group(1)))
            where = path if path and path.startswith(REPO + "/") and not SKIP.search(path) else None
            continue
        m = re.match(r"^(\d+):\s", line)
        if where and m:
            spots.add(f"{where}:{m.group(1)}")
    for s in sorted(spots):
        try:
            gdb.Breakpoint(s)
        except gdb.error:
            pass
    print(f"walk: {len(spots)} functions armed")


def run_to_exit():
    while True:
        try:
            gdb.execute("continue", to_string=True)
        except gdb.error:
            break


def done(event):
    with open(OUT, "w") as f:
        json.dump(hits, f)


gdb.events.stop.connect(stop)
gdb.events.exited.connect(done)
