//! What a router can serve: the models of `--models-dir` and the presets of
//! `--models-preset`, each with the command line its instance starts with.
//!
//! A directory lists each `*.gguf` file as a model named after its stem, and each
//! subdirectory as a model named after it: the GGUF file in it (the first shard of a split
//! file; `mmproj*` files are skipped), or the directory itself when it is a Hugging Face or
//! sentence-transformers directory (`config.json` or `modules.json`).
//!
//! A preset file is INI, as llama-server reads it: `[name]` sections whose keys are
//! command-line flags without their dashes (`ctx-size = 4096`, `c = 4096`, `jinja = true`)
//! or `LLAMA_ARG_*` variables; `[*]` holds what every model gets; `model = PATH` names the
//! file of a section that is not a model of the directory; `load-on-startup` and
//! `stop-timeout` are the router's own. The router's own command line wins over a section,
//! and a section over `[*]`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One model the router can start.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// The name requests give in `model`.
    pub id: String,
    /// The file or directory `--model` gets.
    pub path: PathBuf,
    /// Flags from the preset (`[*]`, then the model's section), already in long form.
    pub flags: Vec<OsString>,
    /// `LLAMA_ARG_*` variables from the preset.
    pub env: Vec<(String, String)>,
    /// Load when the router starts (`load-on-startup`).
    pub load_on_startup: bool,
    /// How long an unloaded instance may take to finish before it is killed.
    pub stop_timeout: Duration,
}

/// How long an instance may take to stop when the preset does not say (llama-server's).
const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The models of `dir` and of the preset file `preset`, by name. `expand` turns a preset's
/// flags into the long form the server's parser takes (llama_flags.rs), or says what is
/// wrong with them. An unreadable directory or preset, a section without a model, or a flag
/// the server refuses is an error naming it.
pub fn list(
    dir: Option<&Path>,
    preset: Option<&Path>,
    expand: &dyn Fn(Vec<OsString>) -> Result<Vec<OsString>, String>,
) -> Result<BTreeMap<String, Spec>, String> {
    let mut models = BTreeMap::new();
    if let Some(dir) = dir {
        for (id, path) in scan(dir)? {
            models.insert(
                id.clone(),
                Spec {
                    id,
                    path,
                    flags: Vec::new(),
                    env: Vec::new(),
                    load_on_startup: false,
                    stop_timeout: DEFAULT_STOP_TIMEOUT,
                },
            );
        }
    }
    if let Some(preset) = preset {
        let text = std::fs::read_to_string(preset)
            .map_err(|e| format!("--models-preset {}: {e}", preset.display()))?;
        let ini =
            parse_ini(&text).map_err(|e| format!("--models-preset {}: {e}", preset.display()))?;
        apply_preset(&mut models, &ini, expand)
            .map_err(|e| format!("--models-preset {}: {e}", preset.display()))?;
    }
    Ok(models)
}

/// The models of a directory, by name.
fn scan(dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("--models-dir {}: {e}", dir.display()))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("--models-dir {}: {e}", dir.display()))?;
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            if let Some(model) = model_in(&path) {
                found.push((name, model));
            }
        } else if let Some(stem) = name.strip_suffix(".gguf") {
            if !stem.starts_with("mmproj") {
                found.push((stem.to_owned(), path));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The model a subdirectory holds: itself when it is a Hugging Face directory, else its
/// one GGUF file (the first shard of a split one), else nothing.
fn model_in(dir: &Path) -> Option<PathBuf> {
    if dir.join("config.json").is_file() || dir.join("modules.json").is_file() {
        return Some(dir.to_owned());
    }
    let mut ggufs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".gguf") && !n.starts_with("mmproj"))
        })
        .collect();
    ggufs.sort();
    let first_shard = ggufs.iter().find(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains("-00001-of-"))
    });
    first_shard.or(ggufs.first()).cloned()
}

/// An INI file: the keys before any section (under `""`), then each section's, in order.
type Ini = Vec<(String, Vec<(String, String)>)>;

