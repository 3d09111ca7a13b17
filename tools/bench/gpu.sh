#!/usr/bin/env bash
# tools/bench/gpu.sh — the one GPU check of the CUDA backend: one call, at most PLN_GPU_LIMIT_S
# (330 s) of wall time on one H200, everything it produces in four files under $OUT.
#   0. the machine; no GPU (nvidia-smi lists none and there is no /dev/nvidia0) stops it at once;
#   1. binaries: the prebuilt bundle build/gpu-bundle/ (tools/bench/gpu-bundle.sh, carried along)
#      when it was built from these very sources, else a build with nvcc there, else the bundle
#      anyway (marked stale); then test_cuda_ops --probe, which stops it, saying why, when the GPU
#      is not usable;
#   2. what `make test-gpu` runs (tests/run-gpu.sh: every op against the CPU backend, the engine
#      end to end against the transformers fixtures);
#   3. tests/gpu/bench_decode: device copy GB/s and fp16 GEMM TFLOP/s ceilings, one TP-8 rank of
#      BLOOM-176B with random weights made on the device (--quick when time is short), the
#      int4 (groups of 128) linears at BLOOM-176B's full TP-1 width at T 1, 8, 16 and 512, and
#      the Llama family's decode ops (RMSNorm, rotary, SwiGLU, grouped-query attention, the fp16
#      linears) at Llama-3.1-8B TP 1 and Llama-3.1-70B TP 8 widths, batch 1 and 8; then, with
#      150 s left, `bench_decode --sweep-only` (every GEMV split-k forced, a stage of its own);
#   4. compute-sanitizer memcheck, then racecheck, on test_cuda_ops --quick (the machine's
#      compute-sanitizer, else the one in the bundle; API errors not reported: the op checks fail a 1 PiB allocation on
#      purpose, and any other failing call already fails the test itself);
#   5. loader GB/s on a synthesized checkpoint file, only when time is left (before
#      PLN_GPU_BUDGET_S, 200 s);
#   6. the table, the summary and the logs tarball, on every exit.
# Deadline: every stage runs under `timeout -k 5` with a limit cut to what is left of
# PLN_GPU_LIMIT_S less PLN_GPU_RESERVE_S (15 s kept for step 6); a stage that would get under 5 s
# is skipped. NCCL and MPI stay on loopback (NCCL_SOCKET_IFNAME=lo, NCCL_IB_DISABLE=1, OMPI tcp
# on lo): a one-machine check needs no other interface.
# $OUT (default ./gpu-results) receives exactly: table.txt (the figures), summary.txt (what ran,
# each stage's exit and time, failures), results.txt (`key value unit` per figure) and
# logs.tar.gz (logs/: machine.txt, build.txt, test-gpu.txt and one log per test binary,
# bench.txt, sweep.txt, sanitizer-*.txt, synth.txt, load-*.txt). Exit 0 when the GPU ran and no test failed.
# PLN_GPU_BUILD=0 never builds, =1 builds even when the bundle matches.
# Test mode, no GPU needed (tests/e2e_gpu_sh.sh): PLN_GPU_FAKE=1 skips detection and binaries and
# runs `bash -c "$PLN_GPU_FAKE_STAGE" STAGE-NAME REAL-COMMAND...` in place of each stage.
# Usage: tools/bench/gpu.sh        (OUT=dir chooses where the four files go)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
LIMIT=${PLN_GPU_LIMIT_S:-330}
BUDGET=${PLN_GPU_BUDGET_S:-200}
RESERVE=${PLN_GPU_RESERVE_S:-15}
MODE=${PLN_GPU_BUILD:-auto}
FAKE=${PLN_GPU_FAKE:-}
T0=$(date +%s)
TMPW=$(mktemp -d "${TMPDIR:-/tmp}/pln-gpu.XXXXXX")
LOGS=$TMPW/logs
mkdir -p "$LOGS"
# Scratch for the loader stage: a fresh directory inside PLN_BENCH_DIR (made here, so removing it
# never touches what the caller keeps there), else inside the run's own temporary directory.
if [ -n "${PLN_BENCH_DIR:-}" ]; then mkdir -p "$PLN_BENCH_DIR"; WORK=$(mktemp -d "$PLN_BENCH_DIR/pln-gpu-work.XXXXXX"); else WORK=$TMPW/work; fi
RES=$TMPW/results.txt SUM=$TMPW/summary.txt
: > "$RES"; : > "$SUM"
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( LIMIT - $(elapsed) - RESERVE )); }
# cap N: a stage's time limit, N seconds or what is left (less 5 s for timeout's -k)
cap() { local c=$1 l; l=$(( $(left) - 5 )); [ "$l" -lt "$c" ] && c=$l; echo "$c"; }
say() { echo "[$(elapsed)s] $*" | tee -a "$SUM"; }
res() { echo "$1 $2 $3" >> "$RES"; }   # key value unit
# stage NAME LIMIT CMD...: CMD under timeout -k 5 (its limit cut by cap), output in logs/NAME.txt,
# exit and seconds recorded; returns CMD's exit, 124/137 on timeout, 125 when skipped for time.
stage() {
  local name=$1 c t rc; c=$(cap "$2"); shift 2
  if [ "$c" -lt 5 ]; then say "$name skipped: $(elapsed)s used of ${LIMIT}s"; res "stage_${name}_exit" skipped -; return 125; fi
  say "== $name (at most ${c}s): $*"
  [ -n "$FAKE" ] && set -- bash -c "${PLN_GPU_FAKE_STAGE:-echo fake \$0}" "$name" "$@"
  t=$(date +%s)
  timeout -k 5 "$c" "$@" > "$LOGS/$name.txt" 2>&1; rc=$?
  t=$(( $(date +%s) - t ))
  echo "exit $rc after ${t}s" >> "$LOGS/$name.txt"
  if [ $rc = 124 ] || [ $rc = 137 ]; then say "$name: TIMEOUT after ${t}s (limit ${c}s)"
  else say "$name: exit $rc after ${t}s"; fi
  res "stage_${name}_exit" "$rc" -; res "stage_${name}_s" "$t" s
  return $rc
}
tread() { local a b; a=$(date +%s.%N); timeout -k 5 "$(cap 60)" cat "$1" > /dev/null || return 1; b=$(date +%s.%N); awk -v a="$a" -v b="$b" 'BEGIN{print b - a}'; }

