"""Drives `sparrow serve`'s tool calling with the official openai package: a two-step agent
loop (the model calls a function, gets its result as a `tool` message, answers), whole and
streamed, and N calls forced by `tool_choice`, sent by four clients at once, whose arguments
all validate against the function's schema (the `jsonschema` package).
Usage: openai_tools.py BASE_URL API_KEY N"""
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

base, key, n_forced = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=600)
PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "The city, e.g. Oslo"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "description": "How many days of forecast"},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {
    "name": "get_forecast", "description": "The weather forecast for a city.",
    "parameters": PARAMS}}]
question = {"role": "user", "content": "What will the weather be in Oslo for the next 3 days?"}


def check_call(call):
    assert call.type == "function", call
    assert call.id, call
    assert call.function.name == "get_forecast", call
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, PARAMS)
    return args


# Step 1, whole: the call.
r = client.chat.completions.create(model="sparrow", messages=[question], tools=TOOLS,
                                   tool_choice="required", max_tokens=64, temperature=0)
c = r.choices[0]
assert c.finish_reason == "tool_calls", r
assert len(c.message.tool_calls) == 1, r
args = check_call(c.message.tool_calls[0])
print("call:", json.dumps(args))

# Step 2: the result goes back as a tool message; the model answers in text.
call = c.message.tool_calls[0]
messages = [question,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id,
             "content": json.dumps({"days": [{"high": 7, "sky": "rain"}, {"high": 9, "sky": "sun"},
                                             {"high": 6, "sky": "snow"}]})}]
r2 = client.chat.completions.create(model="sparrow", messages=messages, tools=TOOLS,
                                    max_tokens=48, temperature=0)
c2 = r2.choices[0]
assert c2.message.content and not c2.message.tool_calls, r2
print("answer:", json.dumps(c2.message.content))

# Step 1 streamed: the call arrives as tool_calls deltas, gathered by index.
stream = client.chat.completions.create(model="sparrow", messages=[question], tools=TOOLS,
                                        tool_choice={"type": "function",
                                                     "function": {"name": "get_forecast"}},
                                        max_tokens=64, temperature=0, stream=True)
calls, finish = {}, None
for chunk in stream:
    ch = chunk.choices[0]
    for d in ch.delta.tool_calls or []:
        got = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
        got["id"] = d.id or got["id"]
        if d.function:
            got["name"] += d.function.name or ""
            got["arguments"] += d.function.arguments or ""
    finish = ch.finish_reason or finish
assert finish == "tool_calls" and list(calls) == [0], (finish, calls)
assert calls[0]["name"] == "get_forecast" and calls[0]["id"], calls
jsonschema.validate(json.loads(calls[0]["arguments"]), PARAMS)
print("streamed call:", calls[0]["arguments"])

# Forced calls, sampled: every one's arguments validate. Four clients at once, as an agent
# framework sends them: the server decodes their tokens in shared passes.
cities = ["Oslo", "Lima", "Perth", "Quito", "Accra", "Hanoi", "Turku", "Cusco", "Dakar", "Bern"]


def forced_call(i):
    q = {"role": "user",
         "content": f"Forecast for {cities[i % len(cities)]}, {1 + i % 5} days, please."}
    r = client.chat.completions.create(model="sparrow", messages=[q], tools=TOOLS,
                                       tool_choice={"type": "function",
                                                    "function": {"name": "get_forecast"}},
                                       max_tokens=96, temperature=0.8, seed=i)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", r
    return check_call(c.message.tool_calls[0])


with ThreadPoolExecutor(4) as pool:
    list(pool.map(forced_call, range(n_forced)))  # re-raises the first call that failed
print(f"{n_forced} forced calls validate")
print("ok")
