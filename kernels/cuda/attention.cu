/* attention.cu — paged flash-decoding for decode steps; split-key attention (one block per token,
 * head and key chunk) and the merge of the chunks' partial softmax states. See attention.cuh.
 * Every kernel reads q, k and v through pln_qkv_layout (kv_append.cuh): BLOOM's interleaved heads
 * are the grouped-query layout's group of one, and slopes == NULL is no positional bias.
 * Sliding window (pln_attn_meta.window > 0): a token at position p reads keys p - window < j <= p;
 * the splits and chunks cover that span from its first key (key_start), so the keys before the
 * window cost nothing. */
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/kv_append.cuh"

#define ATTN_THREADS 128

__device__ __forceinline__ const __half *kv_row(const __half *cache, const int32_t *bt, int j, int bs, int nh,
                                                int h, int D)
{
    int blk = bt[j / bs];
    return cache + (((int64_t)blk * nh + h) * bs + j % bs) * D;
}

/* The first key a token at position pos reads: 0, or the start of its sliding window. */
__device__ __forceinline__ int key_start(int pos, int window)
{
    return window > 0 && pos >= window ? pos - window + 1 : 0;
}

/* Keys a token reads at most in a step: max_pos, or the window when shorter. */
static inline int key_span(const pln_attn_meta *m)
{
    return m->window > 0 && m->window < m->max_pos ? m->window : m->max_pos;
}

/* Token t0 + blockIdx.x, keys from its first (key_start) on. nsplit == 1: writes the normalized output. Else the chunk's state, for
 * the launch's tokens only (local index blockIdx.x): pm/ps [tokens, nh, nsplit] and
 * pacc [tokens, nh, nsplit, D] (sum of exp(score - m) * v, not normalized). */
__global__ void __launch_bounds__(ATTN_THREADS)
attn_chunk_kernel(__half *out, float *pm, float *ps, float *pacc, const __half *qkv, const __half *kc,
                  const __half *vc, const int32_t *tok_seq, const int32_t *tok_pos, const int32_t *block_table,
                  int bs, int max_blocks, const float *slopes, int nh, pln_qkv_layout L, int D, int nsplit, int t0,
                  int window)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    __shared__ float qs[256];
    __shared__ float sc[PLN_ATTN_CHUNK];
    __shared__ float red[ATTN_THREADS * 8];
    __shared__ float scratch[32];
    const int t = t0 + (int)blockIdx.x, h = blockIdx.y, sp = blockIdx.z;
    const int seq = tok_seq[t], pos = tok_pos[t];
    const int j0 = key_start(pos, window) + sp * PLN_ATTN_CHUNK;
    const int j1 = min(j0 + PLN_ATTN_CHUNK, pos + 1);
    const int64_t pidx = ((int64_t)blockIdx.x * nh + h) * nsplit + sp;
    if (j0 >= j1) {   /* this chunk lies past the token's last key: an empty state */
        if (threadIdx.x == 0) { pm[pidx] = -INFINITY; ps[pidx] = 0.0f; }
        for (int d = threadIdx.x; d < D; d += ATTN_THREADS) pacc[pidx * D + d] = 0.0f;
        return;
    }
    const int32_t *bt = block_table + (int64_t)seq * max_blocks;
    const float slope = slopes ? slopes[h] : 0.0f;
    const float inv_norm = rsqrtf((float)D);
    const __half *q = qkv + (int64_t)t * L.stride + (int64_t)h * L.q_step;
    const int kvh = h / L.group, nkv = L.nkv;
    for (int d = threadIdx.x; d < D; d += ATTN_THREADS) qs[d] = __half2float(q[d]) * inv_norm;
    __syncthreads();

    /* Scores: one thread per key, 16-byte loads along the key row, q broadcast from shared. */
    float lmax = -INFINITY;
    for (int j = j0 + threadIdx.x; j < j1; j += ATTN_THREADS) {
        const int4 *kr = (const int4 *)kv_row(kc, bt, j, bs, nkv, kvh, D);
        float s = 0.0f;
#pragma unroll 8
        for (int d8 = 0; d8 < D / 8; d8++) {
            float kf[8];
            pln_h8_to_f(*(const pln_h8 *)&kr[d8], kf);
#pragma unroll
            for (int i = 0; i < 8; i++) s += qs[d8 * 8 + i] * kf[i];
        }
        s += slope * (float)j;
        sc[j - j0] = s;
        lmax = fmaxf(lmax, s);
    }
    const float m = pln_block_max(lmax, scratch);
    float lsum = 0.0f;
    for (int j = j0 + threadIdx.x; j < j1; j += ATTN_THREADS) {
        float p = __expf(sc[j - j0] - m);
        sc[j - j0] = p;
        lsum += p;
    }
    const float s = pln_block_sum(lsum, scratch);   /* its barriers also publish sc[] */

    /* p · V: R threads cover one value row with 16-byte loads, ATTN_THREADS / R rows at once. */
    const int R = D / 8, slots = ATTN_THREADS / R;
    const int slot = threadIdx.x / R, part = threadIdx.x % R;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (slot < slots) {
        for (int j = j0 + slot; j < j1; j += slots) {
            const pln_h8 *vr = (const pln_h8 *)kv_row(vc, bt, j, bs, nkv, kvh, D) + part;
            float vf[8];
            pln_h8_to_f(*vr, vf);
            const float p = sc[j - j0];
#pragma unroll
            for (int i = 0; i < 8; i++) acc[i] += p * vf[i];
        }
#pragma unroll
        for (int i = 0; i < 8; i++) red[slot * D + part * 8 + i] = acc[i];
    }
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += ATTN_THREADS) {
        float v = 0.0f;
        for (int k = 0; k < slots; k++) v += red[k * D + d];
        if (nsplit == 1) out[(int64_t)t * nh * D + (int64_t)h * D + d] = __float2half_rn(v / s);
        else pacc[pidx * D + d] = v;
    }
    if (nsplit > 1 && threadIdx.x == 0) { pm[pidx] = m; ps[pidx] = s; }
}

