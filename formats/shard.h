/* shard.h — the pollen shard format: one rank file per TP rank plus manifest.json for the set.
 *
 * The byte layout is specified in docs/FORMAT.md (the normative text; keep both in step):
 *   rank file = 128-byte preamble | tensor table (n_tensors x 256-byte entries) | zero padding |
 *               data region (each tensor at a 4096-aligned absolute offset, in table order) |
 *               zero padding to a multiple of the alignment.
 * All integers little-endian. Checksums are XXH3-64 with seed 0 (pln_xxh3).
 *
 * Layers:
 *   writer  — pln_shard_writer_*: streams tensors into one rank file (the table is laid out up
 *             front from the full tensor list, so data is written once, in order, in chunks).
 *   reader  — pln_shard_open: mmaps a rank file and validates every count, size and offset
 *             against the file size before anything is touched; then zero-copy views.
 *   set     — pln_manifest_write / pln_shardset_open: manifest.json (format, version, layout,
 *             tp, dtype, BLOOM config, files with sizes and checksums, free-form extras).
 *   layout  — pln_layout_bloom_tp_v1: the exact tensor list of one rank for "bloom-tp-v1", so the
 *             converter writes it and the loader checks it from one definition.
 *
 * Errors follow formats/common.h: -1 / NULL after pln_errorf() naming the file and tensor. */
#ifndef PLN_SHARD_H
#define PLN_SHARD_H

#include "formats/common.h"
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "formats/hf.h"   /* pln_bloom_config */

/* ---- constants ------------------------------------------------------------------------------ */
#define PLN_SHARD_MAGIC          "PLNSHARD"      /* 8 bytes, no NUL */
#define PLN_SHARD_VERSION        1u              /* rank-file byte layout version */
#define PLN_SHARD_ALIGN          4096u           /* tensor offset alignment written (readers accept
                                                    any power of two >= 4096 recorded in the file) */
#define PLN_SHARD_PREAMBLE_SIZE  128u
#define PLN_SHARD_ENTRY_SIZE     256u
#define PLN_SHARD_NAME_MAX       128             /* bytes of the name field, NUL included */
#define PLN_SHARD_MAX_DIMS       8
#define PLN_SHARD_LAYOUT_MAX     32              /* bytes of the layout field, NUL included */
#define PLN_SHARD_MAX_TENSORS    (1u << 20)      /* sanity bound on n_tensors */

#define PLN_MANIFEST_FORMAT      "pollen-shards"
#define PLN_MANIFEST_VERSION     2               /* manifest schema version written */
#define PLN_MANIFEST_VERSION_MIN 1               /* oldest version read (1: no checksums of the small files) */
#define PLN_MANIFEST_NAME        "manifest.json"
#define PLN_LAYOUT_BLOOM_TP_V1   "bloom-tp-v1"

/* ---- tensor table entry ------------------------------------------------------------------- */
typedef struct {
    char name[PLN_SHARD_NAME_MAX];   /* NUL-terminated, printable ASCII, unique in the file */
    pln_dtype dtype;
    int32_t ndim;                    /* 1..PLN_SHARD_MAX_DIMS */
    int64_t shape[PLN_SHARD_MAX_DIMS];   /* unused dims are 0 */
    uint64_t offset;                 /* absolute byte offset in the rank file (aligned) */
    uint64_t nbytes;                 /* = numel * dtype size */
    uint64_t xxh3;                   /* XXH3-64 (seed 0) of the nbytes at offset */
} pln_shard_tensor;

/* What the writer needs to lay out a tensor before any data exists. */
typedef struct {
    const char *name;
    pln_dtype dtype;
    int32_t ndim;
    int64_t shape[PLN_SHARD_MAX_DIMS];
} pln_shard_spec;

/* Byte size of a spec (numel * dtype size); -1 with an error on overflow / bad dtype / bad dims. */
int pln_shard_spec_nbytes(const pln_shard_spec *s, uint64_t *out);

