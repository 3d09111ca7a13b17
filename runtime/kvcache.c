/* kvcache.c — paged KV blocks: pools in backend memory, free list, block tables, reference
 * counts and the prefix cache's hash table on the host (see kvcache.h). Every rank runs the same
 * sequence of calls, so block ids, caching and eviction agree across ranks. */
#include "runtime/kvcache.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define KV_CHAIN_ROOT 0x243F6A8885A308D3ull   /* the parent hash of a sequence's first block */

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
    kv->n_free_list = n_blocks;
    kv->ref = pln_xcalloc((size_t)n_blocks, sizeof(int32_t));
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
    free(kv->ref);
    free(kv->chain); free(kv->n_chained); free(kv->bhash); free(kv->bparent); free(kv->btok); free(kv->cached);
    free(kv->table); free(kv->lru_prev); free(kv->lru_next);
    memset(kv, 0, sizeof *kv);
}

int32_t pln_kv_blocks_needed(const pln_kvcache *kv, int32_t slot, int64_t n_tokens) {
    int64_t want = (n_tokens + kv->block_size - 1) / kv->block_size;
    int64_t have = kv->n_used[slot];
    return want > have ? (int32_t)(want - have) : 0;
}

/* ---- evictable cached blocks: a doubly linked list, oldest at the head ---- */

static void lru_push(pln_kvcache *kv, int32_t b) {
    kv->lru_prev[b] = kv->lru_tail;
    kv->lru_next[b] = -1;
    if (kv->lru_tail >= 0) kv->lru_next[kv->lru_tail] = b; else kv->lru_head = b;
    kv->lru_tail = b;
}

static void lru_remove(pln_kvcache *kv, int32_t b) {
    if (kv->lru_prev[b] >= 0) kv->lru_next[kv->lru_prev[b]] = kv->lru_next[b]; else kv->lru_head = kv->lru_next[b];
    if (kv->lru_next[b] >= 0) kv->lru_prev[kv->lru_next[b]] = kv->lru_prev[b]; else kv->lru_tail = kv->lru_prev[b];
    kv->lru_prev[b] = kv->lru_next[b] = -1;
}

/* ---- the hash table: linear probing, backward-shift deletion (no tombstones) ---- */

static int32_t table_find(const pln_kvcache *kv, uint64_t h, uint64_t parent, const int32_t *tok) {
    uint64_t mask = (uint64_t)kv->tcap - 1;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        int32_t b = kv->table[i];
        if (b < 0) return -1;
        if (kv->bhash[b] == h && kv->bparent[b] == parent &&
            !memcmp(kv->btok + (int64_t)b * kv->block_size, tok, (size_t)kv->block_size * sizeof(int32_t)))
            return b;
    }
}

static void table_insert(pln_kvcache *kv, int32_t b) {
    uint64_t mask = (uint64_t)kv->tcap - 1, i = kv->bhash[b] & mask;
    while (kv->table[i] >= 0) i = (i + 1) & mask;
    kv->table[i] = b;
}

static void table_delete(pln_kvcache *kv, int32_t b) {
    uint64_t mask = (uint64_t)kv->tcap - 1, i = kv->bhash[b] & mask;
    while (kv->table[i] != b) i = (i + 1) & mask;
    kv->table[i] = -1;
    for (uint64_t j = (i + 1) & mask; kv->table[j] >= 0; j = (j + 1) & mask) {
        uint64_t home = kv->bhash[kv->table[j]] & mask;
        /* move the entry back into the hole unless its home lies cyclically in (i, j] */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) { kv->table[i] = kv->table[j]; kv->table[j] = -1; i = j; }
    }
}

/* A free block: from the free list, else the least recently released cached block. */
static int32_t take_block(pln_kvcache *kv) {
    int32_t b;
    if (kv->n_free_list > 0) {
        b = kv->free_list[--kv->n_free_list];
    } else {
        b = kv->lru_head;
        lru_remove(kv, b);
        table_delete(kv, b);
        kv->cached[b] = false;
        kv->n_cached--;
        kv->evictions++;
    }
    kv->n_free--;
    kv->ref[b] = 1;
    return b;
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
    for (int32_t i = 0; i < need; i++) row[kv->n_used[slot]++] = take_block(kv);
    return 0;
}

void pln_kv_release(pln_kvcache *kv, int32_t slot) {
    if (slot < 0 || slot >= kv->max_seqs) return;
    int32_t *row = kv->tables + (int64_t)slot * kv->max_blocks;
    /* Back in reverse: a release-then-reserve reuses the same blocks in the same order, and the
     * cache evicts a sequence's tail blocks before the prefix other requests may share. */
    for (int32_t i = kv->n_used[slot] - 1; i >= 0; i--) {
        int32_t b = row[i];
        row[i] = -1;
        if (--kv->ref[b] > 0) continue;
        kv->n_free++;
        if (kv->prefix_on && kv->cached[b]) lru_push(kv, b);
        else kv->free_list[kv->n_free_list++] = b;
    }
    kv->n_used[slot] = 0;
    if (kv->n_chained) kv->n_chained[slot] = 0;
}

int64_t pln_kv_free_after_release(const pln_kvcache *kv, const bool *release) {
    int32_t *cnt = pln_xcalloc((size_t)kv->n_blocks, sizeof(int32_t));
    int64_t n = 0;
    for (int32_t s = 0; s < kv->max_seqs; s++)
        if (release[s])
            for (int32_t i = 0; i < kv->n_used[s]; i++) cnt[kv->tables[(int64_t)s * kv->max_blocks + i]]++;
    for (int32_t b = 0; b < kv->n_blocks; b++) n += cnt[b] > 0 && cnt[b] == kv->ref[b];
    free(cnt);
    return n;
}

