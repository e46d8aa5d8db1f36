//! `qkv-server`'s model names and gauges, over loopback, on the synthetic decoder of
//! tests/common/synthetic.rs.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::{synthetic_model, Server};

fn synthetic() -> String {
    synthetic_model().to_str().unwrap().to_owned()
}

#[test]
fn any_model_name_is_answered_with_the_served_name() {
    let s = Server::spawn(&[
        "--model",
        &synthetic(),
        "--ctx",
        "256",
        "--model-name",
        "served",
        "--model-name",
        "an-alias",
        "--model-name",
        "gpt-3.5-turbo",
    ])
    .unwrap();
    let (status, text) = s.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["served", "an-alias", "gpt-3.5-turbo"]);
    assert!(models["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["root"] == "served" && m["meta"]["n_ctx"] == 256));
    for name in ["served", "an-alias", "gpt-4o", "anything at all"] {
        let r = s.json(
            "/v1/completions",
            &json!({"model": name, "prompt": "the cat", "max_tokens": 2, "temperature": 0}),
        );
        assert_eq!(r["model"], "served", "{name}");
        let chunks = s
            .stream(
                "/v1/chat/completions",
                &json!({"model": name, "messages": [{"role": "user", "content": "Hi"}],
                        "max_tokens": 2, "stream": true}),
            )
            .all();
        assert!(chunks.iter().all(|c| c["model"] == "served"), "{name}");
    }
    // Without --model-name: the file's name.
    let plain = Server::spawn(&["--model", &synthetic(), "--ctx", "256"]).unwrap();
    let (_, text) = plain.get("/v1/models");
    let file = synthetic_model();
    let file_name = file.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["data"][0]["id"],
        file_name
    );
    let e = Server::spawn(&[
        "--model",
        &synthetic(),
        "--model-name",
        "a",
        "--model-name",
        "a",
    ])
    .err()
    .unwrap();
    assert!(e.contains("--model-name a: given twice"), "{e}");
}

/// A sample line of `/metrics`: its value, checking the whole exposition on the way (every
/// sample's family has HELP and TYPE lines before it, names are valid, values are numbers).
fn metric(text: &str, name: &str) -> f64 {
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut typed: Vec<String> = Vec::new();
    let mut helped: Vec<String> = Vec::new();
    let mut found = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let n = rest.split(' ').next().unwrap();
            assert!(valid_name(n), "{line}");
            helped.push(n.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let n = parts.next().unwrap();
            let kind = parts.next().unwrap();
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(
                helped.last().map(String::as_str) == Some(n),
                "TYPE without HELP: {line}"
            );
            typed.push(n.to_owned());
        } else {
            assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
            let (series, value) = line.rsplit_once(' ').unwrap();
            let n = series.split('{').next().unwrap();
            assert!(valid_name(n), "{line}");
            let family = typed
                .last()
                .unwrap_or_else(|| panic!("a sample before any TYPE: {line}"));
            assert!(n.starts_with(family.as_str()), "{line} under {family}");
            let v: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            if series == name || (n == name && series.contains('{') && !name.contains('{')) {
                found = Some(v);
            }
        }
    }
    found.unwrap_or_else(|| panic!("{name} is missing from /metrics:\n{text}"))
}

#[test]
fn gauges_report_requests_and_kv_use_in_range() {
    let s = Server::spawn(&[
        "--model",
        &synthetic(),
        "--ctx",
        "512",
        "--max-sequences",
        "1",
        "--queue",
        "8",
        "--metrics-vllm-names",
        "--model-name",
        "tiny \"model\"",
    ])
    .unwrap();
    let (_, idle) = s.get("/metrics");
    for name in [
        "qkv_requests_running",
        "qkv_requests_waiting",
        "qkv_kv_cache_usage_ratio",
    ] {
        assert_eq!(metric(&idle, name), 0.0, "{name} idle");
    }
    assert!(
        idle.contains("vllm:gpu_cache_usage_perc{model_name=\"tiny \\\"model\\\"\"} 0"),
        "{idle}"
    );
    // Three long requests on one slot: one runs, the others wait.
    let long = json!({"prompt": "the cat sat on", "max_tokens": 480, "ignore_eos": true,
                      "temperature": 0});
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let (port, body) = (s.port, long.clone());
            std::thread::spawn(move || Server::attach(port).json("/v1/completions", &body))
        })
        .collect();
    let (mut saw_running, mut saw_waiting, mut saw_kv) = (false, false, 0.0f64);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) && !clients.iter().all(|c| c.is_finished()) {
        let (_, m) = s.get("/metrics");
        let running = metric(&m, "qkv_requests_running");
        let waiting = metric(&m, "qkv_requests_waiting");
        let kv = metric(&m, "qkv_kv_cache_usage_ratio");
        assert!((0.0..=1.0).contains(&running), "{running}");
        assert!((0.0..=2.0).contains(&waiting), "{waiting}");
        assert!((0.0..=1.0).contains(&kv), "{kv}");
        assert_eq!(metric(&m, "vllm:num_requests_running"), running);
        assert_eq!(metric(&m, "vllm:num_requests_waiting"), waiting);
        assert_eq!(metric(&m, "vllm:gpu_cache_usage_perc"), kv);
        assert_eq!(metric(&m, "qkv_running_sequences"), running);
        saw_running |= running == 1.0;
        saw_waiting |= waiting >= 1.0;
        saw_kv = saw_kv.max(kv);
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut prompt = 0;
    for c in clients {
        let usage = &c.join().unwrap()["usage"];
        assert_eq!(usage["completion_tokens"], 480);
        prompt = usage["prompt_tokens"].as_u64().unwrap();
    }
    assert!(
        saw_running && saw_waiting,
        "running {saw_running}, waiting {saw_waiting}"
    );
    // One sequence of at most the prompt and 480 positions, in one cache of 512.
    let most = (prompt + 480) as f64 / 512.0;
    assert!(saw_kv > 0.0 && saw_kv <= most + 1e-9, "{saw_kv} > {most}");
    // Back to idle (the gauges are set just after the last tokens are sent).
    let t = Instant::now();
    loop {
        let (_, done) = s.get("/metrics");
        let idle = [
            "qkv_requests_running",
            "qkv_requests_waiting",
            "qkv_kv_cache_usage_ratio",
        ]
        .iter()
        .all(|n| metric(&done, n) == 0.0);
        if idle {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "not idle: {done}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Without the flag, no vLLM names.
    let plain = Server::spawn(&["--model", &synthetic(), "--ctx", "256"]).unwrap();
    let (_, m) = plain.get("/metrics");
    metric(&m, "qkv_kv_cache_usage_ratio");
    assert!(!m.contains("vllm:"), "{m}");
}
