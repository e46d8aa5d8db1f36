//! qkv as another workspace's dependency: the template bounds must hold there too.
//!
//! qkv's minijinja carries fixes (third_party/minijinja/QKV-PATCH.md). A `[patch]` in this
//! workspace would not reach a program that depends on qkv from elsewhere, so the fork is a
//! path dependency; this test builds such a program, in a crate generated outside the
//! workspace, and runs the hostile templates of `tests/fuzz_regressions.rs` in it.
//!
//! It runs a nested `cargo build` (offline, with this workspace's lock file; a debug build into
//! `$QKV_CACHE/downstream-target`, a few minutes the first time and seconds after), so it is
//! ignored by default; `.ci/run` runs it with `--ignored`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The downstream program: renders each template given as an argument and prints one line per
/// template, `ok <text>` or `error <message>`, with the milliseconds it took.
const MAIN_RS: &str = r#"use qkv::tokenizer::{ChatOptions, ChatTemplate};
use std::time::Instant;

fn main() {
    for source in std::env::args().skip(1) {
        let start = Instant::now();
        let result = ChatTemplate::new("downstream", source).render(&[], &ChatOptions::default());
        let ms = start.elapsed().as_millis();
        match result {
            Ok(text) => println!("{ms} ok {}", text.escape_debug()),
            Err(e) => println!("{ms} error {}", e.to_string().escape_debug()),
        }
    }
}
"#;

/// The cache directory (`$QKV_CACHE`, else `~/.cache/qkv`).
fn cache_dir() -> PathBuf {
    match std::env::var_os("QKV_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
            .join(".cache/qkv"),
    }
}

/// Writes the downstream crate into `dir`, depending on the qkv at `qkv` by path.
fn write_crate(dir: &Path, qkv: &Path) {
    std::fs::create_dir_all(dir.join("src")).expect("creating the downstream crate");
    let manifest = format!(
        "[package]\nname = \"qkv-downstream-check\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n# Not part of any workspace above it.\n[workspace]\n\n\
         [dependencies]\nqkv = {{ path = {:?} }}\n\n[profile.dev]\ndebug = 0\n",
        qkv.display().to_string()
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).expect("writing Cargo.toml");
    std::fs::write(dir.join("src/main.rs"), MAIN_RS).expect("writing main.rs");
    // The versions this workspace builds with, so the build needs no network.
    std::fs::copy(qkv.join("Cargo.lock"), dir.join("Cargo.lock")).expect("copying Cargo.lock");
}

/// Builds the downstream crate in `dir`; the path of its binary.
fn build(dir: &Path) -> PathBuf {
    let target = cache_dir().join("downstream-target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--offline", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        // The outer build's flags are for this workspace, not for the downstream crate.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("running cargo");
    assert!(status.success(), "the downstream crate did not build");
    target.join("debug/qkv-downstream-check")
}

/// Runs the downstream binary on `templates`; its lines, or a failure if it runs past
/// `limit` (an unbounded render would hang).
fn render(bin: &Path, templates: &[&str], limit: Duration) -> Vec<String> {
    let mut child = Command::new(bin)
        .args(templates)
        .stdout(Stdio::piped())
        .spawn()
        .expect("running the downstream binary");
    let start = Instant::now();
    while child.try_wait().expect("waiting for it").is_none() {
        if start.elapsed() > limit {
            child.kill().ok();
            child.wait().ok();
            panic!("the downstream program rendered for more than {limit:?}: no bound");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("reading its output");
    assert!(out.status.success(), "the downstream program failed");
    String::from_utf8(out.stdout)
        .expect("UTF-8 output")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
#[ignore = "builds a crate outside the workspace (minutes the first time); .ci/run runs it"]
fn a_downstream_crate_gets_the_template_bounds() {
    let qkv = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("qkv-downstream-{}", std::process::id()));
    write_crate(&dir, qkv);
    let bin = build(&dir);
    std::fs::remove_dir_all(&dir).ok();

    let hostile = "{{ (range(1) * 100000000)[-1] }}";
    // A Python string method (minijinja-contrib's pycompat, on the same minijinja).
    let python = "{{ 'a,b'.split(',') | length }}";
    let lines = render(&bin, &[hostile, python], Duration::from_secs(30));
    assert_eq!(lines.len(), 2, "{lines:?}");
    let (ms, result) = lines[0].split_once(' ').expect("a time and a result");
    let ms: u64 = ms.parse().expect("milliseconds");
    assert!(
        result.starts_with("error ") && result.contains("fuel"),
        "the hostile template should run out of fuel downstream: {result}"
    );
    // The fork refuses the list before building it: well under a second even in debug.
    assert!(ms < 2_000, "the hostile template took {ms} ms to fail");
    assert!(lines[1].ends_with(" ok 2"), "{}", lines[1]);
}
