//! The forward pass of a [`Decoder`]: one sequence ([`Decoder::forward`],
//! [`Decoder::forward_all`]) or many at once ([`Decoder::forward_batch`]), through the same
//! layers.

use super::lora::{add_lora, Proj, ScaledLora, Target};
use super::moe::Ffn;
use super::{Activation, Block, Decoder, DecoderState, KvCache, Scratch};
use crate::error::{Error, Result};
use qkv_kernels::activation::{add_inplace, geglu_tanh, softcap_inplace, swiglu};
use qkv_kernels::{attention_many, linear_many, AttentionCall, AttentionMask, QueryView};

/// One sequence's share of a [`Decoder::forward_batch`] pass: `tokens` at absolute
/// positions `pos0..pos0 + tokens.len()`, appended to `cache` (positions before `pos0` must
/// be in it; later ones are forgotten first), with the logits of its last `logits` tokens.
#[derive(Debug)]
pub struct Segment<'a> {
    /// The sequence's KV cache.
    pub cache: &'a mut KvCache,
    /// The tokens to run: a prompt chunk, or the one token of a decode step.
    pub tokens: &'a [u32],
    /// The absolute position of `tokens[0]`.
    pub pos0: usize,
    /// How many of the last tokens' logits to write into the pass's logits buffer (in
    /// segment order, a row per token): 0 for a prompt chunk that predicts nothing yet, 1
    /// for a decode step, more for a pass that verifies drafted tokens. At most
    /// `tokens.len()`.
    pub logits: usize,
    /// The LoRA adapters applied to this sequence's rows, each at its scale (`&[]`: none,
    /// the base model's bits). See [`lora`](super::lora).
    pub lora: &'a [ScaledLora],
}

/// Each segment's rows of the pass, with its adapters.
fn token_groups<'s>(
    segments: &'s [Segment<'_>],
) -> impl Iterator<Item = (usize, &'s [ScaledLora])> + Clone {
    segments.iter().map(|g| (g.tokens.len(), g.lora))
}

impl Decoder {
    /// Runs `tokens` at absolute positions `pos0..pos0 + tokens.len()`, appending their keys
    /// and values to `state`'s cache, and writes the logits of the last token into `logits`
    /// (length `vocab`) when given. Positions before `pos0` must already be in the cache:
    /// `pos0` may be at most the number of positions the state holds, and running at an
    /// earlier position discards the later ones (how a session rewinds).
    ///
    /// Validates everything before touching the cache: token ids ([`Error::TokenOutOfRange`]),
    /// capacity ([`Error::ContextFull`]), the logits length, `pos0`, and that `state` was made
    /// by this very model ([`Error::ForeignState`]; another one's cache, even of the same
    /// shape, holds other keys). Prompts longer than the state's chunk run as several matrix
    /// passes.
    pub fn forward(
        &self,
        state: &mut DecoderState,
        tokens: &[u32],
        pos0: usize,
        logits: Option<&mut [f32]>,
    ) -> Result<()> {
        match logits {
            Some(l) => self.run(state, tokens, pos0, 1, l),
            None => self.run(state, tokens, pos0, 0, &mut []),
        }
    }

    /// As [`forward`](Self::forward), but writes the logits of the last `rows` tokens:
    /// `logits[i·vocab..(i+1)·vocab]` are those after `tokens[tokens.len() - rows + i]`. A
    /// pass that verifies drafted tokens asks for those after the last accepted token and
    /// after each draft. Errors as `forward` does, and with [`Error::Shape`] when `rows` is
    /// 0 or more than `tokens.len()`, or `logits` is not `rows·vocab` long.
    pub fn forward_tail(
        &self,
        state: &mut DecoderState,
        tokens: &[u32],
        pos0: usize,
        rows: usize,
        logits: &mut [f32],
    ) -> Result<()> {
        if rows == 0 {
            return Err(Error::Shape(
                "decoder forward_tail: 0 rows of logits asked for".into(),
            ));
        }
        self.run(state, tokens, pos0, rows, logits)
    }

