//! The pieces of byte-level BPE: the GPT-2 byte ↔ character map, the pre-tokenizer split and
//! the rank-ordered merge loop.

use regex::Regex;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's reversible map from bytes to printable characters: the printable Latin-1 bytes
/// (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) stand for themselves; the other 68 bytes take the
/// characters U+0100, U+0101, … in byte order (so a space becomes `Ġ`, a newline `Ċ`).
pub(crate) fn byte_to_char() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in map.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(code).expect("codes below 0x200 are chars");
    }
    map
}

/// The inverse of [`byte_to_char`].
pub(crate) fn char_to_byte() -> HashMap<char, u8> {
    byte_to_char()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// GPT-2's split pattern without its `\s+(?!\S)` alternative (the `regex` crate has no
/// look-ahead); [`PreTokenizer::split`] restores that alternative's effect by hand.
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

/// Splits text into the words BPE runs on: optionally every numeric character alone
/// (Hugging Face's `Digits(individual_digits=true)`), then GPT-2's regex
/// (`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`).
#[derive(Clone, Debug)]
pub(crate) struct PreTokenizer {
    pattern: Regex,
    /// Isolate every `\p{N}` character before the regex split.
    pub(crate) split_digits: bool,
}

impl PreTokenizer {
    pub(crate) fn new(split_digits: bool) -> PreTokenizer {
        PreTokenizer {
            pattern: Regex::new(GPT2_PATTERN).expect("the GPT-2 pattern compiles"),
            split_digits,
        }
    }

    /// Calls `f` on each word of `text`, in order; the words concatenate to `text`.
    pub(crate) fn split<'t>(&self, text: &'t str, mut f: impl FnMut(&'t str)) {
        if !self.split_digits {
            return self.split_regex(text, &mut f);
        }
        let mut start = 0;
        for (i, c) in text.char_indices() {
            if c.is_numeric() {
                self.split_regex(&text[start..i], &mut f);
                let end = i + c.len_utf8();
                f(&text[i..end]);
                start = end;
            }
        }
        self.split_regex(&text[start..], &mut f);
    }

    fn split_regex<'t>(&self, text: &'t str, f: &mut impl FnMut(&'t str)) {
        let mut pos = 0;
        while pos < text.len() {
            let Some(m) = self.pattern.find_at(text, pos) else {
                f(&text[pos..]);
                return;
            };
            if m.start() > pos {
                // Every character matches some alternative, so this does not happen; keep the
                // text anyway rather than lose it.
                f(&text[pos..m.start()]);
            }
            let mut end = m.end();
            let s = m.as_str();
            if end < text.len() && s.chars().all(char::is_whitespace) {
                // `\s+(?!\S)`: a whitespace run followed by a non-space gives up its last
                // character (which then starts the next word) when it has more than one.
                if let Some((last, _)) = s.char_indices().last() {
                    if last > 0 {
                        end = m.start() + last;
                    }
                }
            }
            f(&text[m.start()..end]);
            pos = end;
        }
    }
}

/// Merge table: pair of token ids → (rank, merged token id).
pub(crate) type Merges = HashMap<(u32, u32), (u32, u32)>;

const NONE: u32 = u32::MAX;

/// Reusable buffers for [`bpe_word`].
#[derive(Default)]
pub(crate) struct Scratch {
    ids: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    heap: BinaryHeap<Reverse<(u32, u32)>>,
}

/// Runs BPE on one word given as the ids of its bytes: repeatedly merges the adjacent pair of
/// lowest rank (the leftmost among equals) until no pair has a merge, and appends the
/// resulting ids to `out`. O(n log n) in the word's length.
pub(crate) fn bpe_word(byte_ids: &[u32], merges: &Merges, s: &mut Scratch, out: &mut Vec<u32>) {
    let n = byte_ids.len();
    if n <= 1 {
        out.extend_from_slice(byte_ids);
        return;
    }
    s.ids.clear();
    s.ids.extend_from_slice(byte_ids);
    s.prev.clear();
    s.prev.extend((0..n as u32).map(|i| i.wrapping_sub(1)));
    s.prev[0] = NONE;
    s.next.clear();
    s.next.extend(1..=n as u32);
    s.next[n - 1] = NONE;
    s.heap.clear();
    for i in 0..n - 1 {
        if let Some(&(rank, _)) = merges.get(&(s.ids[i], s.ids[i + 1])) {
            s.heap.push(Reverse((rank, i as u32)));
        }
    }
    while let Some(Reverse((rank, left))) = s.heap.pop() {
        let l = left as usize;
        if s.ids[l] == NONE {
            continue;
        }
        let right = s.next[l];
        if right == NONE {
            continue;
        }
        let r = right as usize;
        let merged = match merges.get(&(s.ids[l], s.ids[r])) {
            Some(&(rk, merged)) if rk == rank => merged,
            _ => continue, // stale entry: one side changed since it was pushed
        };
        s.ids[l] = merged;
        s.ids[r] = NONE;
        let after = s.next[r];
        s.next[l] = after;
        if after != NONE {
            s.prev[after as usize] = left;
        }
        let before = s.prev[l];
        if before != NONE {
            if let Some(&(rk, _)) = merges.get(&(s.ids[before as usize], merged)) {
                s.heap.push(Reverse((rk, before)));
            }
        }
        if after != NONE {
            if let Some(&(rk, _)) = merges.get(&(merged, s.ids[after as usize])) {
                s.heap.push(Reverse((rk, left)));
            }
        }
    }
    let mut i = 0u32;
    while i != NONE {
        out.push(s.ids[i as usize]);
        i = s.next[i as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(p: &PreTokenizer, s: &str) -> Vec<String> {
        let mut v = Vec::new();
        p.split(s, |w| v.push(w.to_string()));
        v
    }

    #[test]
    fn byte_map_is_a_bijection() {
        let m = byte_to_char();
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[b'a' as usize], 'a');
        assert_eq!(char_to_byte().len(), 256);
    }

    #[test]
    fn gpt2_split() {
        let p = PreTokenizer::new(false);
        assert_eq!(
            words(&p, "Hello world's  end\n\nx  "),
            ["Hello", " world", "'s", " ", " end", "\n", "\n", "x", "  "]
        );
        assert_eq!(words(&p, "a 123 ?!"), ["a", " 123", " ?!"]);
        let p = PreTokenizer::new(true);
        assert_eq!(words(&p, "a 123 ?!"), ["a", " ", "1", "2", "3", " ?!"]);
    }

    #[test]
    fn merges_lowest_rank_first() {
        // ids: a=0 b=1 c=2 ab=3 bc=4 abc=5
        let mut m = Merges::new();
        m.insert((1, 2), (0, 4)); // b c first
        m.insert((0, 1), (1, 3));
        m.insert((0, 4), (2, 5));
        let mut out = Vec::new();
        bpe_word(&[0, 1, 2], &m, &mut Scratch::default(), &mut out);
        assert_eq!(out, [5]);
        out.clear();
        bpe_word(&[0, 1, 0, 1], &m, &mut Scratch::default(), &mut out);
        assert_eq!(out, [3, 3]);
    }
}