/* ---- writer ----------------------------------------------------------------------------------
 * Usage: w = create(path, ...specs...); for each tensor in spec order: begin(name, xxh3 or NULL),
 * write(chunk)..., end(); then finish(w, &info) or abort(w). The file is written to a temporary
 * sibling "<path>.part" and renamed onto path by finish (after fsync), so a path never holds a
 * half-written rank file. The whole set is made atomic by writing into a directory from
 * pln_outdir_begin(). Memory use is the table (n x 256 bytes) plus a 64 KiB staging buffer for
 * writes that O_DIRECT cannot take as they are; data is never buffered beyond that. With O_DIRECT
 * (the default where the file system allows it; PLN_WRITE_DIRECT=0/1 forces buffered/direct) the
 * data bypasses the page cache. */
typedef struct pln_shard_writer pln_shard_writer;

/* Lays out the table for specs[0..n) (copied; names copied) and creates the file.
 * layout: e.g. PLN_LAYOUT_BLOOM_TP_V1 (< PLN_SHARD_LAYOUT_MAX bytes). rank < n_ranks.
 * NULL + error on a bad spec (name too long / duplicate / bad dtype / overflow) or I/O error. */
pln_shard_writer *pln_shard_writer_create(const char *path, const char *layout, uint32_t rank,
                                          uint32_t n_ranks, const pln_shard_spec *specs, size_t n);
/* Absolute offset / size the writer assigned to tensor i (for callers that want to know). */
uint64_t pln_shard_writer_offset(const pln_shard_writer *w, size_t i);
uint64_t pln_shard_writer_nbytes(const pln_shard_writer *w, size_t i);
/* Starts the next tensor; name must equal the next spec's name (catches ordering bugs).
 * xxh3: the caller's precomputed checksum of the whole tensor, or NULL to have the writer
 * compute it while streaming (a given checksum is trusted, not re-checked). */
int pln_shard_writer_begin(pln_shard_writer *w, const char *name, const uint64_t *xxh3);
/* Appends n bytes to the current tensor; error if it would exceed the tensor's nbytes. */
int pln_shard_writer_write(pln_shard_writer *w, const void *data, size_t n);
/* Ends the current tensor; error unless exactly nbytes were written. */
int pln_shard_writer_end(pln_shard_writer *w);
/* begin + write(all) + end in one call. */
int pln_shard_writer_put(pln_shard_writer *w, const char *name, const void *data, uint64_t nbytes,
                         const uint64_t *xxh3);

typedef struct {
    uint64_t file_size;
    uint64_t header_xxh3;   /* the preamble checksum; recorded in the manifest as the file's xxh3 */
} pln_shard_file_info;
/* Requires every tensor written. Writes table + preamble, fsyncs, renames into place, frees w.
 * info may be NULL. On error the partial file is removed and w is freed (no abort needed). */
int pln_shard_writer_finish(pln_shard_writer *w, pln_shard_file_info *info);
/* Removes the partial file and frees w. Never fails; NULL is fine. */
void pln_shard_writer_abort(pln_shard_writer *w);
/* Whether w writes with O_DIRECT (see "writer" in shard.c; PLN_WRITE_DIRECT=0/1 forces either).
 * Callers pass 4096-aligned buffers of whole 4096-byte blocks to get zero-copy writes. */
bool pln_shard_writer_direct(const pln_shard_writer *w);

/* ---- reader ----------------------------------------------------------------------------------- */
typedef struct {
    pln_map map;                 /* the whole file, read-only */
    const char *path;            /* = map.path */
    uint32_t version, alignment, rank, n_ranks;
    char layout[PLN_SHARD_LAYOUT_MAX];
    uint64_t n_tensors;
    pln_shard_tensor *tensors;   /* [n_tensors], table order (= offset order) */
    uint64_t table_offset, table_size, data_offset, data_size, file_size;
    uint64_t header_xxh3;        /* preamble checksum as stored (== computed after open) */
    void *index;                 /* private: name lookup */
    bool borrowed;               /* private: map.data belongs to the caller (pln_shard_open_mem) */
} pln_shard;

/* Maps path and validates it completely: magic, version, preamble and table checksums, reserved
 * fields zero, counts vs file size (overflow-checked), alignment, every tensor inside the data
 * region in increasing non-overlapping order, nbytes = numel x dtype size, names valid and unique.
 * Tensor data is not touched (checksums of data: pln_shard_verify_*). NULL + error on failure. */
