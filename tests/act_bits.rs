//! The default model with 8-bit activations for its interleaved matrices
//! (`ModelOptions::act_precision`, `--act-bits 8`), beside the same file at 16 bits in the
//! same process: the precision is an option of each model, not of the process.
//!
//! Against the same file widened to f32 (exact weights, no activation rounding): on the
//! reference prompts, the last position's logits stay within a small share of their range,
//! the KL divergence of the next-token distribution stays small, and the top token is the
//! same. The 16-bit model, loaded alongside, is held to the far tighter bound of
//! tests/quantized_files.rs, so each of the two models keeps its own precision.

mod common;

use qkv::load::{Model, ModelOptions};
use qkv::sample::argmax;
use qkv::session::{Session, SessionOptions};
use qkv::weights::FloatType;
use qkv_kernels::quant::act::ActPrecision;
use serde_json::Value;
use std::sync::Arc;

fn session(model: &Arc<Model>) -> Session {
    let options = SessionOptions {
        context: Some(256),
        ..SessionOptions::default()
    };
    Session::new(model.clone(), options).unwrap()
}

/// `Σ p·(log p − log q)` of the softmaxes of two logit vectors, in f64.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    let log_softmax = |v: &[f32]| {
        let max = v
            .iter()
            .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
        let sum: f64 = v.iter().map(|&x| (f64::from(x) - max).exp()).sum();
        v.iter()
            .map(|&x| f64::from(x) - max - sum.ln())
            .collect::<Vec<_>>()
    };
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

#[test]
fn network_eight_bit_activations_stay_close_to_f32() {
    let Some(path) = common::default_gguf() else {
        return;
    };
    let at = |precision: ActPrecision| {
        let options = ModelOptions {
            act_precision: precision,
            ..ModelOptions::default()
        };
        Arc::new(Model::load(&path, &options).unwrap())
    };
    let (quant, wide) = (at(ActPrecision::Byte), at(ActPrecision::Wide));
    let exact = Arc::new(
        Model::load(
            &path,
            &ModelOptions {
                dtype: Some(FloatType::F32),
                ..ModelOptions::default()
            },
        )
        .unwrap(),
    );
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama");
    let text = std::fs::read_to_string(fixture.join("reference.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let cases = reference["cases"].as_array().unwrap();
    let (mut worst_share, mut worst_kl) = (0.0f64, 0.0f64);
    for case in cases {
        let prompt: Vec<u32> = case["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = session(&quant).prefill(&prompt).unwrap().to_vec();
        let want = session(&exact).prefill(&prompt).unwrap().to_vec();
        let got_wide = session(&wide).prefill(&prompt).unwrap().to_vec();
        let range = want.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v))
            - want.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        let worst_of = |got: &[f32]| {
            got.iter()
                .zip(&want)
                .map(|(g, w)| (g - w).abs())
                .fold(0.0f32, f32::max)
        };
        let share = f64::from(worst_of(&got) / range);
        // The 16-bit model in the same process keeps its own, exact, precision.
        let wide_share = f64::from(worst_of(&got_wide) / range);
        assert!(
            wide_share <= 1e-3,
            "{:?}: the 16-bit model is off by {wide_share:e} of the range",
            case["prompt"]
        );
        assert_ne!(got, got_wide, "the two precisions gave the same logits");
        let divergence = kl(&want, &got);
        eprintln!(
            "{:?}: max |Δlogit| {share:.2e} of the range, KL {divergence:.2e}",
            case["prompt"].as_str().unwrap_or("")
        );
        assert!(got.iter().all(|v| v.is_finite()));
        // The same top token, or one the exact run all but ties with it (within 0.1 of a
        // logit): 8-bit rounding may flip a near-tie, as it does in llama.cpp, never more.
        let (top, chosen) = (argmax(&want) as usize, argmax(&got) as usize);
        assert!(
            chosen == top || want[top] - want[chosen] <= 0.1,
            "{:?}: top token {chosen} where the exact run has {top} ({} against {})",
            case["prompt"],
            want[chosen],
            want[top]
        );
        worst_share = worst_share.max(share);
        worst_kl = worst_kl.max(divergence);
    }
    assert!(cases.len() >= 3);
    // Seen on the default model: shares up to 3.9e-2 and KL up to 2.6e-2 (the chat prompt,
    // whose next token is a near tie), most cases below 2.5e-2 and 4e-3 (16-bit: 7.4e-4 of
    // the range); the case's KL moves with the last bits of what feeds the rounding. With
    // the exact sums in the minimum terms (see `QuantizedActs::sum`) the KL reached 4.1e-2,
    // which these bounds refuse.
    assert!(
        worst_share <= 6e-2,
        "max |Δlogit| {worst_share:e} of the range"
    );
    assert!(worst_kl <= 3e-2, "KL {worst_kl:e}");
}