/// Reads INI text: `[section]` lines, `key = value` lines, `;` and `#` comments.
fn parse_ini(text: &str) -> Result<Ini, String> {
    let mut ini: Ini = vec![(String::new(), Vec::new())];
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest
                .strip_suffix(']')
                .ok_or_else(|| format!("line {}: a section name without its `]`", n + 1))?
                .trim();
            if name.is_empty() {
                return Err(format!("line {}: an empty section name", n + 1));
            }
            if ini.iter().any(|(s, _)| s == name) {
                return Err(format!("line {}: section [{name}] given twice", n + 1));
            }
            ini.push((name.to_owned(), Vec::new()));
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| format!("line {}: expected `key = value`, found `{line}`", n + 1))?;
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        let section = ini.last_mut().expect("the unnamed section is always there");
        section.1.push((key.trim().to_owned(), value.to_owned()));
    }
    Ok(ini)
}

/// A preset section read: its flags, its variables and the router's own keys.
#[derive(Default)]
struct Section {
    flags: Vec<OsString>,
    env: Vec<(String, String)>,
    own: Own,
}

/// The router's own keys of a section.
#[derive(Default)]
struct Own {
    model: Option<String>,
    load_on_startup: Option<bool>,
    stop_timeout: Option<Duration>,
}

/// Adds each section of `ini` to `models`: a section named after a model of the directory
/// sets its options; any other must name its file (`model = PATH`).
fn apply_preset(
    models: &mut BTreeMap<String, Spec>,
    ini: &Ini,
    expand: &dyn Fn(Vec<OsString>) -> Result<Vec<OsString>, String>,
) -> Result<(), String> {
    let global = ini.iter().find(|(s, _)| s == "*");
    let Section {
        flags: global_flags,
        env: global_env,
        own: global_own,
    } = match global {
        Some((_, keys)) => section_flags("*", keys)?,
        None => Section::default(),
    };
    for (name, keys) in ini {
        if name.is_empty() || name == "*" {
            continue;
        }
        let Section { flags, env, own } = section_flags(name, keys)?;
        let path = match (&own.model, models.get(name)) {
            (Some(p), _) => PathBuf::from(p),
            (None, Some(spec)) => spec.path.clone(),
            (None, None) => {
                return Err(format!(
                    "[{name}]: not a model of --models-dir; give its file as `model = PATH`"
                ))
            }
        };
        let mut all = global_flags.clone();
        all.extend(flags);
        let flags = expand(all).map_err(|e| format!("[{name}]: {e}"))?;
        let mut all_env = global_env.clone();
        all_env.extend(env);
        models.insert(
            name.clone(),
            Spec {
                id: name.clone(),
                path,
                flags: dedupe(&flags, &[]),
                env: all_env,
                load_on_startup: own
                    .load_on_startup
                    .or(global_own.load_on_startup)
                    .unwrap_or(false),
                stop_timeout: own
                    .stop_timeout
                    .or(global_own.stop_timeout)
                    .unwrap_or(DEFAULT_STOP_TIMEOUT),
            },
        );
    }
    Ok(())
}

/// A truthy or falsey preset value.
fn truth(key: &str, value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" | "enabled" => Ok(true),
        "0" | "false" | "off" | "no" | "disabled" => Ok(false),
        _ => Err(format!("{key} = {value}: give true or false")),
    }
}

/// A section's keys as command-line flags (one or two dashes, as the key's length says),
/// `LLAMA_ARG_*` variables, and the router's own keys.
fn section_flags(name: &str, keys: &[(String, String)]) -> Result<Section, String> {
    let mut flags = Vec::new();
    let mut env = Vec::new();
    let mut own = Own::default();
    for (key, value) in keys {
        let at = |e: String| format!("[{name}] {e}");
        match key.as_str() {
            "model" | "m" => own.model = Some(value.clone()),
            "load-on-startup" => own.load_on_startup = Some(truth(key, value).map_err(at)?),
            "stop-timeout" => {
                let secs: u64 = value
                    .parse()
                    .map_err(|_| at(format!("stop-timeout = {value}: give whole seconds")))?;
                own.stop_timeout = Some(Duration::from_secs(secs));
            }
            // Only hides cache entries, which a router over local files does not have.
            "dedup-cache-models" => {}
            "host" | "port" | "api-key" | "api-key-file" | "alias" | "model-name" => {
                return Err(at(format!("{key}: the router sets it for every model")));
            }
            k if k.starts_with("LLAMA_ARG_") || k == "LLAMA_API_KEY" => {
                env.push((k.to_owned(), value.clone()));
            }
            k => {
                let dashes = if k.len() <= 3 { "-" } else { "--" };
                match value.to_ascii_lowercase().as_str() {
                    "true" | "on" | "enabled" => flags.push(format!("{dashes}{k}").into()),
                    "false" | "off" | "disabled" => {
                        flags.push(format!("--no-{}", k.trim_start_matches("no-")).into())
                    }
                    _ => {
                        flags.push(format!("{dashes}{k}").into());
                        flags.push(value.into());
                    }
                }
            }
        }
    }
    Ok(Section { flags, env, own })
}

