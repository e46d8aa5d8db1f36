//! Router mode (`--models-dir`, `--models-preset`): requests reach an instance of the model
//! they name, instances start on demand and make room for each other least recently used
//! first, a busy instance is never stopped for a queued one, and the router's own routes
//! answer as llama-server's do.

mod support;

use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};
use support::{synthetic_model, ScratchDir, Server};

/// A models directory holding the synthetic model under each of `names`.
fn models_dir(tag: &str, names: &[&str]) -> ScratchDir {
    let dir = ScratchDir::new(tag);
    for n in names {
        link(&dir, n, &synthetic_model());
    }
    dir
}

fn link(dir: &ScratchDir, name: &str, model: &Path) {
    std::os::unix::fs::symlink(model, dir.0.join(format!("{name}.gguf"))).unwrap();
}

/// A directory where `a` is the default model (slow enough to stay busy while the test
/// looks) and `b` the synthetic one; `None` (a skip printed) without the default model.
fn busy_dir(tag: &str) -> Option<ScratchDir> {
    let default = qkv_fetch::testing::default_gguf()?;
    let dir = ScratchDir::new(tag);
    link(&dir, "a", &default);
    link(&dir, "b", &synthetic_model());
    Some(dir)
}

/// Starts a long stream from `a` and reads its first event: `a` is then busy until the
/// returned connection is dropped (the client leaving cancels the generation).
fn keep_busy(server: &Server) -> std::io::BufReader<std::net::TcpStream> {
    let body = json!({"model": "a", "prompt": "x", "max_tokens": 400, "stream": true,
        "ignore_eos": true, "temperature": 0});
    let (code, chunked, mut stream) =
        server.send("POST", "/v1/completions", body.to_string().as_bytes());
    assert_eq!((code, chunked), (200, true));
    assert!(support::next_chunk(&mut stream).is_some());
    stream
}

fn router(dir: &Path, extra: &[&str]) -> Server {
    let dir = dir.to_str().unwrap();
    let args = [
        &["--models-dir", dir, "--ctx", "512", "--threads", "1"],
        extra,
    ]
    .concat();
    Server::spawn(&args).unwrap_or_else(|e| panic!("the router exited: {e}"))
}

