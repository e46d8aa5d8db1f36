//! A sequence's state on a [`Decoder`]: the KV cache and the scratch of one prefill chunk.

#[cfg(doc)]
use super::Decoder;
use crate::alloc::zeroed;
use crate::error::{Error, Result};
use crate::weights::FloatType;
use half::f16;
use qkv_kernels::attention::kv_q8;
use qkv_kernels::convert::f32_to_f16;
use qkv_kernels::{KvData, KvView};

/// What a KV cache of `capacity` positions is called in allocation errors.
pub(super) fn kv_cache(capacity: usize) -> String {
    format!("a KV cache of {capacity} positions")
}

/// How a KV cache stores its keys and values: as floats, or in Q8_0 blocks (32 signed bytes
/// and one f16 scale per 32 elements, llama.cpp's `-ctk q8_0 -ctv q8_0`), which take 1.0625
/// bytes per element against f16's 2 — about half the memory, so twice the sequences in
/// one budget. The attention kernel reads every type where it lies; see
/// [`qkv_kernels::attention::kv_q8`] for the block rule.
///
/// ```
/// use qkv::models::decoder::KvType;
/// use qkv::weights::FloatType;
/// assert_eq!("q8_0".parse::<KvType>().unwrap(), KvType::Q8_0);
/// assert_eq!(KvType::from(FloatType::F16), KvType::F16);
/// assert_eq!(KvType::Q8_0.to_string(), "q8_0");
/// assert!("q4".parse::<KvType>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvType {
    /// 32-bit floats.
    F32,
    /// Half floats (the default of models stored in f16 or quantized formats).
    F16,
    /// Q8_0 blocks.
    Q8_0,
}

impl KvType {
    /// The names [`FromStr`](std::str::FromStr) accepts, as `--kv-type` lists them.
    pub const NAMES: [&'static str; 3] = ["f32", "f16", "q8_0"];

    /// Bytes one position of one head of `head_dim` elements takes in keys or in values.
    /// (A Q8_0 row starts on a block, so a `head_dim` that is not a multiple of 32 is
    /// padded: 80 takes 3 blocks.)
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvType::F32 => head_dim * 4,
            KvType::F16 => head_dim * 2,
            KvType::Q8_0 => kv_q8::row_bytes(head_dim),
        }
    }
}

impl From<FloatType> for KvType {
    fn from(t: FloatType) -> KvType {
        match t {
            FloatType::F32 => KvType::F32,
            FloatType::F16 => KvType::F16,
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        })
    }
}

impl std::str::FromStr for KvType {
    type Err = Error;

    /// `f32`, `f16` or `q8_0` (case-insensitive); [`Error::Config`] naming the choices
    /// otherwise.
    fn from_str(s: &str) -> Result<KvType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            _ => Err(Error::Config(format!(
                "unknown KV cache type `{s}` (expected one of {})",
                KvType::NAMES.join(", ")
            ))),
        }
    }
}

/// One cache tensor (all keys or all values), head-major within each layer:
/// `[layer][kv_head][position][head_dim]`. Each head's positions are contiguous, so a decode
/// step streams every head's history front to back, which is what the memory prefetcher
/// follows best (position-major rows made a decode attention call over 2048 positions
/// much slower). In Q8_0 blocks each position's row is `head_dim` rounded up to 32
/// values, with its scales in a parallel array of one per 32.
pub(super) struct KvStore {
    data: KvBuf,
    layers: usize,
    /// Positions each head holds.
    capacity: usize,
    heads: usize,
    dim: usize,
    /// Elements between consecutive positions of a head (`dim`, or `dim` padded to whole
    /// blocks).
    stride: usize,
}

/// The cache's elements, in the KV type.
enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0 { q: Vec<i8>, d: Vec<f16> },
}

