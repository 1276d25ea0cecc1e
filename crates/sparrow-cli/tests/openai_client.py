"""Drives `sparrow serve` with the official openai package: chat completion, streaming,
JSON mode, JSON schemas (every completion validated by the `jsonschema` package),
completions, models. Usage: openai_client.py BASE_URL API_KEY MAX_TOKENS [N_SCHEMA]"""
import json
import sys

import jsonschema
import openai

base, key, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
n_schema = int(sys.argv[4]) if len(sys.argv) > 4 else 6
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=600)
msgs = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name one bird."}]

r = client.chat.completions.create(model="sparrow", messages=msgs, max_tokens=max_tokens,
                                   temperature=0, seed=1)
c = r.choices[0]
assert r.object == "chat.completion", r
assert c.message.role == "assistant" and isinstance(c.message.content, str), r
assert c.finish_reason in ("stop", "length"), r
assert r.usage.prompt_tokens > 0 and 0 <= r.usage.completion_tokens <= max_tokens, r.usage
assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
print("chat:", json.dumps(c.message.content))

# Streaming, greedy with the same seed: the same text as a non-streamed reply computed the
# same way. Not the first reply: the server keeps each slot's cached tokens, so a repeated
# prompt reuses all but its last token, which it feeds alone. The first reply's prompt went
# through the model as one batch, every repeat's last token as a one-token pass — other
# kernels (batched GEMM against the decode products, depending on the SIMD level), equal
# only to rounding, which can turn a greedy near-tie. A second non-streamed reply makes
# exactly the calls the streamed one makes (the first reply's cached prefix, the last token
# alone, the same decode steps), so those two must agree to the bit, and to the token.
r2 = client.chat.completions.create(model="sparrow", messages=msgs, max_tokens=max_tokens,
                                    temperature=0, seed=1)
c2 = r2.choices[0]
assert c2.finish_reason in ("stop", "length"), r2
print("chat again:", json.dumps(c2.message.content))
stream = client.chat.completions.create(model="sparrow", messages=msgs, max_tokens=max_tokens,
                                        temperature=0, seed=1, stream=True,
                                        stream_options={"include_usage": True})
parts, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for ch in chunk.choices:
        if ch.delta.content:
            parts.append(ch.delta.content)
        if ch.finish_reason:
            finish = ch.finish_reason
assert finish in ("stop", "length"), finish
assert usage is not None and usage.completion_tokens == r2.usage.completion_tokens, usage
assert "".join(parts) == c2.message.content, ("".join(parts), c2.message.content)
print("stream:", len(parts), "chunks")

# JSON mode.
for seed in range(3):
    j = client.chat.completions.create(
        model="sparrow", max_tokens=max_tokens * 2, temperature=1.0, seed=seed,
        messages=[{"role": "user", "content": "Describe a sparrow as JSON."}],
        response_format={"type": "json_object"})
    v = json.loads(j.choices[0].message.content)
    assert isinstance(v, dict), v
    print("json:", j.choices[0].message.content)

# JSON schemas: sampled (temperature 1, a seed each) under each schema's grammar; every
# completion must parse and validate against its schema, whatever the model would say.
SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "email": {"type": "string"}}, "required": ["name", "age"],
     "additionalProperties": False},
    {"type": "object", "properties": {
        "kind": {"enum": ["bird", "fish", "insect"]},
        "wingspan_cm": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "endangered": {"type": "boolean"},
        "note": {"type": ["string", "null"]}},
     "required": ["kind", "endangered", "tags"]},
    {"type": "array", "minItems": 1, "maxItems": 4, "items": {
        "type": "object", "properties": {
            "x": {"type": "integer"}, "y": {"type": "integer"},
            "label": {"const": "point"}},
        "required": ["x", "y", "label"]}},
    {"type": "object", "properties": {
        "inner": {"type": "object", "properties": {
            "ok": {"type": "boolean"}, "n": {"type": "null"}}, "required": ["ok", "n"]}},
     "required": ["inner"]},
]
valid = 0
for i in range(n_schema):
    schema = SCHEMAS[i % len(SCHEMAS)]
    r = client.chat.completions.create(
        model="sparrow", max_tokens=max(96, max_tokens * 6), temperature=1.0, seed=100 + i,
        messages=[{"role": "user", "content": "Reply with JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), schema)
    valid += 1
print(f"json_schema: {valid}/{n_schema} completions valid")
# Malformed or unsupported schemas are 400s naming the problem.
for bad, needle in [
        ({"type": "string", "pattern": "^a"}, "pattern"),
        ({"type": "object", "properties": {"a": {"$ref": "#/x"}}}, "$ref"),
        ({"type": "widget"}, "widget")]:
    try:
        client.chat.completions.create(
            model="sparrow", max_tokens=8, messages=msgs,
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}})
        raise AssertionError(f"schema {bad} was accepted")
    except openai.BadRequestError as e:
        assert needle in str(e), (needle, str(e))

# Log-probabilities: greedy picks each step's top alternative; one entry per token.
lp = client.chat.completions.create(model="sparrow", messages=msgs, max_tokens=max_tokens,
                                    temperature=0, seed=1, logprobs=True, top_logprobs=3)
content = lp.choices[0].logprobs.content
assert len(content) == lp.usage.completion_tokens, (len(content), lp.usage)
for e in content:
    assert e.logprob <= 0 and len(e.top_logprobs) == 3, e
    assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob, e
    assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob, e
assert "".join(e.token for e in content).startswith(lp.choices[0].message.content[:1])
tc = client.completions.create(model="sparrow", prompt="The sparrow is", max_tokens=max_tokens,
                               temperature=0, seed=3, logprobs=2)
tl = tc.choices[0].logprobs
assert len(tl.tokens) == len(tl.token_logprobs) == len(tl.text_offset) == tc.usage.completion_tokens, tl
assert all(lp <= 0 for lp in tl.token_logprobs) and all(len(t) <= 2 for t in tl.top_logprobs), tl
print("logprobs:", [round(e.logprob, 3) for e in content])

# Plain completions, stop strings, models.
t = client.completions.create(model="sparrow", prompt="The sparrow is", max_tokens=max_tokens,
                              temperature=0.7, seed=3, stop=["\n\n"])
assert t.object == "text_completion" and "\n\n" not in t.choices[0].text, t
m = client.models.list()
assert len(m.data) == 1 and m.data[0].id, m
print("ok")
