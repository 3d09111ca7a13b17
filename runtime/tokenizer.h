/* tokenizer.h — the BLOOM byte-level BPE tokenizer (tokenizer.json), encode and decode exactly as
 * Hugging Face `tokenizers` does for BLOOM's pipeline.
 *
 * Encode: special tokens (added_tokens) are matched in the text first (longest match, leftmost)
 * and never merged; the text between them is split by the pre_tokenizer's Split regex with
 * behavior Isolated (the gaps between matches are pieces too), each piece's bytes are mapped to
 * the GPT-2 ByteLevel alphabet (no prefix space, no extra regex) and merged by BPE (lowest merge
 * rank first, leftmost on ties). No BOS/EOS is added.
 * Decode: ByteLevel back to raw bytes; invalid UTF-8 in the result becomes U+FFFD (as HF's
 * String::from_utf8_lossy). The streaming decoder emits only complete UTF-8 sequences.
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

/* Loads tokenizer.json. NULL + pln_errorf naming the file and the field that is missing or not
 * supported (model type other than BPE, a normalizer, a decoder other than ByteLevel, ...). */
pln_tokenizer *pln_tok_load(const char *tokenizer_json_path);
void pln_tok_free(pln_tokenizer *t);

/* Number of ids: 1 + the largest id in model.vocab and added_tokens. */
int64_t pln_tok_vocab_size(const pln_tokenizer *t);

/* Encodes len bytes of UTF-8 text. *ids_out is malloc'd (caller frees; NULL when *n_out is 0).
 * -1 with an error on invalid UTF-8 or a regex failure. Thread-safe. */
int pln_tok_encode(const pln_tokenizer *t, const char *text, size_t len, int32_t **ids_out,
                   size_t *n_out);

/* Decodes n ids to a malloc'd NUL-terminated string (length in *len_out if not NULL).
 * skip_special drops special tokens. Invalid UTF-8 → U+FFFD (one per maximal invalid
 * subsequence, like Rust's from_utf8_lossy). Out-of-range ids are skipped. Never returns NULL. */
char *pln_tok_decode(const pln_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                     size_t *len_out);

/* The raw bytes of a token (ByteLevel map undone; a special token's own text). NULL if id is out
 * of range or unused. The pointer lives as long as the tokenizer. */
const uint8_t *pln_tok_token_bytes(const pln_tokenizer *t, int32_t id, size_t *len);

/* Length in bytes of the longest token (for sizing stream buffers). */
size_t pln_tok_max_token_bytes(const pln_tokenizer *t);

/* True for added tokens marked "special": true. */
bool pln_tok_is_special(const pln_tokenizer *t, int32_t id);

/* Id of a token by its tokenizer.json spelling (ByteLevel alphabet, e.g. "Ġthe", or "</s>");
 * -1 if absent. */
int32_t pln_tok_token_id(const pln_tokenizer *t, const char *token_str);

/* Streaming decoder state; zero-initialise. */
typedef struct { uint8_t pend[8]; int n_pend; } pln_tok_stream;

/* Appends id's bytes and writes only complete UTF-8 to out (no NUL); returns the bytes written.
 * Invalid sequences are written as U+FFFD at once. Output never exceeds 3 × the token's length
 * + 3 bytes (each invalid byte becomes 3), so cap >= 3 * pln_tok_max_token_bytes(t) + 3 always
 * suffices (64 + the length does for every token up to 30 bytes); output that does not fit is
 * dropped. skip_special drops specials (and so does an out-of-range id). */
size_t pln_tok_stream_push(const pln_tokenizer *t, pln_tok_stream *s, int32_t id, bool skip_special,
                           char *out, size_t cap);
/* Writes what is left pending (an incomplete sequence) as U+FFFD and resets s. cap >= 4. */
size_t pln_tok_stream_flush(const pln_tokenizer *t, pln_tok_stream *s, char *out, size_t cap);

#endif
