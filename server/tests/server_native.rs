//! qkv-server's llama-server routes and behaviours (native.rs, and what the OpenAI routes
//! took from llama-server), over loopback on the synthetic decoder of
//! src/testing/synthetic.rs: `/completion` and `/completions` with their prompt forms,
//! fields and stream; `logit_bias`; `/apply-template`, `/props`, `/slots`,
//! `/chat/completions/input_tokens`; `/tokenize` with pieces; `n` > 1; `timings`; the
//! role-only first chunk; `exceed_context_size_error`; message-order 400s; several
//! `--host` addresses; `--no-metrics` and `--no-slots`. llama.cpp's own server suite runs
//! against qkv-server in tools/llamacpp_server_suite.py.

mod support;

use serde_json::{json, Value};
use support::{synthetic, Server};

fn server(extra: &[&str]) -> Server {
    let model = synthetic();
    let args = [&["--model", model.as_str(), "--ctx", "256"][..], extra].concat();
    Server::spawn(&args).unwrap_or_else(|e| panic!("the server exited: {e}"))
}

/// Every `data:` payload of a stream that ends without `[DONE]` (llama-server's native one).
fn native_events(s: &Server, body: &Value) -> Vec<Value> {
    let mut sse = s.stream("/completion", body);
    let mut out = Vec::new();
    while let Some(d) = sse.next() {
        assert_ne!(d, "[DONE]", "the native stream has no [DONE]");
        out.push(serde_json::from_str(&d).unwrap());
    }
    out
}

