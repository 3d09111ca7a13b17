#!/usr/bin/env bash
# kernels_cpu.sh — CPU kernel microbenchmark: GEMV/GEMM of bloom-1b7-sized weights ([8192, 2048]
# and [2048, 8192]: F16, I8 per channel, I8 groups of 32, int4 groups of 128 and 32) at T = 1, 8,
# 32, 128 tokens, and paged attention
# (decode and a 512-token prefill), each beside a STREAM-style copy measured in the same run.
# Weights are cycled through 256 MiB of copies so they come from memory, not the cache.
#   tools/bench/kernels_cpu.sh                    all tiers' best, OpenMP default threads
#   OMP_NUM_THREADS=1 tools/bench/kernels_cpu.sh  one core
#   PLN_CPU_ISA=avx2 tools/bench/kernels_cpu.sh   a lower instruction-set tier (ref, c, avx2, avx512)
# Extra arguments are token counts to time instead of the default list.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
make --no-print-directory -s "$BUILD/tests/test_kernels_cpu"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "\$ OMP_NUM_THREADS=${OMP_NUM_THREADS:-} PLN_CPU_ISA=${PLN_CPU_ISA:-} $BUILD/tests/test_kernels_cpu --bench $*"
exec "$BUILD/tests/test_kernels_cpu" --bench "$@"