# ---- 6. the table, the summary, the tarball (on every exit) ----------------------------------------
v() { awk -v k="$1" '$1 == k {print $2; exit}' "$RES"; }
vd() { local x; x=$(v "$1"); echo "${x:--}"; }   # the value, or - where there is none
f() { local x; x=$(v "$1"); case "$x" in ''|*[!0-9.eE+-]*) printf -- "-";; *) printf "%.${2:-2}f" "$x";; esac; }
# One decode step at batch 1 by kernel class: bench_decode's time per call (a timed loop of that
# op alone, layers rotated so nothing stays in L2) times the calls in one step of a TP-8 rank of
# BLOOM-176B (70 layers: each linear and the attention once per layer, the residual + LayerNorm
# twice, the logits once), its GB/s, and its share of the measured step (the graph's ms/step);
# int8 rows without their own figure use fp16's (the same kernel; marked *). The remainder is
# what no kernel class accounts for (launch gaps; the all-reduces at TP > 1).
breakdown() {
  local dt=$1 step sum=0 oc op n us gbs mark
  step=$(v decode_${dt}_b1_ms_step)
  echo "one decode step, $dt, batch 1, by kernel class (step $(f decode_${dt}_b1_ms_step 3) ms as a graph):"
  printf "  %-20s %9s %6s %9s %8s %7s\n" kernel "us/call" calls "ms/step" "GB/s" "% step"
  for oc in query_key_value:70 dense:70 dense_h_to_4h+gelu:70 dense_4h_to_h:70 attention:70 residual+layernorm:140 logits:1; do
    op=${oc%%:*} n=${oc##*:} mark=""
    us=$(v "op_${op}_${dt}_b1_us"); gbs=$(v "op_${op}_${dt}_b1_gbs")
    if [ -z "$us" ] && [ "$dt" != fp16 ]; then us=$(v "op_${op}_fp16_b1_us"); gbs=$(v "op_${op}_fp16_b1_gbs"); mark="*"; fi
    if [ -z "$us" ]; then printf "  %-20s %9s %6s %9s %8s %7s\n" "$op" - "$n" - - -; continue; fi
    awk -v op="$op$mark" -v us="$us" -v n="$n" -v g="${gbs:-0}" -v st="${step:-0}" 'BEGIN{ms = us * n / 1000;
      printf "  %-20s %9.1f %6d %9.3f %8.0f %7s\n", op, us, n, ms, g, (st > 0 ? sprintf("%.1f", 100 * ms / st) : "-")}'
    sum=$(awk -v a="$sum" -v us="$us" -v n="$n" 'BEGIN{print a + us * n / 1000}')
  done
  awk -v s="$sum" -v st="${step:-0}" 'BEGIN{printf "  %-20s %9s %6s %9.3f %8s %7s\n", "sum of kernels", "", "", s, "",
    (st > 0 ? sprintf("%.1f", 100 * s / st) : "-"); if (st > 0) printf "  %-20s %9s %6s %9.3f\n", "step - sum", "", "", st - s}'
  # the same step with programmatic dependent launch off (plain launches, as on sm_80 or with
  # PLN_PDL=0): what the overlap of each kernel's head with its predecessor's tail gains; and with
  # the LayerNorm rows split over several blocks (PLN_CUDA_LN_SPLIT=1, off by default)
  local on off
  on=$(v decode_${dt}_b1_ms_step); off=$(v decode_${dt}_b1_ms_step_nopdl)
  printf "  %-20s graph %s ms with, %s ms without (eager %s / %s ms)%s\n" "PDL on/off" "$(f decode_${dt}_b1_ms_step 3)" \
    "$(f decode_${dt}_b1_ms_step_nopdl 3)" "$(f decode_${dt}_b1_ms_step_eager 3)" "$(f decode_${dt}_b1_ms_step_eager_nopdl 3)" \
    "$(if [ -n "$on" ] && [ -n "$off" ]; then awk -v a="$on" -v b="$off" 'BEGIN{if (b > 0) printf ": %.3f ms (%.1f %%) saved", b - a, 100 * (b - a) / b}'; fi)"
  printf "  %-20s graph %s ms; residual+layernorm %s us split, %s us one block per row\n" "LayerNorm split" \
    "$(f decode_${dt}_b1_ms_step_lnsplit 3)" "$(f op_residual+layernorm-split_fp16_b1_us 1)" "$(f op_residual+layernorm_fp16_b1_us 1)"
}
table() {
  echo "pollen CUDA backend on $(cat "$TMPW/gpu-name" 2>/dev/null || echo "no GPU (nvidia-smi found none)"), $(date -u +%Y-%m-%d)"
  echo "binaries: $(vd binaries) ($(vd build_dir)); gpu: $(vd gpu)"
  echo "make test-gpu: $(vd test_gpu_passed) passed, $(vd test_gpu_failed) failed"
  echo "one TP-8 rank of BLOOM-176B, random weights, context 512; all-reduce is a no-op (single rank)"
  echo "ceilings: device copy $(f copy_gbs 0) GB/s, fp16 GEMM $(f gemm_tflops 0) TFLOP/s"
  printf "%-6s %6s %12s %12s %12s %8s\n" dtype batch "ms/step" "ms/token" "tokens/s" "MBU %"
  for dt in fp16 int8; do for b in 1 8 32 128; do
    printf "%-6s %6s %12s %12s %12s %8s\n" $dt $b "$(f decode_${dt}_b${b}_ms_step)" "$(f decode_${dt}_b${b}_ms_token 3)" \
      "$(f decode_${dt}_b${b}_tokens_s 0)" "$(f decode_${dt}_b${b}_mbu 0)"
  done; done
  echo "prefill 512 tokens: fp16 $(f prefill_fp16_512_tokens_s 0) tokens/s, int8 $(f prefill_int8_512_tokens_s 0) tokens/s;" \
       "with query-tiled attention: fp16 $(f prefill_fp16_512_tiled_tokens_s 0), int8 $(f prefill_int8_512_tiled_tokens_s 0)"
  local a b t1 t128
  a=$(v decode_fp16_b1_ms_step); b=$(v decode_int8_b1_ms_step); t1=$(v decode_fp16_b1_tokens_s); t128=$(v decode_fp16_b128_tokens_s)
  [ -n "$a" ] && [ -n "$b" ] && echo "int8/fp16 batch-1 time: $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.2f", b/a}') (target <= 0.6)"
  [ -n "$t1" ] && [ -n "$t128" ] && echo "batch 128 / batch 1 tokens/s (fp16): $(awk -v a="$t1" -v b="$t128" 'BEGIN{printf "%.1f", b/a}') (target >= 60)"
  echo "decode kernels, batch 1 (GB/s; copy ceiling $(f copy_gbs 0)):"
  for op in query_key_value dense dense_h_to_4h+gelu dense_4h_to_h attention residual+layernorm logits; do
    printf "  %-20s fp16 %8s  int8 %8s\n" $op "$(f op_${op}_fp16_b1_gbs 0)" "$(f op_${op}_int8_b1_gbs 0)"
  done
  breakdown fp16; breakdown int8
  echo "int4 g128 at BLOOM-176B's full width (TP 1: the model on one GPU), GB/s of weights+scales (T 512: TFLOP/s follows in the log):"
  for op in query_key_value dense dense_h_to_4h dense_4h_to_h; do
    printf "  %-20s T1 %6s  T8 %6s  T16 %6s  T512 %6s us\n" $op "$(f op_int4_tp1_${op}_T1_gbs 0)" "$(f op_int4_tp1_${op}_T8_gbs 0)" \
      "$(f op_int4_tp1_${op}_T16_gbs 0)" "$(f op_int4_tp1_${op}_T512_us 0)"
  done
  echo "linears of one TP-8 rank by batch, us per call / TFLOP/s (fp16: cuBLASLt above 16 tokens; int8/int4: the"
  echo "GEMV to 32 tokens, the cp.async GEMM above; at T 32 and 64 the quantized kernels forced: gemv | gemm us):"
  # one awk for the whole block (a v/f per cell would be ~170 processes, seconds on a loaded machine)
  awk -v res="$RES" 'function f(k, d) { return (k in val && val[k] ~ /^[0-9.eE+-]+$/) ? sprintf("%." d "f", val[k]) : "-" }
    BEGIN {
      while ((getline line < res) > 0) { split(line, w, " "); if (!(w[1] in val)) val[w[1]] = w[2] }
      ns = split("query_key_value dense dense_h_to_4h dense_4h_to_h", S, " "); nt = split("8 32 64 128", Ts, " ")
      nd = split("fp16 int8 int8g128 int4g128", D, " ")
      printf "  %-16s %4s %15s %15s %15s %15s %23s\n", "shape", "T", "fp16", "int8", "int8-g128", "int4-g128", "int8 gemv|gemm"
      for (i = 1; i <= ns; i++) for (j = 1; j <= nt; j++) {
        row = sprintf("  %-16s %4s", S[i], Ts[j])
        for (d = 1; d <= nd; d++) { k = "lin_" S[i] "_" D[d] "_T" Ts[j]; row = row sprintf(" %15s", f(k "_us", 1) "/" f(k "_tflops", 0)) }
        k = "lin_" S[i] "_int8_T" Ts[j]
        if (Ts[j] == 32 || Ts[j] == 64) row = row sprintf(" %23s", f(k "_gemv_us", 1) "|" f(k "_gemm_us", 1))
        print row
      }
      for (d = 1; d <= nd; d++) { k = "lin_layer_" D[d]
        printf "  one layer'"'"'s linears, %s: T1 %s us, T128 %s us; batch 128 / batch 1 tokens/s %sx (target >= 60)\n",
          D[d], f(k "_T1_us", 1), f(k "_T128_us", 1), f(k "_b128_over_b1", 1) }
    }'
  echo "the Llama family's decode ops, fp16, context 512 (bench_decode llama_ops: no model; us per call / GB/s):"
  awk -v res="$RES" 'function f(k, d) { return (k in val && val[k] ~ /^[0-9.eE+-]+$/) ? sprintf("%." d "f", val[k]) : "-" }
    BEGIN {
      while ((getline line < res) > 0) { split(line, w, " "); if (!(w[1] in val)) val[w[1]] = w[2] }
      nm = split("llama3.1-8b-tp1 llama3.1-70b-tp8", M, " ")
      no = split("qkv_proj rope attention o_proj residual+rmsnorm gate_up_proj swiglu gate_up+swiglu down_proj", O, " ")
      for (i = 1; i <= nm; i++) {
        for (j = 1; j <= no; j++) { k = "llama_" M[i] "_" O[j]
          printf "  %-17s %-17s batch 1 %9s   batch 8 %9s\n", M[i], O[j], f(k "_b1_us", 1) "/" f(k "_b1_gbs", 0),
            f(k "_b8_us", 1) "/" f(k "_b8_gbs", 0) }
        printf "  %-17s kernels of one decode step: batch 1 %s ms, batch 8 %s ms\n", M[i],
          f("llama_" M[i] "_kernels_b1_ms_step", 3), f("llama_" M[i] "_kernels_b8_ms_step", 3)
      }
    }'
  echo "loader ($(f load_file_gb 1) GB $(vd load_file)): cold $(f load_cold_gbs) GB/s (cat $(f cat_cold_gbs) GB/s)," \
       "warm $(f load_warm_gbs) GB/s (cat $(f cat_warm_gbs) GB/s), warm with --verify checksums $(f load_verify_warm_gbs) GB/s"
  echo "compute-sanitizer on test_cuda_ops --quick: memcheck exit $(vd sanitizer_memcheck_exit), $(vd sanitizer_memcheck_errors) errors;" \
       "racecheck exit $(vd sanitizer_racecheck_exit), $(vd sanitizer_racecheck_errors) hazards"
  echo "elapsed $(elapsed) s of ${LIMIT} s"
}
STATUS=1 WHY="stopped early"   # the exit status and the summary's verdict
finish() {
  trap - EXIT INT TERM
  say "== done: exit $STATUS"
  table > "$OUT/table.txt" 2>&1
  {
    echo "verdict: $WHY (exit $STATUS)"
    echo "stages (exit; 124/137 = timed out):"
    awk '$1 ~ /^stage_.*_exit$/ {n = $1; sub(/^stage_/, "", n); sub(/_exit$/, "", n); printf "  %-20s %s\n", n, $2}' "$RES"
    [ -f "$LOGS/test-gpu.txt" ] && { echo "make test-gpu:"; grep -E '^(FAIL|TIMEOUT|failed:|total:|SKIP)|NOT OK' "$LOGS/test-gpu.txt" | head -n 40 | sed 's/^/  /'; }
    for s in memcheck racecheck; do
      [ -f "$LOGS/sanitizer-$s.txt" ] && { echo "compute-sanitizer $s:"; grep -E '^========= ' "$LOGS/sanitizer-$s.txt" | head -n 20 | sed 's/^/  /'; }
    done
    echo "log:"; sed 's/^/  /' "$SUM"
  } > "$TMPW/summary.final"
  mv "$TMPW/summary.final" "$OUT/summary.txt"
  cp "$RES" "$OUT/results.txt"
  timeout -k 2 10 tar -C "$TMPW" -czf "$OUT/logs.tar.gz" logs || echo "gpu.sh: could not pack the logs" >> "$OUT/summary.txt"
  cat "$OUT/table.txt"
  rm -rf "$TMPW"; [ -n "${PLN_BENCH_DIR:-}" ] && rm -rf "$WORK"   # both made by this run
  exit $STATUS
}
trap finish EXIT
trap 'say "interrupted"; exit' INT TERM