/* One block per (token t0 + blockIdx.x, head), one thread per output dimension. */
__global__ void attn_merge_kernel(__half *out, const float *pm, const float *ps, const float *pacc, int nh, int D,
                                  int nsplit, int t0)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    const int t = t0 + (int)blockIdx.x, h = blockIdx.y;
    const int64_t base = ((int64_t)blockIdx.x * nh + h) * nsplit;
    pln_softmax_state st = {-INFINITY, 0.0f};
    for (int k = 0; k < nsplit; k++) {
        pln_softmax_state b = {pm[base + k], ps[base + k]};
        st = pln_softmax_merge(st, b);
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float v = 0.0f;
        for (int k = 0; k < nsplit; k++)
            if (pm[base + k] != -INFINITY) v += pacc[(base + k) * D + d] * __expf(pm[base + k] - st.m);
        out[(int64_t)t * nh * D + (int64_t)h * D + d] = __float2half_rn(v / st.s);
    }
}

/* ---- query-tiled prefill: PREFILL_QT consecutive tokens of one sequence share each K/V chunk
 * staged in shared memory, instead of every token re-reading its keys from L2. One warp per
 * query (4 in flight), lane = 2 keys for the scores and DPL dimensions for p·V, online softmax in
 * registers. Runs of tokens of different sequences inside a tile are processed one after another. */
#define PREFILL_QT 16
#define PREFILL_KC 64

