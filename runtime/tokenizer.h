/* tokenizer.h — Hugging Face tokenizer.json with a BPE model (BLOOM, Llama 2 / Mistral, Llama 3,
 * Qwen2, GPT-2 style files), encode and decode exactly as the `tokenizers` library does.
 *
 * Encode: added tokens are matched in the text first (leftmost-longest; lstrip, rstrip,
 * single_word; the non-normalized ones on the raw text, the normalized ones after the
 * normalizer) and never merged; the text between them goes through the normalizer (Prepend,
 * Replace, NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents), the pre-tokenizer (Split with any
 * behavior and invert, ByteLevel, Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit)
 * and BPE (lowest merge rank first, leftmost on ties; byte_fallback, ignore_merges, unk and
 * fuse_unk, continuing_subword_prefix, end_of_word_suffix). pln_tok_encode adds no special
 * tokens; pln_tok_encode_special with add_special applies the post-processor (TemplateProcessing
 * BOS/EOS, Roberta/Bert, ByteLevel, Sequence) as HF's add_special_tokens=True.
 * Decode: the decoder chain (ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence);
 * invalid UTF-8 becomes U+FFFD (ByteLevel: one per invalid sequence, as from_utf8_lossy;
 * ByteFallback: one per byte of an invalid run of byte tokens, as HF). The streaming decoder
 * emits only complete UTF-8 sequences; its output concatenated equals pln_tok_decode except that
 * a run of byte tokens is judged as it arrives (a character the run completed is emitted before
 * a later byte of the same run turns it invalid, where HF turns the whole run into U+FFFD).
 * Any other component (a WordPiece/Unigram model, a Precompiled normalizer, a BPE decoder, ...)
 * is refused at load with its name and JSON path.
 *
 * Input text must be valid UTF-8 (HF receives a Python str): pln_tok_encode rejects anything else
 * with -1 and an error giving the byte offset.
 *
 * A loaded tokenizer is immutable: every function here is thread-safe on a shared pln_tokenizer
 * (the encode word cache is internally locked). */
#ifndef PLN_TOKENIZER_H
#define PLN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pln_tokenizer pln_tokenizer;

/* Loads tokenizer.json. NULL + pln_errorf naming the file and the JSON path of the field that is
 * missing, malformed or not supported (model type other than BPE, an unknown normalizer, ...). */
pln_tokenizer *pln_tok_load(const char *tokenizer_json_path);
void pln_tok_free(pln_tokenizer *t);

/* Number of ids: 1 + the largest id in model.vocab and added_tokens. */
int64_t pln_tok_vocab_size(const pln_tokenizer *t);

/* Encodes len bytes of UTF-8 text. *ids_out is malloc'd (caller frees; NULL when *n_out is 0).
 * -1 with an error on invalid UTF-8 or a regex failure. Thread-safe. */
int pln_tok_encode(const pln_tokenizer *t, const char *text, size_t len, int32_t **ids_out,
                   size_t *n_out);
/* The same, and with add_special the post-processor's special tokens around the ids (HF's
 * encode(text, add_special_tokens=True)). */
int pln_tok_encode_special(const pln_tokenizer *t, const char *text, size_t len, bool add_special,
                           int32_t **ids_out, size_t *n_out);

/* The elementary steps the calling thread's last encode took (symbols, pair lookups, heap moves,
 * ids written, regex calls and the bytes they advanced over): a deterministic cost, so a test can
 * tell linear from quadratic work without a clock. */
uint64_t pln_tok_last_work(void);

/* Decodes n ids to a malloc'd NUL-terminated string (length in *len_out if not NULL).
 * skip_special drops special tokens. Invalid UTF-8 → U+FFFD (one per maximal invalid
 * subsequence, like Rust's from_utf8_lossy). Out-of-range ids are skipped. Never returns NULL. */
char *pln_tok_decode(const pln_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                     size_t *len_out);

/* The raw bytes of a token: the decoder chain applied to it as a token after the first (ByteLevel
 * map undone, "<0x0A>" → one byte 0x0A, "▁the" → " the"; a special token's own text). NULL if
 * id is out of range or unused. The pointer lives as long as the tokenizer. */
const uint8_t *pln_tok_token_bytes(const pln_tokenizer *t, int32_t id, size_t *len);

/* A token's tokenizer.json spelling ("Ġthe", "▁the", "<0x0A>", "</s>"), not NUL-terminated in
 * general use *len; NULL if id is out of range or unused. Lives as long as the tokenizer. */
const char *pln_tok_token_str(const pln_tokenizer *t, int32_t id, size_t *len);

/* Length in bytes of the longest token (for sizing stream buffers). */
size_t pln_tok_max_token_bytes(const pln_tokenizer *t);

/* True for added tokens marked "special": true. */
bool pln_tok_is_special(const pln_tokenizer *t, int32_t id);

/* Id of a token by its tokenizer.json spelling (ByteLevel alphabet, e.g. "Ġthe", or "</s>");
 * -1 if absent. */
int32_t pln_tok_token_id(const pln_tokenizer *t, const char *token_str);

/* Streaming decoder state; zero-initialise (one per decoded text: the first token differs). */
typedef struct {
    uint8_t pend[8];
    int n_pend;
    uint32_t n_tokens;     /* tokens decoded so far */
    int n_stripped;        /* leading characters a Strip decoder removed */
    bool strip_done;
    bool run_bad;          /* the current run of ByteFallback byte tokens is invalid UTF-8 */
} pln_tok_stream;

/* Appends id's bytes and writes only complete UTF-8 to out (no NUL); returns the bytes written.
 * Invalid sequences are written as U+FFFD at once. Output never exceeds 3 × the token's length
 * + 12 bytes (each invalid byte becomes 3), so cap >= 3 * pln_tok_max_token_bytes(t) + 12
 * always suffices (64 + the length does for every token up to 26 bytes); output that does not
 * fit is dropped. skip_special drops specials (and so does an out-of-range id). */
size_t pln_tok_stream_push(const pln_tokenizer *t, pln_tok_stream *s, int32_t id, bool skip_special,
                           char *out, size_t cap);
/* Writes what is left pending (an incomplete sequence) as U+FFFD and resets s. cap >= 9
 * (ByteFallback writes one U+FFFD per pending byte). */
size_t pln_tok_stream_flush(const pln_tokenizer *t, pln_tok_stream *s, char *out, size_t cap);

#endif
