//! Slots on disk (`--slot-save-path`, `POST /slots/{id}?action=save|restore|erase`),
//! context shift (`--context-shift`, `n_keep`, `truncated`) and `/infill`, over loopback:
//! the slot routes on the synthetic decoder (a save restored into another slot, and into a
//! restarted server, is reused as llama-server reports it; names that leave the directory,
//! corrupt files and files of another model are refused by name); the context's end with
//! and without shift; infill's token layout on the default model (skipped without it) and
//! its typed error on a model without fill-in-the-middle tokens. The engine's own tests
//! (tests/engine/slots.rs) check that restored caches and shifted contexts give exactly
//! the tokens of a fresh run.

mod support;

use qkv::testing::synthetic::{self, Storage};
use serde_json::{json, Value};
use support::{synthetic_model, ScratchDir, Server};

fn slot_server(dir: &ScratchDir, model: &std::path::Path) -> Server {
    let dir = dir.0.to_str().unwrap();
    Server::start_with(model, &["--slot-save-path", dir, "--parallel", "2"])
}

fn complete(s: &Server, prompt: &str, slot: i64, n: u64) -> Value {
    s.json(
        "/completion",
        &json!({"prompt": prompt, "id_slot": slot, "n_predict": n, "temperature": 0,
                "ignore_eos": true, "cache_prompt": true}),
    )
}

fn n_tokens(s: &Server, text: &str) -> u64 {
    s.json("/tokenize", &json!({ "content": text }))["tokens"]
        .as_array()
        .unwrap()
        .len() as u64
}

const FIRST: &str = "the cat sat on the mat and";
const SECOND: &str = "the cat sat on the mat or";

#[test]
fn a_saved_slot_is_reused_after_restore_and_after_a_restart() {
    let dir = ScratchDir::new("slots");
    let model = synthetic_model();
    let s = slot_server(&dir, &model);
    let n_first = n_tokens(&s, FIRST);
    let r = complete(&s, FIRST, 1, 6);
    assert_eq!(r["timings"]["prompt_n"], n_first);
    let saved = s.json("/slots/1?action=save", &json!({"filename": "one.bin"}));
    assert_eq!(saved["id_slot"], 1);
    assert_eq!(saved["filename"], "one.bin");
    // The prompt and the generated tokens but the last, which never ran.
    assert_eq!(saved["n_saved"], n_first + 5);
    let written = std::fs::metadata(dir.0.join("one.bin")).unwrap().len();
    assert_eq!(saved["n_written"], written);
    assert!(saved["timings"]["save_ms"].as_f64().unwrap() >= 0.0);
    // Slot 1 reuses its cache for a prompt that starts the same.
    let (a, b) = (ids(&s, FIRST), ids(&s, SECOND));
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count() as u64;
    let want = complete(&s, SECOND, 1, 6);
    assert_eq!(want["timings"]["cache_n"], common);
    let n_second = n_tokens(&s, SECOND);
    assert_eq!(want["timings"]["prompt_n"], n_second - common);
    // Restored into slot 0, the same.
    let restored = s.json("/slots/0?action=restore", &json!({"filename": "one.bin"}));
    assert_eq!(restored["n_restored"], saved["n_saved"]);
    assert_eq!(restored["n_read"], written);
    let got = complete(&s, SECOND, 0, 6);
    assert_eq!(got["timings"]["cache_n"], common);
    assert_eq!(got["content"], want["content"]);
    // Erased, slot 0 runs the whole prompt again.
    let erased = s.json("/slots/0?action=erase", &json!({}));
    assert_eq!(erased, json!({"id_slot": 0, "n_erased": n_second + 5}));
    assert_eq!(complete(&s, SECOND, 0, 6)["timings"]["cache_n"], 0);
    drop(s);
    // A restarted server restores the file.
    let s = slot_server(&dir, &model);
    let restored = s.json("/slots/1?action=restore", &json!({"filename": "one.bin"}));
    assert_eq!(restored["n_restored"], saved["n_saved"]);
    let again = complete(&s, SECOND, 1, 6);
    assert_eq!(again["timings"]["cache_n"], common);
    assert_eq!(again["content"], want["content"]);
}