/// The status of every model, by name.
fn statuses(server: &Server) -> Vec<(String, String)> {
    let (code, text) = server.get("/models");
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_owned(),
                m["status"]["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn status(server: &Server, id: &str) -> String {
    statuses(server)
        .into_iter()
        .find(|(m, _)| m == id)
        .unwrap_or_else(|| panic!("{id} not listed"))
        .1
}

fn wait_for(server: &Server, id: &str, want: &str) {
    let start = Instant::now();
    while status(server, id) != want {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{id} never became {want}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn completion(model: &str, n: usize) -> Value {
    json!({"model": model, "prompt": "one two three", "max_tokens": n, "temperature": 0})
}

#[test]
fn requests_reach_their_model_and_the_least_recently_used_makes_room() {
    let dir = models_dir("router-lru", &["a", "b", "c"]);
    let server = router(&dir.0, &["--models-max", "2"]);
    assert_eq!(
        statuses(&server),
        ["a", "b", "c"].map(|m| (m.to_owned(), "unloaded".to_owned()))
    );
    // The same text as a server of that file alone.
    let direct = Server::start_synthetic(&["--threads", "1"]);
    let want =
        direct.json("/v1/completions", &completion("smollm2", 8))["choices"][0]["text"].clone();
    let got = server.json("/v1/completions", &completion("a", 8));
    assert_eq!(got["choices"][0]["text"], want);
    assert_eq!(got["model"], "a");
    assert_eq!(status(&server, "a"), "loaded");
    server.json("/v1/completions", &completion("b", 2));
    server.json("/v1/completions", &completion("c", 2));
    assert_eq!(
        status(&server, "a"),
        "unloaded",
        "a was the least recently used"
    );
    assert_eq!(status(&server, "b"), "loaded");
    assert_eq!(status(&server, "c"), "loaded");
    // Streaming passes through chunk by chunk.
    let events = server
        .stream(
            "/v1/chat/completions",
            &json!({"model": "b", "stream": true, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .all();
    assert!(events.len() >= 2, "{events:?}");
    // A GET names its model in the query.
    let (code, text) = server.get("/props?model=b");
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["model_alias"],
        "b"
    );
}

#[test]
fn a_busy_model_is_not_stopped_and_the_queue_waits_for_it() {
    let Some(dir) = busy_dir("router-busy") else {
        return;
    };
    let server = router(&dir.0, &["--models-max", "1"]);
    let stream = keep_busy(&server);
    let queued = {
        let port = server.port;
        std::thread::spawn(move || {
            Server::attach(port).call("POST", "/v1/completions", &completion("b", 2))
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(status(&server, "a"), "loaded", "a serves a request");
    assert_eq!(status(&server, "b"), "unloaded", "b waits for a place");
    assert!(!queued.is_finished());
    drop(stream);
    let (code, text) = queued.join().unwrap();
    assert_eq!(code, 200, "{text}");
    assert_eq!(status(&server, "a"), "unloaded");
    assert_eq!(status(&server, "b"), "loaded");
}

#[test]
fn a_client_that_leaves_the_queue_costs_no_model_its_place() {
    let Some(dir) = busy_dir("router-leave") else {
        return;
    };
    let server = router(&dir.0, &["--models-max", "1"]);
    let stream = keep_busy(&server);
    {
        let mut s = server.connect();
        let b = completion("b", 2).to_string();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{b}",
            b.len()
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_millis(300));
    drop(stream);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(status(&server, "a"), "loaded");
    assert_eq!(status(&server, "b"), "unloaded");
}

#[test]
fn the_routers_own_routes_and_errors() {
    let dir = models_dir("router-routes", &["a"]);
    dir.write("broken.gguf", b"GGUF this is not a model");
    let server = router(&dir.0, &["--no-models-autoload", "--models-max", "3"]);
    let (code, text) = server.get("/props");
    assert_eq!(code, 200);
    let props: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(props["role"], "router");
    assert_eq!(props["max_instances"], 3);
    assert_eq!(props["models_autoload"], false);
    assert!(props["build_info"].as_str().unwrap().starts_with('b'));
    // No model named, an unknown one, one not loaded.
    let chat = |m: Option<&str>| {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        if let Some(m) = m {
            body["model"] = json!(m);
        }
        server.call("POST", "/v1/chat/completions", &body)
    };
    let (code, text) = chat(None);
    assert_eq!(code, 400);
    assert!(text.contains("model name is missing"), "{text}");
    assert_eq!(chat(Some("ghost")).0, 404);
    let (code, text) = chat(Some("a"));
    assert_eq!(code, 400);
    assert!(text.contains("not loaded"), "{text}");
    // Loaded by request, then served; unloaded by request.
    assert_eq!(
        server.json("/models/load", &json!({"model": "a"}))["success"],
        true
    );
    wait_for(&server, "a", "loaded");
    assert_eq!(chat(Some("a")).0, 200);
    assert_eq!(
        server.json("/models/unload", &json!({"model": "a"}))["success"],
        true
    );
    assert_eq!(status(&server, "a"), "unloaded");
    assert_eq!(
        server
            .call("POST", "/models/unload", &json!({"model": "a"}))
            .0,
        400
    );
    // A file that does not load: its failure is reported, with the exit code.
    server.json("/models/load", &json!({"model": "broken"}));
    let start = Instant::now();
    let failed = loop {
        let (_, text) = server.get("/models");
        let v: Value = serde_json::from_str(&text).unwrap();
        let m = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == "broken")
            .unwrap()
            .clone();
        if m["status"]["failed"] == true {
            break m;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{m}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(failed["status"]["value"], "unloaded");
    assert_eq!(failed["status"]["exit_code"], 1);
    let (code, text) = server.call(
        "POST",
        "/v1/chat/completions?autoload=true",
        &json!({"model": "broken", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("failed to load"), "{text}");
}

#[test]
fn keys_guard_the_router_and_presets_are_read_again_on_reload() {
    let dir = models_dir("router-preset", &["a"]);
    let model = synthetic_model();
    let ini = |sections: &str| format!("version = 1\n[*]\nctx-size = 256\n{sections}");
    let preset = dir.write(
        "presets.ini",
        ini(&format!("[p1]\nmodel = {}\n", model.display())).as_bytes(),
    );
    let preset = preset.to_str().unwrap();
    let mut server = Server::spawn(&["--models-preset", preset, "--api-key", "sk-r"])
        .unwrap_or_else(|e| panic!("{e}"));
    support::assert_401(server.get("/models"), "GET /models without the key");
    server.key = Some("sk-r".into());
    let ids: Vec<String> = statuses(&server).into_iter().map(|(m, _)| m).collect();
    assert_eq!(ids, ["p1"]);
    let got = server.json("/v1/completions", &completion("p1", 2));
    assert_eq!(got["model"], "p1");
    let v: Value = serde_json::from_str(&server.get("/models").1).unwrap();
    let args: Vec<String> = serde_json::from_value(v["data"][0]["status"]["args"].clone()).unwrap();
    assert!(
        args.windows(2).any(|w| w == ["--ctx-size", "256"]),
        "{args:?}"
    );
    assert!(
        !args.iter().any(|a| a.contains("sk-r")),
        "the key stays with the router"
    );
    dir.write(
        "presets.ini",
        ini(&format!("[p2]\nmodel = {}\n", model.display())).as_bytes(),
    );
    let (code, text) = server.get("/models?reload=1");
    assert_eq!(code, 200, "{text}");
    let ids: Vec<String> = statuses(&server).into_iter().map(|(m, _)| m).collect();
    assert_eq!(ids, ["p2"]);
    // A preset naming no file is refused at start, by section.
    dir.write("bad.ini", b"[nothing]\nc = 1\n");
    let e = Server::spawn(&["--models-preset", dir.0.join("bad.ini").to_str().unwrap()])
        .err()
        .expect("a preset without a model must not start");
    assert!(e.contains("[nothing]"), "{e}");
    // A model and a router's sources together are refused.
    let e = Server::spawn(&[
        "--model",
        model.to_str().unwrap(),
        "--models-dir",
        dir.0.to_str().unwrap(),
    ])
    .err()
    .expect("refused");
    assert!(e.contains("not both"), "{e}");
}
