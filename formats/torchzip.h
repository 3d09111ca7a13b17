/* torchzip.h — reader for PyTorch zip checkpoints (torch.save since 1.6: pytorch_model*.bin),
 * with a safe unpickler: nothing in the pickle is ever executed.
 *
 * Layout: a zip (ZIP64 when large) whose entries share one top-level folder, named after the file
 * it was saved as (often "archive/", not always: the name is taken from the first entry):
 *   FOLDER/data.pkl     the pickled state dict (dict or OrderedDict name -> tensor)
 *   FOLDER/data/KEY     raw little-endian storage bytes, one entry per storage
 *   FOLDER/version, FOLDER/byteorder, FOLDER/.data/serialization_id   (ignored)
 * Every entry read must be stored (compression method 0); its data is used in place from a
 * read-only mapping. Entries and sizes come from the central directory (libarchive, ZIP64
 * included); each entry's data offset is where libarchive's zero-copy read of the entry starts
 * (after the local header and its extra field), checked against the file size. CRCs are not
 * computed: that would read every byte of every tensor.
 *
 * The unpickler is modelled on torch's weights-only loader: protocol 2 opcodes plus FRAME,
 * SHORT_BINUNICODE, MEMOIZE (protocol 4); persistent ids ('storage', StorageType, key, location,
 * numel); globals only from an allowlist (collections.OrderedDict, torch._utils._rebuild_tensor,
 * _rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter, torch.*Storage, torch.float16-style
 * dtypes for _v3). Any other global is an error naming it. Storage offsets and strides are in
 * elements; several tensors may share one storage (tied weights). */
#ifndef PLN_TORCHZIP_H
#define PLN_TORCHZIP_H

#include "formats/common.h"

typedef struct {
    char *path;
    pln_map map;
    char *prefix;            /* top-level folder with its trailing '/', e.g. "archive/" */
    int64_t n_tensors;
    pln_tensor *tensors;     /* in pickle order; names as stored; data points into map */
} pln_torchzip;

/* Maps path and reads the zip directory, local headers and data.pkl only. Legacy (non-zip)
 * torch files give "unsupported legacy format, re-save with torch >= 1.6". -1 with an error
 * naming the file (and entry / global / tensor) on failure; on failure tz needs no close. */
int pln_torchzip_open(pln_torchzip *tz, const char *path);
/* Same, on an in-memory image; `where` names it in errors and in tensors' file field. */
int pln_torchzip_parse(pln_torchzip *tz, const uint8_t *data, uint64_t size, const char *where);
const pln_tensor *pln_torchzip_find(const pln_torchzip *tz, const char *name);
void pln_torchzip_close(pln_torchzip *tz);

/* One tensor as the pickle describes it, before storages are resolved. */
typedef struct {
    char *name;
    char *storage_key;       /* "0", "1", ... : entry data/<key> */
    pln_dtype dtype;
    int64_t storage_numel;   /* elements in the storage, from the persistent id */
    int64_t storage_offset;  /* in elements */
    int ndim;
    int64_t shape[PLN_MAX_DIMS];
    int64_t stride[PLN_MAX_DIMS];
} pln_pickle_tensor;

/* Runs the safe unpickler over a state-dict pickle. *out (n_out entries) is owned by the caller:
 * free with pln_pickle_tensors_free. -1 with an error naming `where` and the problem. */
int pln_unpickle_state_dict(const uint8_t *pkl, uint64_t n, const char *where,
                            pln_pickle_tensor **out, int64_t *n_out);
void pln_pickle_tensors_free(pln_pickle_tensor *t, int64_t n);

#endif
