"""text-generation (TGI's own Python client), unmodified, against `pollen serve`: every call it
makes goes to the root route `POST /` (generate, or SSE by the `stream` flag)."""
import math

from common import MODEL, URL, check, done, generate_ids, post
from text_generation import Client
from text_generation.errors import ValidationError

c = Client(URL, timeout=60)
P = "Hello world"

r = c.generate(P, max_new_tokens=6)
raw = post("/generate", {"inputs": P, "parameters": {"max_new_tokens": 6, "details": True}})[1]
ids = generate_ids(P, 6)
check(r.generated_text == raw["generated_text"], "generate: text == raw /generate text")
check([t.id for t in r.details.tokens] == ids, f"generate: ids == pollen generate {ids}")
check(r.details.finish_reason.value in ("length", "eos_token"), "generate: finish_reason parses")
check(r.details.prefill == [], "generate: no prefill unless decoder_input_details")

s = list(c.generate_stream(P, max_new_tokens=6))
check("".join(x.token.text for x in s) == r.generated_text or s[-1].generated_text == r.generated_text,
      "generate_stream: final text == non-streamed text")
check(s[-1].details is not None and s[-1].details.generated_tokens == len(s), "generate_stream: last event has details")
check([x.token.id for x in s] == ids, "generate_stream: ids == pollen generate")

# decoder_input_details: one prefill entry per prompt token, the first without a log-prob
toks = post("/tokenize", {"inputs": P})[1]
r = c.generate(P, max_new_tokens=2, decoder_input_details=True)
check([t.id for t in r.details.prefill] == [t["id"] for t in toks], "decoder_input_details: prefill ids == /tokenize")
check(r.details.prefill[0].logprob is None, "decoder_input_details: first prefill logprob is null")
check(all(t.logprob is not None and t.logprob <= 0 for t in r.details.prefill[1:]), "decoder_input_details: log-probs <= 0")

# top_n_tokens: greedy, so the first alternative is the token itself; alternatives best first
r = c.generate(P, max_new_tokens=4, top_n_tokens=3)
tt = r.details.top_tokens
check(tt is not None and len(tt) == 4 and all(len(x) == 3 for x in tt), "top_n_tokens: 3 alternatives per token")
check(all(x[0].id == t.id and abs(x[0].logprob - t.logprob) < 1e-6 for x, t in zip(tt, r.details.tokens)),
      "top_n_tokens: the greedy token is the first alternative")
check(all(x[0].logprob >= x[1].logprob >= x[2].logprob for x in tt), "top_n_tokens: best first")
s = list(c.generate_stream(P, max_new_tokens=3, top_n_tokens=2))
check(all(x.top_tokens is not None and len(x.top_tokens) == 2 for x in s), "top_n_tokens streamed: 2 per event")

# sampling: a seed reproduces, best_of answers the best by total log-prob
a = c.generate(P, max_new_tokens=8, do_sample=True, seed=7, top_k=20)
b = c.generate(P, max_new_tokens=8, do_sample=True, seed=7, top_k=20)
check(a.generated_text == b.generated_text and a.details.seed == 7, "seed: same seed, same text; seed reported")
r = c.generate(P, max_new_tokens=8, do_sample=True, best_of=2)
bo = r.details.best_of_sequences
check(bo is not None and len(bo) == 1, "best_of 2: one other sequence in best_of_sequences")
if bo:
    best = sum(t.logprob for t in r.details.tokens)
    other = sum(t.logprob for t in bo[0].tokens)
    check(best >= other, f"best_of: the answer has the higher total log-prob ({best:.3f} >= {other:.3f})")
r = c.generate(P, max_new_tokens=8, do_sample=True, typical_p=0.5, seed=3)
r2 = c.generate(P, max_new_tokens=8, do_sample=True, typical_p=0.5, seed=3)
check(r.generated_text == r2.generated_text, "typical_p: runs and a seed reproduces it")

# text options
r = c.generate(P, max_new_tokens=4, return_full_text=True)
check(r.generated_text.startswith(P), "return_full_text: the text starts with the prompt")
r = c.generate("a b c d e f g h", max_new_tokens=2, truncate=3, decoder_input_details=True)
check(len(r.details.prefill) == 3, "truncate 3: three prompt tokens left")
full = c.generate(P, max_new_tokens=6).generated_text
if len(full) > 2:
    stop = full[1:3]
    r = c.generate(P, max_new_tokens=6, stop_sequences=[stop])
    check(r.details.finish_reason.value == "stop_sequence" and r.generated_text.endswith(stop),
          "stop: finish_reason stop_sequence, TGI keeps the stop text")

# refused features: clear 422s that the client raises as ValidationError
for kw, name in (({"watermark": True}, "watermark"),):
    try:
        c.generate(P, max_new_tokens=2, **kw)
        check(False, f"{name}: refused")
    except ValidationError as e:
        check(name in str(e), f"{name}: 422 ValidationError naming it ({e})")
st, body = post("/", {"inputs": P, "parameters": {"grammar": {"type": "json", "value": {}}}})
check(st == 422 and "grammar" in body["error"], "grammar: 422 naming it")
st, body = post("/", {"inputs": P, "parameters": {"adapter_id": "x"}})
check(st == 422 and "adapter_id" in body["error"], "adapter_id: 422 naming it")
check(MODEL != "", "model id known")
done("test_tgi")
