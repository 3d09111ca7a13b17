#!/usr/bin/env bash
# e2e_sass.sh — static checks of the real device code (tests/sass/check.sh): every kernel of
# kernels/cuda compiled by nvcc for sm_90a has no spills, no local memory, registers within its
# launch bounds' budget, and the 16-byte loads and stores tests/sass/kernels.expect lists are
# 128-bit instructions in the SASS (attention, layernorm, embedding, the GEMVs). Then the same
# checker on tests/sass/broken.cu, whose kernels each break one rule on purpose: every check must
# fail there, each with its own reason, and the control kernel must pass (a check that cannot fail
# proves nothing). SKIPs, saying why, without nvcc, cuobjdump (`make sass-tools`) or c++filt, and
# in builds without the CUDA backend (CUDA=0, SANITIZE=...; PLN_SASS=1 runs it anyway).
source "$(dirname "$0")/e2e.sh"
B=${PLN_BUILD:-build}
if [ "${PLN_SASS:-}" != 1 ] && ! ls "$B"/kernels/cuda/*.cu.o > /dev/null 2>&1; then
  echo "SKIP: $B has no CUDA objects (built with CUDA=0 or SANITIZE=...): the SASS checks run with the CUDA build"
  e2e_done; exit 0
fi
if ! why=$(tests/sass/check.sh --probe); then
  echo "SKIP: $why"; e2e_done; exit 0
fi

# The deliberately broken kernels: each rule must be able to fail.
out=$(WORK="$TMP/broken" tests/sass/check.sh tests/sass/broken.expect tests/sass/broken.cu); rc=$?
echo "$out" | sed 's/^/    broken.cu (failures expected): /'
has() { echo "$out" | grep -Eq "$1"; }
check "broken.cu: seven failures (six kernels and one stale pattern), exit 7 (was $rc)" test "$rc" = 7
check "broken.cu: 32-bit loads where 128-bit are expected fail" has '^FAIL narrow_kernel: ldg128 is 0, expected >=1$'
check "broken.cu: spills fail" has '^FAIL spill_kernel: spills \(ptxas: [1-9][0-9]* bytes'
check "broken.cu: a stack frame and LDL/STL fail without a spill" \
  has '^FAIL local_kernel: [1-9][0-9]* bytes stack frame; [1-9][0-9]* local-memory instructions \(LDL/STL\)$'
check "broken.cu: registers over the budget of 1024 threads fail" \
  has '^FAIL fat_kernel: [0-9]+ registers, over the budget of 64 \(1024 threads per block\)$'
check "broken.cu: a load after griddepcontrol.wait where one before it is expected fails" \
  has '^FAIL late_prefetch_kernel: ldgpre is 0, expected >=1$'
check "broken.cu: a kernel without griddepcontrol.wait fails" has '^FAIL nowait_kernel: pdlwait is 0, expected >=1$'
check "broken.cu: a pattern matching no kernel fails" has '^FAIL expectation /\^renamed_kernel\$/ matches no kernel'
check "broken.cu: the 128-bit control kernel passes" has '^wide_kernel +[0-9]+ +255 .* ok$'

# The real kernels (last, so that a failure's FAIL lines end the log): the table, then one FAIL
# line per broken rule. Only the files that define kernels are compiled.
# shellcheck disable=SC2046
check "kernels/cuda for sm_90a: no spills, no local memory, registers in budget, 128-bit loads where expected" \
  env WORK="$TMP/kernels" tests/sass/check.sh tests/sass/kernels.expect $(grep -l __global__ kernels/cuda/*.cu)
e2e_done