pln_shard *pln_shard_open(const char *path);
/* The same checks on an in-memory image (data must outlive the shard); `where` names it in
 * errors. For the fuzzer and tests. */
pln_shard *pln_shard_open_mem(const uint8_t *data, uint64_t size, const char *where);
void pln_shard_close(pln_shard *s);
/* NULL if absent (with an error "PATH: no tensor NAME"). */
const pln_shard_tensor *pln_shard_find(const pln_shard *s, const char *name);
/* Zero-copy view of a tensor's bytes inside the mapping (valid until close). */
const void *pln_shard_data(const pln_shard *s, const pln_shard_tensor *t);
/* Fills a common pln_tensor view (name borrowed from s, not owned; data points into the map). */
void pln_shard_tensor_view(const pln_shard *s, const pln_shard_tensor *t, pln_tensor *out);
/* Recomputes the tensor's XXH3; -1 with "PATH: tensor NAME: checksum mismatch ..." on mismatch. */
int pln_shard_verify_tensor(const pln_shard *s, const pln_shard_tensor *t);
/* Verifies every tensor (OpenMP over tensors). Returns the number of bad tensors (0 = all good);
 * the error names the first bad one. If bad_names is not NULL it gets a malloc'd list of
 * malloc'd names (caller frees) of length = return value. */
int64_t pln_shard_verify_all(const pln_shard *s, char ***bad_names);

/* ---- manifest and shard set ------------------------------------------------------------------ */
typedef struct {
    char name[64];               /* "rank-R-of-N.pln" (a plain file name inside the set dir) */
    uint64_t size;               /* exact file size */
    uint64_t xxh3;               /* the rank file's header_xxh3 (covers table, hence all data checksums) */
} pln_manifest_file;

/* "rank-R-of-N.pln" into buf (>= 64 bytes). */
const char *pln_shard_file_name(uint32_t rank, uint32_t n_ranks, char *buf, size_t len);

/* Everything pln_manifest_write records. */
typedef struct {
    pln_bloom_config config;
    int32_t tp;
    const char *dtype;           /* "fp16", "int8" or "int4" */
    int64_t group_size;          /* int8: input columns per scale, 0 = per output channel; int4: 32, 64 or 128 */
    bool quantize_embedding;
    int64_t vocab_padded;        /* vocab_size rounded up to a multiple of tp */
    const char *layout;          /* PLN_LAYOUT_BLOOM_TP_V1 */
    const pln_manifest_file *files;  /* [tp], index = rank */
    const char *tokenizer;       /* file name in the set dir ("tokenizer.json"), or NULL */
    const char *hf_config;       /* file name in the set dir ("config.json"), or NULL */
    json_t *extra;               /* borrowed; NULL or an object whose members are added at top
                                    level (e.g. "source", "tensors", "quantization"). A member that
                                    collides with a key above is an error. */
    const char *tokenizer_config; /* "tokenizer_config.json" (special tokens, chat template), or NULL */
    const char *chat_template;   /* "chat_template.jinja" where the model has one, or NULL */
} pln_manifest;

/* Writes DIR/manifest.json atomically (pretty-printed), version PLN_MANIFEST_VERSION. Records the
 * XXH3 of the config block (config_xxh3) and of DIR/<tokenizer>, DIR/<hf_config> and (when given)
 * DIR/<tokenizer_config> and DIR/<chat_template>, which must therefore be in DIR already (write
 * them first); the last two keys are written only when given. -1 + error on failure. */
int pln_manifest_write(const char *dir, const pln_manifest *m);

/* The canonical text of a config block whose XXH3 the manifest records as config_xxh3
 * (docs/FORMAT.md "Checksums of the small files"): one "key=value\n" line per field in a fixed
 * order, integers in decimal, layer_norm_epsilon as the 16 hex digits of its IEEE-754 binary64
 * bits. Returns the text's length (< len), or -1 if buf is too small. */
int pln_config_canonical(const pln_bloom_config *c, char *buf, size_t len);
/* XXH3 of pln_config_canonical(c). */
uint64_t pln_config_xxh3(const pln_bloom_config *c);

