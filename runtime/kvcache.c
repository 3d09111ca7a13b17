/* kvcache.c — paged KV blocks: pools in backend memory, free list and block tables on the host. */
#include "runtime/kvcache.h"

#include <stdlib.h>
#include <string.h>

uint64_t pln_kv_bytes_per_token(const pln_backend *be, int32_t n_layer, int32_t n_head_local,
                                int32_t head_dim) {
    return 2ull * (uint64_t)n_layer * (uint64_t)n_head_local * (uint64_t)head_dim * be->kv_size;
}

int pln_kv_init(pln_kvcache *kv, pln_backend *be, int32_t n_layer, int32_t n_head_local,
                int32_t head_dim, int32_t n_blocks, int32_t block_size, int32_t max_seqs,
                int32_t max_seq_len) {
    memset(kv, 0, sizeof *kv);
    if (n_blocks < 1 || block_size < 1 || max_seqs < 1 || max_seq_len < 1)
        return pln_errorf("kv cache: n_blocks %d, block_size %d, max_seqs %d, max_seq_len %d must all be >= 1",
                          n_blocks, block_size, max_seqs, max_seq_len);
    kv->be = be;
    kv->n_layer = n_layer;
    kv->n_head_local = n_head_local;
    kv->head_dim = head_dim;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->max_seqs = max_seqs;
    kv->max_blocks = (max_seq_len + block_size - 1) / block_size;
    size_t pool = (size_t)n_blocks * (size_t)n_head_local * (size_t)block_size * (size_t)head_dim * be->kv_size;
    kv->k_pool = pln_xcalloc((size_t)n_layer, sizeof(void *));
    kv->v_pool = pln_xcalloc((size_t)n_layer, sizeof(void *));
    for (int32_t l = 0; l < n_layer; l++) {
        kv->k_pool[l] = be->alloc(be, pool);
        kv->v_pool[l] = kv->k_pool[l] ? be->alloc(be, pool) : NULL;
        if (!kv->k_pool[l] || !kv->v_pool[l]) {
            char b[32];
            pln_error_context("kv cache: allocating %s for %d blocks of %d tokens x %d layers "
                              "(ask for fewer KV tokens or sequences)",
                              pln_human_bytes(2.0 * (double)pool * n_layer, b, sizeof b), n_blocks,
                              block_size, n_layer);
            pln_kv_free(kv);
            return -1;
        }
        kv->bytes += 2 * pool;
    }
    kv->free_list = pln_xmalloc((size_t)n_blocks * sizeof(int32_t));
    /* Stack with block 0 on top: allocation order is deterministic on every rank. */
    for (int32_t i = 0; i < n_blocks; i++) kv->free_list[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    kv->tables = pln_xmalloc((size_t)max_seqs * (size_t)kv->max_blocks * sizeof(int32_t));
    for (int64_t i = 0; i < (int64_t)max_seqs * kv->max_blocks; i++) kv->tables[i] = -1;
    kv->n_used = pln_xcalloc((size_t)max_seqs, sizeof(int32_t));
    return 0;
}

void pln_kv_free(pln_kvcache *kv) {
    if (kv->k_pool)
        for (int32_t l = 0; l < kv->n_layer; l++) {
            if (kv->k_pool[l]) kv->be->free(kv->be, kv->k_pool[l]);
            if (kv->v_pool[l]) kv->be->free(kv->be, kv->v_pool[l]);
        }
    free(kv->k_pool);
    free(kv->v_pool);
    free(kv->free_list);
    free(kv->tables);
    free(kv->n_used);
    memset(kv, 0, sizeof *kv);
}

int32_t pln_kv_blocks_needed(const pln_kvcache *kv, int32_t slot, int64_t n_tokens) {
    int64_t want = (n_tokens + kv->block_size - 1) / kv->block_size;
    int64_t have = kv->n_used[slot];
    return want > have ? (int32_t)(want - have) : 0;
}

int pln_kv_reserve(pln_kvcache *kv, int32_t slot, int64_t n_tokens) {
    if (slot < 0 || slot >= kv->max_seqs) return pln_errorf("kv cache: slot %d out of range [0, %d)", slot, kv->max_seqs);
    int64_t want = (n_tokens + kv->block_size - 1) / kv->block_size;
    if (want > kv->max_blocks)
        return pln_errorf("kv cache: slot %d: %lld tokens exceed the maximum sequence length %lld",
                          slot, (long long)n_tokens, (long long)kv->max_blocks * kv->block_size);
    int32_t need = pln_kv_blocks_needed(kv, slot, n_tokens);
    if (need > kv->n_free)
        return pln_errorf("kv cache: slot %d needs %d more blocks, only %d of %d free", slot, need,
                          kv->n_free, kv->n_blocks);
    int32_t *row = kv->tables + (int64_t)slot * kv->max_blocks;
    for (int32_t i = 0; i < need; i++) row[kv->n_used[slot]++] = kv->free_list[--kv->n_free];
    return 0;
}

void pln_kv_release(pln_kvcache *kv, int32_t slot) {
    if (slot < 0 || slot >= kv->max_seqs) return;
    int32_t *row = kv->tables + (int64_t)slot * kv->max_blocks;
    /* Push back in reverse so a release-then-reserve reuses the same blocks in the same order. */
    for (int32_t i = kv->n_used[slot] - 1; i >= 0; i--) { kv->free_list[kv->n_free++] = row[i]; row[i] = -1; }
    kv->n_used[slot] = 0;
}