# NCCL's bootstrap and MPI (tests/gpu/e2e_cuda_tp.sh) on loopback only.
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_plm=isolated
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

# ---- 0. the machine ------------------------------------------------------------------------------
say "pollen GPU check: limit ${LIMIT}s, results in $OUT"
{ date -u; uname -a; timeout -k 2 20 nvidia-smi -L 2>&1;
  timeout -k 2 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1;
  command -v nvcc && timeout -k 2 20 nvcc --version | tail -2; nproc; free -g; command -v mpirun && timeout -k 2 10 mpirun --version 2>&1 | head -1;
  ls /usr/include/jansson.h /usr/include/archive.h /usr/include/xxhash.h /usr/include/pcre2.h /usr/include/microhttpd.h 2>&1; df -h "$PWD" /tmp; } > "$LOGS/machine.txt" 2>&1
timeout -k 2 10 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep . > "$TMPW/gpu-name" || rm -f "$TMPW/gpu-name"
if [ -z "$FAKE" ] && ! timeout -k 2 10 nvidia-smi -L 2>/dev/null | grep -q '^GPU' && [ ! -e /dev/nvidia0 ]; then
  WHY="NO GPU: nvidia-smi lists none and there is no /dev/nvidia0; nothing to measure"
  say "$WHY"; res gpu none -
  exit 1
