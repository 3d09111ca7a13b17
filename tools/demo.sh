#!/usr/bin/env bash
# demo.sh — what `make demo` runs: reshard a small built-in BLOOM (the fixture model trained on
# Debian's license texts; the random-weight bloom-4h fixture if it is absent) to TP 2 int8 and
# generate from it with two MPI ranks, printing the text as it streams and the timings.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
POLLEN=$BUILD/pollen
SRC=tests/fixtures/models/bloom-demo
PROMPT=${PROMPT:-This License}
[ -d "$SRC" ] || { SRC=tests/fixtures/models/bloom-4h/fp16-st; PROMPT=${PROMPT:-Hello world}; }
OUT=$BUILD/demo-tp2-int8
command -v mpirun >/dev/null || { echo "demo: mpirun not found (make deps installs openmpi-bin)" >&2; exit 1; }
# Containers: let Open MPI run as root, oversubscribe small machines, and skip the CMA copy path.
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}

echo "== pollen reshard $SRC -o $OUT --tp 2 --dtype int8"
"$POLLEN" reshard "$SRC" -o "$OUT" --tp 2 --dtype int8 --force --quiet
ls -l "$OUT"
echo
echo "== mpirun -np 2 $POLLEN generate $OUT --prompt \"$PROMPT\" --max-new-tokens 48"
mpirun -np 2 "$POLLEN" generate "$OUT" --prompt "$PROMPT" --max-new-tokens 48
