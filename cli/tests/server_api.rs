//! `qkv-server`'s model names, over loopback, on the synthetic decoder of
//! tests/common/synthetic.rs.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use serde_json::{json, Value};
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
