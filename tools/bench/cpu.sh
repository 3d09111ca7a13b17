#!/usr/bin/env bash
# cpu.sh — the CPU runtime benchmark behind docs/BENCHMARKS.md ("CPU decode and prefill"): synthesizes
# bloom-560m and bloom-1b7 checkpoints (random weights, real shapes; 1b7 cut to LAYERS_1B7 layers to
# fit a small machine's time), reshards each to TP 1 in each of $VARIANTS (fp16, int8, int8 g32 with
# an int8 embedding, int4 g128 and g32), and runs `pollen bench` on each:
# prefill tokens/s for a 512-token prompt, decode ms/token at batch 1, 8 and 32, and MBU against a
# STREAM copy measured by the same process: the median over the steps of each step's bandwidth
# over a copy measured just before it (this VM's bandwidth moves within seconds). Above the results,
# the machine (tools/bench/machine.sh: CPU, flags, cores, memory, load, copy bandwidth); the load
# average after them at the end. Scratch goes to $BENCH_DIR (default build/bench-cpu).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
POLLEN=$BUILD/pollen
DIR=${BENCH_DIR:-$BUILD/bench-cpu}
LAYERS_560M=${LAYERS_560M:-24}
LAYERS_1B7=${LAYERS_1B7:-24}
BATCHES=${BATCHES:-1,8,32}
STEPS=${STEPS:-8}
CONTEXT=${CONTEXT:-32}
PROMPT_LEN=${PROMPT_LEN:-512}
# precisions: fp16, int8 per row, int8 groups of 32 with an int8 embedding, int4 groups of 128 / 32
VARIANTS=${VARIANTS:-fp16 int8 int8-g32-emb8 int4-g128 int4-g32}
mkdir -p "$DIR"
# shellcheck source=tools/bench/machine.sh
source tools/bench/machine.sh
echo "# $(date -u '+%Y-%m-%d %H:%M UTC')"
machine_report "${OMP_NUM_THREADS:-$(getconf _NPROCESSORS_ONLN)}" "$POLLEN"
for spec in "bloom-560m $LAYERS_560M" "bloom-1b7 $LAYERS_1B7"; do
  set -- $spec; model=$1; layers=$2
  src=$DIR/$model-L$layers
  [ -d "$src" ] || "$POLLEN" synth --model "$model" --layers "$layers" -o "$src" --quiet
  for variant in $VARIANTS; do
    # variant: dtype[-gG][-emb8]: int8-g32-emb8 = --dtype int8 --group-size 32 --quantize-embedding
    IFS=- read -r dtype g e <<<"$variant"
    args=(--dtype "$dtype")
    for part in $g $e; do
      case $part in g*) args+=(--group-size "${part#g}") ;; emb8) args+=(--quantize-embedding) ;; esac
    done
    set_dir=$DIR/$model-L$layers-tp1-$variant
    [ -d "$set_dir" ] || "$POLLEN" reshard "$src" -o "$set_dir" --tp 1 "${args[@]}" --quiet
    echo "## $model ($layers layers) TP 1 $variant (reshard ${args[*]})"
    echo "\$ pollen bench $set_dir --prompt-len $PROMPT_LEN --batch $BATCHES --context $CONTEXT --steps $STEPS"
    "$POLLEN" bench "$set_dir" --prompt-len "$PROMPT_LEN" --batch "$BATCHES" --context "$CONTEXT" --steps "$STEPS"
  done
done
machine_load_after "$POLLEN"
