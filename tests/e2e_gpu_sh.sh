#!/usr/bin/env bash
# e2e_gpu_sh.sh — tools/bench/gpu.sh without a GPU: what can go wrong with the one GPU run before
# it starts. Without a GPU it stops at once with its four files; in its test mode (PLN_GPU_FAKE:
# each stage replaced by a command of ours, given the real one as arguments) the figures reach
# results.txt and the table, the stages run with NCCL on loopback and compute-sanitizer with API
# errors off, a failed test fails the run, and stages that hang and ignore SIGTERM are killed on
# time: the whole script ends inside its limit and still writes exactly table.txt, summary.txt,
# results.txt and logs.tar.gz.
source "$(dirname "$0")/e2e.sh"
GPU_SH=tools/bench/gpu.sh
four() { # four DIR: exactly the four files, each non-empty, and the tarball readable
  local d=$1
  [ "$(ls -A "$d" | sort | tr '\n' ' ')" = "logs.tar.gz results.txt summary.txt table.txt " ] &&
    [ -s "$d/table.txt" ] && [ -s "$d/summary.txt" ] && tar -tzf "$d/logs.tar.gz" > /dev/null
}
ends() { # ends cmd...: cmd exits by itself (any status; the status in $last_rc, the seconds in
  # $last_s), not killed by run_gpu_sh's outer 120 s guard (124/137). No upper bound on the time:
  # a loaded machine only makes it slower; the deadline test below checks outcomes instead.
  local t0; t0=$(date +%s)
  "$@"; last_rc=$?
  last_s=$(( $(date +%s) - t0 ))
  [ "$last_rc" != 124 ] && [ "$last_rc" != 137 ]
}
run_gpu_sh() { timeout -k 5 120 env "$@" bash "$GPU_SH" > "$TMP/stdout" 2>&1; }

# 1. No GPU on this machine: stop at once, saying so, with the four files.
if timeout 10 nvidia-smi -L 2>/dev/null | grep -q '^GPU' || [ -e /dev/nvidia0 ]; then
  echo "SKIP (case 1): this machine has a GPU; the no-GPU stop is not exercised"
else
  check "no GPU: stops by itself" ends run_gpu_sh OUT="$TMP/nogpu"
  check "no GPU: exit 1 (was $last_rc)" test "$last_rc" = 1
  check "no GPU: exactly the four files" four "$TMP/nogpu"
  check "no GPU: the summary says why" grep -q '^verdict: NO GPU' "$TMP/nogpu/summary.txt"
  check "no GPU: results say gpu none" grep -qx 'gpu none -' "$TMP/nogpu/results.txt"
  check "no GPU: machine.txt in the logs" sh -c "tar -tzf '$TMP/nogpu/logs.tar.gz' | grep -qx logs/machine.txt"
fi

# 2. Test mode, stages that finish: figures reach the table; loopback NCCL; sanitizer options.
FAKE='echo "stage $0: $*"; env | grep -E "^(NCCL_SOCKET_IFNAME|NCCL_IB_DISABLE|OMPI_MCA_btl_tcp_if_include)=" | sort
case $0 in
  test-gpu) echo "total: 7 passed, ${FAKE_FAILED:-0} failed"; echo "1 passed" > "$PLN_TEST_GPU_LOGS/test_x.log";;
  bench) echo "RESULT decode_fp16_b1_ms_step 12.5 ms"; echo "RESULT copy_gbs 4100 GB/s"
    echo "RESULT op_query_key_value_fp16_b1_us 40 us"; echo "RESULT op_query_key_value_fp16_b1_gbs 3850 GB/s"
    echo "RESULT op_residual+layernorm_fp16_b1_us 5 us"; echo "RESULT op_residual+layernorm_fp16_b1_gbs 40 GB/s"
    echo "RESULT decode_int8_b1_ms_step 7 ms"; echo "RESULT op_query_key_value_int8_b1_us 20 us"
    echo "RESULT decode_fp16_b1_ms_step_nopdl 13.75 ms"; echo "RESULT decode_fp16_b1_ms_step_eager 14 ms"
    echo "RESULT decode_fp16_b1_ms_step_eager_nopdl 16 ms"; echo "RESULT decode_fp16_b1_ms_step_lnsplit 12.25 ms"
    echo "RESULT op_residual+layernorm-split_fp16_b1_us 3.5 us"
    echo "RESULT lin_dense_h_to_4h_int8_T32_us 61.5 us"; echo "RESULT lin_dense_h_to_4h_int8_T32_tflops 107 TFLOP/s"
    echo "RESULT lin_dense_h_to_4h_int8_T32_gemv_us 70.25 us"; echo "RESULT lin_layer_int4g128_b128_over_b1 42.5 x";;
  sanitizer-memcheck) echo "========= ERROR SUMMARY: 0 errors";;
  sanitizer-racecheck) echo "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)"; exit 99;;
