/* kvcache.h — the paged KV cache of one rank: per layer a K pool and a V pool of fixed-size blocks
 * ([n_blocks][n_head_local][block_size][head_dim] in the backend's kv dtype, the layout
 * backend.h's attention reads), a free list of blocks, and per-slot block tables.
 *
 * Every rank runs the same allocation sequence, so block tables agree across ranks (each rank's
 * pools hold only its own heads). Bookkeeping is on the host; only the pools live in backend
 * memory. */
#ifndef PLN_KVCACHE_H
#define PLN_KVCACHE_H

#include "kernels/backend.h"
#include <stdint.h>

typedef struct {
    pln_backend *be;
    int32_t n_layer, n_head_local, head_dim;
    int32_t block_size;         /* tokens per block */
    int32_t n_blocks;           /* blocks per pool */
    int32_t max_seqs;           /* slots */
    int32_t max_blocks;         /* blocks per slot (ceil(max_seq_len / block_size)) */
    void **k_pool, **v_pool;    /* [n_layer] backend memory */
    int32_t *free_list;         /* stack of free block ids */
    int32_t n_free;
    int32_t *tables;            /* [max_seqs * max_blocks]; -1 = none */
    int32_t *n_used;            /* [max_seqs] blocks held by each slot */
    uint64_t bytes;             /* backend memory held by the pools */
} pln_kvcache;

/* Allocates the pools (n_blocks blocks of block_size tokens per layer). -1 + error when the
 * backend is out of memory (the message says how much was asked and how to ask for less). */
int pln_kv_init(pln_kvcache *kv, pln_backend *be, int32_t n_layer, int32_t n_head_local,
                int32_t head_dim, int32_t n_blocks, int32_t block_size, int32_t max_seqs,
                int32_t max_seq_len);
void pln_kv_free(pln_kvcache *kv);

/* Bytes one token takes in one rank's pools over all layers (K and V). */
uint64_t pln_kv_bytes_per_token(const pln_backend *be, int32_t n_layer, int32_t n_head_local,
                                int32_t head_dim);

/* Blocks slot must gain to hold n_tokens tokens in all (0 if it holds enough already). */
int32_t pln_kv_blocks_needed(const pln_kvcache *kv, int32_t slot, int64_t n_tokens);
/* Grows slot's block table to hold n_tokens. -1 + error (and no change) if the blocks are not
 * free or n_tokens exceeds the per-slot maximum. */
int pln_kv_reserve(pln_kvcache *kv, int32_t slot, int64_t n_tokens);
/* Returns all of slot's blocks to the free list. Never fails. */
void pln_kv_release(pln_kvcache *kv, int32_t slot);
/* slot's block table row (max_blocks entries). */
static inline const int32_t *pln_kv_table(const pln_kvcache *kv, int32_t slot) {
    return kv->tables + (int64_t)slot * kv->max_blocks;
}

#endif