template <int DPL>   /* dimensions per lane for p·V: D / 32, or 1 for D < 32 (lanes past D idle) */
__global__ void __launch_bounds__(128)
attn_prefill_kernel(__half *out, const __half *qkv, const __half *kc, const __half *vc, const int32_t *tok_seq,
                    const int32_t *tok_pos, const int32_t *block_table, int bs, int max_blocks, const float *slopes,
                    int nh, pln_qkv_layout L, int D, int T, int window)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    __shared__ __align__(16) __half ks[PREFILL_KC * (128 + 8)];
    __shared__ __align__(16) __half vs[PREFILL_KC * (128 + 8)];
    __shared__ float qs[PREFILL_QT * 128];
    const int h = blockIdx.y, t0 = blockIdx.x * PREFILL_QT;
    const int nq = min(PREFILL_QT, T - t0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int RS = D + 8;   /* staged row stride in halves: conflict-free 16-byte reads */
    const float slope = slopes ? slopes[h] : 0.0f, inv_norm = rsqrtf((float)D);
    const int kvh = h / L.group, nkv = L.nkv;
    for (int sub = 0; sub < nq;) {
        const int seq = tok_seq[t0 + sub];
        int e = sub + 1, maxpos = tok_pos[t0 + sub], minpos = maxpos;
        while (e < nq && tok_seq[t0 + e] == seq) {
            maxpos = max(maxpos, tok_pos[t0 + e]);
            minpos = min(minpos, tok_pos[t0 + e]);
            e++;
        }
        const int run = e - sub;
        const int32_t *bt = block_table + (int64_t)seq * max_blocks;
        __syncthreads();   /* the previous run is done with qs */
        for (int i = threadIdx.x; i < run * D; i += blockDim.x) {
            int qi = i / D, d = i % D;
            qs[qi * D + d] = __half2float(qkv[(int64_t)(t0 + sub + qi) * L.stride + (int64_t)h * L.q_step + d]) * inv_norm;
        }
        float m[4], l[4], acc[4][DPL];
        int pos[4], lo[4];
#pragma unroll
        for (int w = 0; w < 4; w++) {
            m[w] = -INFINITY; l[w] = 0.0f;
            pos[w] = warp + 4 * w < run ? tok_pos[t0 + sub + warp + 4 * w] : -1;
            lo[w] = key_start(pos[w], window);
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[w][i] = 0.0f;
        }
        for (int k0 = key_start(minpos, window); k0 <= maxpos; k0 += PREFILL_KC) {
            __syncthreads();
            for (int i = threadIdx.x; i < PREFILL_KC * (D / 8); i += blockDim.x) {
                int r = i / (D / 8), c = i % (D / 8), j = k0 + r;
                int4 kv = make_int4(0, 0, 0, 0), vv = kv;
                if (j <= maxpos) {
                    kv = ((const int4 *)kv_row(kc, bt, j, bs, nkv, kvh, D))[c];
                    vv = ((const int4 *)kv_row(vc, bt, j, bs, nkv, kvh, D))[c];
                }
                *(int4 *)&ks[r * RS + c * 8] = kv;
                *(int4 *)&vs[r * RS + c * 8] = vv;
            }
            __syncthreads();
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const int p = pos[w], lw = lo[w];
                if (k0 > p || k0 + PREFILL_KC <= lw) continue;   /* warp-uniform: no keys of this query in the chunk */
                const float *q = qs + (warp + 4 * w) * D;
                float sc[2];
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int jj = lane + 32 * u, j = k0 + jj;
                    float a = 0.0f;
                    for (int d8 = 0; d8 < D / 8; d8++) {
                        float kf[8];
                        pln_h8_to_f(*(const pln_h8 *)&ks[jj * RS + d8 * 8], kf);
#pragma unroll
                        for (int i = 0; i < 8; i++) a += q[d8 * 8 + i] * kf[i];
                    }
                    sc[u] = j <= p && j >= lw ? a + slope * (float)j : -INFINITY;
                }
                const float cm = pln_warp_max(fmaxf(sc[0], sc[1]));
                const float mn = fmaxf(m[w], cm);
                const float corr = __expf(m[w] - mn);
                const float p0 = __expf(sc[0] - mn), p1 = __expf(sc[1] - mn);
                l[w] = l[w] * corr + pln_warp_sum(p0 + p1);
                m[w] = mn;
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[w][i] *= corr;
                const int jmax = min(PREFILL_KC, p - k0 + 1);
                for (int jj = 0; jj < jmax; jj++) {
                    const float pj = __shfl_sync(0xffffffffu, jj < 32 ? p0 : p1, jj & 31);
                    if (lane * DPL < D) {
#pragma unroll
                        for (int i = 0; i < DPL; i++) acc[w][i] += pj * __half2float(vs[jj * RS + lane * DPL + i]);
                    }
                }
            }
        }
#pragma unroll
        for (int w = 0; w < 4; w++) {
            if (pos[w] < 0 || lane * DPL >= D) continue;
            const int t = t0 + sub + warp + 4 * w;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                out[(int64_t)t * nh * D + (int64_t)h * D + lane * DPL + i] = __float2half_rn(acc[w][i] / l[w]);
        }
        sub = e;
    }
}

/* ---- paged flash-decoding (decode steps) ---------------------------------------------------
 * One block of 128 threads per (token t0 + blockIdx.x, KV head and run of QH of its q heads, key
 * split). A group of G lanes (G a power of two >= D / 8) owns one key row at a time: each lane
 * holds 8 dimensions of each of the block's QH queries in registers and loads 16 bytes of the K
 * and the V row (128-bit loads, a warp request covers whole rows); each query's dot product meets
 * by shuffles, and each group runs an online softmax per query over keys g, g + NG, ... of the
 * split, two keys per step (four 16-byte loads in flight per lane). Grouped-query attention: the
 * q heads that share a KV head share the block, so each K and V row is read once for all of them
 * (QH = 1 with one KV head per q head: BLOOM). The split's block-table entries are staged in
 * shared memory once (one global load per KV block). The groups' states meet in shared memory,
 * one query at a time; with one split the block writes the outputs, else its states go to scratch
 * and the last block of the (token, head run) to arrive (an arrival counter that it resets)
 * merges every split's state: no second launch. */
#define DEC_THREADS 128
/* q heads of one KV head per decode block, at most (registers: 16 floats per query per lane) */
#define DEC_MAX_QH 8

