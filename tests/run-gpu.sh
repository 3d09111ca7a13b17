#!/usr/bin/env bash
# What `make test-gpu` runs: every op check and end-to-end test on the CUDA backend
# (build/tests-gpu/test_*, built from tests/gpu/*.c by the Makefile, then the scripts
# tests/gpu/e2e_*.sh: TP > 1 under mpirun), then one summary line
# "total: N passed, N failed". Without a usable GPU it prints "SKIP: no GPU (reason)" and exits 0,
# so `make test-gpu` is safe everywhere; `make test` never touches a GPU. Each binary runs under a
# timeout (PLN_TEST_GPU_TIMEOUT seconds, 300 by default): a hung kernel or NCCL init is one
# failure, not a lost run. The op checks run first: they say the most when time is short.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export PLN_BUILD=$BUILD
if [ "${CUDA:-1}" != 1 ]; then
  echo "SKIP: no GPU (this build has no CUDA backend: nvcc was not found or CUDA=0)"
  exit 0
fi
probe="$BUILD/tests-gpu/test_cuda_ops"
if [ ! -x "$probe" ]; then
  echo "SKIP: no GPU ($probe was not built)"
  exit 0
fi
reason=$(timeout 60 "$probe" --probe 2>&1); rc=$?
if [ $rc -ne 0 ]; then
  reason=$(echo "$reason" | grep -m1 '^SKIP' | sed -E 's/^SKIP: no GPU \((.*)\)$/\1/')
  echo "SKIP: no GPU (${reason:-probe exited $rc})"
  exit 0
fi
export PLN_TEST_TMP=$(mktemp -d "${TMPDIR:-/tmp}/pln-test-gpu.XXXXXX")
# PLN_TEST_GPU_LOGS=DIR keeps every binary's full log there (tools/bench/gpu.sh packs them).
trap '[ -n "${PLN_TEST_GPU_LOGS:-}" ] && cp "$PLN_TEST_TMP"/*.log "$PLN_TEST_GPU_LOGS"/ 2>/dev/null; rm -rf "$PLN_TEST_TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pass=0; fail=0; failed_names=()
TMO=${PLN_TEST_GPU_TIMEOUT:-300}
for t in "$probe" "$BUILD"/tests-gpu/test_* tests/gpu/e2e_*.sh; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  log="$PLN_TEST_TMP/$name.log"
  [ -e "$log" ] && continue   # test_cuda_ops: already run first
  t0=$(date +%s.%N)
  timeout -k 5 "$TMO" "$t" ${PLN_TEST_GPU_ARGS:-} >"$log" 2>&1; rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "TIMEOUT $name after ${TMO}s" | tee -a "$log"
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  # the per-op table (OK / NOT OK lines) is the point of these tests: show it
  grep -E ' (OK|NOT OK)$|OK  \(' "$log" | sed 's/^/    /'
  line=$(grep -E '^[A-Za-z0-9_.-]+: [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
  p=0; f=0
  if [ -n "$line" ]; then
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed.*/\1/')
    f=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed.*/\2/')
  elif [ $rc -eq 77 ]; then
    echo "skip  $name ($(grep -m1 SKIP "$log"))"; continue
  fi
  if [ $rc -ne 0 ] && [ "$f" = 0 ]; then f=1; fi
  pass=$((pass + p)); fail=$((fail + f))
  if [ "$f" != 0 ]; then
    failed_names+=("$name"); echo "FAIL  $name ($p passed, $f failed, exit $rc, ${dt}s)"
    grep -E '^FAIL ' "$log" | head -n 30 | sed 's/^/    | /'; tail -n 5 "$log" | sed 's/^/    | /'
  else
    echo "ok    $name ($p passed, ${dt}s)"
  fi
done
[ ${#failed_names[@]} -eq 0 ] || echo "failed: ${failed_names[*]}"
echo "total: $pass passed, $fail failed"
[ "$fail" = 0 ] && [ "$pass" -gt 0 ]
