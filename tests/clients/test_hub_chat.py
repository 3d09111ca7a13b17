"""huggingface_hub's InferenceClient(url).chat_completion() and the openai SDK, unmodified, against a
server rendering the set's own Jinja chat template (tokenizer_config.json): the clients send the
placeholder model names ("dummy", "tgi") and get the completion of the rendered prompt, streamed
or not."""
import subprocess

import openai
from common import POLLEN, SET, URL, check, done, post
from huggingface_hub import InferenceClient

msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
with open(SET + "/msgs.json", "w") as f:
    import json
    json.dump(msgs, f)
rendered = subprocess.run([POLLEN, "template", SET, "--messages", SET + "/msgs.json"], capture_output=True,
                          check=True).stdout.decode()
check(rendered == "<s>[SYSTEM] Be brief.\n[USER] Hello there\n[ASSISTANT]", "pollen template renders the set's template")
want = post("/v1/completions", {"prompt": rendered, "max_tokens": 8, "temperature": 0})[1]["choices"][0]["text"]

h = InferenceClient(URL, timeout=60)
r = h.chat_completion(msgs, max_tokens=8, temperature=0)
check(r.choices[0].message.role == "assistant" and r.choices[0].message.content == want,
      "chat_completion: the completion of the rendered prompt")
check(r.usage.prompt_tokens == post("/v1/completions", {"prompt": rendered, "max_tokens": 1})[1]["usage"]["prompt_tokens"],
      "chat_completion: the rendered prompt's tokens")
parts = list(h.chat_completion(msgs, max_tokens=8, temperature=0, stream=True))
text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
check(text == want, "chat_completion stream: deltas add up to the answer")
try:
    h.chat_completion([{"role": "tool", "content": "x"}], max_tokens=2)
    check(False, "the template's raise_exception reaches the client")
except Exception as e:
    check("Tool messages are not supported" in str(e), "the template's raise_exception reaches the client as an error")

oc = openai.OpenAI(base_url=URL + "/v1", api_key="unused", timeout=60, max_retries=0)
r = oc.chat.completions.create(model="tgi", messages=msgs, max_tokens=8, temperature=0)
check(r.choices[0].message.content == want, "openai with model \"tgi\": the same answer")
check(oc.models.retrieve("tgi").id == "tgi", "openai models.retrieve (GET /v1/models/{id})")
done("test_hub_chat")
