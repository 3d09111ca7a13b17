/* kvcache.h — the paged KV cache of one rank: per layer a K pool and a V pool of fixed-size blocks
 * ([n_blocks][n_head_local][block_size][head_dim] in the backend's kv dtype, the layout
 * backend.h's attention reads), a free list of blocks, and per-slot block tables.
 *
 * Blocks are reference counted: a full block (all block_size positions written) may sit in
 * several slots' tables at once. Only full blocks are ever shared, and a full block is never
 * written again, so sharing needs no copy: where sequences diverge (the block holding a prompt's
 * last token, and everything after it) each has its own block. Two ways to share:
 *  - fork (pln_kv_fork): a new slot takes the first full blocks of another slot with the same
 *    prompt (n > 1, best_of);
 *  - the prefix cache (pln_kv_prefix_enable): every full block is registered under a hash chain
 *    h_i = XXH3(tokens of block i, seed h_{i-1}) (the tokens are compared too; the chain's
 *    64-bit parent hash is trusted, as vLLM's is). A new slot whose tokens start with cached
 *    blocks takes them (pln_kv_match). A cached block no slot holds stays in the cache until its
 *    memory is needed: then the least recently released one is evicted (its tail blocks first).
 * Free blocks (n_free) include those cached-but-unreferenced ones: they can be handed out.
 *
 * Every rank runs the same allocation sequence, so block tables agree across ranks (each rank's
 * pools hold only its own heads). Bookkeeping is on the host; only the pools live in backend
 * memory. */
#ifndef PLN_KVCACHE_H
#define PLN_KVCACHE_H

#include "kernels/backend.h"
#include <stdbool.h>
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
    int32_t *ref;               /* [n_blocks] tables holding each block */
    int32_t n_free_list;        /* blocks on free_list (n_free also counts evictable cached ones) */
    /* prefix cache (NULL / 0 when off) */
    bool prefix_on;
    uint64_t *chain;            /* [max_seqs * max_blocks] hash chain of each slot's full blocks */
    int32_t *n_chained;         /* [max_seqs] leading blocks of the slot with a chain hash */
    uint64_t *bhash;            /* [n_blocks] a cached block's chain hash */
    uint64_t *bparent;          /* [n_blocks] its parent's chain hash */
    int32_t *btok;              /* [n_blocks * block_size] its tokens */
    bool *cached;               /* [n_blocks] registered in the table */
    int32_t *table;             /* open addressing: block id or -1; capacity tcap (power of 2) */
    int64_t tcap;
    int32_t *lru_prev, *lru_next, lru_head, lru_tail;   /* evictable cached blocks, oldest first */
    int64_t n_cached;           /* blocks registered */
    int64_t hit_blocks, query_blocks, evictions;
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
/* Drops slot's references to its blocks: a block nobody holds goes back to the free list, or,
 * when cached, to the evictable end of the cache. Never fails. */
void pln_kv_release(pln_kvcache *kv, int32_t slot);
/* Blocks that would become free if every slot with release[slot] true were released. */
int64_t pln_kv_free_after_release(const pln_kvcache *kv, const bool *release);

/* Turns the prefix cache on (before any slot is used). -1 + error on a bad state. */
int pln_kv_prefix_enable(pln_kvcache *kv);
/* Prefix cache: slot holds exactly its chained full blocks (a fresh slot holds none); tokens[0..n)
 * continue it from that block boundary. Takes the cached blocks that match whole blocks of
 * tokens, at most max_blocks of them; returns how many (0 when the cache is off). */
int32_t pln_kv_match(pln_kvcache *kv, int32_t slot, const int32_t *tokens, int64_t n, int32_t max_blocks);
/* Fork: a fresh slot takes src's first n_blocks full blocks (the caller checked that their
 * tokens are the slot's). Returns n_blocks, or 0 when slot is not fresh or src holds fewer. */
int32_t pln_kv_fork(pln_kvcache *kv, int32_t slot, int32_t src, int32_t n_blocks);
/* After a step wrote slot's positions up to n_tokens (tokens[0..n_tokens) is the slot's whole
 * history): registers every newly full block in the prefix cache. No-op when it is off. */
void pln_kv_commit(pln_kvcache *kv, int32_t slot, const int32_t *tokens, int64_t n_tokens);
/* slot's block table row (max_blocks entries). */
static inline const int32_t *pln_kv_table(const pln_kvcache *kv, int32_t slot) {
    return kv->tables + (int64_t)slot * kv->max_blocks;
}

#endif
