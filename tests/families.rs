//! Every decoder family against transformers: tiny random-weight models of Llama 3 (llama3
//! RoPE scaling), Qwen2, Qwen3, Mistral (a sliding window shorter than the prompt), Phi-3,
//! Gemma 2, Gemma 3, the mixtures of experts Qwen3-MoE, Mixtral and Qwen2-MoE (8 experts,
//! top 2), and Qwen3 with YaRN scaling on a prompt past its original context, made by `tools/family_fixtures.py` with transformers' own config
//! classes, each as a Hugging Face directory and as the GGUF llama.cpp's
//! `convert_hf_to_gguf.py` writes from it. `qwen2_bf16` is Qwen2's network stored in
//! bfloat16 (safetensors saved from torch.bfloat16, a GGUF converted with `--outtype bf16`),
//! run as stored, against transformers in f32 on the same rounded weights.
//!
//! In both layouts, qkv's logits at every prompt position must be within 1e-4 of the
//! reference logits' range of transformers' f32 logits, whether the prompt runs as one
//! prefill, in chunks, or one token at a time through the cache; the greedy 32-token
//! continuation must be transformers' exactly.
//!
//! The fixtures are read from `QKV_FAMILIES_DIR`, else `$QKV_CACHE/families` (`QKV_CACHE`
//! defaulting to `~/.cache/qkv`; made with the network). Without them the tests, named
//! `network_…`, skip with a message, except under CI (`CI=true`), where they fail.

use qkv::load::{Model, ModelOptions};
use qkv::models::decoder::KvType;
use qkv::sample::argmax;
use qkv::session::{Session, SessionOptions};
use qkv::weights::FloatType;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod common;

const FAMILIES: &[&str] = &[
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "phi3",
    "gemma2",
    "gemma3",
    "qwen3moe",
    "mixtral",
    "qwen2moe",
    "qwen3yarn",
    "qwen2_bf16",
];

/// The families whose fixtures `root` holds. One that is missing is a failure under CI and
/// skipped with a message elsewhere (a cache made before the family was added).
fn present(root: &Path) -> Vec<&'static str> {
    let mut out = Vec::new();
    for family in FAMILIES {
        if root.join(family).join("reference.json").is_file() {
            out.push(*family);
            continue;
        }
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "the {family} fixture is not in {} (.ci/run makes it)",
            root.display()
        );
        eprintln!(
            "skipped {family}: no fixture in {} (run python3 tools/family_fixtures.py)",
            root.display()
        );
    }
    out
}

/// Allowed distance from transformers' logits, as a share of their range.
const TOLERANCE: f32 = 1e-4;

/// The fixtures' directory (`tools/family_fixtures.py` makes it).
fn fixtures() -> Option<PathBuf> {
    common::reference_dir(
        "QKV_FAMILIES_DIR",
        "families",
        "llama/reference.json",
        "tools/family_fixtures.py",
    )
}

struct Reference {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    logits: Vec<f32>,
    vocab: usize,
    range: f32,
}

