use super::*;

fn names() -> Vec<String> {
    vec!["get_weather".into(), "add".into()]
}

fn read(json: &str) -> Result<Option<ToolRequest>, ApiError> {
    let b = Body::parse(json.as_bytes()).unwrap();
    let tools = b.field("tools").and_then(Value::as_array).cloned();
    tool_request(&b, tools.as_deref())
}

const TOOLS: &str = r#""tools": [{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
    "required": ["city"]}}}, {"type": "function", "function": {"name": "add"}}]"#;

#[test]
fn each_family_format_is_parsed() {
    let weather = ToolCall {
        name: "get_weather".into(),
        arguments: r#"{"city":"Oslo"}"#.into(),
    };
    let add = ToolCall {
        name: "add".into(),
        arguments: r#"{"a":1,"b":2}"#.into(),
    };
    for (format, text, content, calls) in [
        // Qwen2.5 / Hermes, with text before, two calls.
        (
            ToolFormat::Hermes,
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
            "Let me check.",
            vec![weather.clone(), add.clone()],
        ),
        // A closing tag cut off by max_tokens.
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}",
            "",
            vec![add.clone()],
        ),
        // Llama 3.x: a bare object with `parameters`, with and without the python tag.
        (
            ToolFormat::Llama3,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
            "",
            vec![weather.clone()],
        ),
        (
            ToolFormat::Llama3,
            "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
            "",
            vec![add.clone(), weather.clone()],
        ),
        // Mistral, both spellings.
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]",
            "",
            vec![weather.clone()],
        ),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS]add[ARGS]{\"a\": 1, \"b\": 2}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}",
            "",
            vec![add.clone(), weather.clone()],
        ),
        // Generic JSON, and arguments written as a JSON string.
        (
            ToolFormat::Generic,
            "{\"tool_calls\": [{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]}",
            "",
            vec![add.clone()],
        ),
        (
            ToolFormat::Generic,
            "{\"tool_call\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}}",
            "",
            vec![weather.clone()],
        ),
    ] {
        let r = parse_reply(format, text, &names());
        assert_eq!(r.calls, calls, "{format:?}: {text}");
        assert_eq!(r.content, content, "{format:?}: {text}");
    }
}

#[test]
fn text_that_is_not_a_call_stays_content() {
    for text in [
        "The weather is fine.",
        "{\"name\": \"unknown_tool\", \"arguments\": {}}",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
        "{\"answer\": 42}",
        "[TOOL_CALLS] not json",
    ] {
        let r = parse_reply(ToolFormat::Hermes, text, &names());
        assert!(r.calls.is_empty(), "{text}");
        assert_eq!(r.content, text.trim(), "{text}");
    }
    // Without tools nothing is parsed as a call.
    let r = parse_reply(
        ToolFormat::Generic,
        "{\"name\": \"add\", \"arguments\": {}}",
        &[],
    );
    assert!(r.calls.is_empty());
}

#[test]
fn reasoning_is_split_off() {
    let r = parse_reply(
        ToolFormat::Hermes,
        "<think>\nThe user wants Oslo.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        &names(),
    );
    assert_eq!(r.reasoning.as_deref(), Some("The user wants Oslo."));
    assert_eq!(r.calls.len(), 1);
    let r = parse_reply(ToolFormat::Hermes, "<think>hmm</think>Hello", &[]);
    assert_eq!(
        (r.reasoning.as_deref(), r.content.as_str()),
        (Some("hmm"), "Hello")
    );
    let r = parse_reply(ToolFormat::Hermes, "<think>cut off", &[]);
    assert_eq!(
        (r.reasoning.as_deref(), r.content.as_str()),
        (Some("cut off"), "")
    );
    let r = parse_reply(ToolFormat::Hermes, "plain", &[]);
    assert_eq!((r.reasoning, r.content.as_str()), (None, "plain"));
}

#[test]
fn formats_are_picked_from_templates() {
    for (t, f) in [
        ("{{'<tool_call>'}}", ToolFormat::Hermes),
        ("[TOOL_CALLS]", ToolFormat::Mistral),
        ("<|python_tag|>", ToolFormat::Llama3),
        ("<|im_start|>", ToolFormat::Generic),
    ] {
        assert_eq!(ToolFormat::from_template(Some(t)), f);
    }
    assert_eq!(ToolFormat::from_template(None), ToolFormat::Generic);
}