fn tokenize(s: &Server, text: &str) -> Vec<u64> {
    let r = s.json("/tokenize", &json!({ "content": text }));
    r["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn completion_answers_in_llama_server_shape() {
    let s = server(&[]);
    let prompt = "the cat sat";
    let n_prompt = tokenize(&s, prompt).len();
    let r = s.json(
        "/completion",
        &json!({"prompt": prompt, "n_predict": 5, "temperature": 0, "return_tokens": true,
                "n_probs": 3, "ignore_eos": true}),
    );
    assert_eq!(r["stop"], true);
    assert_eq!(r["stop_type"], "limit");
    assert_eq!(r["tokens_predicted"], 5);
    assert_eq!(r["tokens_evaluated"].as_u64(), Some(n_prompt as u64));
    let tokens = r["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 5);
    // The content is the tokens' text.
    let text = s.json("/detokenize", &json!({ "tokens": tokens }));
    assert_eq!(r["content"], text["content"]);
    let t = &r["timings"];
    assert_eq!(t["predicted_n"], 5);
    assert_eq!(
        t["prompt_n"].as_u64().unwrap() + t["cache_n"].as_u64().unwrap(),
        n_prompt as u64
    );
    assert!(t["predicted_ms"].as_f64().unwrap() >= 0.0);
    // Log-probabilities: the chosen token's is the best of the alternatives (greedy).
    let probs = r["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 5);
    for (p, tok) in probs.iter().zip(tokens) {
        assert_eq!(&p["id"], tok);
        let top = p["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert!(p["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(top[0]["id"], p["id"], "greedy picks the most likely token");
        assert!(top
            .windows(2)
            .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
        assert!(p["bytes"].is_array());
    }
    // The EOS ban ignore_eos implies is reported as llama-server reports it.
    let bias = r["generation_settings"]["logit_bias"].as_array().unwrap();
    assert!(!bias.is_empty() && bias.iter().all(|b| b["bias"].is_null()));
    // /completions is the same route; without return_tokens, tokens is empty.
    let again = s.json(
        "/completions",
        &json!({"prompt": prompt, "n_predict": 5, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(again["content"], r["content"]);
    assert_eq!(again["tokens"], json!([]));
    // response_fields keeps only the fields named, nested ones by path.
    let some = s.json(
        "/completion",
        &json!({"prompt": prompt, "n_predict": 2, "temperature": 0,
                "response_fields": ["content", "generation_settings/n_predict"]}),
    );
    assert_eq!(some.as_object().unwrap().len(), 2, "{some}");
    assert_eq!(some["generation_settings/n_predict"], 2);
}

#[test]
fn prompts_as_text_ids_mixed_and_batches_agree() {
    let s = server(&[]);
    let text = "the dog ran";
    let ids = tokenize(&s, text);
    let ask = |prompt: Value| {
        s.json(
            "/completion",
            &json!({"prompt": prompt, "n_predict": 4, "temperature": 0, "ignore_eos": true}),
        )
    };
    let by_text = ask(json!(text));
    let by_ids = ask(json!(ids));
    assert_eq!(by_text["content"], by_ids["content"]);
    let by_object = ask(json!({ "prompt_string": text }));
    assert_eq!(by_object["content"], by_text["content"]);
    // A list of prompts answers with a list, in order.
    let batch = ask(json!([ids, text, {"prompt_string": text}]));
    let batch = batch.as_array().unwrap();
    assert_eq!(batch.len(), 3);
    for (i, b) in batch.iter().enumerate() {
        assert_eq!(b["content"], by_text["content"]);
        assert_eq!(b["index"], i);
    }
    // Ids and text mixed in one sequence: the text's tokens in place.
    let half = ids.len() / 2;
    let mixed = ask(json!([ids[0], ids[1], "ran"]));
    assert!(mixed["content"].is_string());
    assert_eq!(
        mixed["tokens_evaluated"].as_u64().unwrap() as usize,
        2 + tokenize(&s, "ran").len()
    );
    let _ = half;
    for (body, field) in [
        (
            json!({"prompt": {"prompt_string": "x", "multimodal_data": "AA=="}}),
            "multimodal",
        ),
        (json!({"prompt": [1, 999_999]}), "vocabulary"),
        (json!({"prompt": "x", "n_predict": 0}), "n_predict"),
        (json!({"prompt": "x", "samplers": ["magic"]}), "sampler"),
        (json!({"prompt": ["a", "b"], "stream": true}), "whole"),
    ] {
        let (status, text) = s.call("POST", "/completion", &body);
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(field), "{text}");
    }
}

#[test]
fn the_native_stream_has_one_event_per_token_then_the_final_object() {
    let s = server(&[]);
    let body = json!({"prompt": "a b c", "n_predict": 6, "temperature": 0, "ignore_eos": true,
                      "n_probs": 2});
    let whole = s.json("/completion", &body);
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let events = native_events(&s, &stream_body);
    let (last, tokens) = events.split_last().unwrap();
    assert_eq!(tokens.len(), 6);
    for e in tokens {
        assert_eq!(e["stop"], false);
        assert_eq!(e["tokens"].as_array().unwrap().len(), 1);
        assert_eq!(e["completion_probabilities"].as_array().unwrap().len(), 1);
        assert!(e.get("timings").is_none());
    }
    assert_eq!(last["stop"], true);
    assert_eq!(last["stop_type"], "limit");
    assert_eq!(last["timings"]["predicted_n"], 6);
    assert_eq!(last["generation_settings"]["n_predict"], 6);
    let text: String = events
        .iter()
        .map(|e| e["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, whole["content"].as_str().unwrap());
}

#[test]
fn stop_words_and_logit_bias_steer_the_generation() {
    let s = server(&[]);
    let base = json!({"prompt": "one two", "n_predict": 8, "temperature": 0, "ignore_eos": true,
                      "return_tokens": true});
    let free = s.json("/completion", &base);
    let tokens: Vec<u64> = free["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    // A ban of the greedy first token moves it, in both of llama-server's shapes and in
    // OpenAI's object shape on /v1/completions.
    for bias in [
        json!([[tokens[0], false]]),
        json!({ tokens[0].to_string(): -100 }),
    ] {
        let mut b = base.clone();
        b["logit_bias"] = bias.clone();
        let r = s.json("/completion", &b);
        assert_ne!(r["tokens"][0].as_u64(), Some(tokens[0]), "{bias}");
    }
    // OpenAI's shape on the chat route: the first token's bytes change.
    let first_bytes = |bias: Option<u64>| {
        let mut b = json!({"messages": [{"role": "user", "content": "one two"}], "max_tokens": 1,
                           "temperature": 0, "logprobs": true});
        if let Some(t) = bias {
            b["logit_bias"] = json!({ t.to_string(): -100 });
        }
        let r = s.json("/v1/chat/completions", &b);
        r["choices"][0]["logprobs"]["content"][0]["bytes"].clone()
    };
    let free_first = first_bytes(None);
    let chat_ids = s.json(
        "/tokenize",
        &json!({"content": String::from_utf8(
            free_first.as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect()
        ).unwrap_or_default()}),
    );
    if let Some(t) = chat_ids["tokens"].as_array().filter(|t| t.len() == 1) {
        assert_ne!(first_bytes(t[0].as_u64()), free_first);
    }
    // A large positive bias makes one token win every step.
    let pick = (tokens[0] + 7) % 200 + 3;
    let mut b = base.clone();
    b["logit_bias"] = json!([[pick, 1000]]);
    let r = s.json("/completion", &b);
    assert!(
        r["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t.as_u64() == Some(pick)),
        "{r}"
    );
    // Stop words: the text ends before the first, which is reported.
    let content = free["content"].as_str().unwrap();
    let cut = content.char_indices().nth(3).map(|(i, _)| i);
    if let Some(cut) = cut.filter(|&c| c + 2 <= content.len() && content.is_char_boundary(c + 2)) {
        let word = &content[cut..cut + 2];
        let mut b = base.clone();
        b["stop"] = json!(["never-1", "never-2", "never-3", "never-4", word]);
        let r = s.json("/completion", &b);
        assert_eq!(r["stop_type"], "word");
        assert_eq!(r["stopping_word"], word);
        let expect = &content[..content.find(word).unwrap()];
        assert_eq!(r["content"], expect);
    }
}

#[test]
fn apply_template_props_slots_and_input_tokens() {
    let s = server(&[
        "--seed",
        "1234",
        "--temp",
        "0.5",
        "--n-predict",
        "7",
        "--max-sequences",
        "3",
    ]);
    let msgs =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]);
    let r = s.json("/apply-template", &json!({ "messages": msgs }));
    let prompt = r["prompt"].as_str().unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let n = s.json(
        "/chat/completions/input_tokens",
        &json!({ "messages": msgs }),
    );
    let tokens = s.json(
        "/tokenize",
        &json!({"content": prompt, "parse_special": true}),
    );
    assert_eq!(
        n["input_tokens"].as_u64(),
        Some(tokens["tokens"].as_array().unwrap().len() as u64)
    );
    // Without the generation prompt; a final assistant message is continued.
    let r = s.json(
        "/apply-template",
        &json!({"messages": msgs, "add_generation_prompt": false}),
    );
    assert!(!r["prompt"].as_str().unwrap().ends_with("assistant\n"));
    let prefill =
        json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure"}]);
    let r = s.json("/apply-template", &json!({ "messages": prefill }));
    assert!(
        r["prompt"]
            .as_str()
            .unwrap()
            .ends_with("<|im_start|>assistant\nSure"),
        "{r}"
    );
    let r = s.json(
        "/apply-template",
        &json!({"messages": prefill, "continue_final_message": true, "add_generation_prompt": false}),
    );
    assert!(
        r["prompt"]
            .as_str()
            .unwrap()
            .ends_with("<|im_start|>assistant\nSure"),
        "{r}"
    );
    // llama-server's 400s: both flags, and two assistant messages at the end.
    for body in [
        json!({"messages": prefill, "continue_final_message": true, "add_generation_prompt": true}),
        json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                            {"role": "assistant", "content": "c"}]}),
    ] {
        for route in [
            "/apply-template",
            "/v1/chat/completions",
            "/chat/completions",
        ] {
            assert_eq!(s.call("POST", route, &body).0, 400, "{route} {body}");
        }
    }
    // /props reports the flags; requests without a seed or temperature take them.
    let (status, text) = s.get("/props");
    assert_eq!(status, 200);
    let props: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(props["total_slots"], 3);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 256);
    assert_eq!(props["default_generation_settings"]["params"]["seed"], 1234);
    assert!(props["model_path"].as_str().unwrap().ends_with(".gguf"));
    let r = s.json("/completion", &json!({"prompt": "x y", "ignore_eos": true}));
    let g = &r["generation_settings"];
    assert_eq!(
        (g["seed"].as_u64(), g["n_predict"].as_i64()),
        (Some(1234), Some(7))
    );
    assert!((g["temperature"].as_f64().unwrap() - 0.5).abs() < 1e-6);
    assert_eq!(r["tokens_predicted"], 7, "--n-predict caps the request");
    let again = s.json("/completion", &json!({"prompt": "x y", "ignore_eos": true}));
    assert_eq!(
        again["content"], r["content"],
        "the same --seed, the same text"
    );
    // /slots: one per sequence, idle now. The worker lets the last request go a moment after
    // the client has read its reply (as the metrics gauge below): give it up to two seconds.
    let idle = |slots: &Value| {
        let list = slots.as_array().unwrap();
        list.len() == 3
            && list
                .iter()
                .all(|s| s["is_processing"] == false && s["n_ctx"] == 256)
    };
    let mut slots = Value::Null;
    for _ in 0..200 {
        let (status, text) = s.get("/slots");
        assert_eq!(status, 200);
        slots = serde_json::from_str(&text).unwrap();
        if idle(&slots) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(idle(&slots), "{slots}");
}

#[test]
fn openai_routes_take_llama_servers_extras() {
    let s = server(&[]);
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                      "temperature": 0, "ignore_eos": true});
    // Un-prefixed routes.
    for route in ["/chat/completions", "/v1/chat/completions"] {
        let r = s.json(route, &chat);
        assert_eq!(r["choices"][0]["message"]["role"], "assistant");
        assert!(r["system_fingerprint"].as_str().unwrap().starts_with('b'));
        assert_eq!(r["timings"]["predicted_n"], 4);
    }
    assert_eq!(s.get("/models").0, 200);
    // n choices.
    let mut n3 = chat.clone();
    n3["n"] = json!(3);
    n3["temperature"] = json!(1.0);
    let r = s.json("/v1/chat/completions", &n3);
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
    }
    // The stream's first chunk carries the role alone, the last its finish reason alone,
    // and the usage chunk the timings.
    let mut st = chat.clone();
    st["stream"] = json!(true);
    st["stream_options"] = json!({"include_usage": true});
    let chunks = s.stream("/chat/completions", &st).all();
    let delta = |c: &Value| c["choices"][0]["delta"].clone();
    assert_eq!(
        delta(&chunks[0]),
        json!({"role": "assistant", "content": null})
    );
    let n = chunks.len();
    assert_eq!(delta(&chunks[n - 2]), json!({}));
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "length");
    for c in &chunks[1..n - 2] {
        assert!(delta(c).get("role").is_none());
        assert!(!delta(c)["content"].as_str().unwrap().is_empty());
    }
    assert_eq!(chunks[n - 1]["timings"]["predicted_n"], 4);
    assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 4);
    // A prompt past the context: llama-server's error type with both numbers.
    let long = json!({"messages": [{"role": "user", "content": "word ".repeat(400)}]});
    for stream in [false, true] {
        let mut b = long.clone();
        b["stream"] = json!(stream);
        let (status, text) = s.call("POST", "/chat/completions", &b);
        assert_eq!(status, 400, "{text}");
        let e: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(e["error"]["type"], "exceed_context_size_error");
        assert_eq!(e["error"]["n_ctx"], 256);
        assert!(e["error"]["n_prompt_tokens"].as_u64().unwrap() > 256);
    }
    // /tokenize with pieces: the pieces spell the text.
    let r = s.json(
        "/tokenize",
        &json!({"content": "the cat", "with_pieces": true}),
    );
    let pieces: String = r["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert!(t["id"].is_u64());
            t["piece"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(pieces, "the cat");
}

#[test]
fn hosts_metrics_and_slots_flags() {
    let s = server(&["--no-metrics", "--no-slots", "--host", "127.0.0.1,::1"]);
    for route in ["/metrics", "/slots"] {
        let (status, text) = s.get(route);
        assert_eq!(status, 501, "{route}: {text}");
        assert!(text.contains("not_supported_error"), "{text}");
    }
    // The second address answers on the same port, when the machine has IPv6 loopback.
    if let Ok(mut c) = std::net::TcpStream::connect(("::1", s.port)) {
        use std::io::{Read, Write};
        write!(
            c,
            "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).unwrap();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    } else {
        eprintln!("skipped the ::1 check: no IPv6 loopback here");
    }
    // /metrics as llama-server serves it: only with --metrics; /slots by default.
    let plain = server(&[]);
    assert_eq!(plain.get("/metrics").0, 501);
    assert_eq!(plain.get("/slots").0, 200);
    assert_eq!(server(&["--metrics"]).get("/metrics").0, 200);
}

/// The status line and headers (lower-cased names) of a raw request.
fn raw_headers(s: &Server, request: &str) -> (String, Vec<(String, String)>) {
    use std::io::{BufRead, BufReader, Write};
    let mut c = s.connect();
    c.write_all(request.as_bytes()).unwrap();
    let mut r = BufReader::new(c);
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').unwrap();
        headers.push((k.to_ascii_lowercase(), v.trim().to_owned()));
    }
    (status, headers)
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[test]
fn cors_anthropic_key_header_verbose_and_llamacpp_metrics() {
    let s = server(&[
        "--api-key",
        "sk-1",
        "--cors-origins",
        "localhost",
        "--metrics-llamacpp-names",
    ]);
    let preflight = |origin: &str| {
        raw_headers(
            &s,
            &format!(
                "OPTIONS /completion HTTP/1.1\r\nHost: x\r\nOrigin: {origin}\r\n\
                 Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    // A preflight needs no key; a local origin is echoed, another gets no CORS header.
    for origin in [
        "http://localhost:3000",
        "http://127.0.0.1",
        "http://[::1]:8080",
    ] {
        let (status, h) = preflight(origin);
        assert!(status.contains(" 200 "), "{origin}: {status}");
        assert_eq!(header(&h, "access-control-allow-origin"), Some(origin));
        assert_eq!(header(&h, "access-control-allow-credentials"), Some("true"));
    }
    for origin in [
        "http://evil.com",
        "http://localhost.evil.com",
        "http://notlocalhost",
    ] {
        let (status, h) = preflight(origin);
        assert!(status.contains(" 200 "), "{status}");
        assert_eq!(header(&h, "access-control-allow-origin"), None, "{origin}");
    }
    // Anthropic's x-api-key header is a key too; a wrong one is a 401.
    let body = r#"{"prompt": "a", "n_predict": 1}"#;
    let post = |key: &str| {
        raw_headers(
            &s,
            &format!(
                "POST /completion HTTP/1.1\r\nHost: x\r\nx-api-key: {key}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        )
        .0
    };
    assert!(post("sk-1").contains(" 200 "));
    assert!(post("sk-2").contains(" 401 "));
    // llama-server's metric names, with the process start time header.
    let keyed = s.with_key(Some("sk-1"));
    let r = keyed.json(
        "/completion",
        &json!({"prompt": "a b", "n_predict": 5, "temperature": 0, "ignore_eos": true}),
    );
    let t = &r["timings"];
    let expect = 4.0 * 1e3 / t["predicted_ms"].as_f64().unwrap();
    assert!((t["predicted_per_second"].as_f64().unwrap() - expect).abs() < 1e-6 * expect);
    let (_, h) = raw_headers(
        &s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-1\r\nConnection: close\r\n\r\n",
    );
    assert!(header(&h, "process-start-time-unix").is_some_and(|v| v.parse::<u64>().is_ok()));
    let (_, text) = keyed.get("/metrics");
    let m = |name: &str| support::metric(&text, name);
    assert_eq!(m("llamacpp:tokens_predicted_total"), 5.0 + 1.0);
    assert_eq!(
        m("llamacpp:prompt_tokens_total") + m("llamacpp:prompt_tokens_cached_total"),
        m("qkv_prompt_tokens_total")
    );
    assert!(m("llamacpp:n_decode_total") > 0.0);
    // The gauge drops when the worker lets the request go, which may come a moment after the
    // client has read the whole reply: give it up to two seconds.
    let mut processing = m("llamacpp:requests_processing");
    for _ in 0..200 {
        if processing == 0.0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        let (_, text) = keyed.get("/metrics");
        processing = support::metric(&text, "llamacpp:requests_processing");
    }
    assert_eq!(processing, 0.0);
    // `verbose` adds the prompt as text.
    let r = keyed.json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Book"}], "max_tokens": 1, "verbose": true}),
    );
    assert!(r["__verbose"]["prompt"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>user\nBook"));
}

#[test]
fn gbnf_grammars_and_template_variables() {
    let s = server(&[]);
    // llama-server's grammar field takes GBNF.
    let r = s.json(
        "/completion",
        &json!({"prompt": "x", "n_predict": 8, "grammar": "root ::= \"a\"{3,3}"}),
    );
    assert_eq!(r["content"], "aaa", "{r}");
    let (status, text) = s.call(
        "POST",
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= (((("}),
    );
    assert_eq!(status, 400, "{text}");
    // A --chat-template-file reads enable_thinking and today's date as llama-server sets them.
    let dir = support::ScratchDir::new("native-template");
    let t = dir.write(
        "t.jinja",
        b"{{ date_string }}|{{ datetime }}|{% if enable_thinking %}think{% else %}no{% endif %}",
    );
    for (reasoning, want) in [("auto", "think"), ("off", "no")] {
        let s = server(&[
            "--chat-template-file",
            t.to_str().unwrap(),
            "--reasoning",
            reasoning,
        ]);
        let r = s.json(
            "/apply-template",
            &json!({"messages": [{"role": "user", "content": "x"}]}),
        );
        let p = r["prompt"].as_str().unwrap();
        let parts: Vec<&str> = p.split('|').collect();
        assert_eq!(parts[2], want, "{p}");
        assert_eq!(parts[0].len(), 11, "dd Mon yyyy: {p}");
        assert_eq!(parts[1].len(), 11, "Mon dd yyyy: {p}");
    }
}
