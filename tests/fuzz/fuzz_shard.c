/* fuzz_shard.c — libFuzzer target for the pollen rank-file reader: any byte string must either be
 * rejected with an error or yield a table whose every view lies inside the input.
 * Each input is tried twice: as is, and with its table and preamble checksums recomputed, so the
 * fuzzer gets past the checksums to the structural checks behind them. */
#include "formats/shard.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

static void exercise(const uint8_t *data, size_t size) {
    pln_shard *s = pln_shard_open_mem(data, size, "fuzz.pln");
    if (!s) return;
    for (uint64_t i = 0; i < s->n_tensors; i++) {
        const pln_shard_tensor *t = &s->tensors[i];
        PLN_ASSERT(pln_shard_find(s, t->name) == t);
        PLN_ASSERT(t->offset + t->nbytes <= size && t->offset % s->alignment == 0);
        const volatile uint8_t *p = pln_shard_data(s, t);
        if (t->nbytes) (void)(p[0] + p[t->nbytes - 1]);   /* touch both ends: ASan checks bounds */
        pln_tensor v;
        pln_shard_tensor_view(s, t, &v);
        (void)pln_shard_verify_tensor(s, t);
    }
    (void)pln_shard_verify_all(s, NULL);
    pln_shard_close(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    exercise(data, size);
    if (size < PLN_SHARD_PREAMBLE_SIZE) return 0;
    uint8_t *b = malloc(size);
    memcpy(b, data, size);
    uint64_t n = get64(b + 32);
    if (n <= (size - PLN_SHARD_PREAMBLE_SIZE) / PLN_SHARD_ENTRY_SIZE)
        put64(b + 112, pln_xxh3(b + PLN_SHARD_PREAMBLE_SIZE, (size_t)n * PLN_SHARD_ENTRY_SIZE));
    put64(b + 120, pln_xxh3(b, 120));
    exercise(b, size);
    free(b);
    return 0;
}