fn reference(dir: &Path) -> Reference {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let ids = |k: &str| -> Vec<u32> {
        json[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let logits = common::read_f32s(&dir.join("logits.bin"));
    let (prompt, vocab) = (ids("prompt"), json["vocab"].as_u64().unwrap() as usize);
    assert_eq!(logits.len(), prompt.len() * vocab);
    Reference {
        prompt,
        greedy: ids("greedy"),
        vocab,
        range: json["logit_range"].as_f64().unwrap() as f32,
        logits,
    }
}

fn session(model: &Arc<Model>, chunk: Option<usize>) -> Session {
    // transformers keeps keys and values in f32; so does qkv for f32 weights by default, but
    // for bf16 weights it keeps them in f16, whose rounding alone moves these logits by
    // about 2e-4 of their range: the bf16 families ask for f32.
    let kv = (model.decoder().kv_dtype() != FloatType::F32).then_some(KvType::F32);
    Session::new(
        model.clone(),
        SessionOptions {
            context: Some(128),
            prefill_chunk: chunk,
            kv_dtype: kv,
        },
    )
    .unwrap()
}

/// Checks one model file or directory against the family's reference; returns the worst
/// relative logit error seen.
fn check(family: &str, path: &Path, r: &Reference) -> f32 {
    let model = Arc::new(
        Model::load(path, &ModelOptions::default())
            .unwrap_or_else(|e| panic!("{family}: {} does not load: {e}", path.display())),
    );
    if family.ends_with("_bf16") {
        // Run as stored: every matrix bf16, none widened at load.
        for (name, f) in model.decoder().weight_formats().0 {
            assert_eq!(
                f,
                qkv::weights::WeightFormat::BF16,
                "{family} {}: {name}",
                path.display()
            );
        }
    }
    assert_eq!(model.vocab_size(), r.vocab, "{family}");
    let n = r.prompt.len();
    let mut err = 0.0f32;

    // The whole prompt in one pass, then in chunks of 7 (windows cross chunk edges).
    for chunk in [None, Some(7)] {
        let mut s = session(&model, chunk);
        let mut all = vec![0.0; n * r.vocab];
        s.prefill_all(&r.prompt, &mut all).unwrap();
        let e = common::share_of_range(&all, &r.logits, r.range);
        assert!(
            e <= TOLERANCE,
            "{family} {} chunk {chunk:?}: {e:e}",
            path.display()
        );
        err = err.max(e);
    }

    // One token at a time: every position but the first reads the cache.
    let mut s = session(&model, None);
    for (i, &tok) in r.prompt.iter().enumerate() {
        let logits = if i == 0 {
            s.prefill(&[tok]).unwrap()
        } else {
            s.step(tok).unwrap()
        };
        let e = common::share_of_range(logits, &r.logits[i * r.vocab..(i + 1) * r.vocab], r.range);
        assert!(
            e <= TOLERANCE,
            "{family} {} position {i}: {e:e}",
            path.display()
        );
        err = err.max(e);
    }

    // Greedy continuation.
    let mut got = Vec::new();
    let mut next = argmax(s.logits()) as u32;
    for _ in 0..r.greedy.len() {
        got.push(next);
        next = argmax(s.step(next).unwrap()) as u32;
    }
    assert_eq!(
        got,
        r.greedy,
        "{family} {}: greedy continuation",
        path.display()
    );
    err
}

#[test]
fn network_every_family_matches_transformers_in_both_layouts() {
    let Some(root) = fixtures() else { return };
    let mut report = Vec::new();
    for family in present(&root) {
        let dir = root.join(family);
        let r = reference(&dir);
        let hf = check(family, &dir.join("hf"), &r);
        let gguf = check(family, &dir.join("model.gguf"), &r);
        report.push(format!(
            "{family:>8}: worst logit error / range: HF {hf:.2e}, GGUF {gguf:.2e}"
        ));
    }
    eprintln!("{}", report.join("\n"));
}

/// What transformers' classes store beside the weights matches the configuration qkv reads
/// from the converted GGUF: the same network either way.
#[test]
fn network_gguf_and_hf_configurations_agree() {
    let Some(root) = fixtures() else { return };
    for family in present(&root) {
        let dir = root.join(family);
        let opts = ModelOptions::default();
        let hf = Model::load(&dir.join("hf"), &opts).unwrap();
        let gguf = Model::load(&dir.join("model.gguf"), &opts).unwrap();
        let (mut a, b) = (hf.config().clone(), gguf.config().clone());
        // The layouts differ by design: names, Gemma's (1 + w) stored apart, the llama
        // architecture's permuted Q/K rows, and Llama 3.1's factors computed or stored.
        a.layout = b.layout;
        a.norm_plus_one = b.norm_plus_one;
        a.rope_style = b.rope_style;
        if b.rope.scaling == qkv::models::decoder::RopeScaling::FileFactors {
            a.rope.scaling = b.rope.scaling.clone();
        }
        // transformers rounds query_pre_attn_scalar^-½ from f64, llama.cpp from f32.
        assert!((a.attn_scale - b.attn_scale).abs() <= f32::EPSILON * a.attn_scale);
        a.attn_scale = b.attn_scale;
        assert_eq!(a, b, "{family}");
        assert_eq!(
            hf.decoder().parameters(),
            gguf.decoder().parameters(),
            "{family}"
        );
    }
}
