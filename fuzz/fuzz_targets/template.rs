//! Chat-template rendering with arbitrary templates, messages and variables.
//!
//! Input: the template source, then optionally a 0xFF byte and a JSON list of messages, then
//! optionally another 0xFF byte and a JSON object of extra variables (which can override
//! `add_generation_prompt`, `tools`, `bos_token`…). 0xFF never occurs in UTF-8, so the seeds
//! stay readable. Rendering must end with text or a typed error (never the engine's panic),
//! within the renderer's fuel and output bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qkv::tokenizer::{ChatOptions, ChatTemplate};
use serde_json::{json, Value};
use std::time::{Duration, UNIX_EPOCH};

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == 0xFF);
    let Ok(source) = std::str::from_utf8(parts.next().unwrap_or_default()) else {
        return;
    };
    let messages = match parts.next().map(serde_json::from_slice::<Value>) {
        Some(Ok(Value::Array(m))) => m,
        Some(Ok(other)) => vec![other],
        _ => vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Hi!"}),
            json!({"role": "assistant", "content": "Hello."}),
        ],
    };
    let extra = match parts.next().map(serde_json::from_slice::<Value>) {
        Some(Ok(Value::Object(m))) => m,
        _ => Default::default(),
    };
    let options = ChatOptions {
        add_generation_prompt: true,
        tools: None,
        extra,
        // A fixed clock: strftime_now renders the same on every run.
        now: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
    };
    // A quarter of the default fuel: the hostile renders the target finds run out of it, and
    // a render that takes more than the 10 s timeout on this budget (a pure instruction loop
    // burns it in under 2 s in this build) does work the fuel does not see.
    let template = ChatTemplate::new("fuzz", source)
        .with_special_tokens(Some("<s>"), Some("</s>"))
        .with_fuel(qkv::tokenizer::MAX_TEMPLATE_FUEL / 4);
    match template.render(&messages, &options) {
        Ok(text) => assert!(
            text.len() <= qkv::tokenizer::MAX_TEMPLATE_OUTPUT,
            "a render returned {} bytes, past the bound",
            text.len()
        ),
        // `render` turns a panic in the engine into an error; here it is still a finding.
        Err(qkv::Error::ChatTemplate { msg, .. }) => {
            assert!(!msg.contains("engine panicked"), "{msg}")
        }
        Err(_) => {}
    }
});
