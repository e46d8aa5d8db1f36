//! A cross-encoder: BERT with a sequence-classification head (Hugging Face
//! `BertForSequenceClassification`, as the bge-reranker and ms-marco cross-encoders), which
//! reads a query and a document together and scores how well they match.
//!
//! The pair is read as `[CLS] query [SEP] document [SEP]`, the query's tokens in segment 0 and
//! the document's in segment 1; the `[CLS]` row of the last hidden states goes through the
//! pooler (`tanh(W·h + b)`) and the classifier (`W·p + b`), whose outputs are the logits.
//! A one-label head's logit is the score (sentence-transformers' `CrossEncoder.predict`
//! then applies a sigmoid).

use super::{Bert, BertConfig, BertWorkspace};
use crate::error::{Error, Result};
use crate::tokenizer::{EncodeOptions, Tokenizer};
use crate::weights::safetensors::SafeTensorsFile;
use crate::weights::{Scope, TensorSource};
use serde_json::Value;
use std::path::Path;
use std::sync::Mutex;

/// A dense layer of the head: `[out, in]` weights and `[out]` biases, in f32.
#[derive(Debug)]
struct Dense {
    weight: Vec<f32>,
    bias: Vec<f32>,
    inputs: usize,
}

impl Dense {
    fn load(scope: &Scope<'_>, inputs: usize, outputs: usize) -> Result<Dense> {
        Ok(Dense {
            weight: scope
                .tensor_shaped("weight", &[outputs, inputs])?
                .to_f32_vec()?,
            bias: scope.tensor_shaped("bias", &[outputs])?.to_f32_vec()?,
            inputs,
        })
    }

    fn apply(&self, x: &[f32]) -> Vec<f32> {
        self.weight
            .chunks_exact(self.inputs)
            .zip(&self.bias)
            .map(|(row, b)| row.iter().zip(x).map(|(w, v)| w * v).sum::<f32>() + b)
            .collect()
    }
}

/// A BERT cross-encoder with its tokenizer; see the module's documentation.
#[derive(Debug)]
pub struct CrossEncoder {
    bert: Bert,
    pooler: Dense,
    classifier: Dense,
    tokenizer: Tokenizer,
    workspace: Mutex<BertWorkspace>,
}

/// The number of labels a `config.json` names (`id2label`, else `num_labels`, else 2, as
/// transformers reads it).
fn labels(config: &Value) -> usize {
    match (config.get("id2label"), config.get("num_labels")) {
        (Some(Value::Object(m)), _) if !m.is_empty() => m.len(),
        (_, Some(n)) => n.as_u64().map_or(2, |n| n as usize),
        _ => 2,
    }
}

impl CrossEncoder {
    /// Whether `dir` holds a BERT sequence classifier (`config.json`'s `architectures`).
    pub fn is_cross_encoder(dir: &Path) -> bool {
        std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|c| c.get("architectures").cloned())
            .and_then(|a| a.get(0).and_then(Value::as_str).map(str::to_owned))
            .is_some_and(|a| a == "BertForSequenceClassification")
    }

    /// Loads `dir/config.json`, `dir/model.safetensors` and `dir/tokenizer.json`.
    ///
    /// Errors: those of [`Bert::load`] and of the tokenizer; [`Error::InFile`] around a
    /// missing or misshapen head tensor (`bert.pooler.dense`, `classifier`).
    pub fn load(dir: &Path) -> Result<CrossEncoder> {
        let path = dir.join("config.json");
        let cfg = BertConfig::from_json_file(&path)?;
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Io {
            path: path.clone(),
            source: e,
        })?;
        let raw: Value = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let n = labels(&raw);
        let weights = dir.join("model.safetensors");
        let file = SafeTensorsFile::open(&weights)?;
        let in_file = |e: Error| Error::InFile {
            path: weights.clone(),
            source: Box::new(e),
        };
        let d = cfg.hidden_size;
        let bert = Bert::from_source(&file, cfg).map_err(in_file)?;
        let root = Scope::new(&file as &dyn TensorSource);
        let pooler =
            Dense::load(&root.pp("bert").pp("pooler").pp("dense"), d, d).map_err(in_file)?;
        let classifier = Dense::load(&root.pp("classifier"), d, n).map_err(in_file)?;
        let tokenizer = Tokenizer::from_tokenizer_json(&dir.join("tokenizer.json"))?;
        Ok(CrossEncoder {
            bert,
            pooler,
            classifier,
            tokenizer,
            workspace: Mutex::default(),
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The encoder.
    pub fn bert(&self) -> &Bert {
        &self.bert
    }

    /// The number of logits a pair gets.
    pub fn labels(&self) -> usize {
        self.classifier.bias.len()
    }

    /// The ids and segments of a pair: `[CLS] query [SEP]` in segment 0, `document [SEP]`
    /// in segment 1 (special tokens in either text are read as text).
    pub fn pair(&self, query: &str, document: &str) -> Result<(Vec<u32>, Vec<u8>)> {
        let plain = EncodeOptions {
            add_special: false,
            parse_special: false,
        };
        let mut ids = self.tokenizer.encode_with(
            query,
            EncodeOptions {
                add_special: true,
                parse_special: false,
            },
        )?;
        let first = ids.len();
        ids.extend(self.tokenizer.encode_with(document, plain)?);
        let sep = self.tokenizer.sep_id().ok_or_else(|| {
            Error::Config("cross-encoder: the tokenizer has no [SEP] token".into())
        })?;
        ids.push(sep);
        let mut segments = vec![0u8; first];
        segments.resize(ids.len(), 1);
        Ok((ids, segments))
    }

    /// The logits of each pair ([`pair`](Self::pair)'s ids and segments), read in one
    /// packed pass.
    ///
    /// Errors: those of [`Bert::forward_packed_pairs`] (a pair past
    /// `max_position_embeddings`, an id outside the vocabulary).
    pub fn logits(&self, pairs: &[(Vec<u32>, Vec<u8>)]) -> Result<Vec<Vec<f32>>> {
        let ids: Vec<u32> = pairs.iter().flat_map(|(i, _)| i.iter().copied()).collect();
        let segments: Vec<u8> = pairs.iter().flat_map(|(_, s)| s.iter().copied()).collect();
        let lengths: Vec<usize> = pairs.iter().map(|(i, _)| i.len()).collect();
        let mut ws = self.workspace.lock().unwrap_or_else(|p| p.into_inner());
        let hidden = self
            .bert
            .forward_packed_pairs(&ids, &segments, &lengths, &mut ws)?;
        let d = self.bert.config().hidden_size;
        let mut row = 0;
        Ok(lengths
            .iter()
            .map(|&len| {
                let cls = &hidden[row * d..(row + 1) * d];
                row += len;
                let pooled: Vec<f32> = self.pooler.apply(cls).into_iter().map(f32::tanh).collect();
                self.classifier.apply(&pooled)
            })
            .collect())
    }
}