#[test]
fn tool_fields_are_read() {
    assert_eq!(read("{}").unwrap(), None);
    assert_eq!(read(r#"{"tool_choice": "none"}"#).unwrap(), None);
    let r = read(&format!("{{{TOOLS}}}")).unwrap().unwrap();
    assert_eq!(
        (r.choice.clone(), r.parallel, r.tools.len()),
        (ToolChoice::Auto, true, 2)
    );
    assert_eq!(
        r.tools[1].parameters["type"], "object",
        "missing parameters: no arguments"
    );
    let r = read(&format!(
        r#"{{{TOOLS}, "tool_choice": {{"type": "function", "function": {{"name": "add"}}}},
        "parallel_tool_calls": false}}"#
    ))
    .unwrap()
    .unwrap();
    assert_eq!(
        (r.choice, r.parallel),
        (ToolChoice::Named("add".into()), false)
    );
}

#[test]
fn bad_tool_fields_name_their_field() {
    for (json, name) in [
        (r#"{"tool_choice": "required"}"#.to_owned(), "tool_choice"),
        (format!(r#"{{{TOOLS}, "tool_choice": "always"}}"#), "tool_choice"),
        (format!(r#"{{{TOOLS}, "tool_choice": 3}}"#), "tool_choice"),
        (
            format!(r#"{{{TOOLS}, "tool_choice": {{"type": "function", "function": {{"name": "nope"}}}}}}"#),
            "tool_choice.function.name",
        ),
        (
            format!(r#"{{{TOOLS}, "tool_choice": {{"type": "function"}}}}"#),
            "tool_choice.function.name",
        ),
        (
            format!(r#"{{{TOOLS}, "tool_choice": {{"type": "tool", "function": {{"name": "add"}}}}}}"#),
            "tool_choice.type",
        ),
        (r#"{"tools": [{"type": "retrieval"}]}"#.to_owned(), "tools[0].type"),
        (r#"{"tools": [{"type": "function"}]}"#.to_owned(), "tools[0].function"),
        (
            r#"{"tools": [{"type": "function", "function": {"name": ""}}]}"#.to_owned(),
            "tools[0].function.name",
        ),
        (
            r#"{"tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]}"#.to_owned(),
            "tools[1].function.name",
        ),
        (
            r#"{"tools": [{"type": "function", "function": {"name": "a", "parameters": "x"}}]}"#.to_owned(),
            "tools[0].function.parameters",
        ),
        (
            r#"{"tools": [{"type": "function", "function": {"name": "a", "strict": "yes"}}]}"#.to_owned(),
            "tools[0].function.strict",
        ),
        (format!(r#"{{{TOOLS}, "parallel_tool_calls": 1}}"#), "parallel_tool_calls"),
    ] {
        let e = read(&json).err().unwrap_or_else(|| panic!("{json}"));
        assert_eq!(e.param.as_deref(), Some(name), "{json}");
    }
}

#[test]
fn forced_grammars_name_only_the_chosen_tools() {
    let r = read(&format!(
        r#"{{{TOOLS}, "tool_choice": {{"type": "function", "function": {{"name": "add"}}}}}}"#
    ))
    .unwrap()
    .unwrap();
    for f in [
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::Generic,
    ] {
        let g = r.forced_grammar(f).unwrap();
        assert!(g.contains("\"add\"") && !g.contains("get_weather"), "{g}");
    }
    let auto = read(&format!("{{{TOOLS}}}")).unwrap().unwrap();
    assert_eq!(auto.forced_grammar(ToolFormat::Hermes), None);
}

#[test]
fn template_messages_get_argument_objects() {
    let m = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
        "function": {"name": "add", "arguments": "{\"a\": 1}"}}]});
    let t = template_message(m.clone(), true);
    assert_eq!(t["tool_calls"][0]["function"]["arguments"]["a"], 1);
    assert_eq!(t["content"], "");
    // A template that does not read the calls sees them in the content.
    let t = template_message(m, false);
    assert_eq!(
        t["content"],
        r#"{"tool_calls":[{"name":"add","arguments":{"a":1}}]}"#
    );
}
