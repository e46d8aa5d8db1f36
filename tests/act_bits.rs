//! The default model with 8-bit activations for its interleaved 4-bit matrices
//! (`QKV_ACT_BITS=8`, [`qkv_kernels::quant::x8::set_act_precision`]). The choice is fixed
//! once per process, so this file is a test binary of its own, with one test that fixes it
//! before anything runs a product.
//!
//! Against the same file widened to f32 (exact weights, no activation rounding): on the
//! reference prompts, the last position's logits stay within a small share of their range,
//! the KL divergence of the next-token distribution stays small, and the top token is the
//! same. The default (16-bit) path is held to a far tighter bound in tests/llama.rs.

mod common;

use qkv::load::{Model, ModelOptions};
use qkv::sample::argmax;
use qkv::session::{Session, SessionOptions};
use qkv::weights::FloatType;
use qkv_kernels::quant::{act::ActPrecision, x8, QuantFormat};
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
    x8::set_act_precision(ActPrecision::Byte).unwrap();
    assert_eq!(x8::act_precision(QuantFormat::Q4_1), ActPrecision::Byte);
    let Some(path) = common::default_gguf() else {
        return;
    };
    let quant = Arc::new(Model::load(&path, &ModelOptions::default()).unwrap());
    let exact = Arc::new(
        Model::load(
            &path,
            &ModelOptions {
                dtype: Some(FloatType::F32),
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
        let range = want.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v))
            - want.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0f32, f32::max);
        let share = f64::from(worst / range);
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
    // Seen on the default model: shares up to 3.9e-2 and KL up to 1.4e-2, most cases below
    // 2.5e-2 and 4e-3 (16-bit: 7.4e-4 of the range). With the exact sums in the minimum
    // terms (see `QuantizedActs::sum`) the KL reached 4.1e-2, which these bounds refuse.
    assert!(
        worst_share <= 6e-2,
        "max |Δlogit| {worst_share:e} of the range"
    );
    assert!(worst_kl <= 2.5e-2, "KL {worst_kl:e}");
}
