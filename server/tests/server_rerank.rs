//! Reranking (rerank.rs): a decoder that answers yes or no (`--reranking`) and a BERT
//! cross-encoder score documents as transformers does, on the tiny random-weight models of
//! tools/rerank_fixture.py (read from `$QKV_CACHE/rerank`; skipped without them, except
//! under CI, where .ci/run makes them); Jina's, Cohere's and TEI's shapes, `top_n`, the
//! returned texts, the 400s naming their field, the 501 of a server started without the
//! flag, and the refusal of a model whose vocabulary has no `yes` and `no`.

mod support;

use serde_json::{json, Value};
use std::path::PathBuf;
use support::{synthetic, Server};

fn fixture() -> Option<PathBuf> {
    let dir = std::env::var_os("QKV_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("qkv")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/qkv")))
        .unwrap_or_default()
        .join("rerank");
    if dir.join("qwen3/reference.json").is_file() && dir.join("bert/reference.json").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "the reranker fixture is not at {} (.ci/run makes it with tools/rerank_fixture.py)",
        dir.display()
    );
    eprintln!("skipped: no reranker fixture (python3 tools/rerank_fixture.py makes it)");
    None
}

fn reranker(dir: &std::path::Path) -> Server {
    Server::spawn(&[
        "--model",
        dir.join("qwen3/hf").to_str().unwrap(),
        "--reranking",
    ])
    .unwrap_or_else(|e| panic!("the server exited: {e}"))
}

#[test]
fn scores_equal_transformers() {
    let Some(dir) = fixture() else { return };
    compare(&reranker(&dir), &dir.join("qwen3"), "score");
}

#[test]
fn cross_encoder_logits_equal_transformers() {
    let Some(dir) = fixture() else { return };
    let bert = dir.join("bert");
    // Served without --reranking: a cross-encoder has nothing else to serve.
    let s = Server::spawn(&["--model", bert.join("hf").to_str().unwrap()]).unwrap();
    compare(&s, &bert, "logit");
    let r = s.json(
        "/rerank",
        &json!({"query": "q", "texts": ["a", "b"], "top_n": 1}),
    );
    assert_eq!(r.as_array().unwrap().len(), 1);
    let (status, text) = s.call("POST", "/rerank", &json!({"query": "q", "documents": [7]}));
    assert_eq!(status, 400, "{text}");
    let long = "word ".repeat(200);
    let (status, text) = s.call(
        "POST",
        "/rerank",
        &json!({"query": "q", "documents": [long]}),
    );
    assert_eq!(status, 400, "{text}");
    // Models and tokenize answer; generation is a 400 saying what the model is.
    let (status, text) = s.get("/v1/models");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"n_embd\":32"), "{text}");
    let t = s.json("/tokenize", &json!({"content": "hello world"}));
    assert!(!t["tokens"].as_array().unwrap().is_empty(), "{t}");
    let (status, text) = s.call("POST", "/v1/completions", &json!({"prompt": "a"}));
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("cross-encoder"), "{text}");
}

/// The server's scores for the reference's cases against its `key`.
fn compare(s: &Server, dir: &std::path::Path, key: &str) {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let cases = reference["cases"].as_array().unwrap();
    let mut queries: Vec<&str> = cases.iter().map(|c| c["query"].as_str().unwrap()).collect();
    queries.dedup();
    for q in queries {
        let mine: Vec<&Value> = cases.iter().filter(|c| c["query"] == q).collect();
        let docs: Vec<&Value> = mine.iter().map(|c| &c["document"]).collect();
        let r = s.json("/v1/rerank", &json!({"query": q, "documents": docs}));
        let tokens: u64 = mine.iter().map(|c| c["tokens"].as_u64().unwrap()).sum();
        assert_eq!(r["usage"]["prompt_tokens"], tokens, "{q}");
        assert_eq!(r["object"], "list");
        let results = r["results"].as_array().unwrap();
        assert_eq!(results.len(), mine.len());
        let mut last = f64::INFINITY;
        for x in results {
            let i = x["index"].as_u64().unwrap() as usize;
            let got = x["relevance_score"].as_f64().unwrap();
            let want = mine[i][key].as_f64().unwrap();
            assert!(
                (got - want).abs() < 1e-4,
                "{q} / document {i}: {got} vs {want}"
            );
            assert!(got <= last, "results are not best first: {r}");
            last = got;
        }
    }
}

