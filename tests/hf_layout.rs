//! The Hugging Face layout (config.json + model.safetensors + tokenizer.json, split-half RoPE)
//! in CI, with no Python: the default f16 GGUF (SmolLM2-135M-Instruct) is exported into a
//! faithful Hugging Face directory — HF tensor names, Q/K rows un-permuted from llama.cpp's
//! adjacent-pair order back to split-half order, a byte-level BPE tokenizer.json — and both
//! layouts must then run the same network: same greedy continuations, same logits, same
//! token ids.
//!
//! Run in release mode: `cargo test --release --test hf_layout`.

use qkv::load::{Model, ModelOptions};
use qkv::models::decoder::WeightLayout;
use qkv::sample::argmax;
use qkv::session::{Session, SessionOptions};
use qkv::tokenizer::ChatMessage;
use qkv::weights::gguf::{GgmlType, GgufFile};
use qkv::weights::FloatType;
use qkv::Error;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

mod common;
use common::hf_vocab;

/// A fresh directory under the system temp dir, removed (with its contents) on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "qkv-test-hf-{what}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// The default model converted to an f16 GGUF (by `decode convert`'s code) into the cache
/// directory, once: the HF directory is written from its f16 matrices.
fn gguf_path() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let q4 = common::default_gguf().expect("checked by the test");
        let out = common::cache_dir().join("SmolLM2-135M-Instruct.f16.gguf");
        if !out.is_file() {
            // Written under a temporary name and renamed: concurrent runs are safe.
            qkv::weights::gguf::convert(&q4, &out, FloatType::F16).unwrap();
        }
        out
    })
    .clone()
}

// ---------------------------------------------------------------------------------------------
// The llama.cpp Q/K permutation
// ---------------------------------------------------------------------------------------------

/// llama.cpp's `convert_hf_to_gguf.py` permutation of Q/K rows, written as its numpy
/// expression: `w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2)`. Returns, for
/// each output (GGUF) row, the input (HF) row it holds.
fn llamacpp_permutation(rows: usize, n_head: usize) -> Vec<usize> {
    let half = rows / n_head / 2;
    let mut out = Vec::with_capacity(rows);
    // Output axes after the swap: [n_head, half, 2]; input axes: [n_head, 2, half].
    for h in 0..n_head {
        for i in 0..half {
            for two in 0..2 {
                out.push((h * 2 + two) * half + i);
            }
        }
    }
    out
}

/// The inverse: for each HF row (split-half order, head `h`, half `j`, index `i`), the GGUF
/// row (adjacent pairs) it comes from.
fn hf_rows_from_gguf(rows: usize, n_head: usize) -> Vec<usize> {
    let head_dim = rows / n_head;
    let half = head_dim / 2;
    (0..rows)
        .map(|r| {
            let (h, within) = (r / head_dim, r % head_dim);
            let (j, i) = (within / half, within % half);
            h * head_dim + 2 * i + j
        })
        .collect()
}

/// Row `r` of the result is row `from[r]` of `bytes` (rows of `row_bytes` bytes).
fn gather_rows(bytes: &[u8], row_bytes: usize, from: &[usize]) -> Vec<u8> {
    assert_eq!(bytes.len(), row_bytes * from.len());
    let mut out = Vec::with_capacity(bytes.len());
    for &src in from {
        out.extend_from_slice(&bytes[src * row_bytes..(src + 1) * row_bytes]);
    }
    out
}

#[test]
fn unpermutation_inverts_llamacpp_exactly() {
    for (rows, heads) in [(576, 9), (192, 3), (8, 2), (4, 1)] {
        let p = llamacpp_permutation(rows, heads);
        let inv = hf_rows_from_gguf(rows, heads);
        // hf → gguf (gguf[r] = hf[p[r]]), then gguf → hf (hf'[r] = gguf[inv[r]]).
        for (r, &g) in inv.iter().enumerate() {
            assert_eq!(p[g], r, "rows {rows}, heads {heads}, row {r}");
        }
    }
    // One head of 4: HF rows [a0 a1 b0 b1] are stored by llama.cpp as [a0 b0 a1 b1].
    assert_eq!(llamacpp_permutation(4, 1), vec![0, 2, 1, 3]);
    assert_eq!(hf_rows_from_gguf(4, 1), vec![0, 2, 1, 3]);
    assert_eq!(hf_rows_from_gguf(8, 1), vec![0, 2, 4, 6, 1, 3, 5, 7]);
}

