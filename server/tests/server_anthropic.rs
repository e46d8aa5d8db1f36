//! `qkv-server`'s Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`) and
//! OpenAI Responses API (`/v1/responses`) over loopback, on the default model (the
//! `network_…` tests skip with a printed reason without it): whole and streamed answers
//! (streamed text equal to the whole at temperature 0, Anthropic's event order and names),
//! `system`, content blocks, `stop_sequences`, forced `tool_use` with its input streamed as
//! `input_json_delta` fragments, `tool_result` fed back, `thinking` accepted, token counts
//! equal to the chat route's prompt tokens, errors in Anthropic's shape, and `x-api-key`.
//! Also issue 28's leftovers on the chat route: a tool call streamed while it is generated
//! (a call cut by `max_tokens` still streams its name and arguments so far), and a `strict`
//! function under `tool_choice: "auto"` held to its schema once a call starts.

mod support;

use serde_json::{json, Value};
use support::{next_chunk, Server};

/// The named events of a streamed answer: (event name, data).
fn events(s: &Server, path: &str, body: &Value) -> Vec<(String, Value)> {
    let (status, chunked, mut r) = s.send("POST", path, body.to_string().as_bytes());
    assert_eq!((status, chunked), (200, true), "{path}");
    let mut text = String::new();
    while let Some(c) = next_chunk(&mut r) {
        text.push_str(std::str::from_utf8(&c).unwrap());
    }
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap_or_else(|_| panic!("{d}"));
                }
            }
            assert_eq!(data["type"], name, "an event's name is its data's type");
            (name, data)
        })
        .collect()
}

fn weather_tool() -> Value {
    json!({
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": false
        }
    })
}

/// Checks a `get_weather` input against its schema.
fn check_input(input: &Value) {
    let o = input.as_object().unwrap_or_else(|| panic!("{input}"));
    assert_eq!(o.len(), 2, "{input}");
    assert!(o["city"].as_str().is_some_and(|c| c.chars().count() <= 20));
    assert!(["celsius", "fahrenheit"].contains(&o["unit"].as_str().unwrap()));
}

#[test]
fn network_messages_whole_and_streamed() {
    let Some(s) = Server::start(&[]) else { return };
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 12,
        "temperature": 0,
        "system": [{"type": "text", "text": "You are a helpful assistant."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Name a"},
            {"type": "text", "text": " color."}]}],
        "metadata": {"user_id": "u1"},
    });
    let m = s.json("/v1/messages", &body);
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(m["model"], "smollm2", "the served name");
    let text = m["content"][0]["text"].as_str().unwrap().to_owned();
    assert_eq!(m["content"][0]["type"], "text");
    assert!(!text.is_empty());
    assert!(["end_turn", "max_tokens"].contains(&m["stop_reason"].as_str().unwrap()));
    let u = &m["usage"];
    let out = u["output_tokens"].as_u64().unwrap();
    assert!(out > 0 && out <= 12, "{m}");
    assert!(
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap() > 0
    );
    assert!(m.get("timings").is_none());

    // Streamed: Anthropic's events in order, the same text at temperature 0.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let ev = events(&s, "/v1/messages", &sb);
    let names: Vec<&str> = ev.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names[0], "message_start");
    assert_eq!(names[1], "content_block_start");
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(names[2..names.len() - 3]
        .iter()
        .all(|n| *n == "content_block_delta"));
    let start = &ev[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert!(start["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(ev[1].1["index"], 0);
    assert_eq!(ev[1].1["content_block"]["type"], "text");
    let streamed: String = ev
        .iter()
        .filter(|e| e.0 == "content_block_delta")
        .map(|e| {
            assert_eq!(e.1["delta"]["type"], "text_delta");
            e.1["delta"]["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(streamed, text);
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], m["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"].as_u64(), Some(out));

    // stop_sequences end the text before the sequence.
    let cut = text.chars().nth(3).unwrap().to_string();
    let mut stopped = body.clone();
    stopped["stop_sequences"] = json!([cut]);
    let m2 = s.json("/v1/messages", &stopped);
    let t2 = m2["content"][0]["text"].as_str().unwrap();
    assert_eq!(t2, &text[..text.find(&cut).unwrap()], "{m2}");

    // A conversation, thinking asked for, an empty one (one empty user turn).
    for extra in [
        json!({"messages": [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "How are you?"}]}),
        json!({"thinking": {"type": "enabled", "budget_tokens": 50}}),
        json!({"messages": []}),
    ] {
        let mut b = body.clone();
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let m = s.json("/v1/messages", &b);
        assert_eq!(m["type"], "message", "{m}");
    }
}

#[test]
fn network_count_tokens_is_the_chat_prompt() {
    let Some(s) = Server::start(&[]) else { return };
    let messages = json!([{"role": "user", "content": "Hello world"}]);
    let c = s.json(
        "/v1/messages/count_tokens",
        &json!({"model": "x", "system": "Be brief.", "messages": messages}),
    );
    assert_eq!(c.as_object().unwrap().len(), 1, "{c}");
    let chat = s.json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "system", "content": "Be brief."}, messages[0]],
            "max_tokens": 1}),
    );
    assert_eq!(c["input_tokens"], chat["usage"]["prompt_tokens"]);
    // With tools: the same prompt as the chat route renders with them.
    let with_tools = s.json(
        "/v1/messages/count_tokens",
        &json!({"messages": messages, "tools": [weather_tool()]}),
    );
    let chat = s.json(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 1, "tools": [{"type": "function",
            "function": {"name": "get_weather", "description": "The weather in a city",
                "parameters": weather_tool()["input_schema"]}}]}),
    );
    assert_eq!(with_tools["input_tokens"], chat["usage"]["prompt_tokens"]);
}

