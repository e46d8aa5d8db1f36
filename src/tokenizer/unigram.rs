//! Unigram (SentencePiece's other model; GGUF `t5`, as T5, mT5, XLM-R-based models such as
//! Nomic's embedders store it): every token has a log-probability, and a text is cut into the
//! sequence of tokens whose scores add up highest (Viterbi over the text's characters).
//!
//! Before that, the text is normalized as SentencePiece does: the model's precompiled
//! character map ([`CharsMap`], usually NFKC plus a few replacements) rewrites the longest
//! prefix it knows at each point, spaces become `▁`, and with `remove_extra_whitespaces` runs of
//! spaces collapse to one, with none at the ends but one before every word. llama.cpp's UGM
//! tokenizer does exactly this, and qkv matches it token for token.
//!
//! A character no token spells is the unknown token, scored 10 below the lowest score of any
//! normal token; adjacent unknown characters become one unknown token. User-defined tokens
//! score 0 (above every normal token) and are never rewritten by the normalizer.

use std::collections::HashMap;

/// No node / no token.
const NONE: u32 = u32::MAX;

/// A byte trie over token texts, stored flat: the children of a node are a sorted run of
/// `edges`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Trie {
    /// Per node: the token spelt by the path to it (or [`NONE`]), and its children's range in
    /// `edges`.
    nodes: Vec<(u32, u32, u32)>,
    /// (byte, child node), sorted by byte within each node's run.
    edges: Vec<(u8, u32)>,
}

impl Trie {
    /// Builds the trie of `(text, id)`; of equal texts the last one wins.
    pub(crate) fn new(mut entries: Vec<(&[u8], u32)>) -> Trie {
        entries.sort_by(|a, b| a.0.cmp(b.0));
        let mut trie = Trie::default();
        // Breadth-first over ranges of `entries` sharing a prefix of length `depth`.
        let mut queue = std::collections::VecDeque::new();
        trie.nodes.push((NONE, 0, 0));
        queue.push_back((0usize, entries.len(), 0usize, 0u32));
        while let Some((lo, hi, depth, node)) = queue.pop_front() {
            let mut i = lo;
            let mut value = NONE;
            while i < hi && entries[i].0.len() == depth {
                value = entries[i].1;
                i += 1;
            }
            let first_edge = trie.edges.len() as u32;
            while i < hi {
                let b = entries[i].0[depth];
                let mut j = i;
                while j < hi && entries[j].0[depth] == b {
                    j += 1;
                }
                let child = trie.nodes.len() as u32;
                trie.nodes.push((NONE, 0, 0));
                trie.edges.push((b, child));
                queue.push_back((i, j, depth + 1, child));
                i = j;
            }
            trie.nodes[node as usize] = (value, first_edge, trie.edges.len() as u32);
        }
        trie
    }

    /// The child of `node` along byte `b`.
    fn child(&self, node: u32, b: u8) -> Option<u32> {
        let (_, lo, hi) = self.nodes[node as usize];
        let run = &self.edges[lo as usize..hi as usize];
        run.binary_search_by_key(&b, |e| e.0).ok().map(|k| run[k].1)
    }

    /// Calls `f(len, id)` for every token that is a prefix of `text`, shortest first.
    fn prefixes(&self, text: &[u8], mut f: impl FnMut(usize, u32)) {
        let mut node = 0;
        for (i, &b) in text.iter().enumerate() {
            match self.child(node, b) {
                Some(c) => node = c,
                None => return,
            }
            let value = self.nodes[node as usize].0;
            if value != NONE {
                f(i + 1, value);
            }
        }
    }

    /// The length of the longest token that is a prefix of `text` (0 for none).
    fn longest_prefix(&self, text: &[u8]) -> usize {
        let mut longest = 0;
        self.prefixes(text, |len, _| longest = len);
        longest
    }
}

/// SentencePiece's precompiled character map: a double-array trie (darts-clone's layout) over
/// UTF-8 byte strings, each leaf pointing at a NUL-terminated replacement in a string pool.
#[derive(Clone, Debug)]
pub(crate) struct CharsMap {
    units: Vec<u32>,
    pool: Vec<u8>,
}

impl CharsMap {
    /// Reads the blob stored in `tokenizer.ggml.precompiled_charsmap`: a little-endian `u32`
    /// byte count of the trie, the trie's `u32` units, then the replacement strings.
    pub(crate) fn parse(blob: &[u8]) -> Result<CharsMap, String> {
        let head: [u8; 4] = blob
            .get(..4)
            .and_then(|h| h.try_into().ok())
            .ok_or("shorter than its 4-byte header")?;
        let n = u32::from_le_bytes(head) as usize;
        if !n.is_multiple_of(4) || n == 0 || 4 + n > blob.len() {
            return Err(format!(
                "its trie of {n} bytes does not fit its {} bytes",
                blob.len()
            ));
        }
        let units = blob[4..4 + n]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(CharsMap {
            units,
            pool: blob[4 + n..].to_vec(),
        })
    }

