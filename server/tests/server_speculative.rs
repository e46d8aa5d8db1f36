//! Speculative decoding in qkv-server, over loopback on the synthetic decoder (and the
//! default model in the `network_…` test): the server default (`--spec`, llama-server's
//! `--spec-type` / `--draft-max`), the per-request fields (`speculative.n_max` on
//! `/completion`, `speculative` on the OpenAI routes), the same text with and without
//! speculation (greedy, and sampled with n-gram drafts: the same seed gives the same text),
//! `timings.draft_n` / `draft_n_accepted` as llama-server reports them, `/metrics`
//! counters that add up to them, and a draft model (`--model-draft`, `-md`,
//! `--spec-type draft-simple`; one of another vocabulary refused naming both files).

mod support;

use qkv::kernels::QuantFormat;
use qkv::testing::synthetic::{model_file, Storage};
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
    // Sampling speculates too: n-gram drafts are verified with plain sampling's own draws,
    // so the same seed gives the same text.
    let sampled_body = |n_max: u64| {
        body(
            json!({"temperature": 0.8, "seed": 5, "top_k": 0, "min_p": 0.02,
                    "speculative.n_max": n_max}),
        )
    };
    let sampled = s.json("/completion", &sampled_body(5));
    let sampled_plain = s.json("/completion", &sampled_body(0));
    assert_eq!(sampled["content"], sampled_plain["content"]);
    let (ds, as_) = drafts(&sampled).expect("a sampled request speculates");
    assert!(as_ <= ds);
    // The counters add up the requests' drafts.
    let (d, a) = (d + ds, a + as_);
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

/// `--model-draft` (and llama-server's `-md`): requests draft with a second model of the
/// vocabulary by default, greedy ones with the text of plain decoding, sampled ones too; a
/// request may draft by n-gram lookup instead, or not at all; `--spec-min` reaches
/// `/props`.
#[test]
fn a_draft_model_drafts_for_requests() {
    let far = model_file(Storage::Quant(QuantFormat::Q4_0));
    let far = far.to_str().unwrap();
    for flag in ["--model-draft", "-md"] {
        let s = server(&[flag, far, "--spec-min", "1"]);
        let body = |extra: Value| {
            let mut b = json!({"prompt": repeating(), "n_predict": 40, "temperature": 0,
                               "ignore_eos": true});
            b.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            b
        };
        let drafted = s.json("/completion", &body(json!({})));
        let plain = s.json("/completion", &body(json!({"speculative": false})));
        let ngram = s.json("/completion", &body(json!({"speculative": "ngram"})));
        assert_eq!(drafted["content"], plain["content"], "{flag}");
        assert_eq!(ngram["content"], plain["content"], "{flag}");
        let (d, a) = drafts(&drafted).expect("the draft model drafts");
        assert!(d > 0 && a <= d, "{d} {a}");
        assert_eq!(drafts(&plain), None);
        let sampled = s.json(
            "/v1/completions",
            &json!({"prompt": repeating(), "max_tokens": 30, "temperature": 0.9, "seed": 3,
                    "speculative": "draft-simple"}),
        );
        assert!(drafts(&sampled).unwrap().0 > 0, "{sampled}");
        let props: Value = serde_json::from_str(&s.get("/props").1).unwrap();
        let settings = &props["default_generation_settings"];
        assert_eq!(settings["speculative"], true);
        assert_eq!(settings["params"]["speculative.n_min"], 1);
    }
    // Without a draft model, a request for one is a 400 naming the field.
    let s = server(&[]);
    let (status, text) = s.call(
        "POST",
        "/completion",
        &json!({"prompt": "a", "speculative": "draft"}),
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("speculative"), "{text}");
}

/// A draft model of another vocabulary (the default model's, for the synthetic one) stops
/// the server with an error naming both files.
#[test]
fn network_a_draft_model_of_another_vocabulary_is_refused() {
    let Some(other) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    let model = synthetic();
    let other = other.to_str().unwrap();
    let err = Server::spawn(&["--model", model.as_str(), "--model-draft", other])
        .err()
        .expect("the server refuses");
    assert!(
        err.contains("vocabulary") && err.contains(other) && err.contains(model.as_str()),
        "{err}"
    );
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
