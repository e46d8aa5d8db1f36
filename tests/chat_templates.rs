//! Every chat template in llama.cpp's `models/templates/` rendered by qkv must equal what
//! transformers' `apply_chat_template(..., tokenize=False)` renders on the same conversation.
//!
//! The references come from `python3 tools/template_fixtures.py`, which `.ci/run` runs after
//! unpacking llama.cpp: `$QKV_CACHE/chat_templates/references.json` (or the file
//! `QKV_CHAT_TEMPLATE_REFS` names; made with the network). Without it the test is skipped
//! with a message, except under CI (`CI=true`), where it fails.

use qkv::tokenizer::{ChatOptions, ChatTemplate};
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

/// Renders known to differ from transformers, with why. Each must still differ (a fix shows
/// up as a failure asking to drop the entry). Only the extra cases (tools, a tool call) may be
/// listed: the fixed conversation must render equal on every template.
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[(
    "meetkai-functionary-medium-v3.1.jinja",
    "`'...'|safe + tool|tojson`: in Jinja2 a Markup string plus a plain one HTML-escapes \
         the plain one (the tool's JSON reaches the model as `{&#34;name&#34;: …`); minijinja \
         escapes on concatenation only when auto-escaping is on, which chat templates are not",
)];

fn references() -> Option<Value> {
    let path = match std::env::var_os("QKV_CHAT_TEMPLATE_REFS") {
        Some(p) => PathBuf::from(p),
        None => qkv_fetch::cache_dir()
            .expect("a cache directory")
            .join("chat_templates/references.json"),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(serde_json::from_str(&text).expect("references.json is JSON")),
        Err(e) => {
            let why = format!(
                "{}: {e} (write it with `python3 tools/template_fixtures.py`)",
                path.display()
            );
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{why}");
            }
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// Where two renders first differ, with a little context from each.
fn first_difference(got: &str, want: &str) -> String {
    let at = got
        .chars()
        .zip(want.chars())
        .take_while(|(a, b)| a == b)
        .count();
    let around = |s: &str| {
        let piece: String = s.chars().skip(at.saturating_sub(40)).take(80).collect();
        format!("{piece:?}")
    };
    format!(
        "character {at} of {} / {}: qkv {} vs transformers {}",
        got.chars().count(),
        want.chars().count(),
        around(got),
        around(want)
    )
}

#[test]
fn network_llama_cpp_templates_render_as_in_transformers() {
    let Some(refs) = references() else { return };
    let dir = PathBuf::from(refs["templates_dir"].as_str().unwrap());
    let now = UNIX_EPOCH + Duration::from_secs(refs["now_unix"].as_u64().unwrap());
    let bos = refs["bos_token"].as_str();
    let eos = refs["eos_token"].as_str();
    let conversations = &refs["conversations"];
    let tools: Vec<Value> = refs["tools"].as_array().unwrap().clone();
    let entries = refs["templates"].as_array().unwrap();

    let mut renderable = 0;
    // Templates whose fixed conversation renders equal, and those whose every case does.
    let (mut equal_base, mut equal_all) = (0, 0);
    let mut cases = 0;
    let mut mismatches = Vec::new();
    let mut known_seen = Vec::new();
    let mut not_rendered = Vec::new();
    for entry in entries {
        let name = entry["name"].as_str().unwrap();
        let Some(renders) = entry["renders"].as_array() else {
            not_rendered.push(format!(
                "{name}: transformers fails: {}",
                entry["transformers_fails"].as_str().unwrap_or("?")
            ));
            continue;
        };
        renderable += 1;
        let source = std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()));
        let template = ChatTemplate::new(name, source).with_special_tokens(bos, eos);
        let known = KNOWN_DIFFERENCES.iter().find(|(n, _)| *n == name);
        let (mut base_ok, mut all_ok) = (true, true);
        for (i, case) in renders.iter().enumerate() {
            cases += 1;
            let conversation = case["conversation"].as_str().unwrap();
            let messages = conversations[conversation].as_array().unwrap();
            let options = ChatOptions {
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                tools: case["tools"].as_bool().unwrap().then(|| tools.clone()),
                now: Some(now),
                ..ChatOptions::default()
            };
            // The first two renders are the fixed conversation (with or without its system
            // message, with tools only where a template needs them), with and without the
            // generation prompt; the others (tools, a tool call) are extra cases.
            let base = i < 2;
            let what = format!(
                "{name} [{conversation}{}, add_generation_prompt={}]",
                if options.tools.is_some() {
                    " + tools"
                } else {
                    ""
                },
                options.add_generation_prompt
            );
            let want = case["text"].as_str().unwrap();
            let difference = match template.render(messages, &options) {
                Ok(got) if got == want => None,
                Ok(got) => Some(first_difference(&got, want)),
                Err(e) => Some(format!("qkv fails: {e}")),
            };
            let Some(difference) = difference else {
                continue;
            };
            all_ok = false;
            base_ok &= !base;
            match known {
                Some((_, why)) if !base => known_seen.push(format!("{what}: {why}")),
                _ => mismatches.push(format!("{what}: {difference}")),
            }
        }
        equal_base += usize::from(base_ok);
        equal_all += usize::from(all_ok);
    }
    eprintln!(
        "{} templates; transformers renders {renderable}; qkv renders the fixed conversation \
         equal on {equal_base} of them, and every case (with tools, a tool call) on \
         {equal_all}; {cases} renders compared",
        entries.len()
    );
    for n in &not_rendered {
        eprintln!("  not compared: {n}");
    }
    for k in &known_seen {
        eprintln!("  known difference: {k}");
    }
    for (name, _) in KNOWN_DIFFERENCES {
        if !known_seen.iter().any(|k| k.starts_with(name)) {
            mismatches.push(format!(
                "{name}: renders equal now; drop it from KNOWN_DIFFERENCES"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {cases} renders differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    // The references must cover the folder: a fixture run that rendered almost nothing (a
    // broken transformers install) must not pass as agreement.
    assert!(
        renderable >= 60,
        "transformers rendered only {renderable} of {} templates",
        entries.len()
    );
    assert_eq!(equal_base, renderable);
    assert_eq!(equal_all, renderable - KNOWN_DIFFERENCES.len());
}