// ---------------------------------------------------------------------------------------------
// Export GGUF → Hugging Face directory
// ---------------------------------------------------------------------------------------------

/// A number as JSON, through its shortest f32 spelling (1e-5, not 9.999999747378752e-6).
fn json_f32(x: f32) -> Value {
    Value::from(x.to_string().parse::<f64>().unwrap())
}

fn config_json(f: &GgufFile) -> Value {
    let u = |k: &str| f.get_u32(&format!("llama.{k}")).unwrap();
    let heads = u("attention.head_count");
    let vocab = match f.metadata("llama.vocab_size") {
        Some(_) => u("vocab_size") as usize,
        None => f.get_array("tokenizer.ggml.tokens").unwrap().len(),
    };
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": u("embedding_length"),
        "intermediate_size": u("feed_forward_length"),
        "num_hidden_layers": u("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": f.metadata("llama.attention.head_count_kv")
            .map_or(heads, |_| u("attention.head_count_kv")),
        "head_dim": u("embedding_length") / heads,
        "hidden_act": "silu",
        "rms_norm_eps": json_f32(f.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap()),
        "rope_theta": json_f32(f.get_f32("llama.rope.freq_base").unwrap()),
        "rope_scaling": null,
        "max_position_embeddings": u("context_length"),
        "vocab_size": vocab,
        "tie_word_embeddings": f.tensor_info("output.weight").is_none(),
        "bos_token_id": f.get_u32("tokenizer.ggml.bos_token_id").unwrap(),
        "eos_token_id": f.get_u32("tokenizer.ggml.eos_token_id").unwrap(),
        "pad_token_id": f.get_u32("tokenizer.ggml.padding_token_id").ok(),
        "attention_bias": false,
        "mlp_bias": false,
        "initializer_range": 0.02,
        "torch_dtype": "float16",
        "use_cache": true,
    })
}

/// The HF name of a GGUF tensor, and whether it is Q or K (to un-permute, with which head
/// count). Panics on a tensor the export does not know: every weight must be carried over.
fn hf_name(gguf: &str) -> (String, Option<&'static str>) {
    match gguf {
        "token_embd.weight" => return ("model.embed_tokens.weight".into(), None),
        "output_norm.weight" => return ("model.norm.weight".into(), None),
        "output.weight" => return ("lm_head.weight".into(), None),
        _ => {}
    }
    let rest = gguf
        .strip_prefix("blk.")
        .unwrap_or_else(|| panic!("unknown GGUF tensor {gguf}"));
    let (layer, part) = rest.split_once('.').unwrap();
    let part = part.strip_suffix(".weight").unwrap();
    let (hf, rope) = match part {
        "attn_norm" => ("input_layernorm", None),
        "attn_q" => ("self_attn.q_proj", Some("q")),
        "attn_k" => ("self_attn.k_proj", Some("k")),
        "attn_v" => ("self_attn.v_proj", None),
        "attn_output" => ("self_attn.o_proj", None),
        "ffn_norm" => ("post_attention_layernorm", None),
        "ffn_gate" => ("mlp.gate_proj", None),
        "ffn_up" => ("mlp.up_proj", None),
        "ffn_down" => ("mlp.down_proj", None),
        other => panic!("unknown GGUF tensor part {other} in {gguf}"),
    };
    (format!("model.layers.{layer}.{hf}.weight"), rope)
}