__device__ __forceinline__ void dec_load(pln_h8 &k, pln_h8 &v, bool ok, __half *kc, __half *vc, const int *sbt,
                                         int j, int jb0, int bs_shift, int nkv, int kvh, int D, int part,
                                         const __half *knew, int vofs, int append_pos, bool writer)
{
    if (ok) {
        const int blk = sbt[(j >> bs_shift) - jb0];
        const int64_t off = (((int64_t)blk * nkv + kvh) * (1 << bs_shift) + (j & ((1 << bs_shift) - 1))) * D + part * 8;
        if (j == append_pos) {   /* fused kv_append: the token's own key and value, from qkv into the cache */
            k = *(const pln_h8 *)knew;
            v = *(const pln_h8 *)(knew + vofs);
            if (writer) {   /* one block of the KV head's q-head runs stores them */
                *(pln_h8 *)(kc + off) = k;
                *(pln_h8 *)(vc + off) = v;
            }
        } else {
            k = *(const pln_h8 *)(kc + off);
            v = *(const pln_h8 *)(vc + off);
        }
    } else {
        k.u = make_uint4(0, 0, 0, 0);
        v.u = k.u;
    }
}

/* pm/ps [tokens, nh, nsplit], pacc [tokens, nh, nsplit, D] for the launch's tokens (local index
 * blockIdx.x), by q head; cnt [tokens, nh] zero at entry and at exit (entry: the run's first q
 * head). blockIdx.y = kv head * runs + run; a run is QH consecutive q heads of the KV head (the
 * last one may be shorter). keys_per_split keys per split; the dynamic shared memory holds the
 * split's block-table entries (keys_per_split / bs + 2 ints). */
template <int G, int QH>
__global__ void __launch_bounds__(DEC_THREADS, QH > 1 ? 1 : 0)
attn_decode_kernel(__half *out, float *pm, float *ps, float *pacc, unsigned *cnt, const __half *qkv,
                   __half *kc, __half *vc, const int32_t *tok_seq, const int32_t *tok_pos,
                   const int32_t *block_table, int bs_shift, int max_blocks, const float *slopes, int nh,
                   pln_qkv_layout L, int runs, int D, int nsplit, int keys_per_split, int t0, int append, int window)
{
    pln_pdl_wait();   /* everything below may read what the previous kernel writes */
    pln_pdl_trigger();
    constexpr int NG = DEC_THREADS / G;
    PLN_DYNAMIC_SHARED(int, sbt);
    __shared__ float gm[2][NG], gl[2][NG];
    __shared__ float gacc[2][NG * 8 * G];   /* D <= 8 G; two buffers, one per query in turn */
    __shared__ bool last;
    const int t = t0 + (int)blockIdx.x, sp = blockIdx.z;
    const int kvh = (int)blockIdx.y / runs, run = (int)blockIdx.y % runs;
    const int h0 = kvh * L.group + run * QH, nq = min(QH, L.group - run * QH);   /* this block's q heads */
    const int g = threadIdx.x / G, part = threadIdx.x % G;
    const int seq = tok_seq[t], pos = tok_pos[t];
    const int j0 = key_start(pos, window) + sp * keys_per_split, j1 = min(j0 + keys_per_split, pos + 1);
    const int nk = max(j1 - j0, 0);
    const bool lane_on = part * 8 < D;
    const int32_t *bt = block_table + (int64_t)seq * max_blocks;
    const int jb0 = j0 >> bs_shift;
    if (nk > 0)
        for (int b = threadIdx.x; b <= ((j1 - 1) >> bs_shift) - jb0; b += DEC_THREADS) sbt[b] = bt[jb0 + b];
    const __half *row = qkv + (int64_t)t * L.stride;
    const __half *knew = row + L.k0 + (int64_t)kvh * L.kv_step + part * 8;   /* this token's k (v: + vofs) */
    const int vofs = L.v0 - L.k0;
    const int append_pos = append ? pos : -1;
    const bool writer = run == 0;
    float q[QH][8], sl[QH];
    const float inv_norm = rsqrtf((float)D);
#pragma unroll
    for (int qh = 0; qh < QH; qh++) {
        sl[qh] = slopes && qh < nq ? slopes[h0 + qh] : 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) q[qh][i] = 0.0f;
        if (lane_on && qh < nq) {
            pln_h8 qv = *(const pln_h8 *)(row + (int64_t)(h0 + qh) * L.q_step + part * 8);
            pln_h8_to_f(qv, q[qh]);
#pragma unroll
            for (int i = 0; i < 8; i++) q[qh][i] *= inv_norm;
        }
    }
    __syncthreads();   /* sbt */

    float m[QH], l[QH], acc[QH][8];
