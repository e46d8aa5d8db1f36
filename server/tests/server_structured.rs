//! `qkv-server`'s constrained output and tool calls over loopback. On the default model
//! (the `network_…` tests, which skip with a printed reason without it): `response_format`
//! json_schema (nested objects, arrays with `maxItems`, enums) and json_object with sampling
//! on, llama-server's `json_schema` and `grammar` fields, forced tool calls (named and
//! `required`) whole and streamed with their arguments checked against their schema, and a
//! tool result fed back. On the synthetic model (offline): every malformed constraint or
//! tool field is a 400 naming the field. The parsers of each family's tool-call format are
//! tested on literal model outputs in server/src/tools_tests.rs.

mod support;

use serde_json::{json, Value};
use support::Server;

fn chat(content: &str, extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 200,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}, "zip": {"type": "string", "maxLength": 10}},
                "required": ["city", "zip"],
                "additionalProperties": false
            },
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}
        },
        "required": ["name", "age", "role", "address", "tags"],
        "additionalProperties": false
    })
}

/// Checks `v` against [`person_schema`] by hand.
fn check_person(v: &Value) {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    assert_eq!(o.len(), 5, "{v}");
    assert!(
        o["name"].as_str().is_some_and(|s| s.chars().count() <= 24),
        "{v}"
    );
    assert!(o["age"].as_u64().is_some_and(|a| a <= 120), "{v}");
    assert!(
        ["admin", "user", "guest"].contains(&o["role"].as_str().unwrap_or("")),
        "{v}"
    );
    let a = o["address"].as_object().unwrap();
    assert!(
        a["city"].is_string()
            && a["zip"].as_str().is_some_and(|z| z.chars().count() <= 10)
            && a.len() == 2,
        "{v}"
    );
    let tags = o["tags"].as_array().unwrap();
    assert!(tags.len() <= 3 && tags.iter().all(Value::is_string), "{v}");
}

#[test]
fn network_json_schema_outputs_follow_the_schema_with_sampling_on() {
    let Some(s) = Server::start(&[]) else { return };
    for seed in 0..6 {
        let r = s.json(
            "/v1/chat/completions",
            &chat(
                "Describe a user of a web site as JSON.",
                json!({"temperature": 0.9, "seed": seed, "response_format": {"type": "json_schema",
                    "json_schema": {"name": "person", "strict": true, "schema": person_schema()}}}),
            ),
        );
        let c = &r["choices"][0];
        assert_eq!(c["finish_reason"], "stop", "{r}");
        let text = c["message"]["content"].as_str().unwrap();
        check_person(&serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}")));
    }
}

#[test]
fn network_json_object_grammar_and_llama_server_fields() {
    let Some(s) = Server::start(&[]) else { return };
    let r = s.json(
        "/v1/chat/completions",
        &chat(
            "Reply with a small JSON object with two keys.",
            json!({"temperature": 0, "max_tokens": 400, "response_format": {"type": "json_object"}}),
        ),
    );
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        serde_json::from_str::<Value>(text).unwrap().is_object(),
        "{text}"
    );
    // llama-server's fields, on the completion route too.
    let r = s.json(
        "/v1/completions",
        &json!({"prompt": "Is the sky blue? Answer:", "max_tokens": 10, "grammar": "start: \" yes\" | \" no\""}),
    );
    let text = r["choices"][0]["text"].as_str().unwrap();
    assert!(text == " yes" || text == " no", "{text:?}");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let r = s.json(
        "/v1/chat/completions",
        &chat("Pick numbers.", json!({"temperature": 1.0, "seed": 5,
            "json_schema": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}})),
    );
    let v: Value =
        serde_json::from_str(r["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert!(
        v.as_array()
            .is_some_and(|a| a.len() == 2 && a.iter().all(Value::is_i64)),
        "{v}"
    );
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"], "additionalProperties": false}}}
    ])
}

/// Checks a call's name and arguments against [`weather_tools`].
fn check_call(name: &str, arguments: &str) {
    let a: Value = serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{e}: {arguments}"));
    let o = a.as_object().unwrap();
    match name {
        "get_weather" => {
            assert!(o["city"].is_string() && o.len() == 2, "{a}");
            assert!(
                ["celsius", "fahrenheit"].contains(&o["unit"].as_str().unwrap()),
                "{a}"
            );
        }
        "add" => assert!(o["a"].is_i64() && o["b"].is_i64() && o.len() == 2, "{a}"),
        other => panic!("unknown tool {other}"),
    }
}

