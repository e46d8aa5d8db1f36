//! Pre-tokenization: cutting (normalized) text into the pieces a vocabulary model encodes one
//! at a time, as a sequence of regex splits (Hugging Face's `Split`, `Digits`, `ByteLevel`,
//! `BertPreTokenizer`, …; llama.cpp's per-`tokenizer.ggml.pre` regex lists).
//!
//! Each step splits every piece the previous step produced, on its own: `$` and look-aheads
//! see the end of the piece, not of the whole text.
//!
//! # The one look-ahead
//!
//! The `regex` crate has no look-around. The patterns in use need exactly one:
//! `\s+(?!\S)` as a top-level alternative (a whitespace run that gives its last character to the
//! next piece when a non-space follows), optionally followed by a last alternative `\s+`. It is
//! matched as `\s+` and then corrected: when the match is whitespace only and none of the
//! alternatives before it matches at that position, the match came from that alternative, so
//! it loses its last character if it does not reach the end of the piece (or, alone and without
//! the trailing `\s+`, is no match at all). Any other look-around is refused.

use crate::error::{Error, Result};
use regex::Regex;
use regex_automata::{meta, Anchored, Input};

/// What a split does with the matches of its pattern (Hugging Face's
/// `SplitDelimiterBehavior`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Behavior {
    /// Matches and the text between them become pieces of their own.
    Isolated,
    /// Matches are dropped.
    Removed,
    /// A match joins the piece before it.
    MergedWithPrevious,
    /// A match joins the piece after it.
    MergedWithNext,
    /// Adjacent matches become one piece.
    Contiguous,
}

impl Behavior {
    /// The behaviour Hugging Face spells `name` (`isolated`, `Isolated`, `merged_with_previous`…).
    pub(crate) fn parse(name: &str) -> Option<Behavior> {
        Some(match name.to_ascii_lowercase().replace('_', "").as_str() {
            "isolated" => Behavior::Isolated,
            "removed" => Behavior::Removed,
            "mergedwithprevious" => Behavior::MergedWithPrevious,
            "mergedwithnext" => Behavior::MergedWithNext,
            "contiguous" => Behavior::Contiguous,
            _ => return None,
        })
    }
}

/// The alternative emulated by hand (see the module doc).
const LOOK_AHEAD_ALT: &str = r"\s+(?!\S)";

/// One split step: a pattern, what to do with its matches, and whether the roles of matches and
/// the text between them are swapped (`invert`).
#[derive(Clone, Debug)]
pub(crate) struct Split {
    re: Regex,
    /// Set when the pattern has the `\s+(?!\S)` alternative.
    look_ahead: Option<LookAhead>,
    behavior: Behavior,
    invert: bool,
}

#[derive(Clone, Debug)]
struct LookAhead {
    /// The alternatives before `\s+(?!\S)`, matched anchored; `None` when there are none.
    before: Option<meta::Regex>,
    /// The pattern ends with `|\s+` after the look-ahead alternative.
    trailing_ws: bool,
}