/// model.safetensors: every GGUF tensor under its HF name, bytes unchanged (f16 matrices, f32
/// norms) except Q and K, whose rows are put back in split-half order.
fn write_safetensors(f: &GgufFile, path: &Path) {
    let heads = f.get_u32("llama.attention.head_count").unwrap() as usize;
    let kv_heads = f
        .get_u32("llama.attention.head_count_kv")
        .map_or(heads, |n| n as usize);
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for info in f.tensor_infos() {
        let (dtype, size) = match info.ggml_type {
            GgmlType::F16 => (Dtype::F16, 2),
            GgmlType::F32 => (Dtype::F32, 4),
            other => panic!("{}: {other:?} (the default model is f16)", info.name),
        };
        let bytes = f.tensor_bytes(&info.name).unwrap();
        assert_eq!(bytes.len(), info.numel() * size, "{}", info.name);
        let (name, rope) = hf_name(&info.name);
        let data = match rope {
            None => bytes.to_vec(),
            Some(which) => {
                let n_head = if which == "q" { heads } else { kv_heads };
                let [rows, cols] = info.shape[..] else {
                    panic!("{}: shape {:?}", info.name, info.shape)
                };
                gather_rows(bytes, cols * size, &hf_rows_from_gguf(rows, n_head))
            }
        };
        tensors.push((name, dtype, info.shape.clone(), data));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            let view = TensorView::new(*dtype, shape.clone(), data).unwrap();
            (name.clone(), view)
        })
        .collect();
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).unwrap();
}

/// tokenizer.json (byte-level BPE: Digits + ByteLevel as SmolLM2 ships) and
/// tokenizer_config.json from the GGUF vocabulary.
fn write_tokenizer(f: &GgufFile, dir: &Path) {
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    let merges = f.get_str_array("tokenizer.ggml.merges").unwrap();
    let (vocab, added) = hf_vocab(f);
    assert!(!added.is_empty());
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                "use_regex": true}
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false,
            "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
            "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab,
            "merges": merges.iter().map(|m| {
                let (a, b) = m.split_once(' ').unwrap();
                json!([a, b])
            }).collect::<Vec<_>>()},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let token = |key: &str| {
        f.get_u32(key)
            .ok()
            .map(|id| Value::from(tokens[id as usize]))
    };
    let config = json!({
        "add_bos_token": f.get_bool("tokenizer.ggml.add_bos_token").unwrap_or(false),
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "chat_template": f.get_str("tokenizer.chat_template").ok(),
        "model_max_length": f.get_u32("llama.context_length").unwrap(),
        "tokenizer_class": "GPT2Tokenizer",
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

/// The whole Hugging Face directory for the GGUF at `gguf`.
fn export_hf(gguf: &Path, dir: &Path) {
    let f = GgufFile::open(gguf).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    let config = config_json(&f);
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
    write_safetensors(&f, &dir.join("model.safetensors"));
    write_tokenizer(&f, dir);
    std::fs::write(
        dir.join("generation_config.json"),
        json!({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]})
            .to_string(),
    )
    .unwrap();
}

// ---------------------------------------------------------------------------------------------
// The two models
// ---------------------------------------------------------------------------------------------

fn f32_options() -> ModelOptions {
    ModelOptions {
        dtype: Some(FloatType::F32),
        ..ModelOptions::default()
    }
}

fn gguf_model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| Arc::new(Model::load(&gguf_path(), &f32_options()).unwrap()))
        .clone()
}

/// The exported directory loaded in f32 (weights copied out of the mapping, so the directory
/// is removed right after loading).
fn hf_model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| {
        let dir = TempDir::new("model");
        export_hf(&gguf_path(), dir.path());
        let model = Model::load(dir.path(), &f32_options())
            .unwrap_or_else(|e| panic!("loading the exported directory: {e}"));
        drop(dir);
        Arc::new(model)
    })
    .clone()
}

fn session(model: &Arc<Model>) -> Session {
    let options = SessionOptions {
        context: Some(128),
        ..SessionOptions::default()
    };
    Session::new(model.clone(), options).unwrap()
}

/// The last-position logits of `prompt`, then `n` greedy tokens.
fn run(model: &Arc<Model>, prompt: &[u32], n: usize) -> (Vec<f32>, Vec<u32>) {
    let mut s = session(model);
    let logits = s.prefill(prompt).unwrap().to_vec();
    let mut next = argmax(&logits);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(next);
        if i + 1 < n {
            next = argmax(s.step(next).unwrap());
        }
    }
    (logits, out)
}

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
];