fi

# ---- 1. binaries ---------------------------------------------------------------------------------
export PATH=$PATH:/usr/local/cuda/bin
JOBS=$(nproc)
BUNDLE=build/gpu-bundle
libpaths() {   # CUDA/NCCL libraries of the machine: the toolkit's, else the pip wheels next to PyTorch
  local d p=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && p="$p:$d"; done
  for d in $(timeout -k 2 30 python3 -c 'import nvidia, os; print(" ".join(os.path.join(b, x, "lib") for b in nvidia.__path__ for x in os.listdir(b)))' 2>/dev/null); do
    [ -d "$d" ] && p="$p:$d"
  done
  echo "${p#:}"
}
GPU_BINS="tests-gpu/test_cuda_ops tests-gpu/test_cuda_e2e tests-gpu/test_cuda_nccl tests-gpu/bench_decode"
BUILD=""
# try_bundle: unpack (next to the bundle, not into it: build/gpu-bundle stays what is carried) and
# check that every library of its binaries resolves here
try_bundle() {
  local dir=build/gpu-bundle-run b miss=""
  if [ -f "$BUNDLE/bundle.tar.gz" ]; then
    rm -rf "$dir"; mkdir -p "$dir"
    timeout -k 2 60 tar -C "$dir" -xzf "$BUNDLE/bundle.tar.gz" || { say "cannot unpack $BUNDLE/bundle.tar.gz"; return 1; }
  elif [ -x "$BUNDLE/pollen" ]; then dir=$BUNDLE   # an unpacked bundle
  else say "no prebuilt bundle ($BUNDLE/bundle.tar.gz)"; return 1
  fi
  export LD_LIBRARY_PATH="$PWD/$dir/lib:$SYS_LD_LIBRARY_PATH"
  for b in pollen $GPU_BINS; do miss="$miss $(timeout -k 2 20 ldd "$dir/$b" 2>&1 | awk '/not found/ {print $1}')"; done
  miss=$(echo $miss | tr ' ' '\n' | sort -u | tr '\n' ' ')
  if [ -n "${miss// /}" ]; then
    say "the bundle's binaries cannot start here, libraries not found: $miss"
    export LD_LIBRARY_PATH=$SYS_LD_LIBRARY_PATH
    return 1
  fi
  BUILD=$dir
}
try_build() {
  local h miss=""
  for h in jansson.h archive.h xxhash.h pcre2.h microhttpd.h cublasLt.h nccl.h; do
    echo "#define PCRE2_CODE_UNIT_WIDTH 8
#include <$h>" | timeout -k 2 20 cc -E -I/usr/local/cuda/include -x c - > /dev/null 2>&1 || miss="$miss $h"
  done
  if [ -n "$miss" ]; then say "cannot build here: headers missing:$miss"; return 1; fi
  # shellcheck disable=SC2046
  if stage build 180 make -j"$JOBS" CUDA=1 build/pollen build/tests/test_engine $(for b in $GPU_BINS; do echo build/$b; done); then
    say "built here with $(command -v nvcc)"; BUILD=build
  else
    say "build failed or timed out (see logs/build.txt): $(grep -m1 -E 'error|No such file' "$LOGS/build.txt")"
    return 1
  fi
}
if [ -n "$FAKE" ]; then
  say "test mode (PLN_GPU_FAKE): no binaries, no GPU; each stage runs PLN_GPU_FAKE_STAGE"
  BUILD=build-fake; res binaries fake -
