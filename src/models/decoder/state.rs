//! A sequence's state on a [`Decoder`]: the KV cache and the scratch of one prefill chunk.

use super::super::zeroed;
#[cfg(doc)]
use super::Decoder;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::weights::FloatType;
use half::f16;
use qkv_kernels::convert::f32_to_f16;
use qkv_kernels::{KvData, KvView};

/// What a KV cache of `capacity` positions is called in allocation errors.
pub(super) fn kv_cache(capacity: usize) -> String {
    format!("a KV cache of {capacity} positions")
}

/// One cache tensor (all keys or all values), head-major within each layer:
/// `[layer][kv_head][position][head_dim]`. Each head's positions are contiguous, so a decode
/// step streams every head's history front to back, which is what the memory prefetcher
/// follows best (with position-major rows, a decode attention call over 2048 positions
/// took 2.3× as long).
pub(super) struct KvStore {
    data: KvBuf,
    /// Positions each head holds.
    capacity: usize,
    heads: usize,
    dim: usize,
}

/// The cache's elements, in the KV dtype.
enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl KvStore {
    /// A zeroed cache of `len` elements (whole layers of `heads · capacity · dim`; the caller
    /// checked that the count fits). [`Error::AllocationRefused`] when the memory cannot be
    /// had.
    pub(super) fn new(
        dtype: FloatType,
        len: usize,
        capacity: usize,
        heads: usize,
        dim: usize,
    ) -> Result<Self> {
        let data = match dtype {
            FloatType::F32 => KvBuf::F32(zeroed(len, || kv_cache(capacity))?),
            FloatType::F16 => KvBuf::F16(zeroed(len, || kv_cache(capacity))?),
        };
        Ok(KvStore {
            data,
            capacity,
            heads,
            dim,
        })
    }

    /// Elements of one layer.
    fn layer_len(&self) -> usize {
        self.heads * self.capacity * self.dim
    }

    /// Stores `src` (`[t][kv_head][dim]`, the projections of positions `pos0..pos0 + t`)
    /// into layer `layer`.
    pub(super) fn write(&mut self, layer: usize, pos0: usize, src: &[f32]) -> Result<()> {
        let (start, dim) = (layer * self.layer_len(), self.dim);
        for (t, row) in src.chunks_exact(self.heads * dim).enumerate() {
            for (h, x) in row.chunks_exact(dim).enumerate() {
                let at = start + (h * self.capacity + pos0 + t) * dim;
                match &mut self.data {
                    KvBuf::F32(dst) => dst[at..at + dim].copy_from_slice(x),
                    KvBuf::F16(dst) => f32_to_f16(x, &mut dst[at..at + dim])?,
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
        };
        KvView::head_major(data, rows, self.heads, self.dim, self.capacity)
    }

    pub(super) fn dtype(&self) -> FloatType {
        match self.data {
            KvBuf::F32(_) => FloatType::F32,
            KvBuf::F16(_) => FloatType::F16,
        }
    }

    pub(super) fn bytes(&self) -> usize {
        match &self.data {
            KvBuf::F32(v) => v.len() * 4,
            KvBuf::F16(v) => v.len() * 2,
        }
    }
}

/// One sequence's KV cache on a [`Decoder`]: the keys and values of every layer for up to
/// `capacity` positions, f32 or f16, and how many positions hold real entries. Made by
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
            .field("kv_dtype", &self.keys.dtype())
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

    /// The dtype of the cached keys and values.
    pub fn kv_dtype(&self) -> FloatType {
        self.keys.dtype()
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.keys.bytes() + self.values.bytes()
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

    /// The dtype of the cached keys and values.
    pub fn kv_dtype(&self) -> FloatType {
        self.cache.kv_dtype()
    }

    /// Bytes held by the KV cache.
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }

    /// The KV cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }
}