    /// As [`forward`](Self::forward), but writes the logits of every token:
    /// `logits[i·vocab..(i+1)·vocab]` are those after `tokens[i]` (what perplexity scores).
    /// The output head then runs as one matrix product per chunk. Errors as `forward` does,
    /// and with [`Error::Shape`] when `logits` is not `tokens.len()·vocab` long.
    pub fn forward_all(
        &self,
        state: &mut DecoderState,
        tokens: &[u32],
        pos0: usize,
        logits: &mut [f32],
    ) -> Result<()> {
        self.run(state, tokens, pos0, tokens.len(), logits)
    }

    /// Runs `tokens` from position 0 of `state` (whatever its cache held is forgotten) and
    /// writes every token's final hidden state, after the final norm (the vector the output
    /// head multiplies), into `out`: row `i` (`dim` wide) is `tokens[i]`'s. Embeddings from
    /// a generative model pool these rows. Errors as [`forward`](Self::forward) does, and
    /// with [`Error::Shape`] when `out` is not `tokens.len()·dim` long.
    pub fn forward_hidden(
        &self,
        state: &mut DecoderState,
        tokens: &[u32],
        out: &mut [f32],
    ) -> Result<()> {
        let d = self.config.dim;
        let DecoderState {
            cache,
            scratch,
            lora,
        } = state;
        self.check_segment(cache, tokens, 0)?;
        self.check_lora(lora)?;
        if out.len() != tokens.len().saturating_mul(d) {
            return Err(Error::Shape(format!(
                "hidden-state buffer holds {}, {} tokens of width {d} need {}",
                out.len(),
                tokens.len(),
                tokens.len().saturating_mul(d)
            )));
        }
        cache.filled = 0;
        let mut pos = 0;
        for chunk in tokens.chunks(scratch.rows) {
            let mut seg = [Segment {
                cache: &mut *cache,
                tokens: chunk,
                pos0: pos,
                logits: 0,
                lora,
            }];
            self.layers(&mut seg, scratch)?;
            let rows = &mut out[pos * d..(pos + chunk.len()) * d];
            rows.copy_from_slice(&scratch.x[..chunk.len() * d]);
            self.final_norm.forward_inplace(rows)?;
            pos += chunk.len();
        }
        Ok(())
    }

    /// The pass behind `forward`, `forward_tail` and `forward_all`: `tokens` in chunks of the
    /// scratch's rows, and the logits of the last `wanted` tokens into `logits`.
    fn run(
        &self,
        state: &mut DecoderState,
        tokens: &[u32],
        pos0: usize,
        wanted: usize,
        logits: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let DecoderState {
            cache,
            scratch,
            lora,
        } = state;
        self.check_segment(cache, tokens, pos0)?;
        self.check_lora(lora)?;
        check_wanted(wanted, tokens.len())?;
        let need = wanted.saturating_mul(c.vocab);
        if logits.len() != need {
            return Err(Error::Shape(format!(
                "logits buffer holds {}, {wanted} tokens of a {}-token vocabulary need {need}",
                logits.len(),
                c.vocab
            )));
        }
        // The first token whose logits are wanted, counted from tokens[0].
        let first = tokens.len() - wanted;
        // From here on, positions past pos0 no longer match the tokens before them.
        cache.filled = pos0;
        let mut pos = pos0;
        for chunk in tokens.chunks(scratch.rows) {
            let mut seg = [Segment {
                cache: &mut *cache,
                tokens: chunk,
                pos0: pos,
                logits: 0,
                lora,
            }];
            self.layers(&mut seg, scratch)?;
            // This chunk's share of the wanted tokens, as rows of the chunk.
            let (start, end) = (pos - pos0, pos - pos0 + chunk.len());
            let from = first.max(start);
            if from < end {
                let out = &mut logits[(from - first) * c.vocab..(end - first) * c.vocab];
                let rows = end - from;
                let groups = std::iter::once((rows, &lora[..]));
                self.head(scratch, from - start..end - start, rows, groups, out)?;
            }
            pos += chunk.len();
        }
        Ok(())
    }