else
  export LD_LIBRARY_PATH="$(libpaths)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  SYS_LD_LIBRARY_PATH=$LD_LIBRARY_PATH
  HASH=$(bash tools/bench/gpu-bundle.sh --hash 2>/dev/null)
  BHASH=$(cat "$BUNDLE/SOURCE" 2>/dev/null)
  if [ "$MODE" != 1 ] && [ -n "$BHASH" ] && [ "$BHASH" = "$HASH" ] && try_bundle; then
    say "using the prebuilt bundle: it was built from these sources ($HASH)"; res binaries bundle -
  elif [ "$MODE" != 0 ] && try_build; then
    res binaries built_here -
  elif [ -z "$BUILD" ] && try_bundle; then
    if [ "$BHASH" = "$HASH" ]; then say "using the prebuilt bundle ($HASH)"; res binaries bundle -
    else
      say "WARNING: using the prebuilt bundle built from OTHER sources (${BHASH:-unknown}, tree $HASH): rerun tools/bench/gpu-bundle.sh"
      res binaries bundle_stale -
    fi
  else
    WHY="NO BINARIES: no build here and no usable bundle (tools/bench/gpu-bundle.sh, carried as $BUNDLE/)"
    say "$WHY"; res binaries none -
    exit 1
  fi
  res build_dir "$BUILD" -
  # The GPU itself: without a usable one there is nothing to measure, so stop here, saying why.
  probe=$(timeout -k 2 30 "$BUILD/tests-gpu/test_cuda_ops" --probe 2>&1); rc=$?
  echo "$probe" > "$LOGS/probe.txt"
  if [ $rc -ne 0 ]; then
    WHY="NO USABLE GPU (probe exit $rc): $(echo "$probe" | grep -m1 -E 'SKIP|error' || echo "$probe" | tail -1)"
    say "$WHY"; res gpu none -
    exit 1
  fi
