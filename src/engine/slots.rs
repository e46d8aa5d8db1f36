//! Slots: how waiting requests take them (the free slot that shares the longest prefix
//! with the prompt, or the one a request is pinned to, [`GenRequest::slot`](super::GenRequest)),
//! and a slot's tokens and KV cache as bytes, to keep a conversation's cache across restarts
//! (llama-server's `/slots/{id}?action=save|restore|erase`).
//!
//! The layout of the bytes is [`SavedSlot`]'s.
//!
//! A restore checks all of it before touching the slot: bytes of another model, KV type
//! or shape, of another version, truncated, padded or corrupt are refused with
//! [`Error::SlotState`] naming which, and the slot keeps what it had.

use super::speculate::{self, SpecState};
use super::{common_prefix, Engine, Event, FinishReason, Running, Slot};
use crate::alloc::{fnv1a, FNV_START};
use crate::error::{Error, Result};
use crate::models::decoder::KvType;
use crate::sample::Sampler;
use crate::speculative::SpecStats;
use crate::speculative::Speculation;

const MAGIC: &[u8; 8] = b"QKVSLOT\0";
const VERSION: u32 = 1;
/// Bytes before the token ids.
const HEADER: usize = 8 + 4 + 4 + 8 + 12 + 4 + 8;

/// A slot as bytes ([`Engine::save_slot`]).
///
/// The bytes (all integers little-endian):
///
/// | bytes | what |
/// |---|---|
/// | 8 | `QKVSLOT\0` |
/// | 4 | version, 1 |
/// | 4 | KV type: 0 f32, 1 f16, 2 q8_0 |
/// | 8 | the model's [`fingerprint`](crate::models::decoder::Decoder::fingerprint) |
/// | 4 × 3 | layers, KV heads, head dimension |
/// | 4 | tokens, `n` |
/// | 8 | bytes of the KV cache, `kv` |
/// | 4 × `n` | the token ids |
/// | `kv` | the keys then the values of positions `0..n`, per layer and head, as stored ([`KvCache::save_positions`](crate::models::decoder::KvCache::save_positions)) |
/// | 8 | FNV-1a of every byte before it |
#[derive(Clone, Debug)]
pub struct SavedSlot {
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// The tokens it holds (prompt and generated tokens whose keys and values are cached).
    pub tokens: usize,
}

fn kv_code(t: KvType) -> u32 {
    match t {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::Q8_0 => 2,
    }
}

fn kv_of(code: u32) -> Option<KvType> {
    [KvType::F32, KvType::F16, KvType::Q8_0]
        .into_iter()
        .find(|&t| kv_code(t) == code)
}