#[test]
fn network_tool_use_whole_streamed_and_fed_back() {
    let Some(s) = Server::start(&[]) else { return };
    let body = json!({
        "max_tokens": 80,
        "temperature": 0,
        "tools": [weather_tool()],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
    });
    let m = s.json("/v1/messages", &body);
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let block = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{m}"))
        .clone();
    assert_eq!(block["name"], "get_weather");
    assert!(block["id"].as_str().is_some_and(|i| !i.is_empty()));
    check_input(&block["input"]);

    // Streamed: a tool_use block, its input in several input_json_delta fragments.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let ev = events(&s, "/v1/messages", &sb);
    let start = ev
        .iter()
        .find(|e| e.0 == "content_block_start" && e.1["content_block"]["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{ev:?}"));
    assert_eq!(start.1["content_block"]["name"], "get_weather");
    let index = &start.1["index"];
    let fragments: Vec<&str> = ev
        .iter()
        .filter(|e| e.0 == "content_block_delta" && &e.1["index"] == index)
        .map(|e| {
            assert_eq!(e.1["delta"]["type"], "input_json_delta");
            e.1["delta"]["partial_json"].as_str().unwrap()
        })
        .collect();
    assert!(fragments.len() > 2, "{fragments:?}");
    let input: Value = serde_json::from_str(&fragments.concat()).unwrap();
    assert_eq!(input, block["input"], "streamed = whole at temperature 0");
    let stops = ev.iter().filter(|e| e.0 == "content_block_stop").count();
    let starts = ev.iter().filter(|e| e.0 == "content_block_start").count();
    assert_eq!(starts, stops);
    assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "tool_use");

    // `any` is a required call of some tool.
    let mut any = body.clone();
    any["tool_choice"] = json!({"type": "any", "disable_parallel_tool_use": true});
    let m = s.json("/v1/messages", &any);
    let calls = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .count();
    assert_eq!(calls, 1, "{m}");

    // The result fed back: the answer is text, and the result is in the prompt.
    let result = |content: Value, error: bool| {
        json!({
            "max_tokens": 20,
            "temperature": 0,
            "tools": [weather_tool()],
            "messages": [
                {"role": "user", "content": "What's the weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Look it up.", "signature": ""},
                    {"type": "tool_use", "id": block["id"], "name": "get_weather", "input": block["input"]}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": block["id"], "content": content, "is_error": error},
                    {"type": "text", "text": "Thanks."}]}
            ]
        })
    };
    let m = s.json("/v1/messages", &result(json!("Sunny, 25 C"), false));
    assert_eq!(m["content"][0]["type"], "text", "{m}");
    let short = s.json("/v1/messages/count_tokens", &result(json!("x"), false));
    let long = s.json(
        "/v1/messages/count_tokens",
        &result(
            json!([{"type": "text", "text": "Sunny, 25 C, light wind from the west"}]),
            true,
        ),
    );
    assert!(long["input_tokens"].as_u64() > short["input_tokens"].as_u64());
}