#pragma unroll
    for (int qh = 0; qh < QH; qh++) {
        m[qh] = -INFINITY; l[qh] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) acc[qh][i] = 0.0f;
    }
    const int steps = (nk + 2 * NG - 1) / (2 * NG);   /* the same for every lane: shuffles stay convergent */
    for (int it = 0; it < steps; it++) {
        const int ja = j0 + g + 2 * NG * it, jb = ja + NG;
        const bool oka = ja < j1, okb = jb < j1;
        pln_h8 ka, va, kb, vb;
        dec_load(ka, va, oka && lane_on, kc, vc, sbt, ja, jb0, bs_shift, L.nkv, kvh, D, part, knew, vofs, append_pos, writer);
        dec_load(kb, vb, okb && lane_on, kc, vc, sbt, jb, jb0, bs_shift, L.nkv, kvh, D, part, knew, vofs, append_pos, writer);
        float kfa[8], kfb[8];
        pln_h8_to_f(ka, kfa);
        pln_h8_to_f(kb, kfb);
#pragma unroll
        for (int qh = 0; qh < QH; qh++) {
            float sa = 0.0f, sb = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) { sa += q[qh][i] * kfa[i]; sb += q[qh][i] * kfb[i]; }
#pragma unroll
            for (int o = G / 2; o > 0; o >>= 1) {
                sa += __shfl_xor_sync(0xffffffffu, sa, o);
                sb += __shfl_xor_sync(0xffffffffu, sb, o);
            }
            sa = oka ? sa + sl[qh] * (float)ja : -INFINITY;
            sb = okb ? sb + sl[qh] * (float)jb : -INFINITY;
            const float mn = fmaxf(m[qh], fmaxf(sa, sb));
            if (mn == -INFINITY) continue;   /* group-uniform: no key of this group yet */
            const float corr = __expf(m[qh] - mn), pa = __expf(sa - mn), pb = __expf(sb - mn);
            l[qh] = l[qh] * corr + pa + pb;
            m[qh] = mn;
            float vfa[8], vfb[8];
            pln_h8_to_f(va, vfa);
            pln_h8_to_f(vb, vfb);
#pragma unroll
            for (int i = 0; i < 8; i++) acc[qh][i] = acc[qh][i] * corr + pa * vfa[i] + pb * vfb[i];
        }
    }
    /* the groups' states meet, one query at a time: M = max of the group maxima, every state
     * rescaled to it. Queries alternate between two buffers: the barrier after query qh's writes
     * also ends every read of query qh - 1's, so query qh + 1 may overwrite that buffer. */
