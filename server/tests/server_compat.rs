//! What qkv-server took from llama-server for its own test suite to pass, over loopback on
//! the synthetic decoder of src/testing/synthetic.rs: response header names on the wire in
//! Title-Case; embeddings from a generative model (`--embeddings`, `--pooling`) equal to the
//! library's own hidden states pooled and normalised; `--alias` and `--tags` in
//! `/v1/models`; content parts joined by a blank line; the `functions` variable of
//! FireFunction's template; `--chat-template` by name; Anthropic's `stop_sequence`;
//! `return_progress`.

mod support;

use qkv::load::{Model, ModelOptions};
use qkv::tokenizer::EncodeOptions;
use qkv::weights::FloatType;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use support::{synthetic, synthetic_model, ScratchDir, Server};

fn server(extra: &[&str]) -> Server {
    let model = synthetic();
    let args = [&["--model", model.as_str(), "--ctx", "256"][..], extra].concat();
    Server::spawn(&args).unwrap_or_else(|e| panic!("the server exited: {e}"))
}

/// The status line and header lines of a request, exactly as sent.
fn raw_headers(s: &Server, request: &str) -> Vec<String> {
    let mut c = s.connect();
    c.write_all(request.as_bytes()).unwrap();
    let mut r = BufReader::new(c);
    let mut out = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            return out;
        }
        out.push(line.trim_end().to_owned());
    }
}

#[test]
fn header_names_go_out_in_title_case() {
    let s = server(&["--cors-origins", "*", "--metrics"]);
    let h = raw_headers(
        &s,
        "OPTIONS /completions HTTP/1.1\r\nHost: localhost\r\nOrigin: web.mydomain.fr\r\n\
         Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n",
    );
    assert!(h[0].starts_with("HTTP/1.1 200"), "{h:?}");
    for want in [
        "Access-Control-Allow-Origin: web.mydomain.fr",
        "Access-Control-Allow-Credentials: true",
        "Access-Control-Allow-Methods: GET, POST, DELETE, OPTIONS",
        "Access-Control-Allow-Headers: *",
    ] {
        assert!(h.iter().any(|l| l == want), "{want} not in {h:?}");
    }
    let h = raw_headers(
        &s,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert!(
        h.iter().any(|l| l.starts_with("Process-Start-Time-Unix: ")),
        "{h:?}"
    );
    assert!(h.iter().any(|l| l.starts_with("Content-Type: ")), "{h:?}");
    // Keep-alive still works: two requests on one connection.
    let mut c = s.connect();
    let get = "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n";
    c.write_all(format!("{get}{get}").as_bytes()).unwrap();
    let mut r = BufReader::new(c);
    let mut statuses = 0;
    let mut line = String::new();
    while statuses < 2 && r.read_line(&mut line).unwrap() > 0 {
        // A body has no newline of its own: the next status line follows it on the line.
        if line.contains("HTTP/1.1 200") {
            statuses += 1;
        }
        line.clear();
    }
    assert_eq!(statuses, 2);
}

/// The library's embedding of `text` on the synthetic model: its final hidden states pooled
/// by `pooling`, Euclidean-normalised unless unpooled.
fn reference(text: &str, pooling: &str) -> Vec<Vec<f32>> {
    let model = Model::load(&synthetic_model(), &ModelOptions::default()).unwrap();
    let ids = model
        .tokenizer()
        .unwrap()
        .encode_with(
            text,
            EncodeOptions {
                add_special: true,
                parse_special: true,
            },
        )
        .unwrap();
    let dec = model.decoder();
    let d = dec.config().dim;
    let mut state = dec.new_state(ids.len(), FloatType::F32, 512).unwrap();
    let mut hidden = vec![0.0; ids.len() * d];
    dec.forward_hidden(&mut state, &ids, &mut hidden).unwrap();
    let rows: Vec<Vec<f32>> = hidden.chunks(d).map(<[f32]>::to_vec).collect();
    let mut pooled = match pooling {
        "none" => return rows,
        "last" => rows.last().unwrap().clone(),
        "cls" => rows[0].clone(),
        _ => (0..d)
            .map(|j| rows.iter().map(|r| r[j]).sum::<f32>() / rows.len() as f32)
            .collect(),
    };
    let norm = pooled.iter().map(|x| x * x).sum::<f32>().sqrt();
    pooled.iter_mut().for_each(|x| *x /= norm);
    vec![pooled]
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-4, "{x} vs {y}");
    }
}

