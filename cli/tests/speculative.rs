//! `decode --spec ngram` and `decode --spec draft --model-draft FILE`: the same text, token
//! for token, as without them at temperature 0, with the drafted and kept tokens in
//! `--json`'s stats; with sampling and n-gram drafts, the same text as plain sampling with
//! the same seed, and with a draft model, text of the right length; bad settings refused. The
//! tests named `network_…` run the default model and skip with a printed reason without it.
//! Run in release mode: `cargo test --release -p qkv-cli --test speculative`.

mod support;

use serde_json::Value;
use std::process::Output;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The token lines (id, text, log-probability) and the stats of a `--json` run.
fn run(args: &[&str], prompt: &str) -> (Vec<Value>, Value) {
    run_at("0", args, prompt)
}

/// As [`run`], at temperature `t` (seed and filters as `args` say).
fn run_at(t: &str, args: &[&str], prompt: &str) -> (Vec<Value>, Value) {
    // Speculation runs in the exact mode only (16-bit activations), and plain decoding
    // with it, so that both runs round alike.
    let mut all = vec![
        "--temperature",
        t,
        "--json",
        "--ignore-eos",
        "--act-bits",
        "16",
    ];
    all.extend_from_slice(args);
    let o = support::run_decode(&all, Some(prompt));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let mut lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let stats = lines.pop().unwrap();
    (lines, stats["stats"].clone())
}

/// Same ids and texts; log-probabilities within `1e-2`: a verify pass computes a position's
/// logits with the matrix kernels' several-row path, which rounds differently from the
/// one-row path of a decode step (tests/speculative.rs in qkv says more).
fn assert_same_tokens(got: &[Value], want: &[Value], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g["id"], w["id"], "{what}: token {i}");
        assert_eq!(g["text"], w["text"], "{what}: token {i}");
        if let (Some(g), Some(w)) = (g["logprob"].as_f64(), w["logprob"].as_f64()) {
            assert!(
                (g - w).abs() < 1e-2,
                "{what}: token {i}: logprob {g} vs {w}"
            );
        }
    }
}

const PASSAGE: &str = "The lighthouse keeper climbed the spiral stairs every evening at dusk, \
    trimmed the wick, polished the great lens, and wrote the state of the sea in a leather \
    logbook that had belonged to his grandfather.";

#[test]
fn network_spec_ngram_prints_what_plain_decoding_prints() {
    let Some(_) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    let repeat = format!(
        "Copy this passage exactly, twice.\n\nPassage: {PASSAGE}\n\nCopy 1: {PASSAGE}\n\nCopy 2:"
    );
    let open = "Write a short story about a fox who learns to play the violin.";
    for (prompt, chat) in [(&repeat[..], false), (open, true)] {
        let mut base = vec!["-n", "48"];
        if chat {
            base.push("--chat");
        }
        let (plain, plain_stats) = run(&base, prompt);
        assert_eq!(plain_stats["draft_tokens"], 0, "{plain_stats}");
        assert_eq!(plain_stats["accepted_tokens"], 0, "{plain_stats}");
        for spec in [
            &["--spec", "ngram"][..],
            &["--spec", "ngram", "--spec-max", "3"],
        ] {
            let (fast, stats) = run(&[&base[..], spec].concat(), prompt);
            assert_same_tokens(&fast, &plain, &format!("{spec:?} on {prompt:?}"));
            let (drafted, kept) = (
                stats["draft_tokens"].as_u64().unwrap(),
                stats["accepted_tokens"].as_u64().unwrap(),
            );
            assert!(kept <= drafted, "{stats}");
            if !chat {
                // The copy is drafted from the passage, and the model copies it.
                assert!(kept > 0, "{stats}");
            }
        }
    }
}