#[test]
fn slot_files_refuse_bad_names_bad_bytes_and_other_models() {
    let dir = ScratchDir::new("slots-bad");
    let model = synthetic_model();
    let s = slot_server(&dir, &model);
    complete(&s, FIRST, 0, 4);
    for name in ["../out.bin", "a/b", "..", "", "c:\\x", " x", "a\nb"] {
        let (status, body) = s.call("POST", "/slots/0?action=save", &json!({"filename": name}));
        assert_eq!(status, 400, "{name:?}: {body}");
        assert!(body.contains("filename"), "{body}");
    }
    assert!(!dir.0.parent().unwrap().join("out.bin").exists());
    let (status, body) = s.call(
        "POST",
        "/slots/0?action=restore",
        &json!({"filename": "none"}),
    );
    assert_eq!(status, 404, "{body}");
    let (status, body) = s.call("POST", "/slots/0?action=dance", &json!({"filename": "x"}));
    assert_eq!(status, 400, "{body}");
    let (status, body) = s.call("POST", "/slots/9?action=save", &json!({"filename": "x"}));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("slot 9 does not exist"), "{body}");
    let (status, _) = s.call("POST", "/slots/x?action=save", &json!({"filename": "x"}));
    assert_eq!(status, 400);
    s.json("/slots/0?action=save", &json!({"filename": "good.bin"}));
    let good = std::fs::read(dir.0.join("good.bin")).unwrap();
    // Truncated, flipped, not a slot file.
    dir.write("cut.bin", &good[..good.len() - 3]);
    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 4;
    dir.write("flipped.bin", &flipped);
    dir.write("text.bin", b"hello");
    for (name, words) in [
        ("cut.bin", "truncated"),
        ("flipped.bin", "checksum"),
        ("text.bin", "not a qkv slot file"),
    ] {
        let (status, body) = s.call(
            "POST",
            "/slots/1?action=restore",
            &json!({"filename": name}),
        );
        assert_eq!(status, 400, "{name}: {body}");
        assert!(body.contains(words), "{name}: {body}");
    }
    // Slot 1 still serves.
    assert_eq!(complete(&s, FIRST, 1, 2)["timings"]["cache_n"], 0);
    drop(s);
    // Another model refuses the file.
    let other = synthetic::model_file(Storage::F16);
    let o = slot_server(&dir, &other);
    let (status, body) = o.call(
        "POST",
        "/slots/0?action=restore",
        &json!({"filename": "good.bin"}),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("another model"), "{body}");
    // Without --slot-save-path the route says how to turn it on.
    let plain = Server::start_synthetic(&[]);
    let (status, body) = plain.call("POST", "/slots/0?action=save", &json!({"filename": "x"}));
    assert_eq!(status, 501, "{body}");
    assert!(body.contains("--slot-save-path"), "{body}");
}

