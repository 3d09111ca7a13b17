#!/usr/bin/env bash
# e2e_cuda_tp.sh — the CUDA backend at TP 2 and 4 (bloom-4h) and TP 3 (bloom-6h) under mpirun, on
# whatever GPUs there are: with one GPU every rank shares it and all-reduces go through the host
# (PLN_NCCL=0: NCCL refuses two ranks on one device); with enough GPUs each rank takes its own
# and NCCL runs. Prefill logits of the four fixture prompts within rel L2 1e-2 of transformers,
# the 20 greedy ids identical, and TP > 1 logits within 1e-2 of TP 1 on the same backend. The
# Llama family the same way: llama-gqa (8 q / 2 KV heads; at TP 4 a KV head per rank pair),
# qwen2-bias (q/k/v biases) at TP 2, llama3-tied (1 KV head) at TP 2 and 4.
# Run by tests/run-gpu.sh; SKIP without a GPU, without MPI in the build, or without mpirun.
# PLN_E2E_BACKEND=cpu runs the same checks on the CPU backend (to check this script itself).
# PLN_CUDA_EMU=1 runs them on the CPU execution harness instead of a GPU ($PLN_BUILD/emu/pollen:
# every CUDA kernel executed on the CPU, one emulated device, all-reduces over MPI since the
# harness has no NCCL): bloom-4h and llama3-tied (one KV head, so at TP 2 each rank holds a copy
# of it) at TP 1 and 2, what tests/run.sh does in every make test.
source "$(dirname "$0")/../e2e.sh"
BACKEND=${PLN_E2E_BACKEND:-cuda}
SPECS=("bloom-4h fp16-st 1 2 4" "bloom-6h fp16-bin 1 3" "llama-gqa:bf16 bf16-st 1 2 4" "qwen2-bias fp32-bin 1 2"
       "llama3-tied fp16-bin 1 2 4") HARNESS=""
if [ "${PLN_CUDA_EMU:-0}" = 1 ]; then
  POLLEN=${PLN_BUILD:-build}/emu/pollen
  [ -x "$POLLEN" ] || { echo "SKIP: $POLLEN is not built (needs clang++ and the CUDA headers)"; e2e_done; exit 0; }
  SPECS=("bloom-4h fp16-st 1 2" "llama3-tied fp16-bin 1 2") HARNESS=" (CPU harness)"
fi
CMP=${PLN_BUILD:-build}/tests/test_engine
if ! command -v mpirun >/dev/null; then echo "SKIP: no mpirun on this machine"; e2e_done; exit 0; fi
if [ ! -x "$CMP" ]; then echo "SKIP: $CMP is not built (make test builds it)"; e2e_done; exit 0; fi
if ! "$POLLEN" reshard --help >/dev/null 2>&1; then echo "SKIP: no pollen reshard in this build"; e2e_done; exit 0; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
ngpu=0
if [ "${PLN_CUDA_EMU:-0}" = 1 ]; then
  ngpu=1
elif [ "$BACKEND" = cuda ]; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ "$ngpu" -ge 1 ] || { echo "SKIP: no GPU (nvidia-smi lists none)"; e2e_done; exit 0; }
fi
# A build without MPI refuses to run under mpirun: find out once.
probe=$(mpirun -np 2 "$POLLEN" generate /nonexistent --prompt x 2>&1)
if echo "$probe" | grep -q "built without MPI"; then echo "SKIP: this pollen was built without MPI"; e2e_done; exit 0; fi

run_tp() { # run_tp TP SET args...: one process per rank; ranks share GPU 0 unless there are enough GPUs
  local tp=$1 set=$2; shift 2
  local dev=(--backend "$BACKEND")
  if [ "$BACKEND" = cuda ]; then
    if [ "$ngpu" -ge "$tp" ]; then dev+=(--gpus-per-node "$ngpu"); else dev+=(--device 0); export PLN_NCCL=0; fi
  fi
  # the step watchdog's automatic bound (10 s and up) assumes a GPU: on the CPU harness, the more
  # so in a sanitized build on a shared 2-core machine, one step's kernels can take longer
  # (bloom-4h TP 2 went over it). The harness run has run.sh's timeout as its hang guard; the
  # watchdog itself is tested by e2e_ranks.
  [ "${PLN_CUDA_EMU:-0}" = 1 ] && dev+=(--step-timeout off)
  if [ "$tp" = 1 ]; then "$POLLEN" generate "$set" "${dev[@]}" "$@"
  else mpirun -np "$tp" "$POLLEN" generate "$set" "${dev[@]}" "$@"; fi
  local rc=$?
  unset PLN_NCCL
  return $rc
}
check_tp_fidelity run_tp " on $BACKEND$HARNESS" 1e-2 5e-2 1e-2 "${SPECS[@]}"
# An int4 set under generate's default --int-dot (auto: on for int4 sets, but only the cpu
# backend has that path): the CUDA backend runs it with its own kernels, as it runs int8 (its
# values against the cpu backend: test_cuda_e2e).
check "llama-gqa int4: reshard" "$POLLEN" reshard tests/fixtures/models/llama-gqa/bf16-st -o "$TMP/lg-int4" --tp 1 \
  --dtype int4 --group-size 32 --quiet
check "llama-gqa int4 on $BACKEND$HARNESS: generate with the default --int-dot runs" \
  run_tp 1 "$TMP/lg-int4" --token-ids 1,5,9,100,200 --max-new-tokens 4 --quiet
# The launch budget per decode layer at TP 2 (test_cuda_e2e checks it at TP 1): from the
# harness's launch log, so only here.
E2E_BIN=${PLN_BUILD:-build}/emu/tests-gpu/test_cuda_e2e
if [ "${PLN_CUDA_EMU:-0}" = 1 ] && [ -x "$E2E_BIN" ]; then
  check "bloom-4h: reshard --tp 2 for the launch budget" \
    "$POLLEN" reshard tests/fixtures/models/bloom-4h/fp16-st -o "$TMP/budget-tp2" --tp 2 --dtype fp16 --quiet
  check "bloom-4h TP 2: launches per decode layer within the budget (test_cuda_e2e --launches)" \
    mpirun -np 2 "$E2E_BIN" --launches "$TMP/budget-tp2"
fi
e2e_done
