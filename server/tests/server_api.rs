//! `qkv-server`'s API keys, model names and gauges, over loopback, on the synthetic decoder
//! of src/testing/synthetic.rs. `/v1/embeddings` is tested in server/tests/server_embeddings.rs.

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::{assert_401, metric, synthetic, synthetic_model, ScratchDir, Server};

#[test]
fn api_keys_guard_every_route_but_health() {
    let dir = ScratchDir::new("keys");
    let file = dir.write(
        "keys.txt",
        b"# the team's keys\n\n  sk-from-file  \n#sk-commented-out\nsk-second\n",
    );
    let s = Server::spawn(&[
        "--model",
        &synthetic(),
        "--ctx",
        "256",
        "--api-key",
        "sk-cli",
        "--api-key-file",
        file.to_str().unwrap(),
        "--metrics",
    ])
    .unwrap();
    let completion = json!({"prompt": "the cat", "max_tokens": 2, "temperature": 0});
    // No key, a wrong key, a wrong scheme, a commented-out key: 401 on every route.
    for key in [
        None,
        Some("sk-wrong"),
        Some("sk-cli2"),
        Some("sk-commented-out"),
    ] {
        let c = s.with_key(key);
        assert_401(c.get("/v1/models"), &format!("models, key {key:?}"));
        assert_401(c.get("/metrics"), &format!("metrics, key {key:?}"));
        assert_401(
            c.call("POST", "/v1/completions", &completion),
            &format!("completions, key {key:?}"),
        );
        assert_401(
            c.call("POST", "/tokenize", &json!({"content": "a"})),
            &format!("tokenize, key {key:?}"),
        );
        assert_401(c.get("/no-such-route"), &format!("404 route, key {key:?}"));
        // /health stays open.
        assert_eq!(c.get("/health").0, 200);
    }
    // Each accepted key, from the command line or the file.
    for key in ["sk-cli", "sk-from-file", "sk-second"] {
        let c = s.with_key(Some(key));
        assert_eq!(c.get("/v1/models").0, 200, "{key}");
        let r = c.json("/v1/completions", &completion);
        assert_eq!(r["usage"]["completion_tokens"], 2, "{key}");
        assert_eq!(c.get("/metrics").0, 200, "{key}");
        assert_eq!(c.get("/no-such-route").0, 404, "{key}");
    }
    // The scheme is read in any case; a key alone (no scheme) is refused.
    let status = |auth: &str| {
        use std::io::{BufRead, BufReader, Write};
        let mut stream = s.connect();
        write!(
            stream,
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n\
             Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).unwrap();
        line.split(' ').nth(1).unwrap().to_owned()
    };
    assert_eq!(status("bearer sk-cli"), "200");
    assert_eq!(status("sk-cli"), "401");
    assert_eq!(status("Basic sk-cli"), "401");
}

#[test]
fn metrics_public_opens_metrics_and_nothing_else() {
    let s = Server::spawn(&[
        "--model",
        &synthetic(),
        "--ctx",
        "256",
        "--api-key",
        "sk-1",
        "--metrics-public",
    ])
    .unwrap();
    let (status, text) = s.get("/metrics");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("qkv_requests_total"));
    assert_401(s.get("/v1/models"), "models");
    assert_eq!(s.with_key(Some("sk-1")).get("/v1/models").0, 200);
    // Without any key the flag changes nothing: everything is open.
    let open = Server::spawn(&["--model", &synthetic(), "--ctx", "256", "--metrics"]).unwrap();
    assert_eq!(open.get("/metrics").0, 200);
    assert_eq!(open.get("/v1/models").0, 200);
}

#[test]
fn a_bad_key_file_stops_the_server_at_start() {
    let dir = ScratchDir::new("badkeys");
    let comments = dir.write("comments.txt", b"# no keys here\n\n   \n");
    let spaced = dir.write("spaced.txt", b"sk-good\nsk has-a-space-secret\n");
    let missing = dir.0.join("missing.txt");
    for (path, needle) in [
        (&missing, "missing.txt"),
        (&comments, "no key"),
        (&spaced, "line 2"),
    ] {
        let e = Server::spawn(&[
            "--model",
            &synthetic(),
            "--api-key-file",
            path.to_str().unwrap(),
        ])
        .err()
        .unwrap_or_else(|| panic!("{} was accepted", path.display()));
        assert!(e.contains("--api-key-file") && e.contains(needle), "{e}");
        assert!(!e.contains("secret"), "a key was printed: {e}");
    }
    let e = Server::spawn(&["--model", &synthetic(), "--api-key", ""])
        .err()
        .unwrap();
    assert!(e.contains("--api-key"), "{e}");
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
        // All three wait until the first takes the slot.
        assert!((0.0..=3.0).contains(&waiting), "{waiting}");
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
    let plain = Server::spawn(&["--model", &synthetic(), "--ctx", "256", "--metrics"]).unwrap();
    let (_, m) = plain.get("/metrics");
    metric(&m, "qkv_kv_cache_usage_ratio");
    assert!(!m.contains("vllm:"), "{m}");
}
