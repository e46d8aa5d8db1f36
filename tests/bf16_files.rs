//! A real BF16 file: the default model converted by llama.cpp's `llama-quantize … BF16` from
//! its F32 file (`tools/quantized_models.py`). qkv runs its matrices as stored, mapped (and
//! copied onto pages of their own, as f16 ones), the kernels widening each bf16 in
//! registers, exactly. So the file must give the bits of the same file widened to f32 at
//! load (`--dtype f32`, what every BF16 file ran as before), logits and tokens alike, on the
//! paths both take alike: the GEMV of every decode step and the one pass of a short prompt
//! (tied head and embedding lookup included).
//!
//! With the other files, the file lives in `$QKV_QUANT_MODELS`, else
//! `<cache>/llamacpp/models`; without it the test (named `network_…`) prints why and passes,
//! unless `QKV_REQUIRE_QUANT_MODELS=1`. `decode` on it within its memory bound (the file, the
//! KV cache and 64 MiB) is in cli/tests/fixtures.rs.

mod common;

use qkv::load::{Model, ModelOptions};
use qkv::models::decoder::KvType;
use qkv::sample::argmax;
use qkv::session::{Session, SessionOptions};
use qkv::weights::{FloatType, WeightFormat};
use std::sync::Arc;

fn session(model: &Arc<Model>, kv: Option<KvType>) -> Session {
    let options = SessionOptions {
        context: Some(128),
        kv_dtype: kv,
        ..SessionOptions::default()
    };
    Session::new(model.clone(), options).unwrap()
}

/// The first position where two logit rows differ in their bits.
fn first_difference(a: &[f32], b: &[f32]) -> Option<usize> {
    assert_eq!(a.len(), b.len());
    (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits())
}

#[test]
fn network_bf16_file_runs_as_stored_with_the_bits_of_its_widening() {
    let Some(path) = common::quant_model("BF16") else {
        return;
    };
    let bf16 = Arc::new(Model::load(&path, &ModelOptions::default()).unwrap());
    let (formats, step_bytes) = bf16.decoder().weight_formats();
    assert!(!formats.is_empty());
    for (name, f) in &formats {
        assert_eq!(*f, WeightFormat::BF16, "{name}");
    }
    // The tied head (the embedding) is read as the file's bf16, not a widened copy.
    assert!(bf16.decoder().tied_output());
    let file = std::fs::metadata(&path).unwrap().len() as usize;
    assert!(
        step_bytes <= file,
        "{step_bytes} bytes of matrices > file {file}"
    );
    assert_eq!(bf16.decoder().kv_dtype(), FloatType::F16);

    let widened = Arc::new(
        Model::load(
            &path,
            &ModelOptions {
                dtype: Some(FloatType::F32),
                ..ModelOptions::default()
            },
        )
        .unwrap(),
    );
    assert!(widened
        .decoder()
        .weight_formats()
        .0
        .iter()
        .all(|(_, f)| *f == WeightFormat::F32));
    let tok = bf16.tokenizer().unwrap();
    for prompt in [
        "The capital of France is",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"",
    ] {
        let ids = tok.encode(prompt).unwrap();
        // Both KV dtypes, the same on both sides: the widened run's default (f32) and the
        // bf16 file's (f16).
        for kv in [KvType::F32, KvType::F16] {
            let (mut a, mut b) = (session(&bf16, Some(kv)), session(&widened, Some(kv)));
            let mut la = a.prefill(&ids).unwrap().to_vec();
            let mut lb = b.prefill(&ids).unwrap().to_vec();
            let mut tokens = Vec::new();
            for step in 0..24 {
                if let Some(at) = first_difference(&la, &lb) {
                    panic!(
                        "{prompt:?} kv {kv} step {step}: logit {at} is {} as bf16, {} widened",
                        la[at], lb[at]
                    );
                }
                let t = argmax(&la);
                tokens.push(t);
                la = a.step(t).unwrap().to_vec();
                lb = b.step(t).unwrap().to_vec();
            }
            // The text is the model's, not noise: it does not repeat one token throughout.
            assert!(
                tokens.iter().any(|&t| t != tokens[0]),
                "{prompt:?}: {tokens:?}"
            );
        }
    }
}
