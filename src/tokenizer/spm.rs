//! SentencePiece BPE as GGUF `llama` vocabularies store it (Llama 2, Mistral, Phi-3, Gemma):
//! no merge list, a score per token. Starting from single characters, the adjacent pair whose
//! concatenation is a token with the highest score (the leftmost among equals) is merged, until
//! no pair forms a token. A character left without a token is spelt with byte tokens
//! (`<0x41>`).

use super::bpe::{link, NONE};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// A candidate merge of the symbols starting at `left` and `right`.
#[derive(Clone, Copy, Debug)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    /// Bytes of the pair when it was found: stale once either side has grown.
    len: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Higher score first, then the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

/// Reusable buffers for [`encode`].
#[derive(Default)]
pub(crate) struct Scratch {
    /// Per symbol: byte start and length in the text (length 0 once merged into its left).
    start: Vec<u32>,
    len: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    heap: BinaryHeap<Bigram>,
}

/// What [`encode`] needs of the vocabulary.
pub(crate) struct Spm<'v> {
    pub vocab: &'v HashMap<String, u32>,
    pub scores: &'v [f32],
    /// The token of each byte, for characters without a token of their own.
    pub byte_ids: &'v [u32; 256],
}

impl Spm<'_> {
    fn push_pair(&self, text: &str, s: &mut Scratch, left: u32, right: u32) {
        if left == NONE || right == NONE {
            return;
        }
        let (l, r) = (left as usize, right as usize);
        let start = s.start[l] as usize;
        let end = (s.start[r] + s.len[r]) as usize;
        if let Some(&id) = self.vocab.get(&text[start..end]) {
            s.heap.push(Bigram {
                score: self.scores[id as usize],
                left,
                right,
                len: (end - start) as u32,
            });
        }
    }

    /// Appends the tokens of `text` (already normalized: spaces are `▁`) to `out`.
    pub(crate) fn encode(&self, text: &str, s: &mut Scratch, out: &mut Vec<u32>) {
        s.start.clear();
        s.len.clear();
        for (i, c) in text.char_indices() {
            s.start.push(i as u32);
            s.len.push(c.len_utf8() as u32);
        }
        let n = s.start.len();
        if n == 0 {
            return;
        }
        link(&mut s.prev, &mut s.next, n);
        s.heap.clear();
        for i in 1..n as u32 {
            self.push_pair(text, s, i - 1, i);
        }
        while let Some(b) = s.heap.pop() {
            let (l, r) = (b.left as usize, b.right as usize);
            // Stale: a side was merged away, or grew (then the length no longer adds up).
            if s.len[l] == 0 || s.len[r] == 0 || s.len[l] + s.len[r] != b.len {
                continue;
            }
            s.len[l] += s.len[r];
            s.len[r] = 0;
            let after = s.next[r];
            s.next[l] = after;
            if after != NONE {
                s.prev[after as usize] = b.left;
            }
            self.push_pair(text, s, s.prev[l], b.left);
            self.push_pair(text, s, b.left, after);
        }
        let mut i = 0u32;
        while i != NONE {
            let (start, len) = (s.start[i as usize] as usize, s.len[i as usize] as usize);
            let piece = &text[start..start + len];
            match self.vocab.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(piece.bytes().map(|b| self.byte_ids[b as usize])),
            }
            i = s.next[i as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn highest_score_first_then_bytes() {
        // "▁ab" with ▁a (score -1) and ab (score -2): ▁a wins, b stays alone.
        let toks = ["▁", "a", "b", "▁a", "ab", "<0x63>"];
        let vocab: HashMap<String, u32> = toks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let scores = [0.0, 0.0, 0.0, -1.0, -2.0, 0.0];
        let mut byte_ids = [0u32; 256];
        byte_ids[b'c' as usize] = 5;
        let spm = Spm {
            vocab: &vocab,
            scores: &scores,
            byte_ids: &byte_ids,
        };
        let mut out = Vec::new();
        spm.encode("▁abc", &mut Scratch::default(), &mut out);
        assert_eq!(out, [3, 2, 5]);
        // With the scores swapped, `ab` is merged first.
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, 0.0];
        let spm = Spm {
            scores: &scores,
            ..spm
        };
        out.clear();
        spm.encode("▁ab", &mut Scratch::default(), &mut out);
        assert_eq!(out, [0, 4]);
    }
}
