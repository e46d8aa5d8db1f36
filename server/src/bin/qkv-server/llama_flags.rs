//! llama-server's command line, read before clap sees it: its spellings of several letters
//! after one dash (`-np`, `-ctk`, `-ngl`…) become the long names `args.rs` declares, its
//! `LLAMA_ARG_*` environment variables become flags (the command line wins), a flag that
//! means nothing on a CPU is dropped with a one-line note, and a flag for a feature qkv
//! lacks stops the server with an error naming it.

use std::ffi::OsString;

/// What one of llama-server's spellings becomes.
#[derive(Clone, Copy)]
enum Kind {
    /// This long flag of `args.rs`.
    Rename(&'static str),
    /// Accepted and dropped, with this note; `true`: it takes a value.
    Note(bool, &'static str),
    /// Refused: qkv lacks this feature.
    Refuse(&'static str),
}

use Kind::{Note, Refuse, Rename};

const CPU: &str = "qkv runs on the CPU: there is nothing to offload";
const NO_DOWNLOAD: &str = "downloading models (give --model a local GGUF file or directory)";
const SPECULATIVE: &str = "synthetic speculative drafts";
const VISION: &str = "image and audio input";
const TOOLS: &str = "built-in server tools and MCP servers";
const PREFIX_CACHE: &str = "qkv's prefix cache lives in the KV cache budget (--kv-budget)";
const ROPE: &str = "overriding the model's RoPE scaling";

/// llama-server's spellings that `args.rs` does not declare as they are.
const TABLE: &[(&str, Kind)] = &[
    ("-m", Rename("--model")),
    ("-c", Rename("--ctx-size")),
    ("-t", Rename("--threads")),
    ("-a", Rename("--alias")),
    ("-n", Rename("--n-predict")),
    ("-b", Rename("--batch-size")),
    ("-s", Rename("--seed")),
    ("-v", Rename("--verbose")),
    ("-np", Rename("--parallel")),
    ("-ctk", Rename("--cache-type-k")),
    ("-ctv", Rename("--cache-type-v")),
    ("-kvu", Rename("--kv-unified")),
    ("-no-kvu", Rename("--no-kv-unified")),
    ("-rea", Rename("--reasoning")),
    ("--predict", Rename("--n-predict")),
    ("--temperature", Rename("--temp")),
    ("--embedding", Rename("--embeddings")),
    ("--log-verbose", Rename("--verbose")),
    ("-ngl", Note(true, CPU)),
    ("--gpu-layers", Note(true, CPU)),
    ("--n-gpu-layers", Note(true, CPU)),
    ("-fa", Note(true, "qkv's attention is always one fused pass")),
    ("--flash-attn", Note(true, "qkv's attention is always one fused pass")),
    ("-ub", Note(true, "qkv's engine has no separate physical batch")),
    ("--ubatch-size", Note(true, "qkv's engine has no separate physical batch")),
    ("-cb", Note(false, "qkv's engine always batches continuously")),
    ("--cont-batching", Note(false, "qkv's engine always batches continuously")),
    ("-tb", Note(true, "one pool (--threads) reads prompts and decodes")),
    ("--threads-batch", Note(true, "one pool (--threads) reads prompts and decodes")),
    ("--threads-http", Note(true, "HTTP runs on a small async runtime")),
    ("--offline", Note(false, "qkv-server downloads nothing")),
    ("--no-ui", Note(false, "qkv-server has no web UI")),
    ("--no-webui", Note(false, "qkv-server has no web UI")),
    ("--jinja", Note(false, "qkv always renders chat templates with Jinja")),
    ("--swa-full", Note(false, "qkv keeps full-size caches for sliding-window layers")),
    ("-cram", Note(true, PREFIX_CACHE)),
    ("--cache-ram", Note(true, PREFIX_CACHE)),
    ("--cache-idle-slots", Note(false, PREFIX_CACHE)),
    ("--no-cache-idle-slots", Note(false, PREFIX_CACHE)),
    ("--cache-prompt", Note(false, "qkv always caches prompt prefixes")),
    ("--no-mmproj", Note(false, "there is no projector to load")),
    ("--props", Note(false, "/props is always served")),
    ("--mlock", Note(false, "the weights are a read-only memory mapping")),
    ("--mmap", Note(false, "the weights are a read-only memory mapping")),
    ("--no-mmap", Note(false, "the weights are a read-only memory mapping")),
    ("--numa", Note(true, "the weights are a read-only memory mapping")),
    ("--warmup", Note(false, "qkv-server warms nothing up")),
    ("--no-warmup", Note(false, "qkv-server warms nothing up")),
    ("-bs", Note(false, "qkv samples on the CPU")),
    ("--backend-sampling", Note(false, "qkv samples on the CPU")),
    ("--backend_sampling", Note(false, "qkv samples on the CPU")),
    ("--log-disable", Note(false, "qkv-server logs a few lines to stderr")),
    ("--log-colors", Note(true, "qkv-server logs a few lines to stderr")),
    ("--log-prefix", Note(false, "qkv-server logs a few lines to stderr")),
    ("--log-timestamps", Note(false, "qkv-server logs a few lines to stderr")),
    ("-lv", Note(true, "qkv-server logs a few lines to stderr")),
    ("--verbosity", Note(true, "qkv-server logs a few lines to stderr")),
    ("--log-verbosity", Note(true, "qkv-server logs a few lines to stderr")),
    ("-sps", Note(true, "a request takes any free sequence")),
    ("--slot-prompt-similarity", Note(true, "a request takes any free sequence")),
    ("-hf", Refuse(NO_DOWNLOAD)),
    ("-hfr", Refuse(NO_DOWNLOAD)),
    ("--hf-repo", Refuse(NO_DOWNLOAD)),
    ("-hff", Refuse(NO_DOWNLOAD)),
    ("--hf-file", Refuse(NO_DOWNLOAD)),
    ("-mu", Refuse(NO_DOWNLOAD)),
    ("--model-url", Refuse(NO_DOWNLOAD)),
    ("-hft", Refuse(NO_DOWNLOAD)),
    ("--hf-token", Refuse(NO_DOWNLOAD)),
    (
        "--no-jinja",
        Note(
            false,
            "qkv renders the model's own Jinja template, which llama.cpp's built-in formats imitate",
        ),
    ),
    ("--no-cont-batching", Refuse("batching without continuous batching")),
    ("-nocb", Refuse("batching without continuous batching")),
    ("--no-cache-prompt", Refuse("turning the prefix cache off server-wide")),
    ("--control-vector", Refuse("control vectors")),
    ("--control-vector-scaled", Refuse("control vectors")),
    ("--grp-attn-n", Refuse("group attention (self-extend)")),
    ("--grp-attn-w", Refuse("group attention (self-extend)")),
    ("-md", Rename("--model-draft")),
    ("--spec-synth-len", Refuse(SPECULATIVE)),
    ("--spec-synth-rates", Refuse(SPECULATIVE)),
    ("--draft", Rename("--draft-max")),
    ("--draft-n", Rename("--draft-max")),
    ("-mm", Refuse(VISION)),
    ("--mmproj", Refuse(VISION)),
    ("-mmu", Refuse(VISION)),
    ("--mmproj-url", Refuse(VISION)),
    (
        "--media-path",
        Note(true, "qkv reads no media: every image or audio input is refused"),
    ),
    ("--tools", Refuse(TOOLS)),
    ("--tools-runtime", Refuse(TOOLS)),
    ("--mcp-servers-config", Refuse(TOOLS)),
    ("--mcp-servers-json", Refuse(TOOLS)),
    ("--ui-mcp-proxy", Refuse(TOOLS)),
    ("--webui-mcp-proxy", Refuse(TOOLS)),
    ("-ag", Refuse(TOOLS)),
    ("--agent", Refuse(TOOLS)),
    ("--cache-reuse", Refuse("reusing cache chunks by shifting them")),
    ("--rerank", Rename("--reranking")),
    ("--ssl-key-file", Refuse("TLS (put a TLS proxy in front)")),
    ("--ssl-cert-file", Refuse("TLS (put a TLS proxy in front)")),
    ("--api-prefix", Refuse("a path prefix for the routes")),
    ("--path", Refuse("serving static files")),
    ("--rope-scaling", Refuse(ROPE)),
    ("--rope-scale", Refuse(ROPE)),
    ("--rope-freq-base", Refuse(ROPE)),
    ("--rope-freq-scale", Refuse(ROPE)),
    ("--yarn-orig-ctx", Refuse(ROPE)),
    (
        "--reasoning-format",
        Note(
            true,
            "qkv always moves a <think> block to reasoning_content, as the deepseek format does",
        ),
    ),
    ("-dev", Refuse("choosing a device")),
    ("--device", Refuse("choosing a device")),
];

/// llama-server's environment variables: (variable, flag, whether the flag takes a value,
/// the flag's negation). A switch's variable is read as llama-server reads it (`1`, `true`,
/// `on`, `enabled` or `0`, `false`, `off`, `disabled`); `LLAMA_ARG_NO_…` of a negatable one
/// gives its negation.
const ENV: &[(&str, &str, bool, Option<&str>)] = &[
    ("LLAMA_ARG_MODEL", "--model", true, None),
    ("LLAMA_ARG_MODEL_URL", "--model-url", true, None),
    ("LLAMA_ARG_HF_REPO", "--hf-repo", true, None),
    ("LLAMA_ARG_CTX_SIZE", "--ctx-size", true, None),
    ("LLAMA_ARG_N_PARALLEL", "--parallel", true, None),
    ("LLAMA_ARG_THREADS", "--threads", true, None),
    ("LLAMA_ARG_ALIAS", "--alias", true, None),
    ("LLAMA_ARG_TAGS", "--tags", true, None),
    ("LLAMA_ARG_EMBEDDINGS", "--embeddings", false, None),
    ("LLAMA_ARG_RERANKING", "--reranking", false, None),
    ("LLAMA_ARG_ENDPOINT_METRICS", "--metrics", false, None),
    (
        "LLAMA_ARG_ENDPOINT_SLOTS",
        "--slots",
        false,
        Some("--no-slots"),
    ),
    ("LLAMA_ARG_JINJA", "--jinja", false, Some("--no-jinja")),
    ("LLAMA_ARG_CACHE_TYPE_K", "--cache-type-k", true, None),
    ("LLAMA_ARG_CACHE_TYPE_V", "--cache-type-v", true, None),
    ("LLAMA_ARG_FLASH_ATTN", "--flash-attn", true, None),
    ("LLAMA_ARG_N_GPU_LAYERS", "--n-gpu-layers", true, None),
    (
        "LLAMA_ARG_KV_UNIFIED",
        "--kv-unified",
        false,
        Some("--no-kv-unified"),
    ),
    ("LLAMA_ARG_HOST", "--host", true, None),
    ("LLAMA_ARG_PORT", "--port", true, None),
    ("LLAMA_API_KEY", "--api-key", true, None),
    ("LLAMA_ARG_API_KEY_FILE", "--api-key-file", true, None),
    ("LLAMA_ARG_N_PREDICT", "--n-predict", true, None),
    ("LLAMA_ARG_BATCH", "--batch-size", true, None),
    ("LLAMA_ARG_UBATCH", "--ubatch-size", true, None),
    (
        "LLAMA_ARG_CONT_BATCHING",
        "--cont-batching",
        false,
        Some("--no-cont-batching"),
    ),
    ("LLAMA_ARG_POOLING", "--pooling", true, None),
    ("LLAMA_ARG_CHAT_TEMPLATE", "--chat-template", true, None),
    (
        "LLAMA_ARG_CHAT_TEMPLATE_FILE",
        "--chat-template-file",
        true,
        None,
    ),
    ("LLAMA_ARG_CORS_ORIGINS", "--cors-origins", true, None),
    ("LLAMA_ARG_TEMPERATURE", "--temp", true, None),
    ("LLAMA_ARG_REASONING", "--reasoning", true, None),
    ("LLAMA_ARG_THINK", "--reasoning-format", true, None),
    ("LLAMA_ARG_SWA_FULL", "--swa-full", false, None),
    ("LLAMA_ARG_CACHE_RAM", "--cache-ram", true, None),
    (
        "LLAMA_ARG_CONTEXT_SHIFT",
        "--context-shift",
        false,
        Some("--no-context-shift"),
    ),
    ("LLAMA_ARG_MODELS_DIR", "--models-dir", true, None),
    ("LLAMA_ARG_MODELS_MAX", "--models-max", true, None),
    ("LLAMA_ARG_MODELS_PRESET", "--models-preset", true, None),
    (
        "LLAMA_ARG_MODELS_AUTOLOAD",
        "--models-autoload",
        false,
        Some("--no-models-autoload"),
    ),
    ("LLAMA_ARG_SPEC_DRAFT_MODEL", "--model-draft", true, None),
    ("LLAMA_ARG_MMPROJ", "--mmproj", true, None),
];

/// The command line clap reads, and the notes to print before serving.
#[derive(Debug, PartialEq)]
pub struct Expanded {
    /// The program's name, then the flags.
    pub args: Vec<OsString>,
    /// One line per flag accepted without effect.
    pub notes: Vec<String>,
}

fn lookup(flag: &str) -> Option<Kind> {
    TABLE.iter().find(|(f, _)| *f == flag).map(|&(_, k)| k)
}

/// llama-server's truthy and falsey words, for a switch given by its variable.
fn switch_value(var: &str, v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "enabled" | "yes" => Ok(true),
        "0" | "false" | "off" | "disabled" | "no" => Ok(false),
        _ => Err(format!(
            "{var}={v}: give 1, true, on or enabled, or 0, false, off or disabled"
        )),
    }
}

/// Reads `argv` (the program's name first) as llama-server's command line, with the
/// environment `env`; `takes_value` tells which of qkv-server's own flags take a value (so
/// that a value is never read as a flag). An error names the refused flag or variable.
pub fn expand(
    argv: impl IntoIterator<Item = OsString>,
    env: &dyn Fn(&str) -> Option<String>,
    takes_value: &dyn Fn(&str) -> bool,
) -> Result<Expanded, String> {
    let mut argv = argv.into_iter();
    let mut args: Vec<OsString> = argv.next().into_iter().collect();
    let mut notes = Vec::new();
    let mut given: Vec<String> = Vec::new();
    let rest: Vec<OsString> = argv.collect();
    let mut i = 0;
    while i < rest.len() {
        let raw = &rest[i];
        i += 1;
        let Some(flag) = raw.to_str() else {
            args.push(raw.clone());
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (flag, None),
        };
        let value_of = |i: &mut usize, inline: &Option<String>| -> Result<String, String> {
            if let Some(v) = inline {
                return Ok(v.clone());
            }
            let v = rest
                .get(*i)
                .and_then(|v| v.to_str())
                .ok_or_else(|| format!("{name} needs a value"))?;
            *i += 1;
            Ok(v.to_owned())
        };
        match lookup(name) {
            Some(Rename(long)) => {
                given.push(long.to_owned());
                args.push(long.into());
                if let Some(v) = inline {
                    args.push(v.into());
                } else if takes_value(long) {
                    if let Some(v) = rest.get(i) {
                        args.push(v.clone());
                        i += 1;
                    }
                }
            }
            Some(Note(valued, why)) => {
                let shown = if valued {
                    let v = value_of(&mut i, &inline)?;
                    check_noted_value(name, &v)?;
                    format!("{name} {v}")
                } else {
                    name.to_owned()
                };
                notes.push(format!("{shown}: accepted, no effect ({why})"));
            }
            Some(Refuse(what)) => {
                return Err(format!("{name}: qkv-server does not support {what}"));
            }
            None => {
                given.push(name.to_owned());
                args.push(raw.clone());
                if inline.is_none() && takes_value(name) {
                    if let Some(v) = rest.get(i) {
                        args.push(v.clone());
                        i += 1;
                    }
                }
            }
        }
    }
    from_env(&mut args, &mut notes, &given, env, takes_value)?;
    Ok(Expanded { args, notes })
}

/// The flags of llama-server's variables that the command line did not give.
fn from_env(
    args: &mut Vec<OsString>,
    notes: &mut Vec<String>,
    given: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    takes_value: &dyn Fn(&str) -> bool,
) -> Result<(), String> {
    for &(var, flag, valued, negation) in ENV {
        let on_line = |f: &str| given.iter().any(|g| g == f);
        if on_line(flag) || negation.is_some_and(on_line) {
            continue;
        }
        let negated = var
            .strip_prefix("LLAMA_ARG_")
            .and_then(|rest| env(&format!("LLAMA_ARG_NO_{rest}")));
        let (flag, value) = match (env(var), negated) {
            (_, Some(_)) if negation.is_some() => (negation.unwrap_or(flag), None),
            (Some(v), _) if valued => (flag, Some(v)),
            (Some(v), _) => match (switch_value(var, &v)?, negation) {
                (true, _) => (flag, None),
                (false, Some(n)) => (n, None),
                (false, None) => continue,
            },
            _ => continue,
        };
        let mut sub = vec![OsString::from(flag)];
        sub.extend(value.map(OsString::from));
        let one = expand(
            std::iter::once(OsString::new()).chain(sub),
            &|_| None,
            takes_value,
        )
        .map_err(|e| format!("{var}: {e}"))?;
        args.extend(one.args.into_iter().skip(1));
        notes.extend(one.notes.into_iter().map(|n| format!("{var}: {n}")));
    }
    Ok(())
}

/// The values llama-server accepts for a flag qkv-server notes and drops.
fn check_noted_value(flag: &str, v: &str) -> Result<(), String> {
    let ok = match flag {
        "-fa" | "--flash-attn" => ["on", "off", "auto", "1", "0", "true", "false", "enabled"]
            .contains(&v.to_ascii_lowercase().as_str()),
        "-ngl" | "--gpu-layers" | "--n-gpu-layers" => {
            v.parse::<i64>().is_ok() || v == "auto" || v == "all"
        }
        "--reasoning-format" => {
            if !["deepseek", "auto"].contains(&v) {
                return Err(format!(
                    "--reasoning-format {v}: qkv-server does not support reasoning formats \
                     other than deepseek's (auto)"
                ));
            }
            true
        }
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{flag} {v}: not a value llama-server accepts"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &[&str], env: &[(&str, &str)]) -> Result<Expanded, String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let valued = [
            "--port",
            "--model",
            "--parallel",
            "--ctx-size",
            "--api-key",
            "--cache-type-k",
        ];
        expand(
            std::iter::once("qkv-server")
                .chain(line.iter().copied())
                .map(OsString::from),
            &|k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            &|f| valued.contains(&f),
        )
    }

    fn strings(e: &Expanded) -> Vec<&str> {
        e.args[1..].iter().map(|a| a.to_str().unwrap()).collect()
    }

    #[test]
    fn short_spellings_become_long_flags_and_gpu_flags_are_noted() {
        let e = run(
            &[
                "-np", "4", "-ctk", "q8_0", "-ngl", "99", "-fa", "on", "-c", "-ngl",
            ],
            &[],
        )
        .unwrap();
        // `-c`'s value is copied as it is, even when it looks like a flag.
        assert_eq!(
            strings(&e),
            [
                "--parallel",
                "4",
                "--cache-type-k",
                "q8_0",
                "--ctx-size",
                "-ngl"
            ]
        );
        assert_eq!(e.notes.len(), 2);
        assert!(e.notes[0].starts_with("-ngl 99: accepted, no effect"));
        assert!(run(&["-fa", "maybe"], &[]).is_err());
    }

    #[test]
    fn a_missing_feature_is_refused_by_name() {
        let e = run(&["--control-vector", "a.gguf"], &[]).unwrap_err();
        assert!(
            e.starts_with("--control-vector: qkv-server does not support control vectors"),
            "{e}"
        );
        let e = run(&["--mmproj=/m"], &[]).unwrap_err();
        assert!(e.starts_with("--mmproj:"), "{e}");
        let e = run(&[], &[("LLAMA_ARG_MMPROJ", "/m")]).unwrap_err();
        assert!(e.starts_with("LLAMA_ARG_MMPROJ: --mmproj:"), "{e}");
    }

    #[test]
    fn slot_files_context_shift_and_infill_flags_are_qkv_servers_own() {
        let line = [
            "--slot-save-path",
            "/tmp/slots",
            "--keep",
            "-1",
            "--context-shift",
            "--spm-infill",
            "--no-context-shift",
        ];
        let e = run(&line, &[]).unwrap();
        assert_eq!(strings(&e), line);
        assert!(e.notes.is_empty(), "{:?}", e.notes);
        let e = run(&[], &[("LLAMA_ARG_CONTEXT_SHIFT", "1")]).unwrap();
        assert_eq!(strings(&e), ["--context-shift"]);
        let e = run(&[], &[("LLAMA_ARG_NO_CONTEXT_SHIFT", "1")]).unwrap();
        assert_eq!(strings(&e), ["--no-context-shift"]);
    }

    #[test]
    fn variables_give_flags_the_command_line_did_not() {
        let e = run(
            &["--port", "9000"],
            &[
                ("LLAMA_ARG_PORT", "1"),
                ("LLAMA_ARG_CTX_SIZE", "4096"),
                ("LLAMA_ARG_ENDPOINT_METRICS", "1"),
                ("LLAMA_ARG_EMBEDDINGS", "false"),
                ("LLAMA_ARG_NO_KV_UNIFIED", "1"),
                ("LLAMA_ARG_ENDPOINT_SLOTS", "disabled"),
                ("LLAMA_ARG_N_GPU_LAYERS", "99"),
            ],
        )
        .unwrap();
        assert_eq!(
            strings(&e),
            [
                "--port",
                "9000",
                "--ctx-size",
                "4096",
                "--metrics",
                "--no-slots",
                "--no-kv-unified"
            ]
        );
        assert_eq!(e.notes.len(), 1);
        assert!(run(&[], &[("LLAMA_ARG_JINJA", "maybe")]).is_err());
    }
}