#[test]
fn network_hf_directory_runs_the_same_network_as_the_gguf() {
    let Some(_) = common::default_gguf() else {
        return;
    };
    let (hf, gguf) = (hf_model(), gguf_model());
    assert_eq!(hf.config().layout, WeightLayout::HuggingFace);
    assert_eq!(gguf.config().layout, WeightLayout::Gguf);
    let strip = |m: &Model| {
        let mut c = m.config().clone();
        c.layout = WeightLayout::Gguf;
        c.rope_style = gguf.config().rope_style;
        c
    };
    assert_eq!(strip(&hf), strip(&gguf), "configurations differ");
    assert_eq!(hf.decoder().tied_output(), gguf.decoder().tied_output());
    assert_eq!(hf.decoder().parameters(), gguf.decoder().parameters());

    let tok = gguf.tokenizer().unwrap();
    let hf_tok = hf.tokenizer().unwrap();
    let mut failures = Vec::new();
    for prompt in PROMPTS {
        let ids = tok.encode(prompt).unwrap();
        assert_eq!(hf_tok.encode(prompt).unwrap(), ids, "{prompt:?}");
        let (want_logits, want) = run(&gguf, &ids, 16);
        let (got_logits, got) = run(&hf, &ids, 16);
        let (lo, hi) = want_logits
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        let worst = want_logits
            .iter()
            .zip(&got_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        // The same f32 weights; only the order of the rotated dimensions (and so of some
        // sums) differs between the layouts: seen up to ~1e-6 of the range.
        let tol = 1e-5 * (hi - lo);
        eprintln!(
            "{prompt:?}: {:?} | max |Δlogit| {worst:.2e} (tolerance {tol:.2e})",
            tok.decode(&want).unwrap()
        );
        if worst > tol {
            failures.push(format!(
                "{prompt:?}: max |Δlogit| {worst} > {tol} (range {lo}..{hi})"
            ));
        }
        if got != want {
            failures.push(format!(
                "{prompt:?}:\n  gguf {want:?} {:?}\n  hf   {got:?} {:?}",
                tok.decode(&want).unwrap(),
                hf_tok.decode(&got).unwrap()
            ));
        }
        if prompt == "The capital of France is" {
            assert!(
                tok.decode(&want).unwrap().starts_with(" Paris."),
                "{:?}",
                tok.decode(&want).unwrap()
            );
            assert_eq!(hf_tok.decode(&got[..2]).unwrap(), " Paris.");
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn network_hf_tokenizer_matches_the_gguf_tokenizer() {
    let Some(_) = common::default_gguf() else {
        return;
    };
    let (hf, gguf) = (hf_model(), gguf_model());
    let (a, b) = (gguf.tokenizer().unwrap(), hf.tokenizer().unwrap());
    assert_eq!(a.vocab_size(), b.vocab_size());
    assert_eq!((a.bos_id(), a.eos_id()), (b.bos_id(), b.eos_id()));
    assert_eq!(a.adds_bos(), b.adds_bos());
    for text in [
        "Hello, world!",
        "The year 2024 had 366 days; π ≈ 3.14159.",
        "  leading spaces\tand\ttabs\n\nnew lines  ",
        "naïve café, 日本語のテキスト, emoji 😀🎉",
        "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
        "don't won't I'm we'll they've",
        "",
    ] {
        let ids = a.encode(text).unwrap();
        assert_eq!(b.encode(text).unwrap(), ids, "{text:?}");
        assert_eq!(b.decode(&ids).unwrap(), a.decode(&ids).unwrap(), "{text:?}");
    }
    let chat = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "What is 2+2?"),
    ];
    assert_eq!(
        b.apply_chat_template(&chat, true).unwrap(),
        a.apply_chat_template(&chat, true).unwrap()
    );
}

// ---------------------------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------------------------

/// A tiny valid configuration (2 layers, dim 8) and its weights in HF names, f32.
fn tiny_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 32, "vocab_size": 10,
        "tie_word_embeddings": true, "torch_dtype": "float32",
    })
}

