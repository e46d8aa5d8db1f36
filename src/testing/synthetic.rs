//! A tiny synthetic model, written by qkv's own GGUF writer at test time (the tests of qkv
//! and qkv-cli use it), so that every model
//! path runs offline: a Llama-architecture decoder (2 layers, dim 256, 4 query heads of 64
//! over 2 KV heads, FFN 512) with a byte-level BPE vocabulary of 267 tokens in its metadata
//! (the 256 bytes, 8 merges, 3 control tokens) and a ChatML chat template.
//!
//! Its weight matrices come in f32, f16 and every GGUF block format qkv runs. The f32 and f16
//! files hold the same random weights (f16 rounded); a quantized file holds random blocks
//! (`qkv_kernels::quant::testing::weight_blocks`), so loading it with `dtype: F32` gives
//! exactly the weights its blocks decode to: the reference its own quantized path is
//! compared with. Dimension 256 is one K-quant block per row.
//!
//! Each test process writes the files it uses into its own `$TMPDIR/qkv-synthetic-PID/`
//! (a few MB; the next run removes the directories of processes that have exited), so a file
//! never outlives the code that wrote it.

use crate::kernels::quant::testing::{weight_blocks, Rng};
use crate::kernels::{f16, QuantFormat};
use crate::tokenizer::gpt2_byte_chars;
use crate::weights::gguf::{write_gguf, MetaValue, MetaValueType};
use crate::weights::WeightFormat;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Model width.
pub const DIM: usize = 256;
/// Decoder layers.
pub const LAYERS: usize = 2;
/// Query heads (of [`HEAD_DIM`]).
pub const HEADS: usize = 4;
/// Key/value heads: two query heads share each.
pub const KV_HEADS: usize = 2;
/// Width of one head.
pub const HEAD_DIM: usize = 64;
/// Hidden width of the gated FFN.
pub const FFN: usize = 512;
/// Context length in the metadata.
pub const CONTEXT: usize = 512;

/// The merges of the vocabulary, in rank order; each adds the token `a` + `b`.
const MERGES: [(&str, &str); 8] = [
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("o", "n"),
    ("r", "e"),
];
/// The control tokens, after the bytes and the merged tokens.
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// Tokens in the vocabulary.
pub const VOCAB: usize = 256 + MERGES.len() + SPECIALS.len();
/// The end-of-turn token, which the file names as its end of text.
pub const EOS: u32 = (VOCAB - 1) as u32;

/// ChatML, as the model's own template.
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// How a synthetic file stores its weight matrices (norm weights are always f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// f32.
    F32,
    /// The f32 weights rounded to f16.
    F16,
    /// Random blocks of this format.
    Quant(QuantFormat),
}

impl Storage {
    /// Every storage: f32, f16, then each block format.
    pub fn all() -> Vec<Storage> {
        let mut all = vec![Storage::F32, Storage::F16];
        all.extend(QuantFormat::ALL.iter().map(|&q| Storage::Quant(q)));
        all
    }

    fn name(self) -> String {
        match self {
            Storage::F32 => "F32".into(),
            Storage::F16 => "F16".into(),
            Storage::Quant(q) => q.name().into(),
        }
    }
}

/// The model's matrices: GGUF name, rows, columns.
fn matrices() -> Vec<(String, usize, usize)> {
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut m = vec![("token_embd.weight".to_string(), VOCAB, DIM)];
    for l in 0..LAYERS {
        for (part, rows, cols) in [
            ("attn_q", q, DIM),
            ("attn_k", kv, DIM),
            ("attn_v", kv, DIM),
            ("attn_output", DIM, q),
            ("ffn_gate", FFN, DIM),
            ("ffn_up", FFN, DIM),
            ("ffn_down", DIM, FFN),
        ] {
            m.push((format!("blk.{l}.{part}.weight"), rows, cols));
        }
    }
    m.push(("output.weight".to_string(), VOCAB, DIM));
    m
}

/// The norm weights: GGUF name and length.
fn norms() -> Vec<String> {
    let mut n: Vec<String> = (0..LAYERS)
        .flat_map(|l| {
            [
                format!("blk.{l}.attn_norm.weight"),
                format!("blk.{l}.ffn_norm.weight"),
            ]
        })
        .collect();
    n.push("output_norm.weight".into());
    n
}

/// The vocabulary's tokens, in id order.
pub fn tokens() -> Vec<String> {
    let mut t: Vec<String> = gpt2_byte_chars().iter().map(|c| c.to_string()).collect();
    t.extend(MERGES.iter().map(|(a, b)| format!("{a}{b}")));
    t.extend(SPECIALS.iter().map(|s| s.to_string()));
    t
}

