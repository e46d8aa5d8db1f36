//! LoRA adapters in qkv-server (lora.rs): `--lora`, `--lora-scaled`,
//! `--lora-init-without-apply`, `GET`/`POST /lora-adapters` and a request's `lora` field, in
//! llama-server's shapes; requests with different adapters batched together get what they
//! get alone. On the synthetic decoder of src/testing/synthetic.rs, with adapters written here.

mod support;

use qkv::testing::synthetic::{DIM, FFN, HEADS, HEAD_DIM, LAYERS};
use qkv::weights::gguf::{write_gguf, MetaValue};
use qkv::weights::WeightFormat;
use serde_json::{json, Value};
use std::path::PathBuf;
use support::{synthetic, ScratchDir, Server};

/// An adapter of rank 4 on q and down of every layer, values from `seed`.
fn adapter(dir: &ScratchDir, name: &str, seed: u32) -> PathBuf {
    let path = dir.0.join(name);
    let r = 4;
    let mut state = seed.wrapping_mul(2654435761).wrapping_add(1);
    let mut values = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                state = state.wrapping_mul(1664525).wrapping_add(1013904223);
                let v = ((state >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.5;
                v.to_le_bytes()
            })
            .collect()
    };
    let q = HEADS * HEAD_DIM;
    let mut tensors = Vec::new();
    for l in 0..LAYERS {
        for (part, out, inp) in [("attn_q", q, DIM), ("ffn_down", DIM, FFN)] {
            tensors.push((
                format!("blk.{l}.{part}.weight.lora_a"),
                vec![r, inp],
                values(r * inp),
            ));
            tensors.push((
                format!("blk.{l}.{part}.weight.lora_b"),
                vec![out, r],
                values(out * r),
            ));
        }
    }
    let metadata = vec![
        (
            "general.architecture".to_string(),
            MetaValue::String("llama".into()),
        ),
        ("general.type".into(), MetaValue::String("adapter".into())),
        ("adapter.type".into(), MetaValue::String("lora".into())),
        ("adapter.lora.alpha".into(), MetaValue::F32(8.0)),
    ];
    let tensors: Vec<_> = tensors
        .iter()
        .map(|(n, s, b)| (n.clone(), s.clone(), WeightFormat::F32, &b[..]))
        .collect();
    write_gguf(&path, &metadata, &tensors).unwrap();
    path
}

/// A greedy completion's tokens and the log-probabilities of each step's 3 most likely
/// tokens (the synthetic model is sure of its first choice: its runners-up tell adapters
/// apart), under `lora` when given.
fn logprobs(s: &Server, lora: Option<Value>) -> Vec<String> {
    let mut body = json!({
        "prompt": "the cat sat on the mat",
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": 3,
        "ignore_eos": true,
        "cache_prompt": false,
    });
    if let Some(l) = lora {
        body["lora"] = l;
    }
    let (status, text) = s.call("POST", "/v1/completions", &body);
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let l = &v["choices"][0]["logprobs"];
    let mut out: Vec<String> = l["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    for step in l["top_logprobs"].as_array().unwrap() {
        let mut top: Vec<String> = step
            .as_object()
            .unwrap()
            .iter()
            .map(|(t, p)| format!("{t}:{p}"))
            .collect();
        top.sort();
        out.extend(top);
    }
    out
}