/// Splits `pattern` at its top-level `|`s.
fn top_level_alternatives(pattern: &str) -> Vec<&str> {
    let mut alts = Vec::new();
    let (mut depth, mut class, mut start) = (0usize, 0usize, 0usize);
    let mut chars = pattern.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '[' => class += 1,
            ']' if class > 0 => class -= 1,
            '(' if class == 0 => depth += 1,
            ')' if class == 0 => depth = depth.saturating_sub(1),
            '|' if class == 0 && depth == 0 => {
                alts.push(&pattern[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    alts.push(&pattern[start..]);
    alts
}

fn has_look_around(pattern: &str) -> bool {
    ["(?=", "(?!", "(?<=", "(?<!"]
        .iter()
        .any(|l| pattern.contains(l))
}

impl Split {
    /// A split on the regex `pattern` (Rust `regex` syntax, plus the `\s+(?!\S)` alternative).
    /// [`Error::Unsupported`] for a pattern qkv cannot match exactly.
    pub(crate) fn regex(pattern: &str, behavior: Behavior, invert: bool) -> Result<Split> {
        let unsupported = |why: &str| {
            Error::Unsupported(format!(
                "pre-tokenizer pattern `{}`: {why}",
                pattern.escape_debug()
            ))
        };
        let alts = top_level_alternatives(pattern);
        let mut look_ahead = None;
        let mut compiled = pattern.to_owned();
        if let Some(k) = alts.iter().position(|a| *a == LOOK_AHEAD_ALT) {
            let rest = &alts[k + 1..];
            let trailing_ws = match rest {
                [] => false,
                [r"\s+"] => true,
                _ => {
                    return Err(unsupported(
                        "alternatives after `\\s+(?!\\S)` other than `\\s+`",
                    ))
                }
            };
            let before = alts[..k].join("|");
            if has_look_around(&before) {
                return Err(unsupported("look-around other than `\\s+(?!\\S)`"));
            }
            let before = if k == 0 {
                None
            } else {
                Some(
                    meta::Regex::new(&before)
                        .map_err(|e| unsupported(&format!("the regex does not compile: {e}")))?,
                )
            };
            let mut replaced = alts.clone();
            replaced[k] = r"\s+";
            compiled = replaced.join("|");
            look_ahead = Some(LookAhead {
                before,
                trailing_ws,
            });
        } else if has_look_around(pattern) {
            return Err(unsupported("look-around other than `\\s+(?!\\S)`"));
        }
        let re = Regex::new(&compiled)
            .map_err(|e| unsupported(&format!("the regex does not compile: {e}")))?;
        Ok(Split {
            re,
            look_ahead,
            behavior,
            invert,
        })
    }

    /// A split on the literal text `s`.
    pub(crate) fn literal(s: &str, behavior: Behavior, invert: bool) -> Result<Split> {
        Split::regex(&regex::escape(s), behavior, invert)
    }

    /// The next match in `text` at or after `pos`, as the original pattern (with its
    /// look-ahead) would find it; empty matches are skipped.
    fn next_match(&self, text: &str, mut pos: usize) -> Option<(usize, usize)> {
        while pos <= text.len() {
            let m = self.re.find_at(text, pos)?;
            let (s, mut e) = (m.start(), m.end());
            let step = text[s..].chars().next().map_or(1, char::len_utf8);
            if s == e {
                pos = s + step;
                continue;
            }
            if let Some(la) = &self.look_ahead {
                let ws_only = m.as_str().chars().all(char::is_whitespace);
                let from_before = la.before.as_ref().is_some_and(|b| {
                    b.is_match(Input::new(text).range(s..).anchored(Anchored::Yes))
                });
                if ws_only && !from_before && e < text.len() {
                    // `\s+` took the whole run and a non-space follows.
                    let last = m.as_str().chars().next_back().map_or(0, char::len_utf8);
                    if e - s > last {
                        e -= last;
                    } else if !la.trailing_ws {
                        // A lone space before a non-space: `\s+(?!\S)` fails here.
                        pos = s + step;
                        continue;
                    }
                }
            }
            return Some((s, e));
        }
        None
    }

    /// Calls `f` on the pieces of `text`, in order; empty pieces are skipped.
    pub(crate) fn split<'t>(&self, text: &'t str, f: &mut dyn FnMut(&'t str)) {
        // (start, end, is_delimiter), in order, covering the text.
        let mut segs: Vec<(usize, usize, bool)> = Vec::new();
        let mut pos = 0;
        while let Some((s, e)) = self.next_match(text, pos) {
            if s > pos {
                segs.push((pos, s, self.invert));
            }
            segs.push((s, e, !self.invert));
            pos = e;
        }
        if pos < text.len() {
            segs.push((pos, text.len(), self.invert));
        }
        let mut pieces: Vec<(usize, usize)> = Vec::with_capacity(segs.len());
        let mut prev_delim = false;
        match self.behavior {
            Behavior::Isolated => pieces.extend(segs.iter().map(|&(s, e, _)| (s, e))),
            Behavior::Removed => pieces.extend(segs.iter().filter(|g| !g.2).map(|g| (g.0, g.1))),
            Behavior::MergedWithPrevious => {
                for &(s, e, delim) in &segs {
                    match pieces.last_mut() {
                        Some(last) if delim && !prev_delim => last.1 = e,
                        _ => pieces.push((s, e)),
                    }
                    prev_delim = delim;
                }
            }
            Behavior::MergedWithNext => {
                for &(s, e, delim) in segs.iter().rev() {
                    match pieces.last_mut() {
                        Some(last) if delim && !prev_delim => last.0 = s,
                        _ => pieces.push((s, e)),
                    }
                    prev_delim = delim;
                }
                pieces.reverse();
            }
            Behavior::Contiguous => {
                for (i, &(s, e, delim)) in segs.iter().enumerate() {
                    match pieces.last_mut() {
                        Some(last) if i > 0 && delim == prev_delim => last.1 = e,
                        _ => pieces.push((s, e)),
                    }
                    prev_delim = delim;
                }
            }
        }
        for (s, e) in pieces {
            if s < e {
                f(&text[s..e]);
            }
        }
    }
}

/// A sequence of splits; no splits leaves each text whole.
#[derive(Clone, Debug, Default)]
pub(crate) struct PreTokenizer {
    pub(crate) steps: Vec<Split>,
}

impl PreTokenizer {
    /// Calls `f` on each piece of `text`, in order; the pieces concatenate to `text` unless a
    /// step removes its matches. Empty pieces are skipped.
    pub(crate) fn split<'t>(&self, text: &'t str, f: &mut dyn FnMut(&'t str)) {
        self.run(0, text, f);
    }

    fn run<'t>(&self, step: usize, text: &'t str, f: &mut dyn FnMut(&'t str)) {
        match self.steps.get(step) {
            None if text.is_empty() => {}
            None => f(text),
            Some(split) => split.split(text, &mut |piece| self.run(step + 1, piece, f)),
        }
    }
}

/// GPT-2's pattern (Hugging Face's `ByteLevel` pre-tokenizer with `use_regex`).
pub(crate) const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's pattern.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pattern: Llama 3's with single digits.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5's pattern: Qwen2's with combining marks kept in words.
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's (o200k) pattern, also Llama 4's.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Mistral's Tekken pattern.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// CJK ranges the DeepSeek pre-tokenizers keep together. (Non-ASCII characters in patterns
/// are written as `\x{…}`, so that no editor's normalization can change them.)
const DEEPSEEK_CJK: &str = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+";

/// What a GGUF `tokenizer.ggml.pre` value means for a `gpt2` (byte-level BPE) vocabulary: its
/// splits (each isolating its matches) and whether a piece that is a token is taken whole.
pub(crate) struct GgufPre {
    /// Regexes applied in turn, each isolating its matches.
    pub patterns: Vec<&'static str>,
    /// A piece that is itself a token is not merged (`ignore_merges`).
    pub ignore_merges: bool,
    /// Whether BOS is added when the file does not say (`tokenizer.ggml.add_bos_token`).
    pub add_bos_default: bool,
}

/// The `tokenizer.ggml.pre` values qkv implements, grouped by meaning; [`gguf_pre`] maps a
/// value to its splits. The same groups as llama.cpp's, with Hugging Face's original patterns.
pub(crate) const GGUF_PRE_NAMES: &[&str] = &[
    "default",
    "gpt-2",
    "gpt2",
    "phi-2",
    "mpt",
    "olmo",
    "jais",
    "exaone4",
    "trillion",
    "granite-docling",
    "jina-es",
    "jina-de",
    "jina-v2-es",
    "jina-v2-de",
    "gigachat",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "starcoder",
    "refact",
    "command-r",
    "smollm",
    "codeshell",
    "exaone",
    "minerva-7b",
    "mellum2",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "dbrx",
    "smaug-bpe",
    "qwen2",
    "deepseek-r1-qwen",
    "stablelm2",
    "megrez",
    "hunyuan",
    "solar-open",
    "grok-2",
    "qwen35",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "hunyuan-dense",
    "falcon",
    "gpt-4o",
    "llama4",
    "tekken",
    "bloom",
    "poro-chat",
    "gpt3-finnish",
];

/// The splits of GGUF pre-tokenizer `pre` (see [`GGUF_PRE_NAMES`]), `None` when qkv does not
/// implement it.
pub(crate) fn gguf_pre(pre: &str) -> Option<GgufPre> {
    let (patterns, ignore_merges, add_bos_default): (Vec<&'static str>, bool, bool) = match pre {
        // No pre-tokenizer named: llama.cpp's default guess.
        "default" => (
            vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            false,
            false,
        ),
        "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" | "exaone4" | "trillion"
        | "granite-docling" | "jina-es" | "jina-de" | "jina-v2-es" | "jina-v2-de" | "gigachat"
        | "a.x-4.0" | "mellum" | "modern-bert" => (vec![GPT2], false, false),
        // Every digit alone, then GPT-2's pattern.
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => (vec![r"\p{N}", GPT2], false, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" => (vec![LLAMA3], true, true),
        "dbrx" | "smaug-bpe" => (vec![LLAMA3], false, false),
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" | "hunyuan" | "solar-open"
        | "grok-2" => (vec![QWEN2], false, false),
        "qwen35" => (vec![QWEN35], false, false),
        "deepseek-llm" => (
            vec![
                r"[\r\n]",
                r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
                r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
                r"\s+$",
                DEEPSEEK_CJK,
                r"\p{N}+",
            ],
            false,
            false,
        ),
        "deepseek-coder" => (
            vec![
                r"[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                DEEPSEEK_CJK,
                r"\p{N}",
            ],
            false,
            false,
        ),
        "deepseek-v3" | "hunyuan-dense" => (
            vec![
                r"\p{N}{1,3}",
                r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
                r"[!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            false,
            false,
        ),
        "falcon" => (
            vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
            false,
            false,
        ),
        "gpt-4o" | "llama4" => (vec![GPT4O], false, false),
        "tekken" => (vec![TEKKEN], true, true),
        "bloom" | "poro-chat" | "gpt3-finnish" => (
            vec![r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+"],
            false,
            false,
        ),
        _ => return None,
    };
    Some(GgufPre {
        patterns,
        ignore_merges,
        add_bos_default,
    })
}

/// Hugging Face's `BertPreTokenizer`: whitespace removed, then every punctuation character
/// (ASCII punctuation or Unicode `P*`) alone.
pub(crate) fn bert() -> Vec<Split> {
    vec![
        Split::regex(r"\s+", Behavior::Removed, false).expect("static pattern"),
        Split::regex(r"[\p{P}!-/:-@\[-`{-~]", Behavior::Isolated, false).expect("static pattern"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(steps: Vec<Split>, s: &str) -> Vec<String> {
        let p = PreTokenizer { steps };
        let mut v = Vec::new();
        p.split(s, &mut |w| v.push(w.to_string()));
        v
    }

    fn iso(p: &str) -> Split {
        Split::regex(p, Behavior::Isolated, false).unwrap()
    }

    #[test]
    fn gpt2_split() {
        assert_eq!(
            pieces(vec![iso(GPT2)], "Hello world's  end\n\nx  "),
            ["Hello", " world", "'s", " ", " end", "\n", "\n", "x", "  "]
        );
        assert_eq!(pieces(vec![iso(GPT2)], "a 123 ?!"), ["a", " 123", " ?!"]);
        assert_eq!(
            pieces(vec![iso(r"\p{N}"), iso(GPT2)], "a 123 ?!"),
            ["a", " ", "1", "2", "3", " ?!"]
        );
        // Without the trailing `\s+`, a lone space before a word is text between matches.
        let no_tail = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
        assert_eq!(
            pieces(vec![iso(no_tail)], "a  b\t\t c   \n\nd  "),
            ["a", " ", " b", "\t\t", " c", "   \n", "\n", "d", "  "]
        );
    }

    #[test]
    fn newline_runs_are_not_trimmed() {
        // `\s*[\r\n]+` matches before the look-ahead alternative and keeps its whole match.
        assert_eq!(
            pieces(vec![iso(LLAMA3)], "a\n\nb  \n c"),
            ["a", "\n\n", "b", "  \n", " c"]
        );
    }

    #[test]
    fn behaviors() {
        let split = |p: &str, b: &str, inv: bool, s: &str| {
            pieces(
                vec![Split::regex(p, Behavior::parse(b).unwrap(), inv).unwrap()],
                s,
            )
        };
        assert_eq!(
            split(r"\s+", "merged_with_previous", false, "a  b c "),
            ["a  ", "b ", "c "]
        );
        assert_eq!(
            split(r"\s", "merged_with_next", false, " a  b c "),
            [" a", " ", " b", " c", " "]
        );
        assert_eq!(
            split(r"\s", "contiguous", false, " a  b c "),
            [" ", "a", "  ", "b", " ", "c", " "]
        );
        assert_eq!(split(r"\w+", "removed", true, " a,  b c "), ["a", "b", "c"]);
    }

    #[test]
    fn other_look_arounds_are_refused() {
        for p in [r"\d(?=\d)", r"(?<!a)b", r"\s+(?!\S)|x"] {
            assert!(matches!(
                Split::regex(p, Behavior::Isolated, false),
                Err(Error::Unsupported(_))
            ));
        }
    }

    #[test]
    fn every_named_pre_tokenizer_compiles() {
        for name in GGUF_PRE_NAMES {
            for p in gguf_pre(name).unwrap().patterns {
                iso(p);
            }
        }
        assert!(gguf_pre("kimi-k2").is_none());
    }
}