    fn unit(&self, i: u32) -> Option<u32> {
        self.units.get(i as usize).copied()
    }

    /// The offset a unit points at (its children, or for a leaf's value unit, the value).
    fn offset(u: u32) -> u32 {
        (u >> 10) << ((u & (1 << 9)) >> 6)
    }

    /// The longest prefix of `text` the map rewrites: its length and its replacement. `None`
    /// when no prefix matches (or the map is malformed there).
    fn longest(&self, text: &[u8]) -> Option<(usize, &[u8])> {
        let mut node = Self::offset(self.unit(0)?);
        let mut best = None;
        for (i, &c) in text.iter().enumerate() {
            if c == 0 {
                break;
            }
            node ^= u32::from(c);
            let u = self.unit(node)?;
            // The label check: the unit must be a child along `c`.
            if u & ((1 << 31) | 0xFF) != u32::from(c) {
                break;
            }
            let leaf = (u >> 8) & 1 == 1;
            node ^= Self::offset(u);
            if leaf {
                let value = self.unit(node)? & 0x7FFF_FFFF;
                best = Some((i + 1, value as usize));
            }
        }
        let (len, at) = best?;
        let rest = self.pool.get(at..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        Some((len, &rest[..end]))
    }
}

/// A Unigram model with its normalizer settings.
#[derive(Clone, Debug)]
pub(crate) struct Unigram {
    /// Normal, user-defined and unused tokens.
    pub trie: Trie,
    /// User-defined tokens, which the normalizer leaves alone.
    pub user_trie: Trie,
    pub scores: Vec<f32>,
    pub user_defined: Vec<bool>,
    pub unk: u32,
    /// The score of an unknown character.
    pub unk_score: f64,
    pub charsmap: Option<CharsMap>,
    /// `▁` before the text (or after it, with `whitespace_as_suffix`).
    pub add_space_prefix: bool,
    pub remove_extra_whitespaces: bool,
    /// Spaces become `▁` (else stay spaces).
    pub escape_whitespaces: bool,
    pub whitespace_as_suffix: bool,
}

/// Reusable buffers of [`Unigram::encode`].
#[derive(Default)]
pub(crate) struct Scratch {
    normalized: Vec<u8>,
    /// Per byte position: the best (score, token, start) ending there.
    best: Vec<(f64, u32, u32)>,
    ids: Vec<u32>,
}

impl Unigram {
    /// Builds the model; `kinds` say which tokens are normal, user-defined or unused.
    pub(crate) fn new(
        tokens: &[String],
        scores: Vec<f32>,
        normal: &[bool],
        user_defined: Vec<bool>,
        unused: &[bool],
        unk: u32,
    ) -> Unigram {
        let mut entries = Vec::new();
        let mut user = Vec::new();
        let mut min_score = f32::MAX;
        for (i, t) in tokens.iter().enumerate() {
            if normal[i] {
                min_score = min_score.min(scores[i]);
            }
            if normal[i] || user_defined[i] || unused[i] {
                entries.push((t.as_bytes(), i as u32));
            }
            if user_defined[i] {
                user.push((t.as_bytes(), i as u32));
            }
        }
        Unigram {
            trie: Trie::new(entries),
            user_trie: Trie::new(user),
            scores,
            user_defined,
            unk,
            unk_score: f64::from(min_score) - 10.0,
            charsmap: None,
            add_space_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
            whitespace_as_suffix: false,
        }
    }

    /// The next piece of `text` after normalization, and how many input bytes it consumes.
    fn normalize_prefix<'a>(&'a self, text: &'a [u8]) -> (&'a [u8], usize) {
        let user = self.user_trie.longest_prefix(text);
        if user > 0 {
            return (&text[..user], user);
        }
        if let Some((len, repl)) = self.charsmap.as_ref().and_then(|m| m.longest(text)) {
            return (repl, len);
        }
        // `text` is valid UTF-8: one whole character.
        let n = utf8_len(text[0]).min(text.len());
        (&text[..n], n)
    }

    fn normalize(&self, text: &str, out: &mut Vec<u8>) {
        out.clear();
        let space: &[u8] = if self.escape_whitespaces {
            "\u{2581}".as_bytes()
        } else {
            b" "
        };
        let prefix = !self.whitespace_as_suffix && self.add_space_prefix;
        let suffix = self.whitespace_as_suffix && self.add_space_prefix;
        let merge = self.remove_extra_whitespaces;
        let mut prefixed = false;
        let mut in_word = false;
        let bytes = text.as_bytes();
        let mut pos = 0;
        while pos < bytes.len() {
            let (piece, used) = self.normalize_prefix(&bytes[pos..]);
            for &c in piece {
                if c != b' ' {
                    if !in_word {
                        in_word = true;
                        if (prefix && !prefixed) || merge {
                            out.extend_from_slice(space);
                            prefixed = true;
                        }
                    }
                    out.push(c);
                } else {
                    in_word = false;
                    if !merge {
                        out.extend_from_slice(space);
                    }
                }
            }
            pos += used.max(1);
        }
        if suffix {
            out.extend_from_slice(space);
        }
    }

