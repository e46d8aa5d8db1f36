//! qkv-server started with llama-server's command line (llama_flags.rs and args.rs): its
//! short and long flags and `LLAMA_ARG_*` variables with their meanings (`-c` split among
//! `-np` slots unless `--kv-unified`, `--metrics` with the `llamacpp:` names), GPU flags
//! accepted with a note, missing features refused by name, and CORS as llama-server answers
//! it by default. On the synthetic decoder of src/testing/synthetic.rs.

mod support;

use serde_json::{json, Value};
use support::{synthetic, Server};

fn props(s: &Server) -> Value {
    let (status, text) = s.get("/props");
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

fn n_ctx(s: &Server) -> u64 {
    props(s)["default_generation_settings"]["n_ctx"]
        .as_u64()
        .unwrap()
}

#[test]
fn llama_servers_own_command_line_starts_with_its_meanings() {
    let model = synthetic();
    let (s, said) = Server::spawn_env(
        &[
            "-m",
            &model,
            "-c",
            "512",
            "-np",
            "4",
            "-t",
            "2",
            "-a",
            "tiny,small",
            "-ngl",
            "99",
            "-fa",
            "on",
            "--jinja",
            "-ctk",
            "q8_0",
            "-ctv",
            "q8_0",
            "--metrics",
            "-n",
            "7",
            "--seed",
            "42",
            "--temp",
            "0",
            "-ub",
            "64",
            "-b",
            "128",
            "--cont-batching",
        ],
        &[],
    )
    .unwrap();
    // One note per flag that means nothing here.
    for flag in ["-ngl 99", "-fa on", "--jinja", "-ub 64", "--cont-batching"] {
        let line = format!("note: {flag}: accepted, no effect");
        assert!(said.contains(&line), "{line} not in {said}");
    }
    // -c 512 split among -np 4 slots.
    let p = props(&s);
    assert_eq!(p["total_slots"], 4);
    assert_eq!(p["default_generation_settings"]["n_ctx"], 128);
    assert_eq!(p["default_generation_settings"]["params"]["n_predict"], 7);
    assert_eq!(p["model_alias"], "small");
    // --metrics: /metrics served, with llama-server's names.
    let r = s.json("/completion", &json!({"prompt": "the cat"}));
    assert_eq!(r["tokens_predicted"], 7);
    let (status, text) = s.get("/metrics");
    assert_eq!(status, 200, "{text}");
    assert!(support::metric(&text, "llamacpp:tokens_predicted_total") >= 7.0);
    // --kv-unified: each slot may fill the whole -c, as without -np.
    let unified = Server::spawn(&["-m", &model, "-c", "512", "-np", "4", "--kv-unified"]).unwrap();
    assert_eq!(n_ctx(&unified), 512);
    let auto = Server::spawn(&["--model", &model, "--ctx-size", "300"]).unwrap();
    assert_eq!(n_ctx(&auto), 300);
    // Without --metrics, /metrics is llama-server's 501.
    assert_eq!(auto.get("/metrics").0, 501);
}

#[test]
fn llama_servers_variables_are_read_and_the_command_line_wins() {
    let model = synthetic();
    let (s, said) = Server::spawn_env(
        &["--parallel", "2"],
        &[
            ("LLAMA_ARG_MODEL", &model),
            ("LLAMA_ARG_CTX_SIZE", "256"),
            ("LLAMA_ARG_N_PARALLEL", "8"),
            ("LLAMA_ARG_ENDPOINT_METRICS", "1"),
            ("LLAMA_ARG_N_GPU_LAYERS", "all"),
            ("LLAMA_ARG_ENDPOINT_SLOTS", "disabled"),
            ("LLAMA_API_KEY", "k1,k2"),
        ],
    )
    .unwrap();
    assert!(
        said.contains("note: LLAMA_ARG_N_GPU_LAYERS: --n-gpu-layers all"),
        "{said}"
    );
    for key in ["k1", "k2"] {
        let k = s.with_key(Some(key));
        let p = props(&k);
        assert_eq!(p["total_slots"], 2, "the command line's -np wins");
        assert_eq!(p["default_generation_settings"]["n_ctx"], 128);
        assert_eq!(k.get("/metrics").0, 200);
        assert_eq!(k.get("/slots").0, 501);
    }
    assert_eq!(s.get("/props").0, 401);
}

#[test]
fn missing_features_and_bad_values_are_refused_by_name() {
    let model = synthetic();
    for (args, env, want) in [
        (
            vec!["--control-vector", "a.gguf"],
            vec![],
            "--control-vector: qkv-server does not support control vectors",
        ),
        (
            vec!["--models-dir", "/m"],
            vec![],
            "--model with --models-dir or --models-preset: give one model, or the models of a \
             router, not both",
        ),
        (
            vec!["-hf", "org/repo"],
            vec![],
            "-hf: qkv-server does not support downloading models",
        ),
        (
            vec![],
            vec![("LLAMA_ARG_MODEL_URL", "http://x/m.gguf")],
            "LLAMA_ARG_MODEL_URL: --model-url:",
        ),
        (
            vec!["-ctk", "q4_0", "-ctv", "q4_0"],
            vec![],
            "--cache-type-k q4_0: qkv-server does not support this cache type",
        ),
        (
            vec!["-ctk", "q8_0"],
            vec![],
            "--cache-type-k q8_0 with --cache-type-v f16",
        ),
        (
            vec!["-fa", "sometimes"],
            vec![],
            "-fa sometimes: not a value",
        ),
        (vec!["-np", "0"], vec![], "--parallel 0"),
        (
            vec!["-c", "3", "-np", "4"],
            vec![],
            "--ctx-size 3: fewer positions",
        ),
        (vec!["--no-such-flag"], vec![], "--no-such-flag"),
    ] {
        let args: Vec<&str> = [&["-m", model.as_str()][..], &args].concat();
        let err = match Server::spawn_env(&args, &env) {
            Ok(_) => panic!("{args:?} started"),
            Err(e) => e,
        };
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn a_preflight_is_answered_as_llama_server_does_by_default() {
    let s = Server::spawn(&["-m", &synthetic(), "--api-key", "sk-1"]).unwrap();
    let mut c = s.connect();
    use std::io::{BufRead, BufReader, Write};
    c.write_all(
        b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://web.example\r\n\
          Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: Authorization\r\n\
          Connection: close\r\n\r\n",
    )
    .unwrap();
    let lines: Vec<String> = BufReader::new(c)
        .lines()
        .map_while(Result::ok)
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(lines[0].contains(" 200 "), "{lines:?}");
    for want in [
        "Access-Control-Allow-Origin: http://web.example",
        "Access-Control-Allow-Credentials: true",
        "Access-Control-Allow-Methods: GET, POST, DELETE, OPTIONS",
        "Access-Control-Allow-Headers: *",
    ] {
        assert!(lines.iter().any(|l| l == want), "{want} not in {lines:?}");
    }
}

#[test]
fn sleep_idle_seconds_frees_the_caches_until_a_request_comes() {
    let (s, _) = Server::spawn_env(
        &["-m", &synthetic(), "--sleep-idle-seconds", "1", "--metrics"],
        &[],
    )
    .unwrap();
    let sleeping = |s: &Server| props(s)["is_sleeping"].as_bool().unwrap();
    assert!(!sleeping(&s));
    let r = s.json("/completion", &json!({"prompt": "the cat", "n_predict": 3}));
    assert_eq!(r["tokens_predicted"], 3);
    let t = std::time::Instant::now();
    while !sleeping(&s) {
        assert!(t.elapsed().as_secs() < 20, "the server did not go to sleep");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Reading routes answer without waking it; a generation wakes it and is served.
    let (status, metrics) = s.get("/metrics");
    assert_eq!(status, 200);
    assert_eq!(s.get("/metrics").1, metrics);
    assert_eq!(s.get("/v1/models").0, 200);
    assert!(sleeping(&s));
    let r = s.json("/completion", &json!({"prompt": "the cat", "n_predict": 3}));
    assert_eq!(r["tokens_predicted"], 3);
    assert!(!sleeping(&s));
    assert!(Server::spawn(&["-m", &synthetic(), "--sleep-idle-seconds", "-5"]).is_err());
}
