//! Speculative decoding in qkv-server, over loopback on the synthetic decoder (and the
//! default model in the `network_…` test): the server default (`--spec`, llama-server's
//! `--spec-type` / `--draft-max`), the per-request fields (`speculative.n_max` on
//! `/completion`, `speculative` on the OpenAI routes), the same text with and without
//! speculation, `timings.draft_n` / `draft_n_accepted` as llama-server reports them, and
//! `/metrics` counters that add up to them.

mod support;

use serde_json::{json, Value};
use support::{metric, synthetic, Server};

fn server(extra: &[&str]) -> Server {
    let model = synthetic();
    let args = [&["--model", model.as_str(), "--ctx", "512"][..], extra].concat();
    Server::spawn(&args).unwrap_or_else(|e| panic!("the server exited: {e}"))
}

/// A prompt that repeats itself: drafts are found in it.
fn repeating() -> String {
    "the cat sat on the mat and then there was another one in the garden. ".repeat(4)
}

/// `(draft_n, draft_n_accepted)` of an answer's timings; `None` when it has none.
fn drafts(r: &Value) -> Option<(u64, u64)> {
    let t = &r["timings"];
    assert!(t.is_object(), "no timings: {r}");
    match (t.get("draft_n"), t.get("draft_n_accepted")) {
        (Some(d), Some(a)) => Some((d.as_u64().unwrap(), a.as_u64().unwrap())),
        (None, None) => None,
        _ => panic!("one of draft_n and draft_n_accepted: {t}"),
    }
}

#[test]
fn a_server_default_speculates_greedy_requests_with_the_same_text() {
    let s = server(&[
        "--spec-type",
        "ngram-simple",
        "--draft-max",
        "5",
        "--metrics-llamacpp-names",
    ]);
    let body = |extra: Value| {
        let mut b = json!({"prompt": repeating(), "n_predict": 48, "temperature": 0,
                           "ignore_eos": true});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let fast = s.json("/completion", &body(json!({})));
    let plain = s.json("/completion", &body(json!({"speculative.n_max": 0})));
    let three = s.json(
        "/completion",
        &body(json!({"speculative.n_max": 3, "speculative.n_min": 1})),
    );
    assert_eq!(fast["content"], plain["content"]);
    assert_eq!(three["content"], plain["content"]);
    let (d, a) = drafts(&fast).expect("the default speculates");
    assert!(d > 0 && a <= d, "{d} {a}");
    assert_eq!(drafts(&plain), None, "n_max 0 turns it off");
    let (d3, a3) = drafts(&three).unwrap();
    assert!(d3 > 0 && a3 <= d3);
    // Sampling runs plainly whatever the server's default.
    let sampled = s.json("/completion", &body(json!({"temperature": 0.8, "seed": 5})));
    assert_eq!(drafts(&sampled), None);
    // The counters add up the requests' drafts.
    let (_, text) = s.get("/metrics");
    assert_eq!(
        metric(&text, "qkv_spec_draft_tokens_total"),
        (d + d3) as f64
    );
    assert_eq!(
        metric(&text, "qkv_spec_accepted_tokens_total"),
        (a + a3) as f64
    );
    assert!(metric(&text, "qkv_spec_drafts_total") > 0.0);
    assert_eq!(
        metric(&text, "llamacpp:spec_decode_num_draft_tokens_total"),
        (d + d3) as f64
    );
    assert_eq!(
        metric(&text, "llamacpp:spec_decode_num_accepted_tokens_total"),
        (a + a3) as f64
    );
    let props: Value = serde_json::from_str(&s.get("/props").1).unwrap();
    assert_eq!(props["default_generation_settings"]["speculative"], true);
}

#[test]
fn openai_routes_take_the_speculative_field() {
    let s = server(&[]);
    let chat = |spec: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": repeating()}],
                           "max_tokens": 40, "temperature": 0});
        if !spec.is_null() {
            b["speculative"] = spec;
        }
        s.json("/v1/chat/completions", &b)
    };
    let off = chat(Value::Null);
    assert_eq!(drafts(&off), None, "off by default");
    let on = chat(json!("ngram"));
    assert_eq!(on["choices"][0]["message"], off["choices"][0]["message"]);
    assert!(drafts(&on).unwrap().0 > 0);
    // llama-server's field works on the OpenAI routes too, and so does a stream.
    let completion = s.json(
        "/v1/completions",
        &json!({"prompt": repeating(), "max_tokens": 30, "temperature": 0,
                "speculative.n_max": 4}),
    );
    assert!(drafts(&completion).unwrap().0 > 0);
    let mut sse = s.stream(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": repeating()}], "max_tokens": 40,
                "temperature": 0, "stream": true, "speculative": true}),
    );
    let mut text = String::new();
    let mut last = Value::Null;
    while let Some(d) = sse.next() {
        if d == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&d).unwrap();
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        last = v;
    }
    assert_eq!(
        Some(text.as_str()),
        off["choices"][0]["message"]["content"].as_str()
    );
    assert!(drafts(&last).unwrap().0 > 0, "{last}");
}

#[test]
fn bad_speculation_fields_and_flags_are_refused() {
    let s = server(&["--spec", "off"]);
    for (body, param) in [
        (
            json!({"prompt": "a", "speculative": "eagle"}),
            "speculative",
        ),
        (
            json!({"prompt": "a", "speculative.n_max": -2}),
            "speculative.n_max",
        ),
        (
            json!({"prompt": "a", "speculative.n_max": 2, "speculative.n_min": 4}),
            "speculative.n_min",
        ),
    ] {
        let (status, text) = s.call("POST", "/completion", &body);
        assert_eq!(status, 400, "{text}");
        let e: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(e["error"]["param"], param, "{text}");
    }
    for flags in [
        &["--spec", "draft-simple"][..],
        &["--spec", "eagle"],
        &["--spec-max", "40"],
    ] {
        let model = synthetic();
        let args = [&["--model", model.as_str()][..], flags].concat();
        let err = Server::spawn(&args).err().expect("the server refuses");
        assert!(err.contains("--spec"), "{flags:?}: {err}");
    }
}

/// On the default model: a request that copies its input keeps most drafts, with the text
/// of plain decoding.
#[test]
fn network_speculation_keeps_drafts_on_text_that_copies() {
    let Some(s) = Server::start(&["--spec", "ngram"]) else {
        return;
    };
    let passage = "The lighthouse keeper climbed the spiral stairs every evening at dusk, \
        trimmed the wick, polished the great lens, and wrote the state of the sea in a \
        leather logbook that had belonged to his grandfather.";
    let prompt = format!(
        "Copy this passage exactly, twice.\n\nPassage: {passage}\n\nCopy 1: {passage}\n\nCopy 2:"
    );
    let body = |n_max: u64| json!({"prompt": prompt, "n_predict": 48, "temperature": 0, "speculative.n_max": n_max});
    let fast = s.json("/completion", &body(7));
    let plain = s.json("/completion", &body(0));
    assert_eq!(fast["content"], plain["content"]);
    let (d, a) = drafts(&fast).unwrap();
    assert!(a > 16 && a <= d, "{d} {a}");
}