/// The flags of `base` then `over` (each a list of `--flag [value]` in long form, values
/// told apart as not starting with `--`), a flag given twice kept only where it is given
/// last (`--no-x` counts as `--x`), so that the server's parser never sees a flag twice.
pub fn dedupe(base: &[OsString], over: &[OsString]) -> Vec<OsString> {
    let mut groups: Vec<Vec<OsString>> = Vec::new();
    for a in base.iter().chain(over) {
        let is_flag = a.to_str().is_some_and(|s| s.starts_with("--"));
        match groups.last_mut() {
            Some(g) if !is_flag => g.push(a.clone()),
            _ => groups.push(vec![a.clone()]),
        }
    }
    let name = |g: &[OsString]| -> String {
        let s = g[0].to_string_lossy();
        let s = s.split('=').next().unwrap_or_default();
        match s.strip_prefix("--no-") {
            Some(rest) => format!("--{rest}"),
            None => s.to_owned(),
        }
    };
    let mut names = std::collections::HashSet::new();
    let mut kept = Vec::new();
    for g in groups.into_iter().rev() {
        let n = name(&g);
        if REPEATABLE.contains(&n.as_str()) || names.insert(n) {
            kept.push(g);
        }
    }
    kept.into_iter().rev().flatten().collect()
}

/// Flags the server takes more than once.
const REPEATABLE: &[&str] = &["--model-name", "--api-key", "--lora", "--lora-scaled"];

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_later_flag_wins_and_values_stay_with_their_flag() {
        let base = os(&["--ctx-size", "4096", "--jinja", "--temp", "0.5"]);
        let over = os(&["--temp", "0.2", "--verbose"]);
        assert_eq!(
            dedupe(&base, &over),
            os(&[
                "--ctx-size",
                "4096",
                "--jinja",
                "--temp",
                "0.2",
                "--verbose"
            ])
        );
    }

    #[test]
    fn ini_sections_keys_and_comments() {
        let ini = parse_ini(
            "version = 1\n; note\n[*]\nc = 8192\n[a]\nmodel = \"/x.gguf\"\njinja = true\n",
        )
        .unwrap();
        assert_eq!(ini.len(), 3);
        assert_eq!(ini[0].1, vec![("version".to_owned(), "1".to_owned())]);
        assert_eq!(ini[2].1[0], ("model".to_owned(), "/x.gguf".to_owned()));
        assert!(parse_ini("[a\n").unwrap_err().contains("line 1"));
        assert!(parse_ini("[a]\n[a]\n").unwrap_err().contains("twice"));
        assert!(parse_ini("[a]\nnot a pair\n")
            .unwrap_err()
            .contains("key = value"));
    }

    #[test]
    fn a_preset_merges_global_then_section_and_names_a_missing_model() {
        let ini = parse_ini(
            "[*]\nc = 8192\nstop-timeout = 3\n[m]\nmodel = /m.gguf\nc = 1024\nLLAMA_ARG_THREADS = 1\n\
             load-on-startup = true\n",
        )
        .unwrap();
        let mut models = BTreeMap::new();
        let expand = |v: Vec<OsString>| -> Result<Vec<OsString>, String> {
            Ok(v.into_iter()
                .map(|a| if a == "-c" { "--ctx-size".into() } else { a })
                .collect())
        };
        apply_preset(&mut models, &ini, &expand).unwrap();
        let m = &models["m"];
        assert_eq!(m.path, PathBuf::from("/m.gguf"));
        assert_eq!(m.flags, os(&["--ctx-size", "1024"]));
        assert_eq!(
            m.env,
            vec![("LLAMA_ARG_THREADS".to_owned(), "1".to_owned())]
        );
        assert!(m.load_on_startup);
        assert_eq!(m.stop_timeout, Duration::from_secs(3));
        let ini = parse_ini("[ghost]\nc = 1\n").unwrap();
        let e = apply_preset(&mut BTreeMap::new(), &ini, &expand).unwrap_err();
        assert!(e.contains("[ghost]") && e.contains("model = PATH"), "{e}");
    }
}