#[test]
fn a_decoder_serves_embeddings_of_its_hidden_states() {
    let text = "the cat sat on the mat";
    for pooling in ["last", "mean", "cls"] {
        let s = server(&["--embeddings", "--pooling", pooling]);
        let r = s.json(
            "/v1/embeddings",
            &json!({"input": [text, {"content": [{"type": "text", "text": "the cat sat "},
                {"type": "text", "text": "on the mat"}]}], "model": "anything"}),
        );
        let want = &reference(text, pooling)[0];
        let got = floats(&r["data"][0]["embedding"]);
        close(&got, want);
        assert_eq!(
            r["data"][0]["embedding"], r["data"][1]["embedding"],
            "{pooling}"
        );
        let norm: f32 = got.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-4, "{pooling}: {norm}");
        assert_eq!(r["usage"]["prompt_tokens"], r["usage"]["total_tokens"]);
        // llama-server's /embeddings: the pooled vector in a list; embd_normalize -1 keeps
        // it as it is (not of length 1).
        let n = s.json(
            "/embeddings",
            &json!({"content": text, "embd_normalize": -1}),
        );
        let raw = floats(&n[0]["embedding"][0]);
        let scale = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
        let rescaled: Vec<f32> = raw.iter().map(|x| x / scale).collect();
        close(&rescaled, want);
    }
    // Unpooled: every token's vector on /embeddings, unnormalised; a 400 on /v1/embeddings.
    let s = server(&["--embeddings", "--pooling", "none"]);
    let n = s.json("/embeddings", &json!({"input": text}));
    let rows = n[0]["embedding"].as_array().unwrap();
    let want = reference(text, "none");
    assert_eq!(rows.len(), want.len());
    for (r, w) in rows.iter().zip(&want) {
        close(&floats(r), w);
    }
    let (status, body) = s.call("POST", "/v1/embeddings", &json!({"input": text}));
    assert_eq!(status, 400, "{body}");
    // base64 is the same floats; a text past the context is a 400 that says so.
    let s = server(&["--embeddings"]);
    let f = s.json("/v1/embeddings", &json!({"input": text}));
    let b = s.json(
        "/v1/embeddings",
        &json!({"input": text, "encoding_format": "base64"}),
    );
    assert_eq!(
        b["data"][0]["embedding"].as_str().unwrap(),
        qkv_server::embedding::base64_f32(&floats(&f["data"][0]["embedding"]))
    );
    let long = "the cat sat on the mat ".repeat(200);
    let (status, body) = s.call("POST", "/v1/embeddings", &json!({"input": long}));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("too large"), "{body}");
    for bad in [json!({"input": []}), json!({"input": {"content": "x"}})] {
        assert_eq!(s.call("POST", "/v1/embeddings", &bad).0, 400, "{bad}");
    }
    // Without --embeddings: a 400 that names the flag.
    let plain = server(&[]);
    let (status, body) = plain.call("POST", "/v1/embeddings", &json!({"input": text}));
    assert_eq!(status, 400);
    assert!(body.contains("--embeddings"), "{body}");
    // `--pooling rank` is llama-server's `--reranking`, which this model cannot do.
    assert!(
        Server::spawn(&["--model", &synthetic(), "--pooling", "rank"])
            .err()
            .unwrap()
            .contains("--reranking")
    );
}

#[test]
fn alias_and_tags_name_one_model() {
    let s = server(&[
        "--alias",
        "tinyllama-2,fim,code",
        "--tags",
        "chat,fim,small",
    ]);
    let (status, text) = s.get("/models");
    assert_eq!(status, 200);
    let m: Value = serde_json::from_str(&text).unwrap();
    let data = m["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["id"], "code");
    assert_eq!(data[0]["aliases"], json!(["code", "fim", "tinyllama-2"]));
    assert_eq!(data[0]["tags"], json!(["chat", "fim", "small"]));
    let r = s.json(
        "/v1/completions",
        &json!({"model": "fim", "prompt": "the cat", "max_tokens": 2}),
    );
    assert_eq!(r["model"], "code");
    let e = Server::spawn(&["--model", &synthetic(), "--alias", "a", "--model-name", "b"])
        .err()
        .unwrap();
    assert!(e.contains("--alias and --model-name"), "{e}");
}

#[test]
fn templates_get_what_llama_server_gives_them() {
    // Text parts are joined by a blank line, as llama-server joins them.
    let s = server(&["--chat-template", "command-r"]);
    let r = s.json(
        "/apply-template",
        &json!({"messages": [{"role": "system", "content": "You are a test."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"},
                {"type": "text", "text": "there"}]}]}),
    );
    assert_eq!(
        r["prompt"],
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi\n\nthere<|END_OF_TURN_TOKEN|>\
         <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    );
    // Any other value is the template itself, as llama-server takes it.
    let s = server(&["--chat-template", "{{ messages[0]['content'] }}!"]);
    let r = s.json(
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(r["prompt"], "Hi!");
    // A template reading `functions` (the tools as JSON text) and `datetime`.
    let dir = ScratchDir::new("functions-template");
    let file = dir.write(
        "t.jinja",
        b"{{- 'F[' + functions + '] D[' + datetime + ']' -}}\
          {%- for m in messages %}|{{ m['content'] }}{% endfor -%}",
    );
    let s = server(&["--chat-template-file", file.to_str().unwrap()]);
    let r = s.json(
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "What is today?"}]}),
    );
    let prompt = r["prompt"].as_str().unwrap();
    assert!(prompt.starts_with("F[] D["), "{prompt}");
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": {}}});
    let r = s.json(
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "x"}], "tools": [tool]}),
    );
    let prompt = r["prompt"].as_str().unwrap();
    let listed = &prompt[2..prompt.find("] D[").unwrap()];
    assert_eq!(
        serde_json::from_str::<Value>(listed).unwrap(),
        json!([tool])
    );
}