int pln_kv_prefix_enable(pln_kvcache *kv) {
    if (!kv->tables) return pln_errorf("kv cache: prefix cache enabled before the cache exists");
    if (kv->prefix_on) return 0;
    int64_t nb = kv->n_blocks, bs = kv->block_size;
    kv->chain = pln_xcalloc((size_t)kv->max_seqs * (size_t)kv->max_blocks, sizeof(uint64_t));
    kv->n_chained = pln_xcalloc((size_t)kv->max_seqs, sizeof(int32_t));
    kv->bhash = pln_xcalloc((size_t)nb, sizeof(uint64_t));
    kv->bparent = pln_xcalloc((size_t)nb, sizeof(uint64_t));
    kv->btok = pln_xcalloc((size_t)(nb * bs), sizeof(int32_t));
    kv->cached = pln_xcalloc((size_t)nb, sizeof(bool));
    kv->tcap = 16;
    while (kv->tcap < 2 * nb) kv->tcap *= 2;
    kv->table = pln_xmalloc((size_t)kv->tcap * sizeof(int32_t));
    for (int64_t i = 0; i < kv->tcap; i++) kv->table[i] = -1;
    kv->lru_prev = pln_xmalloc((size_t)nb * sizeof(int32_t));
    kv->lru_next = pln_xmalloc((size_t)nb * sizeof(int32_t));
    for (int64_t i = 0; i < nb; i++) kv->lru_prev[i] = kv->lru_next[i] = -1;
    kv->lru_head = kv->lru_tail = -1;
    kv->prefix_on = true;
    return 0;
}

static uint64_t chain_hash(const pln_kvcache *kv, const int32_t *tok, uint64_t parent) {
    return XXH3_64bits_withSeed(tok, (size_t)kv->block_size * sizeof(int32_t), parent);
}

int32_t pln_kv_match(pln_kvcache *kv, int32_t slot, const int32_t *tokens, int64_t n, int32_t max_blocks) {
    if (!kv->prefix_on || slot < 0 || slot >= kv->max_seqs || kv->n_chained[slot] != kv->n_used[slot]) return 0;
    int32_t *row = kv->tables + (int64_t)slot * kv->max_blocks;
    uint64_t *ch = kv->chain + (int64_t)slot * kv->max_blocks;
    int32_t got = 0;
    while (got < max_blocks && (int64_t)(got + 1) * kv->block_size <= n && kv->n_used[slot] < kv->max_blocks) {
        int32_t u = kv->n_used[slot];
        uint64_t parent = u ? ch[u - 1] : KV_CHAIN_ROOT;
        const int32_t *tok = tokens + (int64_t)got * kv->block_size;
        uint64_t h = chain_hash(kv, tok, parent);
        kv->query_blocks++;
        int32_t b = table_find(kv, h, parent, tok);
        if (b < 0) break;
        kv->hit_blocks++;
        if (kv->ref[b]++ == 0) { lru_remove(kv, b); kv->n_free--; }
        row[u] = b;
        ch[u] = h;
        kv->n_used[slot] = u + 1;
        kv->n_chained[slot] = u + 1;
        got++;
    }
    return got;
}

int32_t pln_kv_fork(pln_kvcache *kv, int32_t slot, int32_t src, int32_t n_blocks) {
    if (slot < 0 || slot >= kv->max_seqs || src < 0 || src >= kv->max_seqs || slot == src) return 0;
    if (kv->n_used[slot] != 0 || kv->n_used[src] < n_blocks || n_blocks <= 0) return 0;
    const int32_t *from = kv->tables + (int64_t)src * kv->max_blocks;
    int32_t *row = kv->tables + (int64_t)slot * kv->max_blocks;
    for (int32_t i = 0; i < n_blocks; i++) { row[i] = from[i]; kv->ref[from[i]]++; }
    kv->n_used[slot] = n_blocks;
    if (kv->prefix_on) {
        int32_t c = kv->n_chained[src] < n_blocks ? kv->n_chained[src] : n_blocks;
        memcpy(kv->chain + (int64_t)slot * kv->max_blocks, kv->chain + (int64_t)src * kv->max_blocks, (size_t)c * sizeof(uint64_t));
        kv->n_chained[slot] = c;
    }
    return n_blocks;
}

void pln_kv_commit(pln_kvcache *kv, int32_t slot, const int32_t *tokens, int64_t n_tokens) {
    if (!kv->prefix_on || slot < 0 || slot >= kv->max_seqs) return;
    int64_t full = n_tokens / kv->block_size;
    if (full > kv->n_used[slot]) full = kv->n_used[slot];
    int32_t *row = kv->tables + (int64_t)slot * kv->max_blocks;
    uint64_t *ch = kv->chain + (int64_t)slot * kv->max_blocks;
    for (int64_t k = kv->n_chained[slot]; k < full; k++) {
        uint64_t parent = k ? ch[k - 1] : KV_CHAIN_ROOT;
        const int32_t *tok = tokens + k * kv->block_size;
        uint64_t h = chain_hash(kv, tok, parent);
        ch[k] = h;
        kv->n_chained[slot] = (int32_t)k + 1;
        int32_t b = row[k];
        if (kv->cached[b] || table_find(kv, h, parent, tok) >= 0) continue;   /* already cached (maybe as another block) */
        kv->bhash[b] = h;
        kv->bparent[b] = parent;
        memcpy(kv->btok + (int64_t)b * kv->block_size, tok, (size_t)kv->block_size * sizeof(int32_t));
        kv->cached[b] = true;
        kv->n_cached++;
        table_insert(kv, b);
    }
}