impl KvStore {
    /// A zeroed cache of `layers` layers of `heads × capacity` rows of `dim` elements.
    /// [`Error::AllocationRefused`] when the count overflows or the memory cannot be had.
    pub(super) fn new(
        kv_type: KvType,
        layers: usize,
        capacity: usize,
        heads: usize,
        dim: usize,
    ) -> Result<Self> {
        let stride = match kv_type {
            KvType::Q8_0 => kv_q8::padded(dim),
            _ => dim,
        };
        let len = layers
            .checked_mul(heads)
            .and_then(|n| n.checked_mul(capacity))
            .and_then(|n| n.checked_mul(stride))
            .ok_or_else(|| Error::AllocationRefused {
                what: kv_cache(capacity),
                bytes: usize::MAX,
            })?;
        let data = match kv_type {
            KvType::F32 => KvBuf::F32(zeroed(len, || kv_cache(capacity))?),
            KvType::F16 => KvBuf::F16(zeroed(len, || kv_cache(capacity))?),
            KvType::Q8_0 => KvBuf::Q8_0 {
                q: zeroed(len, || kv_cache(capacity))?,
                d: zeroed(len / kv_q8::BLOCK, || kv_cache(capacity))?,
            },
        };
        Ok(KvStore {
            data,
            layers,
            capacity,
            heads,
            dim,
            stride,
        })
    }

    /// Elements of one layer.
    fn layer_len(&self) -> usize {
        self.heads * self.capacity * self.stride
    }

    /// Stores `src` (`[t][kv_head][dim]`, the projections of positions `pos0..pos0 + t`)
    /// into layer `layer`.
    pub(super) fn write(&mut self, layer: usize, pos0: usize, src: &[f32]) -> Result<()> {
        let (start, dim, stride) = (layer * self.layer_len(), self.dim, self.stride);
        for (t, row) in src.chunks_exact(self.heads * dim).enumerate() {
            for (h, x) in row.chunks_exact(dim).enumerate() {
                let at = start + (h * self.capacity + pos0 + t) * stride;
                match &mut self.data {
                    KvBuf::F32(dst) => dst[at..at + dim].copy_from_slice(x),
                    KvBuf::F16(dst) => f32_to_f16(x, &mut dst[at..at + dim])?,
                    KvBuf::Q8_0 { q, d } => {
                        let b = at / kv_q8::BLOCK;
                        let blocks = &mut d[b..b + stride / kv_q8::BLOCK];
                        kv_q8::quantize(x, &mut q[at..at + stride], blocks)?
                    }
                }
            }
        }
        Ok(())
    }