#[test]
fn anthropic_names_the_stop_sequence_that_ended_the_reply() {
    let s = server(&[]);
    let body = |stop: Option<&str>, stream: bool| {
        let mut b = json!({"model": "m", "max_tokens": 24, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": "Hello"}]});
        if let Some(stop) = stop {
            b["stop_sequences"] = json!(["never-in-the-reply", stop]);
        }
        b
    };
    let free = s.json("/v1/messages", &body(None, false));
    assert_eq!(free["stop_sequence"], Value::Null);
    let text = free["content"][0]["text"].as_str().unwrap().to_owned();
    // A stop sequence from the middle of the free reply ends it there.
    let mid: String = text
        .chars()
        .skip(text.chars().count() / 2)
        .take(1)
        .collect();
    assert!(!mid.is_empty(), "the reply is empty: {free}");
    let r = s.json("/v1/messages", &body(Some(&mid), false));
    assert_eq!(r["stop_reason"], "stop_sequence", "{r}");
    assert_eq!(r["stop_sequence"], mid.as_str());
    assert!(!r["content"][0]["text"].as_str().unwrap().contains(&mid));
    let (status, chunked, mut rd) = s.send(
        "POST",
        "/v1/messages",
        body(Some(&mid), true).to_string().as_bytes(),
    );
    assert_eq!((status, chunked), (200, true));
    let mut all = String::new();
    while let Some(c) = support::next_chunk(&mut rd) {
        all.push_str(std::str::from_utf8(&c).unwrap());
    }
    let delta = all
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .find(|d| d["type"] == "message_delta")
        .unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(delta["delta"]["stop_sequence"], mid.as_str());
}

/// llama-server's `return_progress`: a streamed reply reports its prompt's progress when the
/// prompt takes its slot (`processed` equal to `cache`, timings at 0) and after each chunk
/// of it is read (`--prefill-step-tokens 8` cuts it small), the last at `total` and before
/// the first token; the chat stream sends the same reports as chunks without choices, and
/// only when asked.
#[test]
fn streams_report_prompt_progress_when_asked() {
    let s = server(&["--step-tokens", "8", "--prefill-step-tokens", "8"]);
    let prompt = "the quick brown fox jumps over the lazy dog ".repeat(2);
    let body = json!({"prompt": prompt, "n_predict": 3, "stream": true,
        "return_progress": true});
    let mut sse = s.stream("/completion", &body);
    let mut chunks = Vec::new();
    while let Some(d) = sse.next() {
        if d == "[DONE]" {
            break;
        }
        chunks.push(serde_json::from_str::<Value>(&d).unwrap());
    }
    let progress: Vec<&Value> = chunks
        .iter()
        .filter(|c| c.get("prompt_progress").is_some())
        .collect();
    assert!(progress.len() > 2, "{chunks:?}");
    let (first, last) = (progress[0], progress[progress.len() - 1]);
    assert_eq!(first["timings"]["prompt_n"], 0);
    assert_eq!(first["timings"]["prompt_ms"], 0.0);
    assert_eq!(first["timings"]["predicted_n"], 0);
    assert_eq!(
        first["prompt_progress"]["processed"],
        first["prompt_progress"]["cache"]
    );
    let processed: Vec<u64> = progress
        .iter()
        .map(|p| p["prompt_progress"]["processed"].as_u64().unwrap())
        .collect();
    assert!(processed.windows(2).all(|w| w[1] > w[0]), "{processed:?}");
    assert_eq!(
        last["prompt_progress"]["processed"],
        last["prompt_progress"]["total"]
    );
    let first_token = chunks
        .iter()
        .position(|c| c["tokens"].as_array().is_some_and(|t| !t.is_empty()))
        .unwrap();
    let last_report = chunks
        .iter()
        .rposition(|c| c.get("prompt_progress").is_some())
        .unwrap();
    assert!(last_report < first_token);

    let chat = |progress: bool| {
        s.stream(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 2,
                "stream": true, "return_progress": progress}),
        )
        .all()
    };
    let with = chat(true);
    let reports: Vec<&Value> = with
        .iter()
        .filter(|c| c.get("prompt_progress").is_some())
        .collect();
    assert!(reports.len() > 2, "{with:?}");
    assert!(reports.iter().all(|c| c["choices"] == json!([])));
    assert!(chat(false)
        .iter()
        .all(|c| c.get("prompt_progress").is_none()));
}
