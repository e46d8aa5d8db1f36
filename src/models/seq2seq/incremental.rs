//! Incremental decoding: a [`DecodeState`] sized once, one step per generated token, and
//! greedy search on top.

use super::{add, EncoderMemory, Seq2Seq, TokenBatch};
use crate::error::{Error, Result};
use qkv_kernels::{AttentionMask, KvView};

/// The state of an incremental decode: the encoder memory, each decoder layer's
/// self-attention KV cache, and every scratch buffer a step needs, all sized once.
#[derive(Debug)]
pub struct DecodeState {
    memory: EncoderMemory,
    pos: usize,
    capacity: usize,
    /// Per decoder layer, `[B, capacity, d_model]`.
    self_k: Vec<Vec<f32>>,
    self_v: Vec<Vec<f32>>,
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    ctx: Vec<f32>,
    delta: Vec<f32>,
    ffn_hidden: Vec<f32>,
    logits: Vec<f32>,
}

impl DecodeState {
    /// Tokens decoded so far (the position of the next one).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Positions the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The encoder memory.
    pub fn memory(&self) -> &EncoderMemory {
        &self.memory
    }

    /// The logits of the last step, `[B, tgt_vocab]`.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
}

impl Seq2Seq {
    /// A decode state over `memory` for up to `max_len` target positions (at most
    /// `max_tgt_len`, else [`Error::ContextFull`]). Every buffer a step needs is sized here.
    /// [`Error::ForeignState`] for a memory another model made; [`Error::AllocationRefused`]
    /// when the cache or the logits do not fit in memory.
    pub fn start(&self, memory: EncoderMemory, max_len: usize) -> Result<DecodeState> {
        self.check_memory(&memory)?;
        if max_len == 0 || max_len > self.cfg.max_tgt_len {
            return Err(Error::ContextFull {
                needed: max_len,
                capacity: self.cfg.max_tgt_len,
            });
        }
        let b = memory.batch();
        let d = self.cfg.d_model;
        let layers = self.decoder.len();
        let what = || format!("seq2seq: a decode cache of {b} × {max_len} positions");
        let cache = b
            .checked_mul(max_len)
            .and_then(|n| n.checked_mul(d))
            .ok_or_else(|| Error::AllocationRefused {
                what: what(),
                bytes: usize::MAX,
            })?;
        let caches = || {
            (0..layers)
                .map(|_| crate::alloc::zeroed(cache, what))
                .collect::<Result<Vec<_>>>()
        };
        let logits = crate::alloc::zeroed_for(&[b, self.cfg.tgt_vocab], || {
            format!("seq2seq: the logits of {b} sequences")
        })?;
        Ok(DecodeState {
            self_k: caches()?,
            self_v: caches()?,
            memory,
            pos: 0,
            capacity: max_len,
            x: vec![0.0; b * d],
            h: vec![0.0; b * d],
            q: vec![0.0; b * d],
            k: vec![0.0; b * d],
            v: vec![0.0; b * d],
            ctx: vec![0.0; b * d],
            delta: vec![0.0; b * d],
            ffn_hidden: vec![0.0; b * d * self.cfg.ffn_scale],
            logits,
        })
    }