#pragma unroll
    for (int qh = 0; qh < QH; qh++) {
        if (qh >= nq) continue;   /* block-uniform */
        const int b = qh & 1;
        if (part == 0) { gm[b][g] = m[qh]; gl[b][g] = l[qh]; }
        if (lane_on) {
#pragma unroll
            for (int i = 0; i < 8; i++) gacc[b][g * D + part * 8 + i] = acc[qh][i];
        }
        __syncthreads();
        float M = -INFINITY;
#pragma unroll
        for (int k = 0; k < NG; k++) M = fmaxf(M, gm[b][k]);
        const int h = h0 + qh;
        const int64_t pidx = ((int64_t)blockIdx.x * nh + h) * nsplit + sp;
        const int64_t oidx = (int64_t)t * nh * D + (int64_t)h * D;
        float Ls = 0.0f;
        for (int k = 0; k < NG; k++) Ls += gm[b][k] == -INFINITY ? 0.0f : gl[b][k] * __expf(gm[b][k] - M);
        for (int d = threadIdx.x; d < D; d += DEC_THREADS) {
            float v = 0.0f;
            for (int k = 0; k < NG; k++) v += gm[b][k] == -INFINITY ? 0.0f : gacc[b][k * D + d] * __expf(gm[b][k] - M);
            if (nsplit == 1) out[oidx + d] = __float2half_rn(v / Ls);
            else pacc[pidx * D + d] = v;
        }
        if (nsplit > 1 && threadIdx.x == 0) { pm[pidx] = M; ps[pidx] = Ls; }
    }
    if (nsplit == 1) return;
    /* publish this split's states, then count it in; the last to arrive merges */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *c = cnt + (int64_t)blockIdx.x * nh + h0;
        last = atomicAdd(c, 1u) == (unsigned)nsplit - 1;
        if (last) atomicExch(c, 0u);   /* zero again for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* The merge, with every load independent of the others (a chain of dependent L2 reads, split
     * after split and head after head, cost more than the attention itself at 8 q heads per block:
     * 68 us at Llama-3.1-70B's TP-8 shape on an H200). Warp w folds the states of q heads w,
     * w + 4, ...: lane i the splits i, i + 32, ... in order, then a butterfly (the merge is
     * symmetric, so every lane ends with the same state); lane 0 leaves it in shared memory. */
    __shared__ float fm[QH], fs[QH];
    /* each split's weight exp(m_k - M), staged per q head when the splits fit (the usual case:
     * at most 64), so that the second pass reads only pacc */
    constexpr int WMAX = 64;
    __shared__ float fw[QH][WMAX];
    const bool staged = nsplit <= WMAX;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int qh = warp; qh < nq; qh += DEC_THREADS / 32) {
        const int64_t base = ((int64_t)blockIdx.x * nh + h0 + qh) * nsplit;
        pln_softmax_state st = {-INFINITY, 0.0f};
        float mk[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {   /* splits lane and lane + 32, kept for the weights */
            const int k = lane + 32 * i;
            mk[i] = k < nsplit ? __ldcg(pm + base + k) : -INFINITY;
            const pln_softmax_state b = {mk[i], k < nsplit ? __ldcg(ps + base + k) : 0.0f};
            st = pln_softmax_merge(st, b);
        }
        for (int k = lane + 64; k < nsplit; k += 32) {
            const pln_softmax_state b = {__ldcg(pm + base + k), __ldcg(ps + base + k)};
            st = pln_softmax_merge(st, b);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const pln_softmax_state b = {__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o)};
            st = pln_softmax_merge(st, b);
        }
        if (staged) {
#pragma unroll
            for (int i = 0; i < 2; i++)
                if (lane + 32 * i < nsplit) fw[qh][lane + 32 * i] = mk[i] == -INFINITY ? 0.0f : __expf(mk[i] - st.m);
        }
        if (lane == 0) { fm[qh] = st.m; fs[qh] = st.s; }
    }
    __syncthreads();
    /* Each thread: 4 dimensions of one q head over every split (16-byte loads of pacc, which
     * starts 16-byte aligned and D is a multiple of 8), unrolled so that several splits' loads
     * are in flight at once. A split without keys has m = -inf and weight 0. */
    const int D4 = D / 4;
    for (int i = threadIdx.x; i < nq * D4; i += DEC_THREADS) {
        const int qh = i / D4, d = (i % D4) * 4;
        const int64_t base = ((int64_t)blockIdx.x * nh + h0 + qh) * nsplit;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (staged) {
#pragma unroll 8
            for (int k = 0; k < nsplit; k++) {
                const float4 a = __ldcg((const float4 *)(pacc + (base + k) * D + d));
                const float w = fw[qh][k];
                v.x += a.x * w; v.y += a.y * w; v.z += a.z * w; v.w += a.w * w;
            }
        } else {
            const float M = fm[qh];
#pragma unroll 4
            for (int k = 0; k < nsplit; k++) {
                const float mk = __ldcg(pm + base + k);
                const float4 a = __ldcg((const float4 *)(pacc + (base + k) * D + d));
                const float w = mk == -INFINITY ? 0.0f : __expf(mk - M);
                v.x += a.x * w; v.y += a.y * w; v.z += a.z * w; v.w += a.w * w;
            }
        }
        const float S = fs[qh];
        __half *o = out + (int64_t)t * nh * D + (int64_t)(h0 + qh) * D + d;
        *(__half2 *)o = __floats2half2_rn(v.x / S, v.y / S);
        *(__half2 *)(o + 2) = __floats2half2_rn(v.z / S, v.w / S);
    }
}

/* The flash-decoding launch (see attn_decode_kernel): splits from c->attn_splits or sized to fill
 * the SMs twice over with at least DEC_MIN_KEYS keys each, bounded by the scratch. Returns 1 when
 * the shape is not one it serves (the caller runs the split-key kernel), 0 done, -1 error. */