#[test]
fn spec_with_bad_settings_is_exit_1() {
    let model = qkv::testing::synthetic::model_file(qkv::testing::synthetic::Storage::F16);
    let model = model.to_str().unwrap();
    for (args, needle) in [
        (
            &["--spec-max", "4", "--temperature", "0"][..],
            "--spec-max needs --spec",
        ),
        (
            &["--spec", "ngram", "--spec-max", "0", "--temperature", "0"],
            "draft",
        ),
        (&["--spec", "lookahead", "--temperature", "0"], "lookahead"),
    ] {
        let o = support::run_decode(
            &[&["--model", model, "--prompt", "hi"], args].concat(),
            None,
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(needle), "{needle:?} not in {err:?}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// `--spec draft --model-draft FILE`: a second model of the same vocabulary drafts (the
/// synthetic model's Q4_0 file for its f32 one), and the text is plain decoding's; a model
/// drafting for itself has every draft kept.
/// Sampling: n-gram drafts are verified with plain sampling's own draws, so for a seed the
/// text is the text of plain sampling; a sampled draft model's drafts are kept or replaced
/// by the speculative-sampling rule (tested for its distribution in qkv's
/// tests/speculative/sampling.rs), here the run and its counts.
#[test]
fn spec_with_sampling_prints_what_plain_sampling_prints() {
    use qkv::testing::synthetic::{model_file, Storage};
    let target = model_file(Storage::F32);
    let other = model_file(Storage::Quant(qkv::kernels::QuantFormat::Q4_0));
    let (target, other) = (target.to_str().unwrap(), other.to_str().unwrap());
    let prompt = "the cat sat on the mat and then there was another one in the garden. ".repeat(3);
    let mut ngram_drafts = 0;
    for seed in ["1", "2", "7"] {
        let base = [
            "--model", target, "-n", "40", "--seed", seed, "--top-k", "0",
        ];
        let (plain, _) = run_at("0.5", &base, &prompt);
        let (fast, stats) = run_at("0.5", &[&base[..], &["--spec", "ngram"]].concat(), &prompt);
        assert_same_tokens(&fast, &plain, &format!("seed {seed}"));
        ngram_drafts += stats["draft_tokens"].as_u64().unwrap();
        let args = [&base[..], &["--spec", "draft", "--model-draft", other]].concat();
        let (drafted, stats) = run_at("0.5", &args, &prompt);
        let ids = |v: &[Value]| v.iter().filter(|l| l.get("id").is_some()).count();
        assert_eq!(ids(&drafted), ids(&plain));
        let (d, k) = (
            stats["draft_tokens"].as_u64().unwrap(),
            stats["accepted_tokens"].as_u64().unwrap(),
        );
        assert!(d > 0 && k <= d, "{stats}");
    }
    assert!(ngram_drafts > 0, "no n-gram draft was verified");
}

#[test]
fn spec_draft_prints_what_plain_decoding_prints() {
    use qkv::testing::synthetic::{model_file, Storage};
    let target = model_file(Storage::F32);
    let other = model_file(Storage::Quant(qkv::kernels::QuantFormat::Q4_0));
    let (target, other) = (target.to_str().unwrap(), other.to_str().unwrap());
    let prompt = "the cat sat on the mat and then there was another one in the garden. ";
    let base = ["--model", target, "-n", "40"];
    let (plain, _) = run(&base, prompt);
    for (draft, all_kept) in [(other, false), (target, true)] {
        let args = [&base[..], &["--spec", "draft", "--model-draft", draft]].concat();
        let (fast, stats) = run(&args, prompt);
        assert_same_tokens(&fast, &plain, &format!("drafted by {draft}"));
        let (drafted, kept) = (
            stats["draft_tokens"].as_u64().unwrap(),
            stats["accepted_tokens"].as_u64().unwrap(),
        );
        assert!(drafted > 0 && kept <= drafted, "{stats}");
        if all_kept {
            assert_eq!(kept, drafted, "{stats}");
        }
    }
    for (args, needle) in [
        (&["--spec", "draft"][..], "--model-draft"),
        (&["--model-draft", other], "--spec draft"),
    ] {
        let o = support::run_decode(
            &[
                &["--model", target, "--prompt", "hi", "--temperature", "0"],
                args,
            ]
            .concat(),
            None,
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(needle), "{needle:?} not in {err:?}");
    }
}
