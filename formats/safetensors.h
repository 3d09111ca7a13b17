/* safetensors.h — reader (and a small writer) for the safetensors format, treating input as hostile.
 *
 * Layout (https://github.com/huggingface/safetensors): u64 little-endian N, then N bytes of UTF-8
 * JSON {"name": {"dtype": "F16", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {"k": "v"}} (possibly padded with spaces), then the data buffer. Offsets are
 * relative to the start of the buffer. Rules enforced, as the reference implementation does:
 * N <= 100 MB and N + 8 <= file size; the header is valid UTF-8 JSON whose top level is an object;
 * dtypes are known (F32 F16 BF16 F64 I8 U8 I16 I32 I64 BOOL); element count × dtype size =
 * end - begin, with overflow checks; the offsets, sorted, tile the buffer exactly (no gap, no
 * overlap, no trailing bytes); no duplicate names. Tensors need not be aligned in the file. */
#ifndef PLN_SAFETENSORS_H
#define PLN_SAFETENSORS_H

#include "formats/common.h"

#define PLN_SAFETENSORS_MAX_HEADER (100u * 1000u * 1000u)

typedef struct {
    char *path;
    pln_map map;             /* the whole file, mapped read-only */
    int64_t n_tensors;
    pln_tensor *tensors;     /* in header order; names as stored (prefix kept); data points into map */
    uint64_t header_len;     /* N */
    uint64_t data_start;     /* 8 + N */
    char *metadata_json;     /* "__metadata__" re-serialised as compact JSON, or NULL when absent */
} pln_safetensors;

/* Maps and validates path; reads only the header (the data stays unread until used).
 * -1 with an error naming the file and the failed check. On failure st needs no close. */
int pln_safetensors_open(pln_safetensors *st, const char *path);
/* Validates an in-memory image (data, size) the same way; `where` names it in errors. tensors
 * point into data (file = where, which must outlive st). st->map is left empty: close frees only
 * what parsing allocated. Used by the fuzzer and by tests. */
int pln_safetensors_parse(pln_safetensors *st, const uint8_t *data, uint64_t size, const char *where);
/* The tensor called name (exact match), or NULL. */
const pln_tensor *pln_safetensors_find(const pln_safetensors *st, const char *name);
/* Unmaps and frees; safe on a zeroed or already closed struct. */
void pln_safetensors_close(pln_safetensors *st);

/* Writes a safetensors file (atomically: tmp + fsync + rename) holding n tensors whose data is
 * in tensors[i].data (nbytes each, which must equal numel × dtype size), in the given order.
 * metadata: NULL or an array of 2*n_meta strings (key, value) for "__metadata__".
 * -1 with an error naming the path or tensor. */
int pln_safetensors_write(const char *path, const pln_tensor *tensors, int64_t n,
                          const char *const *metadata, int n_meta);

#endif