#define DEC_MIN_KEYS 32
static int attn_decode(pln_cuda_ctx *c, void *out, const void *qkv, const void *k_cache, const void *v_cache,
                       const pln_attn_meta *m, const float *slopes, int nh, int D, bool append)
{
    const int T = m->n_tokens, bs = m->block_size;
    if (c->attn_splits < 0 || bs <= 0 || (bs & (bs - 1)) != 0) return 1;
    if (c->attn_splits == 0 && T > 2 * m->n_seqs) return 1;   /* prefill-shaped: the split-key kernel */
    if (append && T != m->n_seqs) return 1;   /* fused append: one token per sequence only */
    const pln_qkv_layout L = pln_qkv_layout_of(m, nh, D);
    int G = 1;
    while (G * 8 < D) G *= 2;
    if (G < 2) G = 2;
    /* q heads per block: the KV head's whole group up to DEC_MAX_QH (a power of two: a group of 7
     * is one run of 8 with one query idle), on the head sizes the Llama family has (64, 128);
     * other sizes one q head per block */
    int QH = 1;
    if (G == 8 || G == 16)
        while (QH < L.group && QH < DEC_MAX_QH) QH *= 2;
    const int runs = pln_cdiv(L.group, QH);
    const int64_t blocks = (int64_t)T * L.nkv * runs;   /* per split */
    const int span = key_span(m);   /* keys per token, at most: splits cover [key_start, pos] */
    int bs_shift = 0;
    while ((1 << bs_shift) < bs) bs_shift++;
    int nsplit = c->attn_splits;
    if (nsplit <= 0) {
        const int by_sm = pln_cdiv(2 * (int64_t)(c->sm_count > 0 ? c->sm_count : 1), blocks);
        nsplit = min(by_sm, pln_cdiv(span, DEC_MIN_KEYS));
    }
    nsplit = max(1, min(nsplit, 65535));
    const size_t per_split = (size_t)T * nh * (2 + (size_t)D) * sizeof(float);
    const size_t cap = c->attn_scratch ? c->attn_scratch : PLN_ATTN_SCRATCH;
    if (nsplit > 1 && (size_t)nsplit * per_split > cap) nsplit = cap / per_split > 1 ? (int)(cap / per_split) : 1;
    int kps = pln_cdiv(span, nsplit);
    /* the split's block-table entries in shared memory: at most 8192 (32 KB); longer splits are split more */
    if (kps / bs + 2 > 8192) {
        nsplit = pln_cdiv(span, (int64_t)8190 * bs);
        kps = pln_cdiv(span, nsplit);
    }
    const size_t smem = ((size_t)kps / bs + 2) * sizeof(int);
    float *pm = nullptr, *ps = nullptr, *pacc = nullptr;
    unsigned *cnt = nullptr;
    if (nsplit > 1) {
        const size_t nst = (size_t)T * nh * nsplit, st4 = (2 * nst + 3) & ~(size_t)3;   /* pacc 16-byte aligned */
        float *w = (float *)pln_cuda_scratch(c, (st4 + nst * (size_t)D) * sizeof(float));
        if (!w) return -1;
        pm = w; ps = w + nst; pacc = w + st4;
        cnt = pln_cuda_attn_counters(c, (size_t)T * nh);
        if (!cnt) return -1;
    }
    dim3 grid((unsigned)T, (unsigned)(L.nkv * runs), (unsigned)nsplit);
#define DEC_LAUNCH(GG, QQ)                                                                                          \
    PLN_LAUNCH(grid, DEC_THREADS, smem, c->stream, attn_decode_kernel<GG, QQ>)(                                      \
        (__half *)out, pm, ps, pacc, cnt, (const __half *)qkv, (__half *)k_cache, (__half *)v_cache,                \
        m->tok_seq, m->tok_pos, m->block_table, bs_shift, m->max_blocks, slopes, nh, L, runs, D, nsplit, kps, 0,    \
        append ? 1 : 0, m->window)
    switch (G * 16 + QH) {
    case 2 * 16 + 1: DEC_LAUNCH(2, 1); break;
    case 4 * 16 + 1: DEC_LAUNCH(4, 1); break;
    case 8 * 16 + 1: DEC_LAUNCH(8, 1); break;
    case 8 * 16 + 2: DEC_LAUNCH(8, 2); break;
    case 8 * 16 + 4: DEC_LAUNCH(8, 4); break;
    case 8 * 16 + 8: DEC_LAUNCH(8, 8); break;
    case 16 * 16 + 1: DEC_LAUNCH(16, 1); break;
    case 16 * 16 + 2: DEC_LAUNCH(16, 2); break;
    case 16 * 16 + 4: DEC_LAUNCH(16, 4); break;
    case 16 * 16 + 8: DEC_LAUNCH(16, 8); break;
    default: DEC_LAUNCH(32, 1); break;
    }
#undef DEC_LAUNCH
    cudaCheckLaunch();
    return 0;
}