fn tiny_tensors() -> Vec<(String, Vec<usize>)> {
    let mut t = vec![
        ("model.embed_tokens.weight".to_string(), vec![10, 8]),
        ("model.norm.weight".to_string(), vec![8]),
    ];
    for l in 0..2 {
        for (part, shape) in [
            ("input_layernorm", vec![8]),
            ("self_attn.q_proj", vec![8, 8]),
            ("self_attn.k_proj", vec![4, 8]),
            ("self_attn.v_proj", vec![4, 8]),
            ("self_attn.o_proj", vec![8, 8]),
            ("post_attention_layernorm", vec![8]),
            ("mlp.gate_proj", vec![16, 8]),
            ("mlp.up_proj", vec![16, 8]),
            ("mlp.down_proj", vec![8, 16]),
        ] {
            t.push((format!("model.layers.{l}.{part}.weight"), shape));
        }
    }
    t
}

fn write_tiny(dir: &Path, config: &Value, skip: Option<&str>) {
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = tiny_tensors()
        .into_iter()
        .filter(|(name, _)| Some(name.as_str()) != skip)
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let data = (0..n)
                .flat_map(|i| ((i % 7) as f32 * 0.01).to_le_bytes())
                .collect();
            (name, shape, data)
        })
        .collect();
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, data)| {
            (
                name.as_str(),
                TensorView::new(Dtype::F32, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

#[test]
fn faulty_hf_directories_are_errors_naming_the_fault() {
    let dir = TempDir::new("bad");
    let load = || Model::load(dir.path(), &ModelOptions::default());

    // The tiny directory is sound up to the tokenizer, which it lacks: the weights load.
    write_tiny(dir.path(), &tiny_config(), None);
    match load() {
        Err(Error::Io { path, .. }) => assert!(path.ends_with("tokenizer.json"), "{path:?}"),
        other => panic!("expected the missing tokenizer.json, got {other:?}"),
    }

    // Fields of the wrong type, each named.
    for (key, value) in [
        ("num_attention_heads", json!("2")),
        ("hidden_size", json!(8.5)),
        ("rms_norm_eps", json!("1e-5")),
        ("vocab_size", json!(null)),
    ] {
        let mut config = tiny_config();
        config[key] = value.clone();
        write_tiny(dir.path(), &config, None);
        let e = load().expect_err(&format!("{key} = {value}"));
        let msg = e.to_string();
        assert!(matches!(e, Error::Format { .. }), "{key}: {msg}");
        assert!(msg.contains(key), "{key} = {value}: {msg}");
        assert!(msg.contains("config.json"), "{key} = {value}: {msg}");
    }

    // A missing tensor, named, typed, and in the directory that lacks it.
    let missing = "model.layers.1.mlp.down_proj.weight";
    write_tiny(dir.path(), &tiny_config(), Some(missing));
    let e = load().expect_err("missing tensor");
    let msg = e.to_string();
    assert!(msg.contains(missing), "{msg}");
    match e {
        Error::InFile { path, source } => {
            assert_eq!(path, dir.path());
            assert!(
                matches!(&*source, Error::MissingTensor { name } if name == missing),
                "{source:?}"
            );
        }
        other => panic!("expected InFile(MissingTensor), got {other:?}"),
    }

    // A tensor of the wrong shape (K sized for 2 KV heads where config says 1), named.
    let mut config = tiny_config();
    config["num_key_value_heads"] = json!(2);
    write_tiny(dir.path(), &config, None);
    let e = load().expect_err("wrong shape");
    let msg = e.to_string();
    assert!(msg.contains("k_proj"), "{msg}");
    assert!(
        matches!(&e, Error::InFile { source, .. } if matches!(**source, Error::TensorShape { .. })),
        "{e:?}"
    );
    assert!(std::error::Error::source(&e).is_some());

    // An untied head that is not in the files: an error, never a silent tie.
    let mut config = tiny_config();
    config["tie_word_embeddings"] = json!(false);
    write_tiny(dir.path(), &config, None);
    let msg = load().expect_err("untied head without lm_head").to_string();
    assert!(msg.contains("lm_head.weight"), "{msg}");
}