esac'
mkdir -p "$TMP/keep/sub" && echo precious > "$TMP/keep/own.txt" && echo precious > "$TMP/keep/sub/own.txt"
check "test mode: ends by itself" ends run_gpu_sh OUT="$TMP/fake" PLN_GPU_FAKE=1 PLN_GPU_FAKE_STAGE="$FAKE" PLN_BENCH_DIR="$TMP/keep"
check "test mode: PLN_BENCH_DIR keeps what the caller had there" \
  sh -c "grep -qx precious '$TMP/keep/own.txt' && grep -qx precious '$TMP/keep/sub/own.txt'"
check "test mode: and holds nothing of the run afterwards" test "$(ls -A "$TMP/keep" | sort | tr '\n' ' ')" = "own.txt sub "
check "test mode: exit 0 when the tests pass (was $last_rc)" test "$last_rc" = 0
check "test mode: exactly the four files" four "$TMP/fake"
check "test mode: test counts in results.txt" grep -qx 'test_gpu_passed 7 tests' "$TMP/fake/results.txt"
check "test mode: bench figures in results.txt" grep -qx 'decode_fp16_b1_ms_step 12.5 ms' "$TMP/fake/results.txt"
check "test mode: and in the table" grep -Eq '^fp16 +1 +12\.50 ' "$TMP/fake/table.txt"
check "test mode: copy ceiling in the table" grep -q 'device copy 4100 GB/s' "$TMP/fake/table.txt"
check "test mode: the batch linears' row (int8 us/TFLOP/s, forced GEMV|GEMM)" \
  grep -Eq '^  dense_h_to_4h +32 +-/- +61\.5/107 +-/- +-/- +70\.2\|-$' "$TMP/fake/table.txt"
check "test mode: the layer's batch-128 / batch-1 ratio" grep -q 'int4g128: T1 - us, T128 - us; batch 128 / batch 1 tokens/s 42.5x' "$TMP/fake/table.txt"
# the per-kernel breakdown: us/call x calls per step (70 per linear, 140 residual + LayerNorm),
# GB/s and the share of the step (40 us x 70 = 2.8 ms = 22.4 % of 12.5 ms); int8 falls back to
# fp16's figure for the kernels it shares (marked *); classes without figures print dashes
check "test mode: breakdown row for the QKV GEMV" \
  grep -Eq '^  query_key_value +40\.0 +70 +2\.800 +3850 +22\.4$' "$TMP/fake/table.txt"
check "test mode: breakdown row for residual + LayerNorm (140 calls)" \
  grep -Eq '^  residual\+layernorm +5\.0 +140 +0\.700 +40 +5\.6$' "$TMP/fake/table.txt"
check "test mode: breakdown sum and remainder" \
  sh -c "grep -Eq '^  sum of kernels +3\.500 +28\.0$' '$TMP/fake/table.txt' && grep -Eq '^  step - sum +9\.000$' '$TMP/fake/table.txt'"
# PDL on/off for the decode step (12.5 ms with, 13.75 without: 1.25 ms, 9.1 % saved), the
# LayerNorm split; int8 has no figures for them: dashes, no saving
check "test mode: PDL on/off line with the saving" \
  grep -Eq '^  PDL on/off +graph 12\.500 ms with, 13\.750 ms without \(eager 14\.000 / 16\.000 ms\): 1\.250 ms \(9\.1 %\) saved$' "$TMP/fake/table.txt"
check "test mode: LayerNorm split line" \
  grep -Eq '^  LayerNorm split +graph 12\.250 ms; residual\+layernorm 3\.5 us split, 5\.0 us one block per row$' "$TMP/fake/table.txt"
check "test mode: PDL line without figures prints dashes" \
  grep -Eq '^  PDL on/off +graph 7\.000 ms with, - ms without \(eager - / - ms\)$' "$TMP/fake/table.txt"
check "test mode: a class without figures prints dashes" grep -Eq '^  dense +- +70 +- +- +-$' "$TMP/fake/table.txt"
check "test mode: int8 uses fp16's figure for a shared kernel, marked" \
  grep -Eq '^  residual\+layernorm\* +5\.0 +140 +0\.700 +40 +10\.0$' "$TMP/fake/table.txt"
check "test mode: int8's own figure where it has one" grep -Eq '^  query_key_value +20\.0 +70 +1\.400 +0 +20\.0$' "$TMP/fake/table.txt"
check "test mode: the split sweep runs as a stage of its own" \
  grep -q 'sweep (at most [0-9]*s): .*tests-gpu/bench_decode --sweep-only$' "$TMP/fake/summary.txt"