int pln_cuda_attention(pln_cuda_ctx *c, void *out, const void *qkv, const void *k_cache,
                       const void *v_cache, const pln_attn_meta *m, const float *slopes,
                       int32_t n_head_local, int32_t head_dim)
{
    const int T = m->n_tokens, nh = n_head_local, D = head_dim;
    if (T <= 0) return 0;
    if (D % 8 != 0 || D > 256 || D <= 0)
        return pln_errorf("attention: head_dim %d is not supported (a multiple of 8, at most 256)", D);
    if (((uintptr_t)qkv | (uintptr_t)k_cache | (uintptr_t)v_cache) & 15)
        return pln_errorf("attention: qkv and the KV cache must be 16-byte aligned");
    if (m->max_pos <= 0) return pln_errorf("attention: max_pos %d must be positive", m->max_pos);
    if (m->window < 0) return pln_errorf("attention: sliding window %d must be 0 (none) or positive", m->window);
    if (m->n_kv_head < 0 || (m->n_kv_head > 0 && nh % m->n_kv_head != 0))
        return pln_errorf("attention: %d KV heads do not divide the %d q heads (grouped-query layout)", m->n_kv_head, nh);
    const int dec = attn_decode(c, out, qkv, k_cache, v_cache, m, slopes, nh, D, false);
    if (dec <= 0) return dec;
    const pln_qkv_layout L = pln_qkv_layout_of(m, nh, D);
    /* Prefill-heavy steps (on average 4+ tokens per sequence) on the query-tiled kernel when
     * enabled; decode and mixed steps on the split-key kernel. */
    if (c->attn_tiled && (D == 8 || D == 16 || D == 32 || D == 64 || D == 128) && T >= 4 * m->n_seqs) {
        dim3 grid((unsigned)pln_cdiv(T, PREFILL_QT), (unsigned)nh);
        const __half *q = (const __half *)qkv, *kc = (const __half *)k_cache, *vc = (const __half *)v_cache;
        if (D == 128)
            PLN_LAUNCH(grid, 128, 0, c->stream, attn_prefill_kernel<4>)(
                (__half *)out, q, kc, vc, m->tok_seq, m->tok_pos, m->block_table, m->block_size, m->max_blocks, slopes,
                nh, L, D, T, m->window);
        else if (D == 64)
            PLN_LAUNCH(grid, 128, 0, c->stream, attn_prefill_kernel<2>)(
                (__half *)out, q, kc, vc, m->tok_seq, m->tok_pos, m->block_table, m->block_size, m->max_blocks, slopes,
                nh, L, D, T, m->window);
        else
            PLN_LAUNCH(grid, 128, 0, c->stream, attn_prefill_kernel<1>)(
                (__half *)out, q, kc, vc, m->tok_seq, m->tok_pos, m->block_table, m->block_size, m->max_blocks, slopes,
                nh, L, D, T, m->window);
        cudaCheckLaunch();
        return 0;
    }
    const int nsplit = pln_cdiv(key_span(m), PLN_ATTN_CHUNK);
    if (nsplit > 65535) return pln_errorf("attention: %d keys is over the %d the kernel can split", key_span(m),
                                          65535 * PLN_ATTN_CHUNK);
    /* The partial states of a long prefill would need T x heads x splits x (D + 2) floats (3.8 GB
     * for an 8k-token prompt of one BLOOM-176B rank): tokens go in groups whose states fit
     * ctx->attn_scratch bytes (PLN_ATTN_SCRATCH), one launch pair per group, the scratch reused. */
    int group = T;
    float *pm = nullptr, *ps = nullptr, *pacc = nullptr;
    if (nsplit > 1) {
        const size_t per_tok = (size_t)nh * nsplit * (2 + (size_t)D) * sizeof(float);
        size_t g = (c->attn_scratch ? c->attn_scratch : PLN_ATTN_SCRATCH) / per_tok;
        if (g < 1) g = 1;
        if (g < (size_t)T) group = (int)g;
        size_t nst = (size_t)group * nh * nsplit;
        float *w = (float *)pln_cuda_scratch(c, nst * (2 + (size_t)D) * sizeof(float));
        if (!w) return -1;
        pm = w; ps = w + nst; pacc = w + 2 * nst;
    }
    for (int t0 = 0; t0 < T; t0 += group) {
        const int n = T - t0 < group ? T - t0 : group;
        dim3 grid((unsigned)n, (unsigned)nh, (unsigned)nsplit);
        PLN_LAUNCH(grid, ATTN_THREADS, 0, c->stream, attn_chunk_kernel)(
            (__half *)out, pm, ps, pacc, (const __half *)qkv, (const __half *)k_cache, (const __half *)v_cache,
            m->tok_seq, m->tok_pos, m->block_table, m->block_size, m->max_blocks, slopes, nh, L, D, nsplit, t0,
            m->window);
        cudaCheckLaunch();
        if (nsplit > 1) {
            PLN_LAUNCH(dim3((unsigned)n, (unsigned)nh), D, 0, c->stream, attn_merge_kernel)(
                (__half *)out, pm, ps, pacc, nh, D, nsplit, t0);
            cudaCheckLaunch();
        }
    }
    return 0;
}

int pln_cuda_append_attention(pln_cuda_ctx *c, void *out, const void *qkv, void *k_cache, void *v_cache,
                              const pln_attn_meta *m, const float *slopes, int32_t n_head_local,
                              int32_t head_dim)
{
    const int D = head_dim;
    if (m->n_tokens > 0 && D % 8 == 0 && D > 0 && D <= 256 && m->max_pos > 0 && m->n_kv_head >= 0 && m->window >= 0 &&
        (m->n_kv_head == 0 || n_head_local % m->n_kv_head == 0) &&
        !(((uintptr_t)qkv | (uintptr_t)k_cache | (uintptr_t)v_cache) & 15)) {
        const int dec = attn_decode(c, out, qkv, k_cache, v_cache, m, slopes, n_head_local, D, true);
        if (dec <= 0) return dec;
    }
    if (pln_cuda_kv_append(c, qkv, k_cache, v_cache, m, n_head_local, head_dim)) return -1;
    return pln_cuda_attention(c, out, qkv, k_cache, v_cache, m, slopes, n_head_local, head_dim);
}
