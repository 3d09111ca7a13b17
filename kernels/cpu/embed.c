/* embed.c — vocab-parallel embedding lookup and row gathers on the CPU. */
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

#include <string.h>

/* One token: the F16 row of this rank's vocab slice, or zeros when the id is another rank's
 * (the all-reduce then sums exactly one non-zero row). */
static void embed_row(float *out, int32_t id, const uint16_t *table, int64_t v0, int64_t vn,
                      int64_t H) {
    if (id < v0 || id >= v0 + vn) { memset(out, 0, (size_t)H * sizeof *out); return; }
    const uint16_t *row = table + (id - v0) * H;
    for (int64_t i = 0; i < H; i++) out[i] = pln_f16_to_f32(row[i]);
}

void pln_cpu_embed(pln_cpu *c, float *out, const int32_t *ids, int32_t T, const uint16_t *table,
                   int64_t v0, int64_t vn, int64_t H) {
    if (c->isa == PLN_CPU_ISA_REF) {
        for (int32_t t = 0; t < T; t++) embed_row(out + t * H, ids[t], table, v0, vn, H);
        return;
    }
    #pragma omp parallel for schedule(static) num_threads(pln_cpu_threads(c)) if (T > 1 && (int64_t)T * H > 65536)
    for (int32_t t = 0; t < T; t++) embed_row(out + t * H, ids[t], table, v0, vn, H);
}

void pln_cpu_gather_rows(pln_cpu *c, float *out, const float *in, const int32_t *rows, int32_t n,
                         int64_t H) {
    for (int32_t i = 0; i < n; i++)
        memmove(out + (int64_t)i * H, in + (int64_t)rows[i] * H, (size_t)H * sizeof *out);
}
