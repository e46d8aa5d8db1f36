//! BPE with a merge list (GGUF `gpt2` and `gemma4`, Hugging Face `BPE`): the GPT-2 byte ↔
//! character map, the rank-ordered merge loop, and what becomes of characters the vocabulary
//! has no token for.

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

/// Merge table: pair of token ids → (rank, merged token id).
pub(crate) type Merges = HashMap<(u32, u32), (u32, u32)>;

/// No symbol: the end of a merge loop's linked list.
pub(crate) const NONE: u32 = u32::MAX;

/// Reusable buffers for [`bpe_word`] and [`Bpe::encode_piece`].
#[derive(Default)]
pub(crate) struct Scratch {
    run: Vec<u32>,
    spelt: String,
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
    link(&mut s.prev, &mut s.next, n);
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

/// What a symbol without a token becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unknown {
    /// Nothing (byte-level vocabularies missing a byte, as llama.cpp and Hugging Face without
    /// an unknown token).
    Drop,
    /// Its UTF-8 bytes as byte tokens `<0xXX>`.
    ByteFallback,
    /// The unknown token; `fuse` makes a run of them one.
    Unk { id: u32, fuse: bool },
}

/// When a piece that is itself a token skips the merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WholePiece {
    Never,
    /// Always (Hugging Face's `ignore_merges`, Llama 3).
    Always,
    /// Only a run of newlines (Gemma 4 in llama.cpp).
    NewlineRuns,
}

/// A BPE model.
#[derive(Clone, Debug)]
pub(crate) struct Bpe {
    pub merges: Merges,
    /// Symbols are bytes spelt with GPT-2's byte characters; otherwise UTF-8 characters.
    pub byte_level: bool,
    pub unknown: Unknown,
    pub whole: WholePiece,
    /// Byte-level: the token of each byte's character. Byte fallback: the `<0xXX>` tokens.
    /// [`NO_TOKEN`] where there is none.
    pub byte_ids: [u32; 256],
}

/// Marks a byte without a token in [`Bpe::byte_ids`].
pub(crate) const NO_TOKEN: u32 = u32::MAX;

impl Bpe {
    /// Appends the tokens of one pre-tokenized piece to `out`.
    pub(crate) fn encode_piece(
        &self,
        piece: &str,
        vocab: &HashMap<String, u32>,
        s: &mut Scratch,
        out: &mut Vec<u32>,
    ) {
        let whole = match self.whole {
            WholePiece::Never => false,
            WholePiece::Always => true,
            WholePiece::NewlineRuns => piece.bytes().all(|b| b == b'\n'),
        };
        if whole {
            let found = if self.byte_level {
                let chars = byte_to_char();
                s.spelt.clear();
                s.spelt.extend(piece.bytes().map(|b| chars[b as usize]));
                vocab.get(s.spelt.as_str())
            } else {
                vocab.get(piece)
            };
            if let Some(&id) = found {
                out.push(id);
                return;
            }
        }
        // Known symbols gather in `run`; an unknown one cannot merge with anything, so it ends
        // the run, which is merged on its own.
        let mut run = std::mem::take(&mut s.run);
        run.clear();
        let mut last_unk = false;
        if self.byte_level {
            for b in piece.bytes() {
                match self.byte_ids[b as usize] {
                    NO_TOKEN => self.unknown(&[b], &mut run, &mut last_unk, s, out),
                    id => {
                        run.push(id);
                        last_unk = false;
                    }
                }
            }
        } else {
            for (i, c) in piece.char_indices() {
                let ch = &piece[i..i + c.len_utf8()];
                match vocab.get(ch) {
                    Some(&id) => {
                        run.push(id);
                        last_unk = false;
                    }
                    None => self.unknown(ch.as_bytes(), &mut run, &mut last_unk, s, out),
                }
            }
        }
        bpe_word(&run, &self.merges, s, out);
        s.run = run;
    }

    /// Merges and flushes `run`, then appends what the unknown symbol `bytes` becomes.
    fn unknown(
        &self,
        bytes: &[u8],
        run: &mut Vec<u32>,
        last_unk: &mut bool,
        s: &mut Scratch,
        out: &mut Vec<u32>,
    ) {
        bpe_word(run, &self.merges, s, out);
        run.clear();
        match self.unknown {
            Unknown::Drop => {}
            Unknown::ByteFallback => out.extend(
                bytes
                    .iter()
                    .map(|&b| self.byte_ids[b as usize])
                    .filter(|&id| id != NO_TOKEN),
            ),
            Unknown::Unk { id, fuse } => {
                if !(fuse && *last_unk) {
                    out.push(id);
                }
                *last_unk = true;
            }
        }
    }
}

/// Links `n ≥ 1` symbols into a list: `prev[i] = i − 1`, `next[i] = i + 1`, the ends
/// [`NONE`]. Both BPE merge loops (byte-level here, SentencePiece's) walk it.
pub(crate) fn link(prev: &mut Vec<u32>, next: &mut Vec<u32>, n: usize) {
    prev.clear();
    prev.extend((0..n as u32).map(|i| i.wrapping_sub(1)));
    prev[0] = NONE;
    next.clear();
    next.extend(1..=n as u32);
    next[n - 1] = NONE;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let m = byte_to_char();
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[b'a' as usize], 'a');
        assert_eq!(char_to_byte().len(), 256);
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
