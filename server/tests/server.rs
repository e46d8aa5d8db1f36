//! `qkv-server` over loopback: on the default model (the `network_…` tests, which skip with a
//! printed reason without it), its routes, streaming and whole answers equal to a session's,
//! stop strings, a full queue and a client that vanishes mid-stream; on the synthetic model of
//! src/testing/synthetic.rs (offline), a completion equal to a session's greedy text, every
//! kind of bad request, many clients with a slow reader among them, and SIGTERM.
//! The client (server/tests/support/) is a few lines of HTTP/1.1 over `TcpStream`, so that what
//! is tested is the bytes on the wire. Keys, model names, metrics and embeddings are tested
//! in server/tests/server_api.rs.

mod support;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{synthetic_model, Server};

fn chat(content: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 24,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The concatenated text of streamed chunks.
fn streamed_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| {
            let ch = c["choices"].get(0)?;
            ch["delta"]["content"]
                .as_str()
                .or(ch["text"].as_str())
                .map(str::to_owned)
        })
        .collect()
}

#[test]
fn network_routes_streaming_and_stop_strings() {
    let Some(s) = Server::start(&["--metrics"]) else {
        return;
    };
    assert_eq!(s.call("GET", "/health", &json!({})).0, 200);
    let (status, models) = s.call("GET", "/v1/models", &json!({}));
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&models).unwrap()["data"][0]["id"],
        "smollm2"
    );

    // Whole and streamed answers agree, and agree with a session's greedy text.
    let q = "What is the capital of France?";
    let whole = s.json("/v1/chat/completions", &chat(q, json!({})));
    let content = whole["choices"][0]["message"]["content"].as_str().unwrap();
    // Not its words: the model's first token here is a near tie ("The" against "L", 0.08
    // nats apart in f32), which 8-bit activations tip the other way.
    assert!(!content.trim().is_empty(), "{content:?}");
    let usage = &whole["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        )
    );
    let chunks = s
        .stream(
            "/v1/chat/completions",
            &chat(
                q,
                json!({"stream": true, "stream_options": {"include_usage": true}}),
            ),
        )
        .all();
    assert_eq!(streamed_text(&chunks), content);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert_eq!(
        last["usage"]["completion_tokens"],
        usage["completion_tokens"]
    );
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    // The same greedy text as a session on the same model.
    let model = std::sync::Arc::new(
        qkv::load::Model::load(
            &qkv_fetch::testing::default_gguf().unwrap(),
            &Default::default(),
        )
        .unwrap(),
    );
    let prompt = "The capital of France is";
    let mut session = qkv::session::Session::new(model, Default::default()).unwrap();
    let mut gen = session
        .generate(prompt, qkv::sample::SamplerConfig::greedy())
        .unwrap()
        .max_tokens(12)
        .ignore_eos(true);
    let mut want = String::new();
    for p in &mut gen {
        want.push_str(&p.unwrap().text);
    }
    want.push_str(&gen.finish());
    let got = s.json(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(got["choices"][0]["text"], want.as_str());
    assert_eq!(got["usage"]["completion_tokens"], 12);

    // Stop strings end the text just before them, in whole and streamed answers.
    let at = want.find("Paris").expect("the greedy text names Paris");
    for stream in [false, true] {
        let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0,
                          "stop": ["Paris", "zzz"], "stream": stream});
        let (text, finish) = if stream {
            let chunks = s.stream("/v1/completions", &body).all();
            let finish = chunks.last().unwrap()["choices"][0]["finish_reason"].clone();
            (streamed_text(&chunks), finish)
        } else {
            let r = s.json("/v1/completions", &body);
            (
                r["choices"][0]["text"].as_str().unwrap().to_owned(),
                r["choices"][0]["finish_reason"].clone(),
            )
        };
        assert_eq!(
            (text.as_str(), finish),
            (&want[..at], json!("stop")),
            "stream {stream}"
        );
    }

    // Log-probabilities: one per token, the top alternatives best first.
    let r = s.json(
        "/v1/chat/completions",
        &chat(
            q,
            json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 5}),
        ),
    );
    let lp = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        lp.len() as u64,
        r["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for t in lp {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["logprob"], t["logprob"], "greedy picks the best");
    }

    // Tokenize / detokenize round trip.
    let t = s.json("/tokenize", &json!({"content": "Hello world"}));
    let d = s.json("/detokenize", &json!({"tokens": t["tokens"]}));
    assert_eq!(d["content"], "Hello world");
    let (_, metrics) = s.call("GET", "/metrics", &json!({}));
    for name in [
        "qkv_requests_total",
        "qkv_generated_tokens_total",
        "qkv_queue_depth",
        "qkv_running_sequences",
        "qkv_batch_size_bucket",
        "qkv_time_to_first_token_seconds_bucket",
        "qkv_inter_token_seconds_bucket",
        "qkv_time_to_first_token_recent_seconds{quantile=\"0.99\"}",
        "qkv_inter_token_recent_seconds{quantile=\"0.5\"}",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

#[test]
fn bad_requests_get_openai_errors() {
    let s = Server::start_synthetic(&["--body-limit", "8"]);
    let cases: Vec<(&[u8], u16, &str)> = vec![
        (b"{bad", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (br#"{"messages": []}"#, 400, "messages"),
        (
            br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "x"}"#,
            400,
            "max_tokens",
        ),
        (
            br#"{"messages": [{"role": "user", "content": "hi"}], "temperature": 7}"#,
            400,
            "temperature",
        ),
        (
            br#"{"model": 4, "messages": [{"role": "user", "content": "hi"}]}"#,
            400,
            "model",
        ),
        (
            br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}"#,
            400,
            "context",
        ),
        (
            br#"{"messages": [{"role": 5, "content": "hi"}]}"#,
            400,
            "role",
        ),
        (
            br#"{"messages": [{"role": "user", "content": "hi"}], "n": 17}"#,
            400,
            "`n`",
        ),
    ];
    for (body, status, needle) in cases {
        let (got, text) = s.call_raw("POST", "/v1/chat/completions", body);
        assert_eq!(got, status, "{}: {text}", String::from_utf8_lossy(body));
        let e: Value = serde_json::from_str(&text).unwrap();
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{msg}");
        assert!(e["error"]["type"].is_string());
    }
    // A prompt past the context.
    let long = "word ".repeat(700);
    let (got, text) = s.call(
        "POST",
        "/v1/completions",
        &json!({"prompt": long, "max_tokens": 4}),
    );
    assert_eq!(got, 400, "{text}");
    assert!(text.contains("context_length_exceeded"), "{text}");
    // Past the body limit (8 KiB here).
    let big = json!({"prompt": "x".repeat(16 << 10)});
    let (got, text) = s.call("POST", "/v1/completions", &big);
    assert_eq!(got, 413, "{text}");
    assert!(text.contains("\"error\""), "{text}");
    assert_eq!(s.call("GET", "/nope", &json!({})).0, 404);
    // Token ids outside the vocabulary.
    let (got, _) = s.call(
        "POST",
        "/v1/completions",
        &json!({"prompt": [1, 999999], "max_tokens": 2}),
    );
    assert_eq!(got, 400);
    let (got, _) = s.call("POST", "/detokenize", &json!({"tokens": [999999]}));
    assert_eq!(got, 400);
}

/// On the default model: the synthetic one writes 400 tokens before the refusal is asked for
/// (the engine's own queue and cancelling run offline in tests/engine.rs).
#[test]
fn network_a_full_queue_refuses_and_a_vanished_client_frees_its_slot() {
    let Some(s) = Server::start(&["--max-sequences", "1", "--queue", "1", "--metrics"]) else {
        return;
    };
    let long = |stream: bool| {
        json!({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": true,
               "temperature": 0, "stream": stream})
    };
    // A runs, B waits, C is refused.
    let mut a = s.stream("/v1/completions", &long(true));
    a.next().unwrap();
    let b = std::thread::spawn({
        let port = s.port;
        move || {
            let s2 = Server::attach(port);
            let t = Instant::now();
            let r = s2.json(
                "/v1/completions",
                &json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0}),
            );
            (r, t.elapsed())
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let (status, text) = s.call("POST", "/v1/completions", &long(false));
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("rate_limit_error"), "{text}");
    // A's client goes away mid-stream: its sequence is cancelled, B runs at once.
    drop(a);
    let (r, waited) = b.join().unwrap();
    assert_eq!(r["usage"]["completion_tokens"], 3);
    assert!(waited < Duration::from_secs(20), "B waited {waited:?}");
    let (_, metrics) = s.call("GET", "/metrics", &json!({}));
    let cancelled = metrics
        .lines()
        .find_map(|l| l.strip_prefix("qkv_sequences_cancelled_total "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(cancelled >= Some(1), "{metrics}");
}

#[test]
fn many_clients_with_a_slow_reader_never_mix() {
    // Widened to f32: a sequence's rows then take the same arithmetic (up to the order of
    // additions) whether a step runs them alone or with others' prompt chunks, so greedy
    // texts must match exactly.
    let s = Server::start_synthetic(&["--max-sequences", "8", "--dtype", "f32"]);
    let prompts: Vec<String> = (0..9)
        .map(|i| format!("Write a list of {} animals:", i + 2))
        .collect();
    let body = |p: &str, stream: bool| {
        json!({"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": true,
               "stream": stream})
    };
    // Each prompt alone first.
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            s.json("/v1/completions", &body(p, false))["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    // Then all at once, the last one read slowly.
    let handles: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (port, b) = (s.port, body(p, true));
            std::thread::spawn(move || {
                let s = Server::attach(port);
                let mut sse = s.stream("/v1/completions", &b);
                let mut chunks = Vec::new();
                while let Some(d) = sse.next() {
                    if d == "[DONE]" {
                        break;
                    }
                    if i == 8 {
                        std::thread::sleep(Duration::from_millis(150));
                    }
                    chunks.push(serde_json::from_str::<Value>(&d).unwrap());
                }
                (i, streamed_text(&chunks), Instant::now())
            })
        })
        .collect();
    let mut done: Vec<(usize, String, Instant)> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, text, _) in &done {
        assert_eq!(text, &alone[*i], "prompt {i} mixed or changed in a batch");
    }
    // The slow reader did not hold the others back.
    done.sort_by_key(|d| d.2);
    assert_eq!(done.last().unwrap().0, 8, "the slow reader finishes last");
}

#[test]
fn sigterm_finishes_running_streams_then_exits() {
    let mut s = Server::start_synthetic(&[]);
    let mut sse = s.stream(
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": true,
                "temperature": 0, "stream": true}),
    );
    sse.next().unwrap();
    let child = s.child.as_mut().unwrap();
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    std::thread::sleep(Duration::from_millis(200));
    // New work is refused (or the listener is already closed).
    if let Ok(mut c) = TcpStream::connect(("127.0.0.1", s.port)) {
        let body = br#"{"prompt": "Hi", "max_tokens": 2}"#;
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        if c.write_all(req.as_bytes())
            .and_then(|()| c.write_all(body))
            .is_ok()
        {
            let mut out = String::new();
            c.read_to_string(&mut out).ok();
            assert!(out.is_empty() || out.starts_with("HTTP/1.1 503"), "{out}");
        }
    }
    // The running stream ends cleanly with all its tokens.
    let chunks = sse.all();
    let finish = &chunks.last().unwrap()["choices"][0]["finish_reason"];
    assert_eq!(finish, "length");
    let t = Instant::now();
    let status = loop {
        if let Some(st) = s.child.as_mut().unwrap().try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the server did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

/// One completion on the synthetic model, whole and streamed: the greedy text a session
/// gives, its token count, and a chat answer rendered with the model's own template.
#[test]
fn a_completion_on_the_synthetic_model_is_a_sessions_greedy_text() {
    let s = Server::start_synthetic(&[]);
    let model = std::sync::Arc::new(
        qkv::load::Model::load(&synthetic_model(), &Default::default()).unwrap(),
    );
    let prompt = "the cat sat on";
    let mut session = qkv::session::Session::new(model.clone(), Default::default()).unwrap();
    let mut gen = session
        .generate(prompt, qkv::sample::SamplerConfig::greedy())
        .unwrap()
        .max_tokens(10)
        .ignore_eos(true);
    let mut want = String::new();
    for p in &mut gen {
        want.push_str(&p.unwrap().text);
    }
    want.push_str(&gen.finish());
    for stream in [false, true] {
        let body = json!({"prompt": prompt, "max_tokens": 10, "temperature": 0,
                          "ignore_eos": true, "stream": stream});
        let text = if stream {
            streamed_text(&s.stream("/v1/completions", &body).all())
        } else {
            let r = s.json("/v1/completions", &body);
            assert_eq!(r["usage"]["completion_tokens"], 10, "{r}");
            r["choices"][0]["text"].as_str().unwrap().to_owned()
        };
        assert_eq!(text, want, "stream: {stream}");
    }
    // The chat route prompts with the file's ChatML template: its token count says so.
    let r = s.json(
        "/v1/chat/completions",
        &chat("Hi", json!({"max_tokens": 2})),
    );
    let tok = model.tokenizer().unwrap();
    let rendered = tok
        .apply_chat_template(&[qkv::tokenizer::ChatMessage::new("user", "Hi")], true)
        .unwrap();
    let n = tok.encode(&rendered).unwrap().len();
    assert_eq!(r["usage"]["prompt_tokens"].as_u64(), Some(n as u64), "{r}");
}
