/* sampler.h — Hugging Face sampling semantics on the host, over candidates merged from ranks.
 *
 * Order (transformers' LogitsProcessor order, as TGI applies it): repetition penalty → temperature
 * → top-k (ties at the k-th value kept) → top-p (smallest set, in descending order, whose mass is
 * ≥ p; at least one token) → draw. Greedy (do_sample false or temperature 0) takes the largest
 * processed logit, lowest id on ties. Penalty and temperature run on the device per vocab slice
 * (backend logit_process); this file does the rest on the merged candidate list, so the same seed
 * gives the same tokens whatever the TP size. */
#ifndef PLN_SAMPLER_H
#define PLN_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

/* Most alternatives one token can carry (TGI's --max-top-n-tokens default, OpenAI's logprobs cap). */
#define PLN_TOP_MAX 5

typedef struct {
    bool do_sample;             /* false: greedy */
    float temperature;          /* > 0; 1.0 = off */
    int32_t top_k;              /* 0 = off */
    float top_p;                /* (0, 1]; 1.0 = off */
    float repetition_penalty;   /* > 0; 1.0 = off */
    uint64_t seed;
    float typical_p;            /* typical decoding mass, (0, 1); 0 or 1 = off (HF TypicalLogitsWarper) */
    float presence_penalty;     /* OpenAI: subtracted once from the logit of every id generated so far */
    float frequency_penalty;    /* OpenAI: subtracted once per occurrence among the generated ids */
} pln_sample_params;

/* HF semantics in detail (what pln_sample_pick implements):
 * - repetition penalty (before this file, per vocab slice): each DISTINCT id seen (prompt
 *   included) has its logit divided by the penalty when > 0, multiplied when < 0 (HF's
 *   RepetitionPenaltyLogitsProcessor); then logits are divided by the temperature.
 *   pln_logits_apply_penalty_temp() below is the host reference of that step.
 * - top-k: keeps every token whose value is >= the k-th largest (ties at the k-th kept).
 * - top-p: in canonical order (value descending, lower id first on ties) keeps the smallest
 *   prefix whose probability mass is >= top_p (a mass within 1e-7 of p counts as reaching it, as
 *   HF's float32 cumsum does), at least one token. The mass is relative to the whole vocabulary
 *   (lse) when top_k is off, and to the top-k set when top_k is on (HF's TopK sets the rest to
 *   -inf before TopP's softmax).
 * - typical_p (after top-p, as HF's TypicalLogitsWarper and TGI order it): over the kept set,
 *   with its log-probs lp (renormalised) and entropy H = -sum p·lp, sort by |−lp − H| ascending
 *   (canonical order on ties), keep up to and including the first position where the cumulative
 *   probability in that order reaches typical_p (HF: last_ind = count(cumsum < mass)), plus every
 *   token whose |−lp − H| equals that one's; at least one token.
 * - presence / frequency penalties (OpenAI semantics, applied by the engine before temperature,
 *   on the host over a full gathered row): logit[id] -= frequency_penalty · count(id) +
 *   presence_penalty · (count(id) > 0), counting generated tokens only.
 * - draw: u = uniform [0,1) from the slot's RNG times the kept mass, walking the kept set in
 *   canonical order; the same seed gives the same token whatever the candidate order or TP size.
 * - greedy: largest value, lowest id on ties; NaN counts as -inf everywhere. */

/* A temperature below this samples greedily, as vLLM does below its 1e-5: greedy is the limit of
 * sampling as the temperature goes to 0, and dividing logits by a smaller temperature can
 * overflow them to infinity. The same floor bounds repetition_penalty from below (it divides
 * positive logits): pln_sample_params_check refuses a smaller one. */
#define PLN_SAMPLE_MIN_TEMPERATURE 1e-5f
#define PLN_SAMPLE_MIN_PENALTY 1e-5f

/* True when p picks greedily: do_sample false, or a temperature below PLN_SAMPLE_MIN_TEMPERATURE
 * (0 included). */
bool pln_sample_is_greedy(const pln_sample_params *p);

/* Defaults: greedy, temperature 1, top_k 0, top_p 1, penalty 1, seed 0, typical_p 1,
 * presence and frequency penalties 0. */
void pln_sample_params_default(pln_sample_params *p);
/* Validates ranges; -1 with an error naming the parameter (used by the server's 422s):
 * temperature finite and >= 0, and > 0 when do_sample; top_k >= 0 (any value: a top_k at or above
 * the vocabulary keeps every token, as top_k 0 does); 0 < top_p <= 1;
 * repetition_penalty finite and >= PLN_SAMPLE_MIN_PENALTY; typical_p in [0, 1]; presence and frequency penalties
 * finite. NaN fails every check. */
int pln_sample_params_check(const pln_sample_params *p);

/* xoshiro256** seeded with splitmix64: deterministic, identical on every platform. */
typedef struct { uint64_t s[4]; } pln_rng;
void pln_rng_seed(pln_rng *r, uint64_t seed);
uint64_t pln_rng_next(pln_rng *r);
double pln_rng_uniform(pln_rng *r);   /* [0, 1) with 53 bits */

/* Picks a token from n candidates (processed logits vals, distinct global ids), sorted or not.
 * The candidate set must contain the global top-n of the processed distribution; lse is the
 * log-sum-exp of the processed logits over the WHOLE vocabulary (for exact top-p mass).
 * Returns the chosen id; *logprob_out (if not NULL) gets log p of it under the processed
 * distribution (vals[chosen] - lse, before top-k/top-p). Never fails for n >= 1. A full
 * 250k-entry row costs a few ms: the kept set is selected, not the whole row sorted. */
int32_t pln_sample_pick(const pln_sample_params *p, pln_rng *rng, const float *vals,
                        const int32_t *ids, int32_t n, float lse, float *logprob_out);

/* With top_k on, send more than top_k candidates per rank: a tie at the k-th value that was cut
 * off then shows up as more than top_k values >= the k-th, and this returns false.
 * Greedy rows always suffice; plain sampling (top_k off, top_p 1) never does unless n >= vocab.
 * True if top-p can be decided from these candidates alone: their probability mass (from lse)
 * reaches top_p, or top_k bounds the set within them. Otherwise the caller gathers the full row.
 * Typical decoding needs the kept set whole: with neither top_k nor top_p it needs the full row. */
bool pln_sample_candidates_suffice(const pln_sample_params *p, const float *vals, int32_t n,
                                   float lse, int64_t vocab);

/* Host reference of the backend's logit_process for one row of n logits: HF repetition penalty
 * over the distinct ids in seen[0..n_seen) (out-of-range ids ignored; penalty 1 = off), then
 * division by temperature (temperature 1 or <= 0 = off; HF divides, it does not multiply by
 * the inverse). */
void pln_logits_apply_penalty_temp(float *logits, int64_t n, const int32_t *seen, int n_seen, float penalty,
                                   float temperature);

#endif