#[test]
fn network_errors_are_in_anthropics_shape() {
    let Some(s) = Server::start(&["--api-key", "sk-test"]) else {
        return;
    };
    let k = s.with_key(Some("sk-test"));
    let check = |body: Value, status: u16, kind: &str, says: &str| {
        let (st, text) = k.call("POST", "/v1/messages", &body);
        assert_eq!(st, status, "{body}: {text}");
        let e: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(e["type"], "error", "{text}");
        assert_eq!(e["error"]["type"], kind, "{text}");
        let m = e["error"]["message"].as_str().unwrap();
        assert!(m.contains(says), "{m} should name {says}");
    };
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    check(
        json!({"max_tokens": 5}),
        400,
        "invalid_request_error",
        "messages",
    );
    check(
        json!({"messages": msgs, "max_tokens": 0}),
        400,
        "invalid_request_error",
        "max_tokens",
    );
    check(
        json!({"messages": msgs, "stop_sequences": ["a", "b", "c", "d", "e"]}),
        400,
        "invalid_request_error",
        "stop_sequences",
    );
    check(
        json!({"messages": msgs, "tools": [{"name": "f", "input_schema": {"type": "object",
            "properties": {"a": {"type": 7}}}}]}),
        400,
        "invalid_request_error",
        "tools[0].input_schema",
    );
    check(
        json!({"messages": msgs, "tools": [weather_tool()], "tool_choice": {"type": "tool", "name": "nope"}}),
        400,
        "invalid_request_error",
        "tool_choice.name",
    );
    check(
        json!({"messages": [{"role": "user", "content": [{"type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}),
        500,
        "api_error",
        "image input is not supported",
    );
    // Anthropic's clients send the key as x-api-key.
    let (st, _) = s.call(
        "POST",
        "/v1/messages/count_tokens",
        &json!({"messages": msgs}),
    );
    assert_eq!(st, 401);
    let (status, _, mut r) = {
        use std::io::Write;
        let mut c = s.connect();
        let body = json!({"messages": msgs}).to_string();
        write!(
            c,
            "POST /v1/messages/count_tokens HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             x-api-key: sk-test\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut r = std::io::BufReader::new(c);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut r, &mut line).unwrap();
        (
            line.split(' ').nth(1).unwrap().parse::<u16>().unwrap(),
            (),
            r,
        )
    };
    assert_eq!(status, 200);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut r, &mut rest).unwrap();
    assert!(rest.contains("input_tokens"), "{rest}");
}

#[test]
fn network_responses_whole_and_streamed() {
    let Some(s) = Server::start(&[]) else { return };
    let body = json!({
        "model": "gpt-4.1",
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}],
        "max_output_tokens": 10,
        "temperature": 0,
    });
    let r = s.json("/v1/responses", &body);
    assert!(r["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(r["object"], "response");
    let item = &r["output"][0];
    assert!(item["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(item["content"][0]["type"], "output_text");
    let text = item["content"][0]["text"].as_str().unwrap().to_owned();
    assert!(!text.is_empty());
    assert!(["completed", "incomplete"].contains(&r["status"].as_str().unwrap()));
    let u = &r["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap())
    );

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let ev = events(&s, "/v1/responses", &sb);
    let names: Vec<&str> = ev.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        names[names.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    for (k, e) in ev.iter().enumerate() {
        assert_eq!(e.1["sequence_number"], k);
    }
    let streamed: String = ev
        .iter()
        .filter(|e| e.0 == "response.output_text.delta")
        .map(|e| e.1["delta"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, text);
    let done = &ev[ev.len() - 1].1["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], text.as_str());
    assert!(done["usage"]["output_tokens"].as_u64().unwrap() > 0);

    // A forced function call is a function_call item; a string input works too.
    let call = s.json(
        "/v1/responses",
        &json!({"input": "What's the weather in Paris?", "max_output_tokens": 80,
            "tools": [{"type": "function", "name": "get_weather",
                "parameters": weather_tool()["input_schema"]}],
            "tool_choice": "required", "temperature": 0}),
    );
    let item = &call["output"][0];
    assert_eq!(item["type"], "function_call", "{call}");
    assert_eq!(item["name"], "get_weather");
    check_input(&serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap());

    // Faults name the Responses field.
    for (b, name) in [
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({}), "input"),
    ] {
        let (st, t) = s.call("POST", "/v1/responses", &b);
        assert_eq!(st, 400, "{t}");
        let e: Value = serde_json::from_str(&t).unwrap();
        assert_eq!(e["error"]["param"], name, "{t}");
    }
}

#[test]
fn network_a_streamed_call_arrives_while_it_is_generated() {
    let Some(s) = Server::start(&[]) else { return };
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": weather_tool()["input_schema"]}}]);
    // Cut by max_tokens inside the arguments: the whole reply has no complete call, yet the
    // stream already sent the name and the arguments generated so far.
    let head = s.json(
        "/tokenize",
        &json!({"content": "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {"}),
    );
    let n = head["tokens"].as_array().unwrap().len();
    let body = json!({"messages": [{"role": "user", "content": "What's the weather in Paris?"}],
        "tools": tools, "tool_choice": "required", "max_tokens": n + 3, "temperature": 0,
        "stream": true});
    let chunks = s.stream("/v1/chat/completions", &body).all();
    let mut name = None;
    let mut args = String::new();
    let mut finish = None;
    for ch in &chunks {
        let c = &ch["choices"][0];
        for d in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            if let Some(n) = d["function"]["name"].as_str() {
                assert!(args.is_empty(), "the name comes first");
                name = Some(n.to_owned());
            }
            args.push_str(d["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
    }
    assert_eq!(name.as_deref(), Some("get_weather"), "{chunks:?}");
    assert_eq!(finish.as_deref(), Some("length"));
    assert!(
        args.starts_with("{\"") && serde_json::from_str::<Value>(&args).is_err(),
        "{args}"
    );
}

/// A `strict` function under `auto`, on the default model's vocabulary: free text stays
/// free; once a call starts (the generic format's `{`, a Hermes `<tool_call>`), its
/// arguments must follow the schema, and after a Hermes call the text is free again.
#[test]
fn network_strict_functions_under_auto_are_held_to_their_schema() {
    use qkv::engine::TokenConstraint;
    use qkv_server::tools::{tool_request, ToolFormat};
    let Some(path) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    let model = std::sync::Arc::new(
        qkv::load::Model::load(&path, &qkv::load::ModelOptions::default()).unwrap(),
    );
    let grammars = qkv_server::constraint::Grammars::new(model.clone()).unwrap();
    let tok = model.tokenizer().unwrap();
    let encode = |t: &str| {
        tok.encode_with(
            t,
            qkv::tokenizer::EncodeOptions {
                add_special: false,
                parse_special: false,
            },
        )
        .unwrap()
    };
    let body = qkv_server::body::Body::parse(
        json!({"tools": [{"type": "function", "function": {"name": "get_weather", "strict": true,
            "parameters": weather_tool()["input_schema"]}}]})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let tools = body.field("tools").unwrap().as_array().unwrap().clone();
    let req = tool_request(&body, Some(&tools)).unwrap().unwrap();
    let make = |format| {
        qkv_server::strict_calls::strict_calls(&req, format, &grammars, model.clone())
            .unwrap()
            .expect("a strict tool under auto is constrained")
    };
    let commit = |c: &mut dyn TokenConstraint, text: &str| {
        for t in encode(text) {
            assert!(c.allows(t), "{text}: token {t} refused");
            c.commit(t).unwrap();
        }
    };
    let five = encode("5")[0];
    // The generic format: a reply that opens with `{` is a call.
    let mut c = make(ToolFormat::Generic);
    commit(
        &mut c,
        r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "#,
    );
    assert!(!c.allows(five), "a number where the schema wants a string");
    commit(&mut c, r#""Paris", "unit": "#);
    // A reply that opens with text is free.
    let mut c = make(ToolFormat::Generic);
    commit(&mut c, "Sure, ");
    commit(&mut c, r#"{"city": 5}"#);
    // Hermes: free, then the call after the marker, then free again.
    let mut c = make(ToolFormat::Hermes);
    commit(&mut c, "Let me check. 5 {");
    commit(&mut c, "<tool_call>");
    assert!(!c.allows(five));
    commit(
        &mut c,
        "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ",
    );
    assert!(!c.allows(five));
    commit(&mut c, "\"Paris\", \"unit\": \"celsius\"}}\n</tool_call>");
    assert!(c.allows(five), "free again after the call");
}
