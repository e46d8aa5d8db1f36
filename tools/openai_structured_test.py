"""Structured output and tool calls through the official `openai` client, called by
tools/openai_client_test.py on its running qkv-server (the default model, SmolLM2-135M).

- json_schema (nested objects, arrays with maxItems, enums) and json_object;
- forced tool calls (a named function, `required`), whole and streamed, their arguments
  validated against the function's schema; `auto` with a tool result fed back;
- validity: 60 constrained generations with sampling on (10 schemas x 6 seeds, temperature
  0.7-1.0), each parsed and validated with `jsonschema`;
- bad input: a malformed schema, an unknown tool in tool_choice and an invalid tool_choice
  are the client's BadRequestError naming the field.

The default model is tiny, so `auto` is not expected to call a tool; the parsers of each
family's format are tested on literal outputs in server/src/tools_tests.rs.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema

S = {"type": "string", "maxLength": 16}


def obj(props, required=None):
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required,
            "additionalProperties": False}


PERSON = obj({
    "name": S,
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]},
    "address": obj({"city": S, "zip": {"type": "integer", "minimum": 0, "maximum": 99999}}),
    "tags": {"type": "array", "items": S, "maxItems": 3},
})

SCHEMAS = [
    ("person", PERSON, "Describe a user of a web site."),
    ("colors", {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                "minItems": 1, "maxItems": 4}, "List some colors."),
    ("flag", obj({"ok": {"type": "boolean"}, "reason": S}), "Is water wet?"),
    ("point", obj({"x": {"type": "integer", "minimum": -100, "maximum": 100},
                   "y": {"type": "integer", "minimum": -100, "maximum": 100}}), "A point."),
    ("team", obj({"team": S, "members": {"type": "array", "items": obj({"name": S,
                  "level": {"enum": [1, 2, 3]}}), "maxItems": 2}}), "Describe a team."),
    ("book", obj({"title": S, "year": {"type": "integer", "minimum": 1500, "maximum": 2030},
                  "genre": {"enum": ["novel", "poetry", "essay"]},
                  "rating": {"type": "number", "minimum": 0, "maximum": 5}}), "A book."),
    ("optional", obj({"a": S, "b": {"type": "integer", "minimum": 0, "maximum": 9}},
                     required=["a"]), "Some data."),
    ("nested", obj({"outer": obj({"inner": obj({"value": {"enum": ["x", "y"]}})})}),
     "Nested data."),
    ("choice", {"anyOf": [obj({"cat": S}), obj({"dog": {"type": "integer", "minimum": 0,
                                                          "maximum": 10}})]}, "A pet."),
    ("matrix", {"type": "array", "items": {"type": "array", "items": {"type": "integer",
                "minimum": 0, "maximum": 9}, "maxItems": 3}, "maxItems": 3}, "A small matrix."),
]

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
ADD = obj({"a": {"type": "integer"}, "b": {"type": "integer"}})
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description":
          "The weather in a city", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
PARAMS = {"get_weather": WEATHER, "add": ADD}


def valid(value, schema):
    try:
        jsonschema.validate(value, schema)
        return True
    except jsonschema.ValidationError:
        return False


def run(client, openai, check):
    model = "smollm2"

    def chat(content, **kw):
        kw.setdefault("max_tokens", 300)
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": content}], **kw)

    # json_schema with nested objects, arrays, enums and maxItems.
    r = chat("Describe a user of a web site.", temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "strict": True,
                                               "schema": PERSON}})
    text = r.choices[0].message.content
    check("json_schema: nested, arrays, enums, maxItems",
          valid(json.loads(text), PERSON) and r.choices[0].finish_reason == "stop", text)
    r = chat("Reply with a small JSON object with two keys.", temperature=0,
             response_format={"type": "json_object"})
    text = r.choices[0].message.content
    check("json_object", isinstance(json.loads(text), dict), text)

    # Validity over many sampled cases, sent concurrently (the engine batches them).
    cases = [(name, schema, prompt, seed, 0.7 + 0.06 * seed)
             for name, schema, prompt in SCHEMAS for seed in range(6)]

    def one(case):
        name, schema, prompt, seed, temperature = case
        r = chat(prompt, temperature=temperature, seed=seed, response_format={
            "type": "json_schema", "json_schema": {"name": name, "schema": schema}})
        text = r.choices[0].message.content
        try:
            ok = valid(json.loads(text), schema)
        except json.JSONDecodeError:
            ok = False
        return ok, f"{name} seed {seed}: {text!r} ({r.choices[0].finish_reason})"

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, cases))
    bad = [d for ok, d in results if not ok]
    check(f"validity: {len(cases)} sampled constrained outputs validate", not bad, bad)

    # Forced tool calls, whole and streamed.
    for label, choice in [("named", {"type": "function", "function": {"name": "get_weather"}}),
                          ("required", "required")]:
        kw = dict(tools=TOOLS, tool_choice=choice, temperature=0.8, seed=3, max_tokens=200)
        r = chat("What is the weather in Paris?", **kw)
        calls = r.choices[0].message.tool_calls or []
        ok = r.choices[0].finish_reason == "tool_calls" and calls and all(
            valid(json.loads(c.function.arguments), PARAMS[c.function.name]) for c in calls)
        if label == "named":
            ok = ok and all(c.function.name == "get_weather" for c in calls)
        check(f"tool call ({label}), whole, arguments follow the schema", ok, r)
        names, args, finish = {}, {}, None
        for chunk in chat("What is the weather in Paris?", stream=True, **kw):
            if not chunk.choices:
                continue
            ch = chunk.choices[0]
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or []:
                if d.function and d.function.name:
                    names[d.index] = d.function.name
                args[d.index] = args.get(d.index, "") + ((d.function and d.function.arguments) or "")
        streamed = [(names[i], args[i]) for i in sorted(names)]
        whole = [(c.function.name, c.function.arguments) for c in calls]
        check(f"tool call ({label}), streamed = whole", finish == "tool_calls"
              and streamed == whole, (streamed, whole))

    # auto, with a tool result fed back through the template.
    msgs = [{"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function", "function": {
                    "name": "get_weather",
                    "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
            {"role": "tool", "tool_call_id": "call_1",
             "content": json.dumps({"temperature": 21, "sky": "sunny"})}]
    r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS,
                                       tool_choice="auto", temperature=0, max_tokens=40)
    m = r.choices[0].message
    calls_ok = all(valid(json.loads(c.function.arguments), PARAMS[c.function.name])
                   for c in m.tool_calls or [])
    check("auto with a tool result fed back", (m.content is not None or m.tool_calls)
          and calls_ok and r.usage.prompt_tokens > 60, r)

    # Bad input: a 400 naming the field.
    for label, kw, param in [
        ("malformed schema", dict(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "strict": True, "schema": {"type": "object", "properties": {
                "a": {"type": "no-such-type"}}}}}), "response_format.json_schema.schema"),
        ("unknown tool", dict(tools=TOOLS, tool_choice={"type": "function", "function": {
            "name": "nope"}}), "tool_choice.function.name"),
        ("invalid tool_choice", dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
    ]:
        try:
            chat("hi", **kw)
            check(f"{label} refused", False, "no error")
        except openai.BadRequestError as e:
            check(f"{label} refused", e.status_code == 400 and e.param == param, e)