/// The metadata: the architecture's numbers, the tokenizer and the chat template.
fn metadata() -> Vec<(String, MetaValue)> {
    let u = |v: usize| MetaValue::U32(v as u32);
    let strings = |v: Vec<String>| {
        MetaValue::Array(
            MetaValueType::String,
            v.into_iter().map(MetaValue::String).collect(),
        )
    };
    let types: Vec<MetaValue> = (0..VOCAB)
        .map(|i| MetaValue::I32(if i < 256 + MERGES.len() { 1 } else { 3 }))
        .collect();
    let s = |k: &str, v: MetaValue| (k.to_string(), v);
    vec![
        s("general.architecture", MetaValue::String("llama".into())),
        s("general.name", MetaValue::String("qkv synthetic".into())),
        s("llama.context_length", u(CONTEXT)),
        s("llama.embedding_length", u(DIM)),
        s("llama.block_count", u(LAYERS)),
        s("llama.feed_forward_length", u(FFN)),
        s("llama.attention.head_count", u(HEADS)),
        s("llama.attention.head_count_kv", u(KV_HEADS)),
        s(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        ),
        s("llama.rope.dimension_count", u(HEAD_DIM)),
        s("llama.rope.freq_base", MetaValue::F32(10000.0)),
        s("llama.vocab_size", u(VOCAB)),
        s("tokenizer.ggml.model", MetaValue::String("gpt2".into())),
        s("tokenizer.ggml.pre", MetaValue::String("default".into())),
        s("tokenizer.ggml.tokens", strings(tokens())),
        s(
            "tokenizer.ggml.merges",
            strings(MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect()),
        ),
        s(
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaValueType::I32, types),
        ),
        s("tokenizer.ggml.bos_token_id", u(256 + MERGES.len())),
        s("tokenizer.ggml.eos_token_id", u(EOS as usize)),
        s("tokenizer.ggml.add_bos_token", MetaValue::Bool(false)),
        s(
            "tokenizer.chat_template",
            MetaValue::String(CHAT_TEMPLATE.into()),
        ),
    ]
}

/// `rows × cols` random f32 weights of about `1/√cols`, the same for the same `seed`.
fn f32_weights(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let scale = 2.0 / (cols as f32).sqrt();
    (0..rows * cols).map(|_| scale * rng.uniform()).collect()
}

/// The bytes of the synthetic model stored as `storage`.
fn file_bytes(storage: Storage) -> Vec<(String, Vec<usize>, WeightFormat, Vec<u8>)> {
    let mut tensors = Vec::new();
    for (i, (name, rows, cols)) in matrices().into_iter().enumerate() {
        let seed = 1 + i as u64;
        let (format, bytes) = match storage {
            Storage::F32 => {
                let w = f32_weights(rows, cols, seed);
                (
                    WeightFormat::F32,
                    w.iter().flat_map(|x| x.to_le_bytes()).collect(),
                )
            }
            Storage::F16 => {
                let w = f32_weights(rows, cols, seed);
                let b = w
                    .iter()
                    .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                    .collect();
                (WeightFormat::F16, b)
            }
            Storage::Quant(q) => {
                let mut rng =
                    Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ q.block_bytes() as u64);
                (
                    WeightFormat::Quant(q),
                    weight_blocks(q, rows, cols, &mut rng),
                )
            }
        };
        tensors.push((name, vec![rows, cols], format, bytes));
    }
    for (i, name) in norms().into_iter().enumerate() {
        let mut rng = Rng(1000 + i as u64);
        let w: Vec<f32> = (0..DIM).map(|_| 1.0 + 0.2 * rng.uniform()).collect();
        let bytes = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        tensors.push((name, vec![DIM], WeightFormat::F32, bytes));
    }
    tensors
}

/// This process's directory for the synthetic files, `$TMPDIR/qkv-synthetic-PID`. Those of
/// test processes that have exited are removed first (where `/proc` says which are alive).
fn files_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = std::env::temp_dir();
        let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists();
        if alive(std::process::id()) {
            for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
                let name = e.file_name();
                let pid = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("qkv-synthetic-"))
                    .and_then(|p| p.parse::<u32>().ok());
                if pid.is_some_and(|p| !alive(p)) {
                    std::fs::remove_dir_all(e.path()).ok();
                }
            }
        }
        let dir = base.join(format!("qkv-synthetic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
    .clone()
}

/// The synthetic model stored as `storage`, written on first use in this process (threads
/// writing it at once are safe: the writer renames a complete file into place).
pub fn model_file(storage: Storage) -> PathBuf {
    let path = files_dir().join(format!("synthetic-{}.gguf", storage.name()));
    if !path.is_file() {
        let tensors = file_bytes(storage);
        let entries: Vec<(String, Vec<usize>, WeightFormat, &[u8])> = tensors
            .iter()
            .map(|(n, s, f, b)| (n.clone(), s.clone(), *f, &b[..]))
            .collect();
        write_gguf(&path, &metadata(), &entries).unwrap();
    }
    path
}

/// The model of [`model_file`] with `extra` metadata keys added (a vocabulary with
/// fill-in-the-middle markers, say), written on first use as `synthetic-{storage}-{tag}.gguf`.
pub fn model_file_with(storage: Storage, tag: &str, extra: Vec<(String, MetaValue)>) -> PathBuf {
    let path = files_dir().join(format!("synthetic-{}-{tag}.gguf", storage.name()));
    if !path.is_file() {
        let tensors = file_bytes(storage);
        let entries: Vec<(String, Vec<usize>, WeightFormat, &[u8])> = tensors
            .iter()
            .map(|(n, s, f, b)| (n.clone(), s.clone(), *f, &b[..]))
            .collect();
        let mut meta = metadata();
        meta.extend(extra);
        write_gguf(&path, &meta, &entries).unwrap();
    }
    path
}

/// `n` token ids of text-like input: the tokenizer's encoding of a fixed English passage,
/// repeated as needed.
pub fn text_tokens(tok: &crate::tokenizer::Tokenizer, n: usize) -> Vec<u32> {
    let text = "the cat sat on the mat and then there was another one in the garden. ";
    let one = tok.encode(text).unwrap();
    one.iter().copied().cycle().take(n).collect()
}