fi
res gpu ok -

# ---- 2. make test-gpu ----------------------------------------------------------------------------
mkdir -p "$LOGS/test-gpu"
BUILD=$BUILD CUDA=1 PLN_TEST_GPU_TIMEOUT=90 PLN_TEST_GPU_LOGS="$LOGS/test-gpu" stage test-gpu 120 bash tests/run-gpu.sh
grep -E 'NOT OK|^FAIL|^ok|^skip|^SKIP|^TIMEOUT|passed, .* failed$' "$LOGS/test-gpu.txt" | tail -n 25
line=$(grep -E '^(total: )?[0-9]+ passed, [0-9]+ failed' "$LOGS/test-gpu.txt" | tail -1)
if [ -n "$line" ]; then
  res test_gpu_passed "$(echo "$line" | sed -E 's/^(total: )?([0-9]+) passed, ([0-9]+) failed.*/\2/')" tests
  res test_gpu_failed "$(echo "$line" | sed -E 's/^(total: )?([0-9]+) passed, ([0-9]+) failed.*/\3/')" tests
else
  say "test-gpu stopped before its summary line (timeout?): see logs/test-gpu.txt"
fi

# ---- 3. decode / prefill / per-op ---------------------------------------------------------------
quick=""; [ "$(left)" -lt 200 ] && quick=--quick
stage bench 90 "$BUILD/tests-gpu/bench_decode" $quick
grep -v '^RESULT' "$LOGS/bench.txt" | tail -n 40
grep '^RESULT' "$LOGS/bench.txt" | sed 's/^RESULT //' >> "$RES"
# The GEMV split-k sweep (every split forced on every decode linear, fp16 / int8 / int8 g128 at
# 1-32 tokens) in a stage of its own: the one run of it on an H200 stopped with "an illegal
# instruction was encountered" at Llama-3.1-8B's gate_up_proj in int8 groups of 128 (the CPU
# harness passes that shape at every split), so a fault there costs only this stage.
if [ "$(left)" -ge 150 ]; then stage sweep 45 "$BUILD/tests-gpu/bench_decode" --sweep-only
else say "sweep stage skipped: $(elapsed)s used (it starts only with 150s left)"; fi
[ -f "$LOGS/sweep.txt" ] && grep '^RESULT' "$LOGS/sweep.txt" | sed 's/^RESULT //' >> "$RES"

