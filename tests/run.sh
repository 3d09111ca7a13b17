#!/usr/bin/env bash
# Runs every test binary (build/tests/test_*) and every end-to-end script (tests/e2e_*.sh) from
# the repository root, and the CUDA tests on the CPU execution harness (build/emu/, where built;
# beside the others when there are two cores or more), and ends with one summary line
# "total: N passed, N failed".
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export PLN_BUILD=$BUILD
export PLN_TEST_TMP=$(mktemp -d "${TMPDIR:-/tmp}/pln-test.XXXXXX")
emu_pid=""
trap '[ -n "$emu_pid" ] && kill -- -"$emu_pid" 2>/dev/null; rm -rf "$PLN_TEST_TMP"' EXIT
# MPI under root in containers: allow it, keep it on loopback and quiet.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_plm=isolated OMPI_MCA_btl_tcp_if_include=lo
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
# The server suite runs with LeakSanitizer on (a leak per request is a server that dies slowly):
# a leak in the server, the engine, the sampler or pollen serve fails the run. OpenMPI's own
# allocations kept until exit are suppressed (tests/lsan.supp; the slow unwinder reaches their
# frames in its unloaded plugins).
LSAN_TESTS=" test_server test_http_hostile test_httpreq test_engine test_sampler e2e_serve e2e_http_hostile "
LSAN_ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
pass=0; fail=0; failed_names=()
run_one() {
  local name=$1; shift
  local log="$PLN_TEST_TMP/$name.log"
  local t0=$(date +%s.%N)
  if [[ $LSAN_TESTS == *" $name "* ]]; then
    ASAN_OPTIONS=$LSAN_ASAN_OPTIONS "$@" >"$log" 2>&1
  else
    "$@" >"$log" 2>&1
  fi
  local rc=$?
  local dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  local line=$(grep -E '^[A-Za-z0-9_.-]+: [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
  local p=0 f=0
  if [ -n "$line" ]; then
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed.*/\1/')
    f=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed.*/\2/')
  fi
  if [ $rc -ne 0 ] && [ "$f" = 0 ]; then f=1; fi   # a crash counts as a failure
  pass=$((pass + p)); fail=$((fail + f))
  if [ "$f" != 0 ]; then
    failed_names+=("$name"); echo "FAIL  $name ($p passed, $f failed, exit $rc, ${dt}s)"; tail -n 30 "$log" | sed 's/^/    | /'
  else
    echo "ok    $name ($p passed, ${dt}s)"
  fi
}
# The CUDA kernels executed on the CPU (kernels/cuda/emu, built into $BUILD/emu/ where clang++ and
# the CUDA headers exist): the harness's self-test, every op check against the CPU backend, and
# the engine against the transformers fixtures at TP 1 and (MPI for NCCL) TP 2.
# In the sanitized build (build-san) the op-by-op check is left to the plain pass: under ASan
# its fibers run about 5x slower (803 s on a quiet 2-core machine), too close to the timeout
# and to CI's time budget; the harness's self-test and the whole-model checks, which run every
# kernel family through the same harness, still run there. PLN_SAN_EMU_OPS=1 runs it anyway.
# The timeout is a hang guard, not a speed check: the sanitized whole-model check took 753 s on a
# 2-vCPU Zen 3 that other jobs shared (156 s on another runner), so there it is twice as long.
emu_tests="test_cuda_emu test_cuda_ops test_cuda_e2e"
emu_timeout=900
case $BUILD in
  *-san) [ "${PLN_SAN_EMU_OPS:-0}" = 1 ] || emu_tests="test_cuda_emu test_cuda_e2e"; emu_timeout=1800 ;;
esac
have_emu=0; [ -x "$BUILD/emu/tests-gpu/test_cuda_ops" ] && have_emu=1
# The harness runs a kernel's threads as fibers on one core, and its three test binaries are
# half the suite's time: on a machine with two or more cores they run beside the rest (one
# background job, its lines printed when it ends), so the suite takes about the time of the
# longer half. PLN_TEST_SERIAL=1 runs everything one after another.
emu_bin() {
  for t in $emu_tests; do
    [ -x "$BUILD/emu/tests-gpu/$t" ] && run_one "emu-$t" timeout "$emu_timeout" "$BUILD/emu/tests-gpu/$t"
  done
  return 0
}
emu_bg=0
if [ $have_emu = 1 ] && [ "${PLN_TEST_SERIAL:-0}" != 1 ] && [ "$(nproc 2>/dev/null || echo 1)" -ge 2 ]; then
  emu_bg=1
  set -m   # the job gets its own process group, so an interrupted run stops it whole
  ( emu_bin; echo "$pass $fail ${failed_names[*]}" >"$PLN_TEST_TMP/emu.result" ) >"$PLN_TEST_TMP/emu.out" 2>&1 &
  emu_pid=$!
  set +m
  echo "note  the CUDA-harness tests ($emu_tests) run beside the others; their lines follow them"
fi
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  run_one "$(basename "$t")" "$t"
done
for s in tests/e2e_*.sh; do
  [ -f "$s" ] || continue
  run_one "$(basename "$s" .sh)" bash "$s"
done
if [ $have_emu = 1 ]; then
  if [ $emu_bg = 1 ]; then
    wait "$emu_pid"; emu_rc=$?; emu_pid=""
    cat "$PLN_TEST_TMP/emu.out"
    if read -r ep ef en <"$PLN_TEST_TMP/emu.result" 2>/dev/null; then
      pass=$((pass + ep)); fail=$((fail + ef)); [ -n "$en" ] && failed_names+=($en)
    else
      fail=$((fail + 1)); failed_names+=("emu-job"); echo "FAIL  emu-job (the background CUDA-harness job ended without a summary, exit $emu_rc)"
    fi
  else
    emu_bin
  fi
  case " $emu_tests " in *" test_cuda_ops "*) ;; *) echo "note  emu-test_cuda_ops runs in the plain pass only (PLN_SAN_EMU_OPS=1 runs it here)" ;; esac
  run_one emu-e2e_cuda_tp env PLN_CUDA_EMU=1 timeout "$emu_timeout" bash tests/gpu/e2e_cuda_tp.sh
  echo "note  the CUDA kernels above ran on the CPU harness; cuBLASLt and NCCL are not exercised there (make test-gpu)"
else
  echo "SKIP  CUDA kernels on the CPU harness: $BUILD/emu is not built (needs clang++ and the CUDA headers)"
fi
[ ${#failed_names[@]} -eq 0 ] || echo "failed: ${failed_names[*]}"
echo "total: $pass passed, $fail failed"
[ "$fail" = 0 ] && [ "$pass" -gt 0 ]
