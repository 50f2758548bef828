#!/usr/bin/env bash
# Writes the King James Bible as plain text (4,298,239 bytes, 80-column
# lines, book and chapter headings, numbered verses) to OUT (default
# data/kjv.txt), once: the language-model quickstart's corpus. The text is
# Debian's bible-kjv-text package (public domain; the package's own copyright
# file says so), printed by its `bible` program; scripts/packages.sh installs
# both. docs/workloads.md "Language models" says why this corpus.
set -euo pipefail
out=${1:-data/kjv.txt}
[ -s "$out" ] && exit 0
command -v bible >/dev/null || { echo "kjv: no 'bible' program (Debian package bible-kjv; scripts/packages.sh installs it)" >&2; exit 2; }
mkdir -p "$(dirname "$out")"
trap 'rm -f "$out.tmp.$$"' EXIT
COLUMNS=80 bible -l80 'gen1:1-rev22:21' > "$out.tmp.$$"
mv "$out.tmp.$$" "$out"
echo "kjv: wrote $out ($(wc -c < "$out") bytes)"