# ---- 4. compute-sanitizer on the op checks ----------------------------------------------------------
# memcheck finds out-of-bounds and misaligned accesses that happen not to change a result; racecheck
# finds shared-memory hazards. --report-api-errors no: test_cuda_ops fails a 1 PiB allocation on
# purpose (its error message is checked), which memcheck would otherwise count as an error; any
# other failing CUDA call fails the op checks themselves (their summary line is in the log).
# Neither tool takes kernel filters (--kernel-name, --kernel-name-exclude): on an H200 with the
# CUDA 13.0 toolkit's compute-sanitizer, racecheck with any filter stopped at the first GEMV launch
# it did not instrument ("Internal Sanitizer Error: The Sanitizer failed to handle a hardware
# exception") and every later kernel faulted; unfiltered, the same binary ran clean. racecheck is
# slow (the --quick checks need more than its cap), so it gets 100 s; its only reports so far were
# inside cuBLASLt's own kernels (nvjet_*), which it instruments too.
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer "$BUILD/sanitizer/compute-sanitizer" 2>/dev/null | head -1)
[ -n "$FAKE" ] && SAN=compute-sanitizer
if [ -n "$SAN" ]; then
  for tool in memcheck racecheck; do
    cap=60; [ $tool = racecheck ] && cap=100
    stage "sanitizer-$tool" $cap "$SAN" --tool "$tool" --report-api-errors no --error-exitcode 99 \
      "$BUILD/tests-gpu/test_cuda_ops" --quick
    rc=$?
    [ $rc = 125 ] && continue
    res "sanitizer_${tool}_exit" "$rc" -
    n=$(grep -E '^========= (ERROR|RACECHECK) SUMMARY' "$LOGS/sanitizer-$tool.txt" | tail -1 | sed -E 's/.*SUMMARY: ([0-9]+).*/\1/')
    [ -n "$n" ] && res "sanitizer_${tool}_errors" "$n" -
    line=$(grep -E '^[a-z_]+: [0-9]+ passed, [0-9]+ failed' "$LOGS/sanitizer-$tool.txt" | tail -1)
    say "compute-sanitizer $tool: exit $rc, ${n:-no} errors/hazards in its summary line${line:+; op checks: $line}"
  done