/// Little-endian reads from a byte slice whose length was checked.
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Engine {
    /// Moves waiting requests into free slots, reusing the cached prefix of the slot that
    /// shares the longest one with each prompt.
    pub(super) fn admit(&mut self, events: &mut Vec<Event>) -> Result<()> {
        while let Some((seq, request, constraint)) = self.queue.pop_front() {
            if request.max_tokens == 0 {
                // Cancelled while waiting.
                events.push(Event::Done {
                    seq,
                    reason: FinishReason::Cancelled,
                    prompt_tokens: request.prompt.len(),
                    cached_tokens: 0,
                    generated: 0,
                    spec: SpecStats::default(),
                });
                continue;
            }
            let free = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.running.is_none());
            // At least the prompt's last token runs again, for its logits.
            let reuse_len = |s: &Slot| {
                if !super::same_lora(&s.lora, &request.lora) {
                    return 0;
                }
                let cached = &s.tokens[..s.tokens.len().min(s.cache.filled())];
                common_prefix(cached, &request.prompt).min(request.prompt.len() - 1)
            };
            let best = free.max_by_key(|(_, s)| reuse_len(s)).map(|(i, _)| i);
            let slot = match (request.slot, best) {
                // A pinned request waits for its slot (and keeps its place in the queue).
                (Some(i), _) if self.slots.get(i).is_some_and(|s| s.running.is_some()) => {
                    self.queue.push_front((seq, request, constraint));
                    break;
                }
                (Some(i), _) => {
                    self.make_slots(i + 1)?;
                    i
                }
                (None, best) => match best {
                    Some(i)
                        if reuse_len(&self.slots[i]) > 0 || self.slots.len() >= self.max_slots =>
                    {
                        i
                    }
                    _ if self.slots.len() < self.max_slots => {
                        let cache = self
                            .model
                            .decoder()
                            .new_cache(self.options.context, self.kv_dtype)?;
                        self.slots.push(Slot {
                            cache,
                            tokens: Vec::new(),
                            lora: Vec::new(),
                            running: None,
                            draft: None,
                        });
                        self.slots.len() - 1
                    }
                    Some(i) => i,
                    None => {
                        self.queue.push_front((seq, request, constraint));
                        break;
                    }
                },
            };
            let s = &mut self.slots[slot];
            if let (Speculation::Draft(_), Some(d)) = (request.speculation, &self.draft_model) {
                speculate::draft_session(&mut s.draft, d, self.options.context)?;
            }
            let vocab = self.model.vocab_size();
            let spec = SpecState::new(request.speculation, &request.sampler, vocab)?;
            let keep = reuse_len(s);
            s.tokens.truncate(keep);
            s.cache.truncate(keep);
            s.lora.clone_from(&request.lora);
            let total = request.prompt.len();
            s.running = Some(Running {
                seq,
                sampler: Sampler::new(request.sampler.clone())?,
                prompt_len: total,
                read: keep,
                cached: keep,
                generated: 0,
                next: None,
                cancelled: false,
                constraint,
                spec,
                request,
            });
            events.push(Event::Prompt {
                seq,
                cached: keep,
                read: keep,
                total,
            });
        }
        Ok(())
    }

    /// [`Error::Slot`] unless `slot` is one of the engine's.
    pub(super) fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.max_slots {
            return Err(Error::Slot {
                slot,
                why: format!("does not exist (the engine has {})", self.max_slots),
            });
        }
        Ok(())
    }

    /// True when a sequence runs in `slot` (an operation on it then fails with
    /// [`Error::Slot`]; a server waits for the sequence to end).
    pub fn slot_busy(&self, slot: usize) -> bool {
        self.slots.get(slot).is_some_and(|s| s.running.is_some())
    }

    /// Makes the first `n` slots' caches (at most `max_slots`).
    pub(super) fn make_slots(&mut self, n: usize) -> Result<()> {
        while self.slots.len() < n.min(self.max_slots) {
            let cache = self
                .model
                .decoder()
                .new_cache(self.options.context, self.kv_dtype)?;
            self.slots.push(Slot {
                cache,
                tokens: Vec::new(),
                lora: Vec::new(),
                running: None,
                draft: None,
            });
        }
        Ok(())
    }

    /// A free slot, made when it does not exist yet; [`Error::Slot`] when it does not
    /// exist or runs a sequence.
    fn free_slot(&mut self, slot: usize) -> Result<&mut Slot> {
        self.check_slot(slot)?;
        self.make_slots(slot + 1)?;
        let s = &mut self.slots[slot];
        if s.running.is_some() {
            return Err(Error::Slot {
                slot,
                why: "is busy: a sequence runs in it".into(),
            });
        }
        Ok(s)
    }

    /// The tokens a slot caches and their keys and values, as bytes (laid out as
    /// [`SavedSlot`] says). [`Error::Slot`] when the slot does not exist, a sequence runs in
    /// it, or it caches tokens run under LoRA adapters (the file records none).
    pub fn save_slot(&mut self, slot: usize) -> Result<SavedSlot> {
        let fingerprint = self.model.decoder().fingerprint();
        let c = self.model.config();
        let (layers, heads, dim) = (c.layers, c.kv_heads, c.head_dim);
        let s = self.free_slot(slot)?;
        if s.lora.iter().any(|l| l.scale != 0.0) {
            // The file names the model, not adapters: a cache made under them would be
            // taken for the base model's when restored.
            return Err(Error::Slot {
                slot,
                why: "caches tokens run under LoRA adapters, which a saved slot cannot record"
                    .into(),
            });
        }
        let n = s.tokens.len().min(s.cache.filled());
        let kv = s.cache.saved_bytes(n);
        let mut bytes = Vec::with_capacity(HEADER + 4 * n + kv + 8);
        bytes.extend_from_slice(MAGIC);
        bytes.extend(VERSION.to_le_bytes());
        bytes.extend(kv_code(s.cache.kv_type()).to_le_bytes());
        bytes.extend(fingerprint.to_le_bytes());
        for x in [layers, heads, dim, n] {
            bytes.extend((x as u32).to_le_bytes());
        }
        bytes.extend((kv as u64).to_le_bytes());
        for t in &s.tokens[..n] {
            bytes.extend(t.to_le_bytes());
        }
        s.cache.save_positions(n, &mut bytes)?;
        let sum = fnv1a(FNV_START, &bytes);
        bytes.extend(sum.to_le_bytes());
        Ok(SavedSlot { bytes, tokens: n })
    }

    /// Puts what [`save_slot`](Self::save_slot) wrote into `slot` (any slot, of this
    /// engine or of another process on the same model file); returns how many tokens it
    /// holds now. A request whose prompt starts with them reuses them. [`Error::Slot`]
    /// when the slot does not exist or runs a sequence; [`Error::SlotState`] naming what is
    /// wrong when the bytes are not a whole, intact save of this model with this KV type
    /// and shape, or hold more tokens than the context: the slot is then unchanged (but
    /// for a save whose checksum holds and whose cache holds a value that is not finite,
    /// found while reading it: the slot is then left empty).
    pub fn restore_slot(&mut self, slot: usize, bytes: &[u8]) -> Result<usize> {
        self.check_slot(slot)?;
        let (tokens, kv) = self.parse_saved(bytes)?;
        let s = self.free_slot(slot)?;
        if let Err(e) = s.cache.load_positions(tokens.len(), kv) {
            s.tokens.clear();
            return Err(e);
        }
        s.tokens = tokens;
        s.lora.clear();
        Ok(s.tokens.len())
    }

    /// Forgets what a slot caches; returns how many tokens it held. [`Error::Slot`] when
    /// the slot does not exist or runs a sequence.
    pub fn erase_slot(&mut self, slot: usize) -> Result<usize> {
        self.check_slot(slot)?;
        let Some(s) = self.slots.get_mut(slot) else {
            return Ok(0);
        };
        if s.running.is_some() {
            return self.free_slot(slot).map(|_| 0);
        }
        let n = s.tokens.len().min(s.cache.filled());
        s.tokens.clear();
        s.cache.truncate(0);
        Ok(n)
    }

    /// The token ids and the cache bytes of a save, every field checked against this
    /// engine.
    fn parse_saved<'a>(&self, b: &'a [u8]) -> Result<(Vec<u32>, &'a [u8])> {
        let bad = |msg: String| Err(Error::SlotState(msg));
        if b.len() < HEADER + 8 || &b[..8] != MAGIC {
            return bad(format!(
                "not a qkv slot file ({} bytes, without the `QKVSLOT` header)",
                b.len()
            ));
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return bad(format!(
                "version {version}; this qkv reads version {VERSION}"
            ));
        }
        let n = u32_at(b, 36) as usize;
        let kv = u64_at(b, 40);
        let whole = (n as u64)
            .checked_mul(4)
            .and_then(|t| t.checked_add(kv))
            .and_then(|t| t.checked_add((HEADER + 8) as u64));
        if whole != Some(b.len() as u64) {
            return bad(format!(
                "{} bytes, where its header ({n} tokens, {kv} bytes of KV cache) says {}: \
                 truncated or padded",
                b.len(),
                whole.map_or("more than 2^64".into(), |w| w.to_string())
            ));
        }
        let body = b.len() - 8;
        if fnv1a(FNV_START, &b[..body]) != u64_at(b, body) {
            return bad("the checksum does not match: the file is corrupt".into());
        }
        let decoder = self.model.decoder();
        if u64_at(b, 16) != decoder.fingerprint() {
            return bad(
                "it was saved by another model (or the same file loaded with other \
                 options): its keys and values mean nothing to this one"
                    .into(),
            );
        }
        let code = u32_at(b, 12);
        let Some(kv_type) = kv_of(code) else {
            return bad(format!("unknown KV cache type {code}"));
        };
        if kv_type != self.kv_dtype {
            return bad(format!(
                "its KV cache is {kv_type}, this server's is {}",
                self.kv_dtype
            ));
        }
        let c = self.model.config();
        let shape = [u32_at(b, 24), u32_at(b, 28), u32_at(b, 32)];
        let ours = [c.layers, c.kv_heads, c.head_dim].map(|x| x as u32);
        if shape != ours {
            return bad(format!(
                "its cache has (layers, KV heads, head dim) {shape:?}, this model {ours:?}"
            ));
        }
        if n > self.options.context {
            return bad(format!(
                "it holds {n} tokens, more than the context of {}",
                self.options.context
            ));
        }
        let vocab = self.model.vocab_size();
        let tokens: Vec<u32> = b[HEADER..HEADER + 4 * n]
            .chunks_exact(4)
            .map(|t| u32::from_le_bytes(t.try_into().expect("4 bytes")))
            .collect();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return bad(format!("token {id} is outside the vocabulary of {vocab}"));
        }
        Ok((tokens, &b[HEADER + 4 * n..body]))
    }
}