#[test]
fn the_context_ends_a_sequence_or_shifts_as_asked() {
    let model = synthetic_model();
    let m = model.to_str().unwrap();
    let plain = Server::spawn(&["--model", m, "--ctx", "48"]).unwrap();
    let prompt = "the cat sat on the mat";
    let n = n_tokens(&plain, prompt);
    let ask = |s: &Server, n_predict: i64| {
        s.json(
            "/completion",
            &json!({"prompt": prompt, "n_predict": n_predict, "temperature": 0,
                    "ignore_eos": true}),
        )
    };
    // Without shift: prompt and generated tokens fill the context, and it says truncated.
    let r = ask(&plain, -1);
    assert_eq!(r["timings"]["predicted_n"], 48 - n);
    assert_eq!(r["truncated"], true);
    // A limit past the context is refused without shift.
    let (status, body) = plain.call(
        "POST",
        "/completion",
        &json!({"prompt": prompt, "n_predict": 100}),
    );
    assert_eq!(status, 400, "{body}");
    let r = ask(&plain, 5);
    assert_eq!(
        (r["timings"]["predicted_n"].as_u64(), &r["truncated"]),
        (Some(5), &json!(false))
    );
    let long = "the cat sat on the mat ".repeat(20);
    let (status, body) = plain.call("POST", "/completion", &json!({"prompt": long}));
    assert_eq!(status, 400);
    assert!(
        body.contains("exceeds the available context size"),
        "{body}"
    );
    // With shift: as many tokens as asked, truncated; n_keep within range.
    let shift = Server::spawn(&[
        "--model",
        m,
        "--ctx",
        "48",
        "--context-shift",
        "--keep",
        "2",
    ])
    .unwrap();
    let r = ask(&shift, 100);
    assert_eq!(
        (r["timings"]["predicted_n"].as_u64(), &r["truncated"]),
        (Some(100), &json!(true))
    );
    let r = ask(&shift, 5);
    assert_eq!(r["truncated"], false);
    let r = shift.json(
        "/completion",
        &json!({"prompt": prompt, "n_predict": 60, "n_keep": -1, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(
        (r["timings"]["predicted_n"].as_u64(), &r["truncated"]),
        (Some(60), &json!(true))
    );
    let (status, body) = shift.call(
        "POST",
        "/completion",
        &json!({"prompt": prompt, "n_keep": -3}),
    );
    assert_eq!(status, 400, "{body}");
}

#[test]
fn infill_needs_fim_tokens() {
    let s = Server::start_synthetic(&[]);
    let (status, body) = s.call(
        "POST",
        "/infill",
        &json!({"input_prefix": "a", "input_suffix": "b"}),
    );
    assert_eq!(status, 501, "{body}");
    assert!(
        body.contains("no prefix, no suffix, no middle token"),
        "{body}"
    );
}

/// The synthetic model with fill-in-the-middle ids named in its metadata: its three special
/// tokens as prefix, suffix and middle, and two byte tokens as repository and file markers.
fn fim_model() -> std::path::PathBuf {
    use qkv::weights::gguf::MetaValue;
    let ids = [
        ("tokenizer.ggml.fim_pre_token_id", 264),
        ("tokenizer.ggml.fim_suf_token_id", 265),
        ("tokenizer.ggml.fim_mid_token_id", 266),
        ("tokenizer.ggml.fim_rep_token_id", 35),
        ("tokenizer.ggml.fim_sep_token_id", 36),
    ];
    synthetic::model_file_with(
        Storage::F32,
        "fim",
        ids.iter()
            .map(|&(k, v)| (k.to_string(), MetaValue::U32(v)))
            .collect(),
    )
}

/// The token ids of `text` (no special tokens added).
fn ids(s: &Server, text: &str) -> Vec<u64> {
    s.json("/tokenize", &json!({ "content": text }))["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn infill_lays_out_files_prefix_suffix_and_middle() {
    for spm in [false, true] {
        let mut extra = vec!["--batch-size", "64"];
        if spm {
            extra.push("--spm-infill");
        }
        let s = Server::start_with(&fim_model(), &extra);
        let (prefix, prompt, suffix) = ("the cat sat\n", "on the", " mat\n");
        let body = json!({"input_prefix": prefix, "prompt": prompt, "input_suffix": suffix,
                          "input_extra": [{"filename": "a.txt", "text": "the dog"}, {"text": "ran"}],
                          "n_predict": 3, "temperature": 0, "ignore_eos": true});
        let r = s.json("/infill", &body);
        // Repository marker and name, each file's marker, name and text, the current
        // file's marker; then prefix, prompt, suffix (or suffix first) and the middle.
        let mut want = vec![35];
        want.extend(ids(&s, "myproject\n"));
        for (name, text) in [("a.txt", "the dog"), ("tmp", "ran")] {
            want.push(36);
            want.extend(ids(&s, &format!("{name}\n")));
            want.extend(ids(&s, text));
        }
        want.push(36);
        want.extend(ids(&s, "filename\n"));
        let mut pre = vec![264];
        pre.extend(ids(&s, prefix));
        pre.extend(ids(&s, prompt));
        let mut suf = vec![265];
        suf.extend(ids(&s, suffix));
        if spm {
            want.extend(suf.iter().chain(&pre));
        } else {
            want.extend(pre.iter().chain(&suf));
        }
        want.push(266);
        // The same as text: tokens 35 and 36 are the bytes `#` and `$`.
        let files = "#myproject\n$a.txt\nthe dog$tmp\nran$filename\n";
        let (pre, suf) = ("<|endoftext|>the cat sat\non the", "<|im_start|> mat\n");
        let text = match spm {
            false => format!("{files}{pre}{suf}<|im_end|>"),
            true => format!("{files}{suf}{pre}<|im_end|>"),
        };
        assert_eq!(r["prompt"], text.as_str(), "spm {spm}");
        assert_eq!(r["tokens_evaluated"], want.len(), "spm {spm}");
        assert_eq!(r["tokens_predicted"], 3);
        for bad in [
            json!([{}]),
            json!([{"filename": "ok"}]),
            json!([{"filename": 1, "text": "x"}]),
            json!({}),
        ] {
            let (status, body) = s.call(
                "POST",
                "/infill",
                &json!({"input_prefix": "a", "input_suffix": "b", "input_extra": bad}),
            );
            assert_eq!(status, 400, "{bad}: {body}");
        }
        let (status, _) = s.call("POST", "/infill", &json!({"input_prefix": "a"}));
        assert_eq!(status, 400);
    }
}

#[test]
fn network_the_default_model_has_no_fim_tokens() {
    // SmolLM2's vocabulary has no prefix, suffix or middle marker: llama-server refuses
    // its infill too.
    let Some(s) = Server::start(&[]) else {
        return;
    };
    let (status, body) = s.call(
        "POST",
        "/infill",
        &json!({"input_prefix": "a", "input_suffix": "b"}),
    );
    assert_eq!(status, 501, "{body}");
}
