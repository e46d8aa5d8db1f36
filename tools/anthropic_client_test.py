"""Anthropic's Messages API through the official `anthropic` client, and OpenAI's Responses
API through the `openai` client, called by tools/openai_client_test.py on its running
qkv-server (the default model, SmolLM2-135M).

- messages.create whole and streamed (the SDK's event stream: text deltas add up to the
  whole text at temperature 0, the final message's stop reason and usage), with `system`,
  text blocks and `stop_sequences`;
- a forced tool (`tool_choice` `tool` and `any`): a `tool_use` block whose input validates
  against the tool's schema (`jsonschema`), streamed as `input_json` deltas that add up to
  the same input; the result fed back as a `tool_result` block;
- messages.count_tokens equal to the chat route's prompt tokens;
- a bad request surfacing as the SDK's BadRequestError naming the field;
- responses.create whole and streamed (the SDK's `output_text`, the delta events adding up
  to it), and a forced function call as a `function_call` item.
"""

import json

import jsonschema

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
# The SDK has no sampling arguments any more; the server reads them from the body.
T0 = {"temperature": 0}
TOOL = {"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}


def run(base_url, check):
    """`base_url` is the server's OpenAI base (`http://host:port/v1`)."""
    import anthropic
    import openai

    root = base_url.rsplit("/v1", 1)[0]
    client = anthropic.Anthropic(base_url=root, api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]

    whole = client.messages.create(model="qkv", max_tokens=24, extra_body=T0,
                                   system="You are a helpful assistant.", messages=msgs)
    text = whole.content[0].text
    check("anthropic: message, whole", whole.type == "message" and whole.role == "assistant"
          and whole.content[0].type == "text" and "Paris" in text
          and whole.stop_reason in ("end_turn", "max_tokens"), whole)
    check("anthropic: usage", whole.usage.output_tokens > 0
          and whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0) > 0, whole.usage)

    with client.messages.stream(model="qkv", max_tokens=24, extra_body=T0,
                                system="You are a helpful assistant.", messages=msgs) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check("anthropic: message, streamed = whole", streamed == text
          and final.content[0].text == text and final.stop_reason == whole.stop_reason
          and final.usage.output_tokens == whole.usage.output_tokens, (streamed, final))

    cut = client.messages.create(model="x", max_tokens=24, extra_body=T0, messages=msgs,
                                 system="You are a helpful assistant.", stop_sequences=["Paris"])
    check("anthropic: stop_sequences", cut.content[0].text == text[:text.index("Paris")],
          cut.content)

    count = client.messages.count_tokens(model="x", messages=msgs,
                                         system="You are a helpful assistant.")
    oai = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    chat = oai.chat.completions.create(
        model="x", max_tokens=1, messages=[{"role": "system", "content": "You are a helpful assistant."},
                                           {"role": "user", "content": "What is the capital of France?"}])
    check("anthropic: count_tokens = the chat prompt", count.input_tokens == chat.usage.prompt_tokens,
          (count, chat.usage))

    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any"}):
        m = client.messages.create(model="x", max_tokens=80, extra_body=T0, tools=[TOOL],
                                   tool_choice=choice, messages=ask)
        uses = [b for b in m.content if b.type == "tool_use"]
        ok = m.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
        if ok:
            jsonschema.validate(uses[0].input, WEATHER)
        check(f"anthropic: tool_use ({choice['type']})", ok, m)
        if choice["type"] == "tool":
            use = uses[0]
    with client.messages.stream(model="x", max_tokens=80, extra_body=T0, tools=[TOOL],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=ask) as s:
        parts = [e.partial_json for e in s if e.type == "input_json"]
        final = s.get_final_message()
    streamed_use = [b for b in final.content if b.type == "tool_use"]
    check("anthropic: tool_use streamed in fragments", len(parts) > 2
          and json.loads("".join(parts)) == use.input and streamed_use
          and streamed_use[0].input == use.input, (parts, final))

    back = client.messages.create(model="x", max_tokens=20, extra_body=T0, tools=[TOOL], messages=[
        *ask,
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                           "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "Sunny, 25 C"}]},
    ])
    check("anthropic: tool_result fed back", back.content[0].type == "text", back)

    try:
        client.messages.create(model="x", max_tokens=8, messages=ask, tools=[TOOL],
                               tool_choice={"type": "tool", "name": "nope"})
        check("anthropic: unknown tool refused", False, "no error")
    except anthropic.BadRequestError as e:
        check("anthropic: unknown tool refused", "tool_choice.name" in str(e), e)

    # OpenAI's Responses API.
    r = oai.responses.create(model="gpt-4.1", instructions="You are a helpful assistant.",
                             input="What is the capital of France?", max_output_tokens=24,
                             extra_body=T0)
    check("responses: whole", r.id.startswith("resp_") and r.output[0].id.startswith("msg_")
          and "Paris" in r.output_text, r)
    deltas, done = [], None
    for e in oai.responses.create(model="gpt-4.1", instructions="You are a helpful assistant.",
                                  input="What is the capital of France?", max_output_tokens=24,
                                  extra_body=T0, stream=True):
        if e.type == "response.output_text.delta":
            deltas.append(e.delta)
        if e.type == "response.completed":
            done = e.response
    check("responses: streamed = whole", done is not None and "".join(deltas) == r.output_text
          and done.output_text == r.output_text, (deltas, done))
    f = oai.responses.create(model="x", input="What's the weather in Paris?", max_output_tokens=80,
                             extra_body=T0, tool_choice="required",
                             tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}])
    calls = [o for o in f.output if o.type == "function_call"]
    ok = bool(calls) and calls[0].name == "get_weather"
    if ok:
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    check("responses: function_call", ok, f)