    /// Appends the tokens of `text` (a run of text between special tokens) to `out`.
    pub(crate) fn encode(&self, text: &str, s: &mut Scratch, out: &mut Vec<u32>) {
        let mut normalized = std::mem::take(&mut s.normalized);
        self.normalize(text, &mut normalized);
        let n = normalized.len();
        if n == 0 {
            s.normalized = normalized;
            return;
        }
        s.best.clear();
        s.best.resize(n + 1, (f64::MIN, self.unk, 0));
        s.best[0] = (0.0, self.unk, 0);
        let mut start = 0;
        while start < n {
            let char_len = utf8_len(normalized[start]).min(n - start);
            let base = s.best[start].0;
            let mut whole_char = false;
            let best = &mut s.best;
            self.trie.prefixes(&normalized[start..], |len, id| {
                if len == char_len {
                    whole_char = true;
                }
                let score = if self.user_defined[id as usize] {
                    0.0
                } else {
                    f64::from(self.scores[id as usize])
                };
                let slot = &mut best[start + len];
                if base + score > slot.0 {
                    *slot = (base + score, id, start as u32);
                }
            });
            if !whole_char {
                let slot = &mut s.best[start + char_len];
                if base + self.unk_score > slot.0 {
                    *slot = (base + self.unk_score, self.unk, start as u32);
                }
            }
            start += char_len;
        }
        // Back from the end; a run of unknown characters is one unknown token.
        s.ids.clear();
        let mut at = n;
        let mut prev_unk = false;
        loop {
            let (_, id, from) = s.best[at];
            let unk = id == self.unk;
            if !(prev_unk && unk) {
                s.ids.push(id);
            }
            prev_unk = unk;
            if from == 0 {
                break;
            }
            at = from as usize;
        }
        out.extend(s.ids.iter().rev());
        s.normalized = normalized;
    }

    /// The token ids of the text, by token (for `token_id`): the trie's exact match.
    pub(crate) fn lookup(&self, vocab: &HashMap<String, u32>, text: &str) -> Option<u32> {
        let spelt = if self.escape_whitespaces {
            text.replace(' ', "\u{2581}")
        } else {
            text.to_owned()
        };
        vocab.get(&spelt).copied()
    }
}

/// The length of the UTF-8 sequence a lead byte starts (1 for a stray continuation byte).
fn utf8_len(b: u8) -> usize {
    match b {
        0xF0..=0xFF => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(tokens: &[(&str, f32)]) -> Unigram {
        let toks: Vec<String> = tokens.iter().map(|t| t.0.to_string()).collect();
        let scores = tokens.iter().map(|t| t.1).collect();
        let n = toks.len();
        let mut normal = vec![true; n];
        normal[0] = false; // <unk>
        Unigram::new(&toks, scores, &normal, vec![false; n], &vec![false; n], 0)
    }

    #[test]
    fn best_total_score_wins() {
        // "▁ab": ▁a + b = -1 - 1.5 = -2.5 beats ▁ + ab = -2 - 1 = -3 and the single ▁ab at -4.
        let m = model(&[
            ("<unk>", 0.0),
            ("\u{2581}", -2.0),
            ("a", -3.0),
            ("b", -1.5),
            ("\u{2581}a", -1.0),
            ("ab", -1.0),
            ("\u{2581}ab", -4.0),
        ]);
        let mut out = Vec::new();
        m.encode("ab", &mut Scratch::default(), &mut out);
        assert_eq!(out, [4, 3]);
        // Extra spaces collapse; unknown characters in a row are one unknown token.
        out.clear();
        m.encode("  ab   xy  b", &mut Scratch::default(), &mut out);
        assert_eq!(out, [4, 3, 1, 0, 1, 3]);
    }

    #[test]
    fn trie_prefixes() {
        let t = Trie::new(vec![(b"a", 1), (b"abc", 2), (b"b", 3), (b"ab", 4)]);
        let mut got = Vec::new();
        t.prefixes(b"abcd", |len, id| got.push((len, id)));
        assert_eq!(got, [(1, 1), (2, 4), (3, 2)]);
        assert_eq!(t.longest_prefix(b"x"), 0);
    }

    #[test]
    fn malformed_charsmaps_are_refused() {
        assert!(CharsMap::parse(&[1, 2]).is_err());
        assert!(CharsMap::parse(&[8, 0, 0, 0, 1, 2, 3]).is_err());
    }
}