#[test]
fn network_forced_tool_calls_whole_and_streamed() {
    let Some(s) = Server::start(&[]) else { return };
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for (choice, seed) in [
        (named.clone(), 0),
        (json!("required"), 1),
        (json!("required"), 2),
    ] {
        let body = chat(
            "What is the weather in Paris?",
            json!({"tools": weather_tools(), "tool_choice": choice, "temperature": 0.8, "seed": seed}),
        );
        let r = s.json("/v1/chat/completions", &body);
        let c = &r["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{r}");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert!(!calls.is_empty());
        for call in calls {
            assert_eq!(call["type"], "function");
            assert!(call["id"].as_str().is_some_and(|i| !i.is_empty()));
            let f = &call["function"];
            if choice == named {
                assert_eq!(f["name"], "get_weather");
            }
            check_call(
                f["name"].as_str().unwrap(),
                f["arguments"].as_str().unwrap(),
            );
        }
        // Streamed: the same calls, the name first, then the argument fragments.
        let mut stream_body = body.clone();
        stream_body["stream"] = json!(true);
        let chunks = s.stream("/v1/chat/completions", &stream_body).all();
        let mut names: Vec<String> = Vec::new();
        let mut args: Vec<String> = Vec::new();
        let mut finish = None;
        for ch in &chunks {
            let choice = &ch["choices"][0];
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = Some(f.to_owned());
            }
            for d in choice["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let i = d["index"].as_u64().unwrap() as usize;
                if let Some(n) = d["function"]["name"].as_str() {
                    assert_eq!(i, names.len(), "a call's name comes first");
                    assert!(d["id"].is_string());
                    names.push(n.to_owned());
                    args.push(String::new());
                }
                args[i].push_str(d["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        assert_eq!(finish.as_deref(), Some("tool_calls"));
        assert_eq!(names.len(), calls.len(), "the same seed, the same calls");
        for (k, call) in calls.iter().enumerate() {
            assert_eq!(call["function"]["name"], names[k]);
            assert_eq!(call["function"]["arguments"], args[k]);
        }
    }
    // parallel_tool_calls: false gives one call.
    let r = s.json(
        "/v1/chat/completions",
        &chat("Add 2 and 3, and the weather in Rome.", json!({"tools": weather_tools(),
            "tool_choice": "required", "parallel_tool_calls": false, "temperature": 0.9, "seed": 4})),
    );
    assert_eq!(
        r["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "{r}"
    );
}

#[test]
fn network_a_tool_result_is_fed_back() {
    let Some(s) = Server::start(&[]) else { return };
    let messages = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21, \"sky\": \"sunny\"}"}
    ]);
    let body =
        json!({"messages": messages, "tools": weather_tools(), "max_tokens": 30, "temperature": 0});
    let r = s.json("/v1/chat/completions", &body);
    let c = &r["choices"][0];
    assert!(
        c["message"]["content"].is_string() || c["message"]["tool_calls"].is_array(),
        "{r}"
    );
    // The tool's answer reached the prompt.
    let without =
        json!({"messages": [messages[0].clone()], "tools": weather_tools(), "max_tokens": 1});
    let short = s.json("/v1/chat/completions", &without);
    assert!(
        r["usage"]["prompt_tokens"].as_u64().unwrap()
            > short["usage"]["prompt_tokens"].as_u64().unwrap() + 10,
        "{r}"
    );
}

#[test]
fn bad_constraints_and_tool_fields_are_400s_naming_the_field() {
    let s = Server::start_synthetic(&[]);
    let tools = weather_tools();
    for (extra, param) in [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true,
                "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format.type",
        ),
        (json!({"json_schema": {"type": "strange"}}), "json_schema"),
        (json!({"grammar": "start: ( \"a\""}), "grammar"),
        (
            json!({"tools": tools, "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"x": {"type": 7}}}}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [{"type": "function", "function": {}}]}),
            "tools[0].function.name",
        ),
    ] {
        let (status, text) = s.call("POST", "/v1/chat/completions", &chat("hi", extra.clone()));
        assert_eq!(status, 400, "{extra}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], param, "{extra}: {text}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    // The server is still up.
    assert_eq!(s.get("/health").0, 200);
}