    /// The first `rows` positions of layer `layer`.
    pub(super) fn view(&self, layer: usize, rows: usize) -> KvView<'_> {
        let span = layer * self.layer_len()..(layer + 1) * self.layer_len();
        let data = match &self.data {
            KvBuf::F32(v) => KvData::F32(&v[span]),
            KvBuf::F16(v) => KvData::F16(&v[span]),
            KvBuf::Q8_0 { q, d } => {
                let b = kv_q8::BLOCK;
                KvData::Q8_0 {
                    q: &q[span.clone()],
                    d: &d[span.start / b..span.end / b],
                }
            }
        };
        KvView {
            data,
            rows,
            heads: self.heads,
            dim: self.dim,
            row_stride: self.stride,
            head_stride: self.capacity * self.stride,
        }
    }

    /// Bytes that [`save`](Self::save) writes for `n` positions.
    fn saved_bytes(&self, n: usize) -> usize {
        let elems = self.layers * self.heads * n * self.stride;
        match &self.data {
            KvBuf::F32(_) => elems * 4,
            KvBuf::F16(_) => elems * 2,
            KvBuf::Q8_0 { .. } => elems + elems / kv_q8::BLOCK * 2,
        }
    }

    /// The element ranges of positions `0..n` of every layer and head, in storage order.
    fn spans(&self, n: usize) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        let (layer, head) = (self.layer_len(), self.capacity * self.stride);
        (0..self.layers * self.heads).map(move |lh| {
            let at = (lh / self.heads) * layer + (lh % self.heads) * head;
            at..at + n * self.stride
        })
    }

    /// Appends positions `0..n` (at most `capacity`) of every layer and head to `out`,
    /// little-endian: each head's rows as stored (Q8_0: the quants, then that head's scales).
    fn save(&self, n: usize, out: &mut Vec<u8>) {
        for span in self.spans(n) {
            match &self.data {
                KvBuf::F32(v) => v[span].iter().for_each(|x| out.extend(x.to_le_bytes())),
                KvBuf::F16(v) => v[span]
                    .iter()
                    .for_each(|x| out.extend(x.to_bits().to_le_bytes())),
                KvBuf::Q8_0 { q, d } => {
                    let b = kv_q8::BLOCK;
                    out.extend(q[span.clone()].iter().map(|&x| x as u8));
                    d[span.start / b..span.end / b]
                        .iter()
                        .for_each(|x| out.extend(x.to_bits().to_le_bytes()));
                }
            }
        }
    }

    /// Reads what [`save`](Self::save) wrote for `n` positions from the front of `bytes`
    /// (which holds [`saved_bytes`](Self::saved_bytes)`(n)` at least), refusing a value that
    /// is not finite; returns the rest of `bytes`. On an error the store may hold part of
    /// the positions: the caller marks them empty.
    fn load<'a>(&mut self, n: usize, mut bytes: &'a [u8]) -> Result<&'a [u8]> {
        let bad = |what: &str| Error::SlotState(format!("a {what} in the KV cache is not finite"));
        let spans: Vec<_> = self.spans(n).collect();
        for span in spans {
            match &mut self.data {
                KvBuf::F32(v) => {
                    let (head, rest) = bytes.split_at(span.len() * 4);
                    for (x, b) in v[span].iter_mut().zip(head.chunks_exact(4)) {
                        *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        if !x.is_finite() {
                            return Err(bad("value"));
                        }
                    }
                    bytes = rest;
                }
                KvBuf::F16(v) => {
                    let (head, rest) = bytes.split_at(span.len() * 2);
                    for (x, b) in v[span].iter_mut().zip(head.chunks_exact(2)) {
                        *x = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                        if !x.is_finite() {
                            return Err(bad("value"));
                        }
                    }
                    bytes = rest;
                }
                KvBuf::Q8_0 { q, d } => {
                    let blocks = span.len() / kv_q8::BLOCK;
                    let (quants, rest) = bytes.split_at(span.len());
                    let (scales, rest) = rest.split_at(blocks * 2);
                    for (x, &b) in q[span.clone()].iter_mut().zip(quants) {
                        *x = b as i8;
                    }
                    let at = span.start / kv_q8::BLOCK;
                    for (x, b) in d[at..at + blocks].iter_mut().zip(scales.chunks_exact(2)) {
                        *x = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                        if !x.is_finite() {
                            return Err(bad("Q8_0 scale"));
                        }
                    }
                    bytes = rest;
                }
            }
        }
        Ok(bytes)
    }

    pub(super) fn kv_type(&self) -> KvType {
        match self.data {
            KvBuf::F32(_) => KvType::F32,
            KvBuf::F16(_) => KvType::F16,
            KvBuf::Q8_0 { .. } => KvType::Q8_0,
        }
    }

    pub(super) fn bytes(&self) -> usize {
        match &self.data {
            KvBuf::F32(v) => v.len() * 4,
            KvBuf::F16(v) => v.len() * 2,
            KvBuf::Q8_0 { q, d } => q.len() + d.len() * 2,
        }
    }
}

/// One sequence's KV cache on a [`Decoder`]: the keys and values of every layer for up to
/// `capacity` positions, in f32, f16 or Q8_0 blocks ([`KvType`]), and how many positions
/// hold real entries. Made by
/// [`Decoder::new_cache`] (or inside a [`DecoderState`]); it refuses to serve another model.
pub struct KvCache {
    pub(super) capacity: usize,
    /// The id of the model that made it.
    pub(super) model: u64,
    /// Positions `0..filled` hold keys and values.
    pub(super) filled: usize,
    pub(super) keys: KvStore,
    pub(super) values: KvStore,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("capacity", &self.capacity)
            .field("filled", &self.filled)
            .field("kv_type", &self.keys.kv_type())
            .finish()
    }
}

impl KvCache {
    /// Positions the cache holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Positions `0..filled()` hold keys and values.
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// Forgets positions from `len` on (a rewind); a `len` past [`filled`](Self::filled)
    /// changes nothing.
    pub fn truncate(&mut self, len: usize) {
        self.filled = self.filled.min(len);
    }

    /// How the keys and values are stored.
    pub fn kv_type(&self) -> KvType {
        self.keys.kv_type()
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.keys.bytes() + self.values.bytes()
    }

    /// Bytes [`save_positions`](Self::save_positions) writes for `n` positions.
    pub fn saved_bytes(&self, n: usize) -> usize {
        self.keys.saved_bytes(n) + self.values.saved_bytes(n)
    }