    /// Runs many sequences' tokens as one pass: the rows of every segment go through each
    /// weight matrix together (so a step of `B` decoding sequences reads each weight once,
    /// not `B` times), while attention runs per segment over its own cache at its own
    /// positions. `logits` receives, in segment order, one row of `vocab` logits for each of
    /// the last [`Segment::logits`] tokens of every segment, computed by one product with the
    /// output head.
    ///
    /// Each segment is checked as [`forward`](Self::forward) checks its arguments, all before
    /// anything runs; the total rows must fit `scratch` ([`Error::Shape`]), and the same cache
    /// may not appear twice (the borrow checker sees to that).
    ///
    /// ```
    /// use qkv::models::decoder::{Decoder, DecoderConfig, Segment, WeightLayout};
    /// use qkv::weights::FloatType;
    /// let config = DecoderConfig::llama(64, 2, 4, 2, 128, 100, 256, WeightLayout::Gguf);
    /// let model = Decoder::synthetic(config, 7, FloatType::F32)?;
    /// let (mut a, mut b) = (model.new_cache(64, FloatType::F32)?, model.new_cache(64, FloatType::F32)?);
    /// let mut scratch = model.new_scratch(16)?;
    /// let mut logits = vec![0.0; 2 * 100];
    /// // A prompt of 3 tokens for `a` and of 5 for `b`, in one pass; then one step each.
    /// model.forward_batch(&mut [
    ///     Segment { cache: &mut a, tokens: &[1, 2, 3], pos0: 0, logits: 1, lora: &[] },
    ///     Segment { cache: &mut b, tokens: &[4, 5, 6, 7, 8], pos0: 0, logits: 1, lora: &[] },
    /// ], &mut scratch, &mut logits)?;
    /// model.forward_batch(&mut [
    ///     Segment { cache: &mut a, tokens: &[9], pos0: 3, logits: 1, lora: &[] },
    ///     Segment { cache: &mut b, tokens: &[9], pos0: 5, logits: 1, lora: &[] },
    /// ], &mut scratch, &mut logits)?;
    /// assert_eq!((a.filled(), b.filled()), (4, 6));
    /// # Ok::<(), qkv::Error>(())
    /// ```
    pub fn forward_batch(
        &self,
        segments: &mut [Segment<'_>],
        scratch: &mut Scratch,
        logits: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let (mut rows, mut wanted) = (0usize, 0usize);
        for seg in segments.iter() {
            self.check_segment(seg.cache, seg.tokens, seg.pos0)?;
            self.check_lora(seg.lora)?;
            check_wanted(seg.logits, seg.tokens.len())?;
            rows += seg.tokens.len();
            wanted += seg.logits;
        }
        if rows > scratch.rows {
            return Err(Error::Shape(format!(
                "a batched pass of {rows} positions, the scratch holds {}",
                scratch.rows
            )));
        }
        if logits.len() != wanted * c.vocab {
            return Err(Error::Shape(format!(
                "logits buffer holds {}, {wanted} rows of logits asked for, of a {}-token \
                 vocabulary, need {}",
                logits.len(),
                c.vocab,
                wanted * c.vocab
            )));
        }
        if segments.is_empty() {
            return Ok(());
        }
        for seg in segments.iter_mut() {
            seg.cache.filled = seg.pos0;
        }
        self.layers(segments, scratch)?;
        if wanted > 0 {
            let tail_rows = segments
                .iter()
                .scan(0, |end, g| {
                    *end += g.tokens.len();
                    Some(*end - g.logits..*end)
                })
                .flatten();
            let groups = segments.iter().map(|g| (g.logits, g.lora));
            self.head(scratch, tail_rows, wanted, groups, logits)?;
        }
        Ok(())
    }

    /// Checks one sequence's tokens against its cache and this model, before anything runs:
    /// token ids ([`Error::TokenOutOfRange`]), capacity ([`Error::ContextFull`]), `pos0`, and
    /// that the cache was made by this very model ([`Error::ForeignState`]; another one's
    /// cache, even of the same shape, holds other keys).
    fn check_segment(&self, cache: &KvCache, tokens: &[u32], pos0: usize) -> Result<()> {
        let c = &self.config;
        if tokens.is_empty() {
            return Err(Error::Shape("decoder forward: no tokens".into()));
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= c.vocab) {
            return Err(Error::TokenOutOfRange { id, vocab: c.vocab });
        }
        let needed = pos0.saturating_add(tokens.len());
        if needed > cache.capacity {
            return Err(Error::ContextFull {
                needed,
                capacity: cache.capacity,
            });
        }
        if cache.model != self.id {
            return Err(Error::ForeignState {
                state: "KV cache",
                made_by: cache.model,
                used_with: self.id,
            });
        }
        if pos0 > cache.filled {
            return Err(Error::Shape(format!(
                "decoder forward at position {pos0}, but the cache holds only positions 0..{}",
                cache.filled
            )));
        }
        Ok(())
    }

    /// The blocks over the segments' tokens (already checked, at most `s.rows` in all), one
    /// row each in segment order; appends their keys and values to the segments' caches and
    /// leaves the final residual stream in `s.x`.
    fn layers(&self, segments: &mut [Segment<'_>], s: &mut Scratch) -> Result<()> {
        let d = self.config.dim;
        let t: usize = segments.iter().map(|g| g.tokens.len()).sum();
        let mut row = 0;
        for seg in segments.iter() {
            let n = seg.tokens.len();
            self.embed(seg.tokens, &mut s.x[row * d..(row + n) * d])?;
            row += n;
        }
        for (l, b) in self.blocks.iter().enumerate() {
            self.attention_block(l, b, segments, s, t)?;
            self.ffn_block(l, b, segments, s, t)?;
        }
        for seg in segments.iter_mut() {
            seg.cache.filled = seg.pos0 + seg.tokens.len();
        }
        Ok(())
    }

    /// Layer `l`'s attention over the `t` rows of `s.x`: the normed rows projected to queries,
    /// keys and values, rotated, the keys and values written to each segment's cache at its
    /// positions, every segment attending over its own cache, and the heads' output projected
    /// back and added to the residual stream.
    fn attention_block(
        &self,
        l: usize,
        b: &Block,
        segments: &mut [Segment<'_>],
        s: &mut Scratch,
        t: usize,
    ) -> Result<()> {
        let c = &self.config;
        let (d, qd, kvd) = (c.dim, c.q_dim(), c.kv_dim());
        let x = &mut s.x[..t * d];
        let xn = &mut s.xn[..t * d];
        let q = &mut s.q[..t * qd];
        let k = &mut s.k[..t * kvd];
        let v = &mut s.v[..t * kvd];
        let att = &mut s.att[..t * qd];
        b.attn_norm.forward_into(x, xn)?;
        // Q, K and V as one group: one hand-off to the threads.
        linear_many(
            xn,
            t,
            d,
            &mut [b.wq.projection(q), b.wk.projection(k), b.wv.projection(v)],
        )?;
        let lora = &mut s.lora;
        for (p, y, n) in [
            (Proj::Q, &mut *q, qd),
            (Proj::K, &mut *k, kvd),
            (Proj::V, &mut *v, kvd),
        ] {
            add_lora(
                Target::Layer(l, p),
                token_groups(segments),
                xn,
                d,
                y,
                n,
                lora,
            )?;
        }
        if let (Some(qn), Some(kn)) = (&b.q_norm, &b.k_norm) {
            qn.forward_inplace(q)?;
            kn.forward_inplace(k)?;
        }
        let window = c.windows[l];
        let (rope, rope_config) = match (window, &self.rope_local, &c.rope_local) {
            (Some(_), Some(local), Some(config)) => (local, config),
            _ => (&self.rope, &c.rope),
        };
        // YaRN multiplies cos and sin, so the rotated queries and keys, by its attention
        // factor: their dot products by its square.
        let factor = rope_config.scaling.attention_factor();
        let attn_scale = c.attn_scale * factor * factor;
        let mut row = 0;
        for seg in segments.iter_mut() {
            let (n, pos0) = (seg.tokens.len(), seg.pos0);
            let rows = row..row + n;
            row += n;
            let q = &mut q[rows.start * qd..rows.end * qd];
            let k = &mut k[rows.start * kvd..rows.end * kvd];
            let v = &v[rows.start * kvd..rows.end * kvd];
            rope.apply(q, n, c.heads, pos0, c.rope_style)?;
            rope.apply(k, n, c.kv_heads, pos0, c.rope_style)?;
            seg.cache.keys.write(l, pos0, k)?;
            seg.cache.values.write(l, pos0, v)?;
        }
        // Every segment's attention over its own cache, in one pass over the threads (each
        // output as the segment's call alone would give it). The calls' vector is kept
        // between layers and passes, empty, so that a step allocates nothing.
        let mut calls = crate::alloc::recycle(std::mem::take(&mut s.calls));
        let (mut q_rest, mut att_rest) = (&q[..], &mut att[..]);
        for seg in segments.iter() {
            let (n, pos0) = (seg.tokens.len(), seg.pos0);
            // Each row attends in a call of its own, as the decode step at its position does
            // (the kernel's several-query path sums in another order than its one-query
            // path), so that a row's bits never depend on how its sequence was cut into
            // passes: a prompt read in chunks of any size, a cached prefix, a verify pass of
            // drafted tokens. The calls all run in one pass over the threads.
            for at in pos0..pos0 + n {
                let (q_row, q_next) = q_rest.split_at(qd);
                let (att_row, att_next) = std::mem::take(&mut att_rest).split_at_mut(qd);
                (q_rest, att_rest) = (q_next, att_next);
                let mut mask = match window {
                    Some(w) => AttentionMask::sliding(at, w),
                    None => AttentionMask::causal(at),
                };
                mask.softcap = c.attn_softcap;
                calls.push(AttentionCall {
                    q: QueryView::contiguous(q_row, 1, c.heads, c.head_dim),
                    k: seg.cache.keys.view(l, at + 1),
                    v: seg.cache.values.view(l, at + 1),
                    mask,
                    scale: Some(attn_scale),
                    out: att_row,
                });
            }
        }
        let done = attention_many(&mut calls);
        s.calls = crate::alloc::recycle(calls);
        done?;
        b.wo.forward_into(att, t, xn)?;
        let groups = token_groups(segments);
        add_lora(
            Target::Layer(l, Proj::O),
            groups,
            att,
            qd,
            xn,
            d,
            &mut s.lora,
        )?;
        if let Some(n) = &b.attn_post_norm {
            n.forward_inplace(xn)?;
        }
        add_inplace(x, xn)?;
        Ok(())
    }

    /// A block's feed-forward over the `t` rows of `s.x`: dense (gated, SiLU or GELU) or a
    /// mixture of experts, its output added to the residual stream.
    fn ffn_block(
        &self,
        l: usize,
        b: &Block,
        segments: &[Segment<'_>],
        s: &mut Scratch,
        t: usize,
    ) -> Result<()> {
        let c = &self.config;
        let (d, ff) = (c.dim, c.ffn_dim);
        let x = &mut s.x[..t * d];
        let xn = &mut s.xn[..t * d];
        b.ffn_norm.forward_into(x, xn)?;
        match (&b.ffn, &c.moe, s.moe.as_mut()) {
            (Ffn::Dense(f), _, _) => {
                let gate = &mut s.gate[..t * ff];
                let up = &mut s.up[..t * ff];
                let hidden = &mut s.hidden[..t * ff];
                linear_many(
                    xn,
                    t,
                    d,
                    &mut [f.gate.projection(gate), f.up.projection(up)],
                )?;
                let lora = &mut s.lora;
                for (p, y) in [(Proj::Gate, &mut *gate), (Proj::Up, &mut *up)] {
                    add_lora(
                        Target::Layer(l, p),
                        token_groups(segments),
                        xn,
                        d,
                        y,
                        ff,
                        lora,
                    )?;
                }
                match c.activation {
                    Activation::Silu => swiglu(hidden, gate, up)?,
                    Activation::GeluTanh => geglu_tanh(hidden, gate, up)?,
                }
                f.down.forward_into(hidden, t, xn)?;
                let groups = token_groups(segments);
                add_lora(
                    Target::Layer(l, Proj::Down),
                    groups,
                    hidden,
                    ff,
                    xn,
                    d,
                    &mut s.lora,
                )?;
            }
            (Ffn::Moe(block), Some(m), Some(ms)) => {
                let ffn = [&mut s.gate[..], &mut s.up[..], &mut s.hidden[..]];
                block.forward(m, xn, t, d, ms, ffn)?;
                xn.copy_from_slice(&ms.acc[..t * d]);
            }
            _ => {
                return Err(Error::Shape(
                    "a mixture-of-experts layer without its scratch".into(),
                ))
            }
        }
        if let Some(n) = &b.ffn_post_norm {
            n.forward_inplace(xn)?;
        }
        add_inplace(x, xn)?;
        Ok(())
    }

    /// Final norm and output head for `count` rows of `s.x` (their indices from `rows`,
    /// gathered into `s.xn`), into `logits` (`count·vocab`); `groups` are runs of those rows
    /// with their adapters.
    fn head<'g>(
        &self,
        s: &mut Scratch,
        rows: impl Iterator<Item = usize>,
        count: usize,
        groups: impl Iterator<Item = (usize, &'g [ScaledLora])> + Clone,
        logits: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let d = c.dim;
        for (i, r) in rows.enumerate().take(count) {
            s.xn[i * d..(i + 1) * d].copy_from_slice(&s.x[r * d..(r + 1) * d]);
        }
        let xn = &mut s.xn[..count * d];
        self.final_norm.forward_inplace(xn)?;
        let w = self.output.as_ref().unwrap_or(&self.embedding);
        qkv_kernels::linear(logits, xn, w.weights(), None, count, d, c.vocab)?;
        add_lora(Target::Output, groups, xn, d, logits, c.vocab, &mut s.lora)?;
        if let Some(cap) = c.final_softcap {
            softcap_inplace(logits, cap);
        }
        Ok(())
    }

    /// Looks up the embedding rows of `tokens` (already validated) into `out`, scaled when
    /// the configuration says so.
    fn embed(&self, tokens: &[u32], out: &mut [f32]) -> Result<()> {
        let d = self.config.dim;
        for (&id, row) in tokens.iter().zip(out.chunks_exact_mut(d)) {
            self.embedding.rows_to_f32(id as usize, row)?;
        }
        if let Some(scale) = self.config.embed_scale {
            out.iter_mut().for_each(|x| *x *= scale);
        }
        Ok(())
    }
}

/// [`Error::Shape`] unless the logits of the last `wanted` of `tokens` tokens can be had.
fn check_wanted(wanted: usize, tokens: usize) -> Result<()> {
    if wanted > tokens {
        return Err(Error::Shape(format!(
            "logits of the last {wanted} tokens asked for, of a pass of {tokens}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod hidden_tests {
    use super::super::{DecoderConfig, WeightLayout};
    use super::*;
    use crate::weights::FloatType;

    /// The hidden states, through the output head, are the logits `forward_all` gives; in
    /// chunks smaller than the prompt too.
    #[test]
    fn hidden_states_times_the_head_are_the_logits() {
        let config = DecoderConfig::llama(64, 2, 4, 2, 128, 100, 256, WeightLayout::Gguf);
        let model = Decoder::synthetic(config, 11, FloatType::F32).unwrap();
        let tokens = [3u32, 14, 15, 92, 65, 35, 89];
        let (d, vocab) = (64, 100);
        let mut state = model.new_state(32, FloatType::F32, 3).unwrap();
        let mut hidden = vec![0.0; tokens.len() * d];
        model
            .forward_hidden(&mut state, &tokens, &mut hidden)
            .unwrap();
        let mut state2 = model.new_state(32, FloatType::F32, 3).unwrap();
        let mut want = vec![0.0; tokens.len() * vocab];
        model
            .forward_all(&mut state2, &tokens, 0, &mut want)
            .unwrap();
        let w = model.output.as_ref().unwrap_or(&model.embedding);
        let mut got = vec![0.0; tokens.len() * vocab];
        qkv_kernels::linear(&mut got, &hidden, w.weights(), None, tokens.len(), d, vocab).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-4, "{g} vs {w}");
        }
        // Running again forgets the first run; a wrong buffer is a typed error.
        let mut again = vec![0.0; tokens.len() * d];
        model
            .forward_hidden(&mut state, &tokens, &mut again)
            .unwrap();
        assert_eq!(hidden, again);
        assert!(matches!(
            model.forward_hidden(&mut state, &tokens, &mut again[1..]),
            Err(Error::Shape(_))
        ));
    }
}