    /// Feeds one token per sequence (`tokens.len() == B`) at the next position and returns
    /// the logits `[B, tgt_vocab]` for the position after it. Equal, within float rounding, to
    /// row `position` of [`Seq2Seq::decode_teacher_forced`] on the same prefix.
    ///
    /// Errors: [`Error::Shape`] for a wrong number of tokens, [`Error::ForeignState`] for a
    /// state another model made, [`Error::TokenOutOfRange`], [`Error::ContextFull`] when the
    /// state's capacity is used up.
    pub fn step<'s>(&self, state: &'s mut DecodeState, tokens: &[u32]) -> Result<&'s [f32]> {
        // On one of rayon's workers, the kernels' parallel loops queue their jobs locally
        // instead of injecting them into the pool from outside, once per call (as `Session`
        // does for the Llama).
        qkv_kernels::on_pool(|| self.step_on_worker(state, tokens))?;
        Ok(&state.logits)
    }

    /// The body of [`Seq2Seq::step`].
    fn step_on_worker(&self, state: &mut DecodeState, tokens: &[u32]) -> Result<()> {
        self.check_memory(&state.memory)?;
        let b = state.memory.batch();
        let d = self.cfg.d_model;
        if tokens.len() != b {
            return Err(Error::Shape(format!(
                "seq2seq step: {} tokens for a batch of {b}",
                tokens.len()
            )));
        }
        let pos = state.pos;
        if pos >= state.capacity {
            return Err(Error::ContextFull {
                needed: pos + 1,
                capacity: state.capacity,
            });
        }
        let cap = state.capacity;
        let src_len = state.memory.output.len();
        self.tgt_embedding.lookup_into(tokens, &mut state.x)?;
        for row in state.x.chunks_exact_mut(d) {
            self.tgt_pe.add_into(row, 1, pos)?;
        }
        for (l, layer) in self.decoder.iter().enumerate() {
            // Causal self-attention over the cache (positions 0..=pos).
            let core = layer.self_attn.core();
            layer.norm1.forward_into(&state.x, &mut state.h)?;
            core.q_proj().forward_into(&state.h, b, &mut state.q)?;
            core.k_proj().forward_into(&state.h, b, &mut state.k)?;
            core.v_proj().forward_into(&state.h, b, &mut state.v)?;
            let (ck, cv) = (&mut state.self_k[l], &mut state.self_v[l]);
            for i in 0..b {
                let at = (i * cap + pos) * d;
                ck[at..at + d].copy_from_slice(&state.k[i * d..(i + 1) * d]);
                cv[at..at + d].copy_from_slice(&state.v[i * d..(i + 1) * d]);
            }
            for i in 0..b {
                let base = i * cap * d;
                let kv: KvView<'_> = core.key_view(&ck[base..base + (pos + 1) * d], pos + 1);
                let vv = core.value_view(&cv[base..base + (pos + 1) * d], pos + 1);
                let qv = core.query_view(&state.q[i * d..(i + 1) * d], 1);
                core.attend(
                    &qv,
                    &kv,
                    &vv,
                    &AttentionMask::causal(pos),
                    &mut state.ctx[i * d..(i + 1) * d],
                )?;
            }
            core.project_out(&state.ctx, b, &mut state.delta)?;
            add(&mut state.x, &state.delta)?;

            // Cross-attention over the kept encoder K, V, masked by the source padding.
            let core = layer.cross_attn.core();
            layer.norm2.forward_into(&state.x, &mut state.h)?;
            core.q_proj().forward_into(&state.h, b, &mut state.q)?;
            for i in 0..b {
                let span = i * src_len * d..(i + 1) * src_len * d;
                let kv = core.key_view(&state.memory.cross_k[l][span.clone()], src_len);
                let vv = core.value_view(&state.memory.cross_v[l][span], src_len);
                let qv = core.query_view(&state.q[i * d..(i + 1) * d], 1);
                let keep = state.memory.padding.keep(i).ok_or_else(|| {
                    Error::Shape(format!("the source padding has no sequence {i}"))
                })?;
                let mask = AttentionMask::none().with_key_keep(keep);
                core.attend(&qv, &kv, &vv, &mask, &mut state.ctx[i * d..(i + 1) * d])?;
            }
            core.project_out(&state.ctx, b, &mut state.delta)?;
            add(&mut state.x, &state.delta)?;

            layer.norm3.forward_into(&state.x, &mut state.h)?;
            layer
                .ffn
                .forward_into(&state.h, b, &mut state.ffn_hidden, &mut state.delta)?;
            add(&mut state.x, &state.delta)?;
        }
        self.generator
            .forward_into(&state.x, b, &mut state.logits)?;
        state.pos += 1;
        Ok(())
    }

    /// Greedy decoding of every source in `src`, batched: starts each target with `bos`,
    /// feeds back the most likely token, and stops a sequence at `eos` (not included in the
    /// result) or after `max_len` tokens. Returns one token list per source.
    ///
    /// Errors: [`Error::TokenOutOfRange`] when `bos` or `eos` lie outside the target
    /// vocabulary, [`Error::ContextFull`] when `max_len > max_tgt_len`,
    /// [`Error::NonFiniteLogits`] when a step's logits are not all finite (broken weights).
    pub fn greedy(
        &self,
        src: &TokenBatch<'_>,
        bos: u32,
        eos: u32,
        max_len: usize,
    ) -> Result<Vec<Vec<u32>>> {
        for id in [bos, eos] {
            if id as usize >= self.cfg.tgt_vocab {
                return Err(Error::TokenOutOfRange {
                    id,
                    vocab: self.cfg.tgt_vocab,
                });
            }
        }
        // Checked here too, so that `max_len` 0 does not skip what the encoder would refuse.
        if let Some(&id) = src
            .ids()
            .iter()
            .find(|&&id| id as usize >= self.cfg.src_vocab)
        {
            return Err(Error::TokenOutOfRange {
                id,
                vocab: self.cfg.src_vocab,
            });
        }
        let b = src.batch();
        let mut out = vec![Vec::new(); b];
        if max_len == 0 {
            return Ok(out);
        }
        let memory = self.encode(src)?;
        let mut state = self.start(memory, max_len)?;
        let mut tokens = vec![bos; b];
        let mut done = vec![false; b];
        let vocab = self.cfg.tgt_vocab;
        for pos in 0..max_len {
            let logits = self.step(&mut state, &tokens)?;
            for i in 0..b {
                let row = &logits[i * vocab..(i + 1) * vocab];
                // Broken weights (NaN, ±inf) would otherwise decode as token 0 forever.
                if let Some(j) = row.iter().position(|v| !v.is_finite()) {
                    return Err(Error::NonFiniteLogits {
                        sequence: Some(i),
                        position: Some(pos),
                        token: j,
                        value: row[j],
                    });
                }
                let next = qkv_kernels::activation::argmax(row) as u32;
                tokens[i] = next;
                if !done[i] {
                    if next == eos {
                        done[i] = true;
                    } else {
                        out[i].push(next);
                    }
                }
            }
            if done.iter().all(|&x| x) {
                break;
            }
        }
        Ok(out)
    }
}