#[test]
fn request_shapes_top_n_texts_and_errors() {
    let Some(dir) = fixture() else { return };
    let s = reranker(&dir);
    let docs = ["a cat", "a dog", "the city", "learning"];
    // Every route, TEI's shape with its texts, top_n past the count.
    for route in ["/rerank", "/reranking", "/v1/rerank"] {
        let r = s.json(
            route,
            &json!({"query": "q", "texts": docs, "return_text": true, "top_n": 99}),
        );
        let list = r.as_array().unwrap_or_else(|| panic!("{route}: {r}"));
        assert_eq!(list.len(), 4);
        for x in list {
            let i = x["index"].as_u64().unwrap() as usize;
            assert_eq!(x["text"], docs[i]);
            assert!(x["score"].as_f64().is_some());
        }
    }
    // Jina's and Cohere's shape: top_n, documents as strings or {"text"}, returned.
    let r = s.json(
        "/rerank",
        &json!({"model": "m", "query": "q", "documents": ["a cat", {"text": "a dog"}, "x"],
                "top_n": 2, "return_documents": true}),
    );
    assert_eq!(r["model"], "m");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for x in results {
        let i = x["index"].as_u64().unwrap() as usize;
        assert_eq!(x["document"]["text"], ["a cat", "a dog", "x"][i]);
    }
    let top = s.json(
        "/rerank",
        &json!({"query": "q", "documents": ["a cat", "a dog", "x"]}),
    );
    assert_eq!(top["results"][0], {
        let mut first = results[0].clone();
        first.as_object_mut().unwrap().remove("document");
        first
    });
    // Malformed requests: 400s naming the field; the server goes on.
    for (body, field) in [
        (json!({"documents": ["a"]}), "query"),
        (json!({"query": "q", "documents": []}), "documents"),
        (json!({"query": "q", "documents": null}), "documents"),
        (json!({"query": "q", "documents": 123}), "documents"),
        (
            json!({"query": "q", "documents": [1, 2, 3]}),
            "documents[0]",
        ),
        (
            json!({"query": "q", "documents": ["a"], "top_n": 0}),
            "top_n",
        ),
    ] {
        let (status, text) = s.call("POST", "/rerank", &body);
        assert_eq!(status, 400, "{body}: {text}");
        let e: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(e["error"]["param"], field, "{text}");
    }
    let long = "word ".repeat(2000);
    let (status, text) = s.call(
        "POST",
        "/rerank",
        &json!({"query": "q", "documents": [long]}),
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("exceed_context_size_error"), "{text}");
    assert_eq!(
        s.json("/rerank", &json!({"query": "q", "texts": ["a"]}))[0]["index"],
        0
    );
}

#[test]
fn without_the_flag_or_a_yes_no_vocabulary() {
    let plain = Server::spawn(&["--model", &synthetic(), "--ctx", "256"]).unwrap();
    let (status, text) = plain.call(
        "POST",
        "/rerank",
        &json!({"query": "q", "documents": ["a"]}),
    );
    assert_eq!(status, 501, "{text}");
    assert!(text.contains("--reranking"), "{text}");
    let e = Server::spawn(&["--model", &synthetic(), "--rerank"])
        .err()
        .expect("a model without yes and no tokens was served as a reranker");
    assert!(
        e.contains("--reranking") && e.contains("`yes` and `no`"),
        "{e}"
    );
}