else
  say "compute-sanitizer not found on this machine: skipped"
fi

# ---- 5. loader on a synthesized checkpoint file (only when time is left) ---------------------------
MODEL=${PLN_GPU_LOAD_MODEL:-bloom-1b7}
if [ "$(elapsed)" -lt "$BUDGET" ] && [ "$(left)" -ge 90 ]; then
  mkdir -p "$WORK"
  F=""
  if stage synth 60 "$BUILD/pollen" synth --model "$MODEL" -o "$WORK/src" --quiet; then
    F=$(ls -S "$WORK"/src/*.safetensors 2>/dev/null | head -1)   # the loader streams bytes: any large file
  fi
  if [ -n "$F" ] && [ -f "$F" ]; then
    sz=$(stat -c %s "$F"); res load_file "$MODEL/$(basename "$F")" -
    res load_file_gb "$(awk -v s="$sz" 'BEGIN{printf "%.2f", s/1e9}')" GB
    timeout -k 2 "$(cap 30)" sync
    if [ "$(left)" -ge 40 ] && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
      t=$(tread "$F") && res cat_cold_gbs "$(awk -v s="$sz" -v t="$t" 'BEGIN{printf "%.2f", s/t/1e9}')" GB/s
      echo 3 > /proc/sys/vm/drop_caches
      stage load-cold 30 "$BUILD/tests-gpu/bench_decode" --load "$F"
      x=$(awk '/^RESULT load_gbs/{print $3}' "$LOGS/load-cold.txt"); [ -n "$x" ] && res load_cold_gbs "$x" GB/s
    else
      say "cold figures not measured (cannot drop the page cache here, or no time left)"
    fi
    if [ "$(left)" -ge 30 ]; then
      tread "$F" > /dev/null
      t=$(tread "$F") && res cat_warm_gbs "$(awk -v s="$sz" -v t="$t" 'BEGIN{printf "%.2f", s/t/1e9}')" GB/s
      stage load-warm 30 "$BUILD/tests-gpu/bench_decode" --load "$F"
      x=$(awk '/^RESULT load_gbs/{print $3}' "$LOGS/load-warm.txt"); [ -n "$x" ] && res load_warm_gbs "$x" GB/s
      x=$(awk '/^RESULT load_verify_gbs/{print $3}' "$LOGS/load-warm.txt"); [ -n "$x" ] && res load_verify_warm_gbs "$x" GB/s
    fi
  fi
  rm -rf "$WORK"
else
  say "loader stage skipped: $(elapsed)s used (it starts only before ${BUDGET}s with 90s left)"
fi

if [ "$(v stage_test-gpu_exit)" = 0 ] && [ "$(v test_gpu_failed)" = 0 ]; then
  STATUS=0; WHY="the GPU ran every stage it had time for; make test-gpu passed ($(v test_gpu_passed) checks)"
else
  WHY="make test-gpu failed or did not finish: $(vd test_gpu_failed) failed, stage exit $(vd stage_test-gpu_exit) (see below)"
fi
exit $STATUS