check "test mode: racecheck's hazards counted" grep -qx 'sanitizer_racecheck_errors 2 -' "$TMP/fake/results.txt"
check "test mode: racecheck's exit recorded" grep -qx 'sanitizer_racecheck_exit 99 -' "$TMP/fake/results.txt"
mkdir -p "$TMP/fake/x" && tar -C "$TMP/fake/x" -xzf "$TMP/fake/logs.tar.gz"
check "test mode: one log per stage in the tarball" \
  sh -c "cd '$TMP/fake/x/logs' && ls test-gpu.txt bench.txt sanitizer-memcheck.txt sanitizer-racecheck.txt machine.txt > /dev/null"
check "test mode: memcheck on the op checks with API errors off" \
  grep -Eq '^stage sanitizer-memcheck: .*compute-sanitizer --tool memcheck --report-api-errors no .*tests-gpu/test_cuda_ops --quick$' \
  "$TMP/fake/x/logs/sanitizer-memcheck.txt"
check "test mode: racecheck on the op checks, every kernel instrumented (a kernel filter crashed it)" \
  grep -Eq '^stage sanitizer-racecheck: .*compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 99 .*tests-gpu/test_cuda_ops --quick$' \
  "$TMP/fake/x/logs/sanitizer-racecheck.txt"
check "test mode: no kernel filters on either sanitizer" \
  sh -c "! grep -q 'kernel-name' '$TMP/fake/x/logs/sanitizer-memcheck.txt' '$TMP/fake/x/logs/sanitizer-racecheck.txt'"
check "test mode: NCCL bootstrap on loopback" grep -qx 'NCCL_SOCKET_IFNAME=lo' "$TMP/fake/x/logs/test-gpu.txt"
check "test mode: no InfiniBand" grep -qx 'NCCL_IB_DISABLE=1' "$TMP/fake/x/logs/bench.txt"
check "test mode: MPI's TCP on loopback" grep -qx 'OMPI_MCA_btl_tcp_if_include=lo' "$TMP/fake/x/logs/test-gpu.txt"
check "test mode: the per-binary logs run-gpu.sh keeps are in the tarball" test -f "$TMP/fake/x/logs/test-gpu/test_x.log"

# 2b. A failed op check fails the run and the summary says so.
check "failed test: runs" ends run_gpu_sh OUT="$TMP/fail" PLN_GPU_FAKE=1 PLN_GPU_FAKE_STAGE="$FAKE" FAKE_FAILED=2
check "failed test: exit 1 (was $last_rc)" test "$last_rc" = 1
check "failed test: the verdict names the failures" grep -q '^verdict: make test-gpu failed.*2 failed' "$TMP/fail/summary.txt"
check "failed test: exactly the four files" four "$TMP/fail"

# 3. Deadline: every stage hangs and ignores SIGTERM. Limit 16 s, 5 s reserved for the results
# (room for a loaded machine): the first stage gets 6 s, timeout's -k kills it 5 s later,
# everything after is skipped for time.
HANG='echo $$ >> "$HANG_PIDS"; trap "" TERM; exec sleep 600'
: > "$TMP/pids"
check "deadline: the script ends by itself, its hung stages killed" \
  ends run_gpu_sh OUT="$TMP/hang" PLN_GPU_FAKE=1 PLN_GPU_FAKE_STAGE="$HANG" HANG_PIDS="$TMP/pids" \
    PLN_GPU_LIMIT_S=16 PLN_GPU_RESERVE_S=5
check "deadline: took $last_s s, at least the stage's 6 s + 5 s" test "$last_s" -ge 10
check "deadline: exit 1 (was $last_rc)" test "$last_rc" = 1
check "deadline: exactly the four files" four "$TMP/hang"
check "deadline: the hung stage is reported as a timeout" grep -q 'test-gpu: TIMEOUT after' "$TMP/hang/summary.txt"
check "deadline: later stages skipped for time" grep -q 'bench skipped: ' "$TMP/hang/summary.txt"
check "deadline: one stage was started" test "$(wc -l < "$TMP/pids")" = 1
# (timeout's SIGKILL reaches its own process group, itself included: the stage may be a zombie
# for a moment until it is reaped, which is not alive)
running() { local st; st=$(ps -o stat= -p "$1" 2> /dev/null) && [ "${st#Z}" = "$st" ]; }
alive=""; while read -r p; do
  for _ in 1 2 3 4 5 6 7 8 9 10; do running "$p" || break; sleep 0.2; done
  running "$p" && alive="$alive $p"
done < "$TMP/pids"
check "deadline: the hung stage is gone (alive:${alive:- none})" test -z "$alive"
for p in $alive; do kill -9 "$p"; done
e2e_done
