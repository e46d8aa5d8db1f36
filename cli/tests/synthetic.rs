//! `decode` offline, on the synthetic model of src/testing/synthetic.rs: generation equal to
//! a library session's greedy tokens (JSON and text mode, prompt from stdin, with a warm-up
//! run, up to a full context), `tokenize` equal to the tokenizer, and `perplexity` equal to
//! `qkv::perplexity::evaluate`.

mod support;

use qkv::kernels::QuantFormat;
use qkv::load::{Model, ModelOptions};
use qkv::sample::SamplerConfig;
use qkv::session::{Session, SessionOptions};
use qkv::testing::synthetic::{self, Storage};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;
use support::run_decode;

const PROMPT: &str = "the cat sat on the mat";

fn model_path() -> PathBuf {
    synthetic::model_file(Storage::Quant(QuantFormat::Q4_0))
}

fn model() -> Arc<Model> {
    Arc::new(Model::load(&model_path(), &ModelOptions::default()).unwrap())
}

fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// A library session's `n` greedy token ids and their text, as `decode` runs it (default
/// session options, the model's whole context).
fn library_greedy(text: &str, n: usize) -> (Vec<u32>, String) {
    let mut s = Session::new(model(), SessionOptions::default()).unwrap();
    let config = SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    };
    let mut gen = s
        .generate(text, config)
        .unwrap()
        .max_tokens(n)
        .ignore_eos(true);
    let (mut ids, mut out) = (Vec::new(), String::new());
    for p in &mut gen {
        let p = p.unwrap();
        ids.push(p.id);
        out.push_str(&p.text);
    }
    out.push_str(&gen.finish());
    (ids, out)
}

/// `decode` greedy on the synthetic model with `extra` arguments.
fn generate(extra: &[&str], stdin: Option<&str>) -> Output {
    let path = model_path();
    let mut args = vec![
        "--model",
        path.to_str().unwrap(),
        "-n",
        "12",
        "--temperature",
        "0",
        "--ignore-eos",
    ];
    args.extend_from_slice(extra);
    run_decode(&args, stdin)
}

/// The token ids of `--json` output, and the stats line.
fn json_ids(stdout: &str) -> (Vec<u32>, Value) {
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    let (stats, tokens) = lines.split_last().unwrap();
    let ids = tokens
        .iter()
        .filter_map(|t| t["id"].as_u64())
        .map(|i| i as u32)
        .collect();
    (ids, stats["stats"].clone())
}

#[test]
fn decode_generates_a_sessions_greedy_tokens() {
    let (want_ids, want_text) = library_greedy(PROMPT, 12);
    let (ids, stats) = json_ids(&ok(&generate(&["--prompt", PROMPT, "--json"], None)));
    assert_eq!(ids, want_ids);
    assert_eq!(stats["generated_tokens"], 12);
    let n_prompt = model().tokenizer().unwrap().encode(PROMPT).unwrap().len();
    assert_eq!(stats["prompt_tokens"].as_u64(), Some(n_prompt as u64));
    // Text mode prints the same tokens' text, from --prompt or from stdin, and a warm-up run
    // changes nothing.
    let text = ok(&generate(&["--prompt", PROMPT], None));
    assert_eq!(text.trim_end_matches('\n'), want_text);
    assert_eq!(ok(&generate(&[], Some(PROMPT))), text);
    assert_eq!(ok(&generate(&["--prompt", PROMPT, "--warmup"], None)), text);
}

#[test]
fn decode_stops_at_a_full_context_with_the_stats() {
    // The prompt and 4 more tokens fill the context (the last one sampled, never fed back).
    let n_prompt = model().tokenizer().unwrap().encode(PROMPT).unwrap().len();
    let ctx = (n_prompt + 4).to_string();
    let o = generate(&["--prompt", PROMPT, "--ctx", &ctx, "--json"], None);
    let (ids, stats) = json_ids(&ok(&o));
    assert_eq!(ids.len(), 4);
    assert_eq!(stats["generated_tokens"], 4);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("the context ({ctx} positions) is full")),
        "{err}"
    );
}

#[test]
fn decode_tokenize_gives_the_tokenizers_ids() {
    let m = model();
    let tok = m.tokenizer().unwrap();
    let path = model_path();
    let file = path.to_str().unwrap();
    let text = " the cat<|im_end|> in there";
    let ids = |extra: &[&str], stdin: Option<&str>| -> Vec<u32> {
        let out = ok(&run_decode(
            &[&["tokenize", "--model", file], extra].concat(),
            stdin,
        ));
        assert_eq!(out.lines().count(), 1, "{out:?}");
        serde_json::from_str(out.trim()).unwrap()
    };
    assert_eq!(ids(&["--prompt", text], None), tok.encode(text).unwrap());
    assert_eq!(ids(&[], Some(text)), tok.encode(text).unwrap());
    // Control tokens are parsed by default, and spelt out byte by byte without it.
    assert!(ids(&["--prompt", text], None).contains(&synthetic::EOS));
    let split = ids(&["--prompt", text, "--no-parse-special"], None);
    assert!(!split.contains(&synthetic::EOS));
    assert_eq!(tok.decode(&split).unwrap(), text);
}

#[test]
fn decode_tokenize_names_a_bad_model() {
    let dir = std::env::temp_dir().join(format!("qkv-tok-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"not a gguf file").unwrap();
    let out = run_decode(
        &[
            "tokenize",
            "--model",
            bad.to_str().unwrap(),
            "--prompt",
            "x",
        ],
        None,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.gguf"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn decode_perplexity_reports_what_the_library_computes() {
    let dir = std::env::temp_dir().join(format!("qkv-ppl-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text: String = std::iter::repeat_n("the cat sat on the mat in the garden. ", 8).collect();
    let file = dir.join("text.txt");
    std::fs::write(&file, &text).unwrap();
    let path = model_path();
    let out = ok(&run_decode(
        &[
            "perplexity",
            "--model",
            path.to_str().unwrap(),
            "--file",
            file.to_str().unwrap(),
            "--ctx",
            "32",
        ],
        None,
    ));
    let got: Value = serde_json::from_str(out.trim()).unwrap();
    let model = model();
    let tokens = model.tokenizer().unwrap().encode(&text).unwrap();
    let want = qkv::perplexity::evaluate(
        &model,
        &tokens,
        32,
        qkv::perplexity::Scoring::Perplexity,
        |_, _| {},
    )
    .unwrap();
    assert_eq!(got, want.to_json());
    assert!(want.windows >= 2 && want.ppl > 1.0);
    std::fs::remove_dir_all(&dir).ok();
}
