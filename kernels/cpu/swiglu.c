/* swiglu.c — the Llama MLP's gate: out[t] = silu(gate[t]) * up[t] from the fused gate|up
 * projection [T, 2I] (backend.h swiglu). A memory-bound pass: the micro kernels' silu_mul. */
#include "kernels/cpu/cpu.h"
#include "kernels/pln_math.h"

void pln_cpu_swiglu(pln_cpu *c, float *out, const float *in, int32_t T, int64_t I) {
    if (c->isa == PLN_CPU_ISA_REF) {
        for (int32_t t = 0; t < T; t++)
            for (int64_t i = 0; i < I; i++)
                out[t * I + i] = pln_silu(in[t * 2 * I + i]) * in[t * 2 * I + I + i];
        return;
    }
    const pln_cpu_kernels *k = c->k;
    #pragma omp parallel for schedule(static) num_threads(pln_cpu_threads(c)) if (T > 1 && (int64_t)T * I > 32768)
    for (int32_t t = 0; t < T; t++) k->silu_mul(out + t * I, in + t * 2 * I, in + t * 2 * I + I, I);
}
