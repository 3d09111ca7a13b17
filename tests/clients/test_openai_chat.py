"""The openai SDK's chat.completions against a server started with
--chat-template docs/examples/chat-template-bloomz.json: the answer is exactly the completion of
the rendered prompt, streamed or not, with chat-shaped log-probs."""
import openai
from common import MODEL, URL, check, done

oc = openai.OpenAI(base_url=URL + "/v1", api_key="unused", timeout=60, max_retries=0)
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
rendered = "Be brief.\n\nUser: Hello there\nAssistant:"

r = oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0)
c = oc.completions.create(model=MODEL, prompt=rendered, max_tokens=8, temperature=0, stop=["\nUser:"])
check(r.object == "chat.completion" and r.choices[0].message.role == "assistant", "chat.completion shape")
check(r.choices[0].message.content == c.choices[0].text, "chat answer == completion of the rendered prompt")
check(r.usage.prompt_tokens == c.usage.prompt_tokens, "same prompt tokens as the rendered prompt")
parts = list(oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0, stream=True,
                                        stream_options={"include_usage": True}))
text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
check(parts[0].choices[0].delta.role == "assistant", "stream: the first delta names the role")
check(text == r.choices[0].message.content, "stream: deltas add up to the answer")
check(parts[-1].usage is not None and parts[-1].choices == [], "stream: usage chunk last")
r = oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
lc = r.choices[0].logprobs.content
check(len(lc) == 4 and all(len(t.top_logprobs) == 2 for t in lc), "logprobs: 2 alternatives per token")
check(all(bytes(t.bytes).decode("utf-8", "replace") == t.token for t in lc), "logprobs: bytes spell the token")
r = oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, n=2, seed=3)
check(len(r.choices) == 2, "n=2: two choices")
try:
    oc.chat.completions.create(model=MODEL, messages=[{"role": "tool", "content": "x"}], max_tokens=2)
    check(False, "an unknown role is refused")
except openai.BadRequestError as e:
    check("role" in str(e), "an unknown role: 400 naming it")
done("test_openai_chat")
