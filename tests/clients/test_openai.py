"""The openai SDK, unmodified, against `pollen serve`'s /v1 routes."""
import math

import openai
from common import MODEL, URL, check, done, generate_ids, post

oc = openai.OpenAI(base_url=URL + "/v1", api_key="unused", timeout=60, max_retries=0)
P = "Hello world"
ids = generate_ids(P, 6)

check([m.id for m in oc.models.list()] == [MODEL], "models.list")
r = oc.completions.create(model=MODEL, prompt=P, max_tokens=6, temperature=0)
raw = post("/generate", {"inputs": P, "parameters": {"max_new_tokens": 6}})[1]
check(r.choices[0].text == raw["generated_text"].split("</s>")[0], "completions: text == /generate text")
r = oc.completions.create(model=MODEL, prompt=[P, "The quick"], max_tokens=4, temperature=0)
check([c.index for c in r.choices] == [0, 1], "a list of prompts: one choice each")

# logprobs: tokens, token_logprobs, top_logprobs, text_offset
r = oc.completions.create(model=MODEL, prompt=P, max_tokens=6, temperature=0, logprobs=2)
lp = r.choices[0].logprobs
gen = post("/generate", {"inputs": P, "parameters": {"max_new_tokens": 6, "details": True}})[1]["details"]["tokens"]
check(lp is not None and len(lp.tokens) == 6, "logprobs: one entry per generated token")
check(all(abs(a - b["logprob"]) < 1e-6 for a, b in zip(lp.token_logprobs, gen)), "logprobs == TGI details log-probs")
check(all(len(d) <= 2 and max(d.values()) >= lp.token_logprobs[i] - 1e-6 for i, d in enumerate(lp.top_logprobs)),
      "top_logprobs: 2 alternatives, the greedy token's among the best")
check(lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0, "text_offset ascends from 0")
r = oc.completions.create(model=MODEL, prompt=P, max_tokens=3, temperature=0, logprobs=1, echo=True)
ch = r.choices[0]
ntok = len(post("/tokenize", {"inputs": P})[1])
check(ch.text.startswith(P), "echo: the text starts with the prompt")
check(len(ch.logprobs.tokens) == ntok + 3 and ch.logprobs.token_logprobs[0] is None and ch.logprobs.top_logprobs[0] is None,
      "echo + logprobs: prompt tokens first, the first without a log-prob")
check(all(v is not None and v <= 0 for v in ch.logprobs.token_logprobs[1:]), "echo: prompt log-probs <= 0")

# n, best_of, seed, penalties
r = oc.completions.create(model=MODEL, prompt=P, max_tokens=6, temperature=0, n=2)
check(len(r.choices) == 2 and r.choices[0].text == r.choices[1].text, "n=2 greedy: two identical choices")
r = oc.completions.create(model=MODEL, prompt=P, max_tokens=6, n=2, seed=5)
r2 = oc.completions.create(model=MODEL, prompt=P, max_tokens=6, n=2, seed=5)
check([c.text for c in r.choices] == [c.text for c in r2.choices], "n=2 with a seed: reproducible")
r = oc.completions.create(model=MODEL, prompt=P, max_tokens=6, n=1, best_of=3, logprobs=0)
check(len(r.choices) == 1 and r.usage.completion_tokens >= 3, "best_of 3, n 1: one choice, all three generated")
r = oc.completions.create(model=MODEL, prompt=P, max_tokens=8, temperature=0, presence_penalty=2, frequency_penalty=1)
check(isinstance(r.choices[0].text, str), "presence/frequency penalties accepted")

# streaming
parts = list(oc.completions.create(model=MODEL, prompt=P, max_tokens=6, temperature=0, stream=True,
                                   stream_options={"include_usage": True}))
text = "".join(p.choices[0].text for p in parts if p.choices)
check(text == oc.completions.create(model=MODEL, prompt=P, max_tokens=6, temperature=0).choices[0].text,
      "stream: deltas add up to the non-streamed text")
check(parts[-1].choices == [] and parts[-1].usage is not None and parts[-1].usage.completion_tokens == 6,
      "stream_options.include_usage: a last chunk with usage")
parts = list(oc.completions.create(model=MODEL, prompt=P, max_tokens=4, temperature=0, stream=True, logprobs=1))
check(sum(len(p.choices[0].logprobs.tokens) for p in parts) == 4, "stream + logprobs: one token per chunk")
parts = list(oc.completions.create(model=MODEL, prompt=P, max_tokens=4, temperature=0, stream=True, n=2))
check(sorted({p.choices[0].index for p in parts}) == [0, 1], "stream n=2: chunks for both choices")
parts = list(oc.completions.create(model=MODEL, prompt=P, max_tokens=4, temperature=0, stream=True, n=2,
                                   stream_options={"include_usage": True}))
u = parts[-1].usage
check(u is not None and u.prompt_tokens == ntok and u.completion_tokens == 8,
      "stream n=2 usage: the prompt once, both completions")

# refusals in the OpenAI error shape
for kw, what in (({"suffix": "tail"}, "suffix"), ({"extra_body": {"frobnicate": 1}}, "frobnicate")):
    try:
        oc.completions.create(model=MODEL, prompt=P, max_tokens=2, **kw)
        check(False, f"{what}: refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and what in str(e), f"{what}: 400 naming it")
try:
    oc.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    check(False, "chat without a template: refused")
except openai.BadRequestError as e:
    check("chat template" in str(e) and "/v1/completions" in str(e), "chat: 400 saying there is no chat template")
try:
    oc.completions.create(model="other", prompt=P, max_tokens=2)
    check(False, "unknown model refused")
except openai.NotFoundError as e:
    check(e.status_code == 404, "unknown model: 404")
done("test_openai")
