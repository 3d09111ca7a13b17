#!/usr/bin/env bash
# demo.sh — what `make demo` runs: reshard a small built-in BLOOM (the fixture model trained on
# Debian's license texts; the random-weight bloom-4h fixture if it is absent) to TP 2 int8 and
# generate from it with two MPI ranks (pollen starts them itself), printing the text as it streams
# and the timings.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
POLLEN=$BUILD/pollen
SRC=tests/fixtures/models/bloom-demo
PROMPT=${PROMPT:-This License}
[ -d "$SRC" ] || { SRC=tests/fixtures/models/bloom-4h/fp16-st; PROMPT=${PROMPT:-Hello world}; }
OUT=$BUILD/demo-tp2-int8
command -v mpirun >/dev/null || { echo "demo: mpirun not found (make deps installs openmpi-bin)" >&2; exit 1; }
echo "== pollen reshard $SRC -o $OUT --tp 2 --dtype int8"
"$POLLEN" reshard "$SRC" -o "$OUT" --tp 2 --dtype int8 --force --quiet
ls -l "$OUT"
echo
# A TP-2 set: pollen starts its 2 ranks under mpirun itself and prints that mpirun command line.
echo "== $POLLEN generate $OUT --prompt $(printf %q "$PROMPT") --max-new-tokens 48"
"$POLLEN" generate "$OUT" --prompt "$PROMPT" --max-new-tokens 48