typedef struct {
    char *path;                  /* DIR/rank-R-of-N.pln */
    char name[64];
    uint64_t size;
    uint64_t xxh3;
} pln_shardset_file;

typedef struct {
    char *dir;
    uint32_t version;            /* manifest schema version */
    char layout[PLN_SHARD_LAYOUT_MAX];
    pln_bloom_config config;
    int32_t tp;
    char dtype[8];               /* "fp16", "int8" or "int4" */
    int64_t group_size;          /* 0 = per channel (int8 only) */
    bool quantize_embedding;
    int64_t vocab_padded;
    pln_shardset_file *files;    /* [tp], index = rank */
    char *tokenizer_path;        /* DIR/<manifest "tokenizer">, NULL when the manifest says null */
    char *config_path;           /* DIR/<manifest "hf_config">, NULL when the manifest says null */
    char *tokenizer_config_path; /* DIR/<manifest "tokenizer_config">, NULL when absent or null */
    char *chat_template_path;    /* DIR/<manifest "chat_template">, NULL when absent or null */
    bool small_files_checked;    /* version >= 2: config block, tokenizer and config.json matched
                                    their recorded checksums (version 1 records none) */
    json_t *json;                /* the whole manifest (owned by the set): extra fields */
} pln_shardset;

/* Reads and validates DIR/manifest.json (format, known version and layout, tp, dtype, config,
 * one file per rank with a safe name) and checks each rank file exists with the recorded size
 * (an error names the file). The small files are checked completely: the tokenizer and
 * hf_config files named must be regular files inside DIR (no absolute path, "..", or symlink
 * out of DIR), config.json must parse and agree with the manifest's config field by field, and
 * from version 2 on the config block, tokenizer and config.json must match config_xxh3,
 * tokenizer_xxh3 and hf_config_xxh3 (and tokenizer_config / chat_template, where the manifest
 * names them, their _xxh3). Rank files are not opened. NULL + error on failure. */
pln_shardset *pln_shardset_open(const char *dir);
void pln_shardset_close(pln_shardset *set);
/* Opens rank r's file and cross-checks it against the manifest: rank, n_ranks, layout,
 * header checksum, and that its tensor table is exactly the layout's list for this rank
 * (names, order, dtypes, shapes). NULL + error naming the file on failure. */
pln_shard *pln_shardset_open_rank(const pln_shardset *set, int32_t rank);

/* ---- the "bloom-tp-v1" layout ----------------------------------------------------------------
 * The tensors of rank `rank` in the order the forward pass reads them (docs/FORMAT.md). Checks
 * n_head % tp == 0, vocab_padded % tp == 0 and >= vocab_size, group divides the columns.
 * Returns a malloc'd array (names malloc'd; free with pln_layout_free) and its length in *n. */
typedef struct {
    const pln_bloom_config *config;
    int32_t tp;
    bool int8;                   /* dtype "int8" */
    int64_t group_size;          /* 0 = per channel */
    bool quantize_embedding;     /* int8 embedding (dtype int8 or int4) */
    int64_t vocab_padded;
    bool int4;                   /* dtype "int4": the four linear weights packed int4 (U8) + scales */
} pln_layout_params;
pln_shard_spec *pln_layout_bloom_tp_v1(const pln_layout_params *p, int32_t rank, size_t *n);
void pln_layout_free(pln_shard_spec *specs, size_t n);
/* Checks that every int8/int4 scale (each F16 tensor whose name ends in "_scale") is finite and
 * positive, as the writer makes them: a NaN, infinite, zero or negative scale turns whole rows of
 * weights into garbage. Reads only the scales (~1/(2G) of the int8 weights' bytes). -1 with an
 * error naming the file, tensor, element and value on the first bad one. */
int pln_layout_check_scales(const pln_shard *s);
/* Checks that the bytes FORMAT.md says are zero are zero: between the table and data_offset,
 * between tensors, and after the last tensor. -1 with an error naming the file and the offset
 * of the first non-zero byte. Reads the padding (at most ALIGN bytes per tensor). */
int pln_shard_check_padding(const pln_shard *s);

/* vocab_size rounded up to a multiple of tp. */
int64_t pln_vocab_padded(int64_t vocab_size, int32_t tp);

#endif
