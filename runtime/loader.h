/* loader.h — opens this rank's file of a shard set and turns its tensors into backend memory.
 *
 * The set's manifest gives the model config and TP size; the rank count must equal it. The rank
 * file is mapped read-only (advised sequential; --populate faults it in up front) and validated by
 * the shard reader before any tensor is touched. On the CPU backend tensors are used in place,
 * zero copy; on backends with load_file the whole data region is streamed into one allocation
 * sized from the file. The loader owns that memory: it must outlive the model built from it. */
#ifndef PLN_LOADER_H
#define PLN_LOADER_H

#include "formats/hf.h"
#include "kernels/backend.h"
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int64_t vocab_size;         /* real vocabulary (config.json) */
    int64_t vocab_padded;       /* rows of the embedding over all ranks (multiple of tp) */
    int64_t hidden, n_head, n_layer;
    float eps;
    int32_t tp, rank;
    int32_t eos_id, bos_id, pad_id;
    char dtype[8];              /* "fp16", "int8" or "int4" */
    int64_t group_size;         /* int8: 0 = per output channel */
    bool quantize_embedding;
    char layout[32];            /* the set's layout id: which family runs it (runtime/family.h) */
    pln_hf_config hf;           /* the whole config of the manifest (the family's own fields) */
} pln_model_config;

typedef struct {
    bool populate;              /* fault the mapping in now */
    bool verify;                /* check every tensor checksum (while streaming, on load_file backends) */
    bool quiet;                 /* no progress bar */
} pln_loader_opts;

typedef struct pln_loader pln_loader;

/* Opens dir (a shard set) for rank/size. NULL + error naming the file and what to do: missing
 * files, rank count != the set's TP, a header that fails validation, a checksum mismatch. */
pln_loader *pln_loader_open(const char *dir, int rank, int size, pln_backend *be,
                            const pln_loader_opts *opts);
void pln_loader_close(pln_loader *l);

const pln_model_config *pln_loader_config(const pln_loader *l);
/* A F16 tensor of exactly numel elements, in backend memory. -1 + error naming the tensor. */
int pln_loader_f16(pln_loader *l, const char *name, int64_t numel, const uint16_t **out);
/* A linear weight [rows, cols] (F16, or I8 followed by its "<name>_scale" tensor) in backend
 * memory. -1 + error naming the tensor when it is absent or its shape or dtype is wrong. */
int pln_loader_weight(pln_loader *l, const char *name, int64_t rows, int64_t cols, pln_weight *out);
/* Same, with host pointers into the mapping (for ops done on the host, e.g. an I8 embedding). */
int pln_loader_weight_host(pln_loader *l, const char *name, int64_t rows, int64_t cols, pln_weight *out);

uint64_t pln_loader_weight_bytes(const pln_loader *l);   /* data bytes of this rank's file */
double pln_loader_seconds(const pln_loader *l);          /* open + map (+ populate/verify/copy) */
/* Bytes/s at which the weights were streamed into backend memory (load_file backends), with any
 * --verify checksums computed on the way; 0 when the mapping is used in place (CPU). */
double pln_loader_rate(const pln_loader *l);
/* The tokenizer file the manifest names (borrowed; checked at open), or NULL when it names none. */
const char *pln_loader_tokenizer_path(const pln_loader *l);

#endif
