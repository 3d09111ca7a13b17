"""huggingface_hub's InferenceClient(url).text_generation, unmodified, against `pollen serve`."""
from common import URL, check, done, generate_ids, post
from huggingface_hub import InferenceClient

h = InferenceClient(URL, timeout=60)
P = "Hello world"
ids = generate_ids(P, 6)
raw = post("/generate", {"inputs": P, "parameters": {"max_new_tokens": 6}})[1]

t = h.text_generation(P, max_new_tokens=6)
check(t == raw["generated_text"], "text_generation: text == raw /generate")
o = h.text_generation(P, max_new_tokens=6, details=True)
check([x.id for x in o.details.tokens] == ids, "details: ids == pollen generate")
check(o.details.finish_reason in ("length", "eos_token"), "details: finish_reason")
s = list(h.text_generation(P, max_new_tokens=6, stream=True))
check("".join(s) == t, "stream: concatenated tokens == text")
sd = list(h.text_generation(P, max_new_tokens=6, stream=True, details=True))
check([x.token.id for x in sd] == ids and sd[-1].generated_text == t, "stream with details: ids and final text")
o = h.text_generation(P, max_new_tokens=3, details=True, decoder_input_details=True, top_n_tokens=2)
check(len(o.details.prefill) == len(post("/tokenize", {"inputs": P})[1]) and o.details.prefill[0].logprob is None,
      "decoder_input_details: prefill per prompt token")
check(len(o.details.top_tokens) == 3 and all(len(x) == 2 for x in o.details.top_tokens), "top_n_tokens 2")
a = h.text_generation(P, max_new_tokens=8, do_sample=True, seed=11, temperature=0.8)
b = h.text_generation(P, max_new_tokens=8, do_sample=True, seed=11, temperature=0.8)
check(a == b, "seed: reproducible sampling")
o = h.text_generation(P, max_new_tokens=8, do_sample=True, best_of=2, details=True)
check(o.details.best_of_sequences is not None and len(o.details.best_of_sequences) == 1, "best_of 2")
t = h.text_generation(P, max_new_tokens=4, return_full_text=True)
check(t.startswith(P), "return_full_text")
t = h.text_generation(P, max_new_tokens=8, do_sample=True, typical_p=0.6, seed=2)
check(isinstance(t, str), "typical_p")
try:
    h.text_generation(P, max_new_tokens=2, watermark=True)
    check(False, "watermark refused")
except Exception as e:
    check("watermark" in str(e), f"watermark: refused with a message naming it")
done("test_hub")
