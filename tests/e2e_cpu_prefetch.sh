#!/usr/bin/env bash
# e2e_cpu_prefetch.sh — a static check of the compiled CPU kernels: every batch-1 GEMV of the
# AVX-512 and AVX2 tiers keeps its software prefetch (kernels/cpu/simd_avx512.c PREFETCH_NOTE,
# pln_cpu_pf_ahead4 in cpu.h). The prefetches change no result, so no numeric test can see them
# go; once, a helper that was only `static inline` lost every one of them inside the
# always_inline target("avx512f...") tiles (GCC deleted the calls as side-effect free) and
# batch-1 int8 decode ran 1.6x slower with every test passing. Then the same counter on a small
# file that repeats that mistake must find none (a check that cannot fail proves nothing), and
# with always_inline must find them. SKIPs off x86-64 or without objdump.
source "$(dirname "$0")/e2e.sh"
B=${PLN_BUILD:-build}
CC=${CC:-cc}
if [ "$(uname -m)" != x86_64 ] || ! command -v objdump > /dev/null; then
  echo "SKIP: needs x86-64 and objdump (binutils)"; e2e_done; exit 0
fi

# prefetches OBJ FUNC [HINT]: the prefetcht0 (or HINT: prefetcht1, the level into L2 of cpu.h
# PF_L2_NOTE) instructions in FUNC's disassembly (its own symbol's range)
prefetches() {
  objdump -d --no-show-raw-insn "$1" | awk -v f="<$2>:" -v h="${3:-prefetcht0}" '
    $2 == f { on = 1; next }
    on && /^[0-9a-f]+ <.*>:$/ { on = 0 }
    on && $0 ~ h { n++ }
    END { print n + 0 }'
}

# The one-token GEMV's rows (GEMV_NOTE), both tiers: AVX-512 fp16 prefetches four lines per
# 128-column step and two in its 64-column tail, int8 per row and grouped one in each of five
# loops (groups of 32: the 512-column blocks and their tail), int4 one in each of two; AVX2 one line per
# step in each loop (fp16 1, int8 3, int4 1).
for spec in "simd_avx512 gemv_f16_row 6" "simd_avx512 gemv_i8_row 5" "simd_avx512 gemv_i4_row 2" \
            "simd_avx2 gemv_f16_row 1" "simd_avx2 gemv_i8_row 3" "simd_avx2 gemv_i4_row 1"; do
  set -- $spec
  n=$(prefetches "$B/kernels/cpu/$1.o" "$2")
  check "$1 $2 keeps its prefetches (prefetcht0: $n, expected >= $3)" test "$n" -ge "$3"
  n=$(prefetches "$B/kernels/cpu/$1.o" "$2" prefetcht1)
  check "$1 $2 has them into L2 as well (prefetcht1: $n, expected >= $3)" test "$n" -ge "$3"
done

# Each GEMV calls pln_cpu_pf_ahead4 (4 prefetches) at least once; the grouped ones add the scales'.
for spec in "simd_avx512 gemm_f16_avx512 gemm_i8_avx512 gemm_i4_avx512 gemm_q4n_vnni512" \
            "simd_avx2 gemm_f16_avx2 gemm_i8_avx2 gemm_i4_avx2"; do
  set -- $spec; obj=$B/kernels/cpu/$1.o; shift
  if [ ! -f "$obj" ]; then
    check "$obj exists (make $B/pollen)" false; continue
  fi
  for fn in "$@"; do
    n=$(prefetches "$obj" "$fn")
    check "$fn keeps its GEMV prefetches (prefetcht0: $n, expected >= 4)" test "$n" -ge 4
  done
done

# The counter against the mistake itself, and against its fix.
cat > "$TMP/pf.c" <<'EOF'
#include <immintrin.h>
#ifdef PF_ALWAYS
#define PF_INL static inline __attribute__((always_inline))
#else
#define PF_INL static inline
#endif
PF_INL void pf4(const void *p) {
    const char *c = (const char *)p + 8192;
    _mm_prefetch(c, _MM_HINT_T0);
    _mm_prefetch(c + 64, _MM_HINT_T0);
    _mm_prefetch(c + 128, _MM_HINT_T0);
    _mm_prefetch(c + 192, _MM_HINT_T0);
}
static inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c"))) float tile(const float *w, long n) {
    __m512 a = _mm512_setzero_ps();
    for (long k = 0; k < n; k += 16) {
        if ((k & 63) == 0) pf4(w + k);
        a = _mm512_add_ps(a, _mm512_loadu_ps(w + k));
    }
    return _mm512_reduce_add_ps(a);
}
__attribute__((target("avx512f,avx2,fma,f16c"))) float gemv(const float *w, long n) { return tile(w, n); }
EOF
if $CC -O2 -c "$TMP/pf.c" -o "$TMP/pf_plain.o" 2>"$TMP/cc.log" && $CC -O2 -DPF_ALWAYS -c "$TMP/pf.c" -o "$TMP/pf_always.o" 2>>"$TMP/cc.log"; then
  plain=$(prefetches "$TMP/pf_plain.o" gemv); always=$(prefetches "$TMP/pf_always.o" gemv)
  # Where the compiler keeps the plain helper's prefetches, the control shows nothing either way.
  if [ "$plain" = 0 ]; then
    check "the counter finds the plain static inline helper's prefetches gone (found $plain)" test "$plain" = 0
  else
    echo "    note: this compiler kept the plain helper's prefetches ($plain); the control only shows the counter counts"
  fi
  check "the counter finds the always_inline helper's 4 prefetches (found $always)" test "$always" -ge 4
else
  echo "SKIP: $CC cannot build the control file: $(head -c 300 "$TMP/cc.log")"
fi
e2e_done