    /// Appends the keys and then the values of positions `0..n` to `out`, little-endian, as
    /// stored ([`kv_type`](Self::kv_type)): [`saved_bytes`](Self::saved_bytes)`(n)` bytes.
    /// [`Error::ContextFull`] when `n` is past [`filled`](Self::filled).
    pub fn save_positions(&self, n: usize, out: &mut Vec<u8>) -> Result<()> {
        if n > self.filled {
            return Err(Error::ContextFull {
                needed: n,
                capacity: self.filled,
            });
        }
        out.reserve(self.saved_bytes(n));
        self.keys.save(n, out);
        self.values.save(n, out);
        Ok(())
    }

    /// Replaces the cache's contents by `n` positions read from `bytes`, which must be
    /// exactly what [`save_positions`](Self::save_positions) wrote for `n` positions of a
    /// cache of the same model shape and KV type. [`Error::SlotState`] when `n` exceeds
    /// the capacity, when the length is not that, or when a value is not finite; on an
    /// error the cache is left empty.
    pub fn load_positions(&mut self, n: usize, bytes: &[u8]) -> Result<()> {
        self.filled = 0;
        if n > self.capacity {
            return Err(Error::SlotState(format!(
                "{n} positions do not fit a KV cache of {}",
                self.capacity
            )));
        }
        let want = self.saved_bytes(n);
        if bytes.len() != want {
            return Err(Error::SlotState(format!(
                "{n} positions of this KV cache ({}) take {want} bytes, the saved cache has {}",
                self.kv_type(),
                bytes.len()
            )));
        }
        let rest = self.keys.load(n, bytes)?;
        self.values.load(n, rest)?;
        self.filled = n;
        Ok(())
    }
}

/// The activations of one forward pass of up to `rows` positions (one sequence's prefill
/// chunk, or the rows of many sequences batched together), reused from pass to pass.
pub struct Scratch {
    pub(super) rows: usize,
    pub(super) x: Vec<f32>,
    pub(super) xn: Vec<f32>,
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) att: Vec<f32>,
    pub(super) gate: Vec<f32>,
    pub(super) up: Vec<f32>,
    pub(super) hidden: Vec<f32>,
    /// The mixture of experts' buffers, for a model that has one.
    pub(super) moe: Option<super::MoeScratch>,
    /// The attention calls of a pass's segments, kept empty between passes (see
    /// [`recycle`](crate::alloc::recycle)).
    pub(super) calls: Vec<qkv_kernels::AttentionCall<'static>>,
    /// The LoRA adapters' products, sized by the first pass that uses an adapter.
    pub(super) lora: super::lora::LoraScratch,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch").field("rows", &self.rows).finish()
    }
}

impl Scratch {
    /// Most positions one pass may hold.
    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// Everything one sequence needs to run on a [`Decoder`] alone: its [`KvCache`] and the
/// [`Scratch`] of one prefill chunk. Made by [`Decoder::new_state`]; it does not know its
/// position — the caller passes it.
pub struct DecoderState {
    pub(super) cache: KvCache,
    pub(super) scratch: Scratch,
    /// The LoRA adapters its passes apply, with their scales ([`DecoderState::set_lora`]).
    pub(super) lora: Vec<super::ScaledLora>,
}

impl std::fmt::Debug for DecoderState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecoderState")
            .field("cache", &self.cache)
            .field("chunk", &self.scratch.rows)
            .finish()
    }
}

impl DecoderState {
    /// Positions the KV cache holds.
    pub fn capacity(&self) -> usize {
        self.cache.capacity
    }

    /// Most positions one matrix pass handles; longer prompts run in several.
    pub fn chunk(&self) -> usize {
        self.scratch.rows
    }

    /// How the cached keys and values are stored.
    pub fn kv_type(&self) -> KvType {
        self.cache.kv_type()
    }

    /// Bytes held by the KV cache.
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }

    /// The KV cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// The LoRA adapters the state's passes apply, each at its scale (none at first). The
    /// cached keys and values were made under the adapters before: a caller that changes
    /// them runs the sequence again from the first position the change affects (from 0,
    /// as [`Session::set_lora`](crate::session::Session::set_lora) does). The adapters must
    /// have been loaded for the model the state runs on ([`Error::ForeignState`] at the
    /// next pass otherwise).
    pub fn set_lora(&mut self, adapters: Vec<super::ScaledLora>) {
        self.lora = adapters;
    }

    /// The LoRA adapters its passes apply.
    pub fn lora(&self) -> &[super::ScaledLora] {
        &self.lora
    }
}