fn adapters(s: &Server) -> Value {
    let (status, text) = s.get("/lora-adapters");
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

#[test]
fn adapters_are_listed_set_and_chosen_per_request() {
    let dir = ScratchDir::new("lora");
    let (a, b) = (adapter(&dir, "a.gguf", 1), adapter(&dir, "b.gguf", 2));
    let model = synthetic();
    let s = Server::spawn(&[
        "-m",
        &model,
        "-c",
        "256",
        "-np",
        "4",
        "--lora",
        a.to_str().unwrap(),
        "--lora-scaled",
        b.to_str().unwrap(),
        "0.5",
    ])
    .unwrap();
    let list = adapters(&s);
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    assert_eq!(list[0]["id"], 0);
    assert_eq!(list[0]["path"], a.to_str().unwrap());
    assert_eq!(list[0]["scale"], 1.0);
    assert_eq!(
        (&list[1]["id"], &list[1]["scale"]),
        (&json!(1), &json!(0.5))
    );

    // The server's scales apply to a request without its own.
    let both = logprobs(&s, None);
    assert_eq!(
        both,
        logprobs(
            &s,
            Some(json!([{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}]))
        )
    );
    // A request's list: the adapters it leaves out are at 0.
    let base = logprobs(&s, Some(json!([{"id": 0, "scale": 0.0}])));
    let only_a = logprobs(&s, Some(json!([{"id": 0, "scale": 1.0}])));
    let half_b = logprobs(&s, Some(json!([{"id": 1, "scale": 0.5}])));
    assert_ne!(base, only_a);
    assert_ne!(only_a, both);
    assert_ne!(half_b, both);

    // Requests with different adapters, all at once: each gets what it got alone.
    let cases = [
        (Some(json!([{"id": 0, "scale": 0.0}])), base.clone()),
        (Some(json!([{"id": 0, "scale": 1.0}])), only_a.clone()),
        (Some(json!([{"id": 1, "scale": 0.5}])), half_b.clone()),
        (None, both.clone()),
    ];
    for _round in 0..2 {
        std::thread::scope(|scope| {
            let runs: Vec<_> = cases
                .iter()
                .map(|(lora, want)| {
                    let s = &s;
                    scope.spawn(move || (logprobs(s, lora.clone()), want))
                })
                .collect();
            for (i, r) in runs.into_iter().enumerate() {
                let (got, want) = r.join().unwrap();
                assert_eq!(&got, want, "request {i}");
            }
        });
    }

    // POST sets the server's scales: those not listed go to 0.
    let (status, text) = s.call("POST", "/lora-adapters", &json!([{"id": 0, "scale": 1.0}]));
    assert_eq!((status, text.as_str()), (200, r#"{"success":true}"#));
    let list = adapters(&s);
    assert_eq!(
        (&list[0]["scale"], &list[1]["scale"]),
        (&json!(1.0), &json!(0.0))
    );
    assert_eq!(logprobs(&s, None), only_a);
    let (status, _) = s.call("POST", "/lora-adapters", &json!([]));
    assert_eq!(status, 200);
    assert_eq!(logprobs(&s, None), base);

    // Bad input is a 400 naming what is wrong.
    for (path, body, says) in [
        (
            "/lora-adapters",
            json!([{"id": 2, "scale": 1.0}]),
            "no LoRA adapter has id 2",
        ),
        (
            "/lora-adapters",
            json!({"id": 0, "scale": 1.0}),
            "must be a list",
        ),
        ("/lora-adapters", json!([{"scale": 1.0}]), "no `id`"),
        (
            "/v1/completions",
            json!({"prompt": "hi", "lora": [{"id": 7, "scale": 1.0}]}),
            "no LoRA adapter has id 7",
        ),
        (
            "/completion",
            json!({"prompt": "hi", "lora": [{"id": 0, "scale": "big"}]}),
            "finite number",
        ),
        (
            "/completion",
            json!({"prompt": "hi", "lora": {"id": 0}}),
            "must be a list",
        ),
    ] {
        let (status, text) = s.call("POST", path, &body);
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(says), "{body}: {text}");
    }
}

#[test]
fn adapters_start_at_zero_without_apply_and_bad_files_stop_the_server() {
    let dir = ScratchDir::new("lora-init");
    let a = adapter(&dir, "a.gguf", 3);
    let model = synthetic();
    let s = Server::spawn(&[
        "-m",
        &model,
        "--lora",
        a.to_str().unwrap(),
        "--lora-init-without-apply",
    ])
    .unwrap();
    assert_eq!(adapters(&s)[0]["scale"], 0.0);
    let none = logprobs(&s, None);
    assert_eq!(none, logprobs(&s, Some(json!([{"id": 0, "scale": 0.0}]))));
    assert_ne!(none, logprobs(&s, Some(json!([{"id": 0, "scale": 1.0}]))));
    drop(s);

    // A model file is not an adapter.
    let err = Server::spawn(&["-m", &model, "--lora", &model])
        .err()
        .unwrap();
    assert!(err.contains("general.type"), "{err}");
    let missing = dir.0.join("missing.gguf");
    let err = Server::spawn(&["-m", &model, "--lora", missing.to_str().unwrap()])
        .err()
        .unwrap();
    assert!(err.contains("missing.gguf"), "{err}");
}
