//! The feed-forward block of a decoder layer: one gated MLP, or a mixture of experts.
//!
//! A mixture of experts ([`Moe`]) routes each token: `p = softmax(W_router · x)` over the
//! `E` experts, the `k` most probable are kept (their probabilities divided by their sum
//! when the family renormalises), and the block's output is `Σ pᵢ · expertᵢ(x)` over them,
//! each expert a SwiGLU of its own, plus `sigmoid(w_g · x) · shared(x)` where there is a
//! shared expert (Qwen2-MoE).
//!
//! Experts are matrices of their own, views of the rows of the file's 3-D tensors (GGUF's
//! `ffn_{gate,up,down}_exps`) or the per-expert tensors of a Hugging Face directory, left
//! mapped and in their stored format. Only the chosen experts are read: a decode step runs
//! `k` of `E`; a pass of many rows groups them by expert, so each expert that any row chose
//! runs once, as one product over exactly those rows (gathered, then scattered back with
//! their weights), and its weights are read once per pass.

use super::config::{DecoderConfig, Family, Moe, WeightLayout};
use crate::error::{Error, Result};
use crate::nn::Linear;
use crate::weights::{Tensor, TensorSource};
use qkv_kernels::activation::{softmax_inplace, swiglu};
use qkv_kernels::{linear_many, Projection, Weights};

/// `down · (act(gate · x) ⊙ up · x)`: a dense feed-forward block, or one expert.
pub(super) struct GatedMlp {
    pub(super) gate: Linear,
    pub(super) up: Linear,
    pub(super) down: Linear,
}

impl GatedMlp {
    fn matrices(&self) -> [&Tensor; 3] {
        [self.gate.weight(), self.up.weight(), self.down.weight()]
    }

    fn bytes(&self) -> usize {
        self.matrices().iter().map(|t| t.bytes()).sum()
    }
}

/// A layer's mixture of experts.
pub(super) struct MoeBlock {
    /// `[experts, dim]`.
    router: Linear,
    experts: Vec<GatedMlp>,
    /// The shared expert and its gate row `[dim]` (Qwen2-MoE).
    shared: Option<(GatedMlp, Vec<f32>)>,
}

/// A layer's feed-forward block.
pub(super) enum Ffn {
    Dense(GatedMlp),
    Moe(MoeBlock),
}

impl Ffn {
    /// Every weight matrix of the block.
    pub(super) fn matrices(&self) -> Vec<&Tensor> {
        match self {
            Ffn::Dense(m) => m.matrices().to_vec(),
            Ffn::Moe(b) => {
                let mut all = vec![b.router.weight()];
                for e in b.experts.iter().chain(b.shared.iter().map(|(s, _)| s)) {
                    all.extend(e.matrices());
                }
                all
            }
        }
    }

    /// Bytes of matrices one token reads on average: the router, `used` experts' share of
    /// all experts, and the shared expert.
    pub(super) fn step_bytes(&self, moe: Option<&Moe>) -> usize {
        match (self, moe) {
            (Ffn::Moe(b), Some(m)) => {
                let experts: usize = b.experts.iter().map(GatedMlp::bytes).sum();
                b.router.weight().bytes()
                    + experts / m.experts.max(1) * m.used
                    + b.shared.as_ref().map_or(0, |(s, _)| s.bytes())
            }
            _ => self.matrices().iter().map(|t| t.bytes()).sum(),
        }
    }

    /// Weight elements, the shared expert's gate included.
    pub(super) fn parameters(&self) -> usize {
        let gate = match self {
            Ffn::Moe(MoeBlock {
                shared: Some((_, g)),
                ..
            }) => g.len(),
            _ => 0,
        };
        gate + self.matrices().iter().map(|t| t.numel()).sum::<usize>()
    }
}

/// Loads layer `l`'s mixture of experts from `source`, each matrix passed through `widen`.
pub(super) fn load_moe(
    c: &DecoderConfig,
    m: &Moe,
    l: usize,
    source: &dyn TensorSource,
    widen: &dyn Fn(Tensor) -> Result<Tensor>,
) -> Result<MoeBlock> {
    let d = c.dim;
    let tensor = |name: &str, shape: &[usize]| -> Result<Tensor> {
        let t = source.tensor(name)?;
        t.expect_shape(shape)?;
        Ok(t)
    };
    let linear = |t: Tensor| Linear::from_tensors(widen(t)?, None);
    let mlp = |gate: Tensor, up: Tensor, down: Tensor| -> Result<GatedMlp> {
        Ok(GatedMlp {
            gate: linear(gate)?,
            up: linear(up)?,
            down: linear(down)?,
        })
    };
    let (e, ff) = (m.experts, m.expert_ffn);
    // The shared expert's gate: one row, stored [1, dim] or [dim].
    let gate_row = |name: &str| -> Result<Vec<f32>> {
        let t = source.tensor(name)?;
        if t.numel() != d || !matches!(t.shape(), [1, _] | [_]) {
            return Err(Error::TensorShape {
                name: name.to_owned(),
                expected: vec![1, d],
                actual: t.shape().to_vec(),
            });
        }
        t.to_f32_vec()
    };
    match c.layout {
        WeightLayout::Gguf => {
            let n = |part: &str| format!("blk.{l}.{part}.weight");
            let router = linear(tensor(&n("ffn_gate_inp"), &[e, d])?)?;
            let gates = tensor(&n("ffn_gate_exps"), &[e, ff, d])?.split_outer()?;
            let ups = tensor(&n("ffn_up_exps"), &[e, ff, d])?.split_outer()?;
            let downs = tensor(&n("ffn_down_exps"), &[e, d, ff])?.split_outer()?;
            let experts = gates
                .into_iter()
                .zip(ups)
                .zip(downs)
                .map(|((g, u), dn)| mlp(g, u, dn))
                .collect::<Result<Vec<_>>>()?;
            let shared = match m.shared_ffn {
                None => None,
                Some(sf) => Some((
                    mlp(
                        tensor(&n("ffn_gate_shexp"), &[sf, d])?,
                        tensor(&n("ffn_up_shexp"), &[sf, d])?,
                        tensor(&n("ffn_down_shexp"), &[d, sf])?,
                    )?,
                    gate_row(&n("ffn_gate_inp_shexp"))?,
                )),
            };
            Ok(MoeBlock {
                router,
                experts,
                shared,
            })
        }
        WeightLayout::HuggingFace => {
            let layer = format!("model.layers.{l}");
            // Mixtral's files name the block `block_sparse_moe` and its experts' matrices
            // w1 (gate), w3 (up), w2 (down); Qwen's (and transformers 5's) name it `mlp`.
            let mixtral = c.family == Family::Llama
                && source.contains(&format!("{layer}.block_sparse_moe.gate.weight"));
            let block = if mixtral {
                format!("{layer}.block_sparse_moe")
            } else {
                format!("{layer}.mlp")
            };
            let router = linear(tensor(&format!("{block}.gate.weight"), &[e, d])?)?;
            let fused = format!("{block}.experts.gate_up_proj");
            let experts = if source.contains(&fused) {
                // transformers 5's own layout: [E, 2·ff, dim] and [E, dim, ff].
                let gate_up = tensor(&fused, &[e, 2 * ff, d])?.split_outer()?;
                let downs =
                    tensor(&format!("{block}.experts.down_proj"), &[e, d, ff])?.split_outer()?;
                gate_up
                    .into_iter()
                    .zip(downs)
                    .map(|(gu, dn)| {
                        let mut p = gu.split_rows(&[ff, ff])?.into_iter();
                        match (p.next(), p.next()) {
                            (Some(g), Some(u)) => mlp(g, u, dn),
                            _ => Err(Error::Config(format!("{fused}: not two halves"))),
                        }
                    })
                    .collect::<Result<Vec<_>>>()?
            } else {
                let [g, u, dn] = if mixtral {
                    ["w1", "w3", "w2"]
                } else {
                    ["gate_proj", "up_proj", "down_proj"]
                };
                (0..e)
                    .map(|x| {
                        let n = |p: &str| format!("{block}.experts.{x}.{p}.weight");
                        mlp(
                            tensor(&n(g), &[ff, d])?,
                            tensor(&n(u), &[ff, d])?,
                            tensor(&n(dn), &[d, ff])?,
                        )
                    })
                    .collect::<Result<Vec<_>>>()?
            };
            let shared = match m.shared_ffn {
                None => None,
                Some(sf) => {
                    let n = |p: &str| format!("{block}.shared_expert.{p}.weight");
                    Some((
                        mlp(
                            tensor(&n("gate_proj"), &[sf, d])?,
                            tensor(&n("up_proj"), &[sf, d])?,
                            tensor(&n("down_proj"), &[d, sf])?,
                        )?,
                        gate_row(&format!("{block}.shared_expert_gate.weight"))?,
                    ))
                }
            };
            Ok(MoeBlock {
                router,
                experts,
                shared,
            })
        }
    }
}

/// A mixture of experts of pseudo-random matrices from `matrix(name, rows, cols)`.
pub(super) fn synthetic_moe(
    c: &DecoderConfig,
    m: &Moe,
    l: usize,
    matrix: &mut dyn FnMut(String, usize, usize) -> Result<Tensor>,
) -> Result<MoeBlock> {
    let (d, ff) = (c.dim, m.expert_ffn);
    let mut lin = |name: String, rows: usize, cols: usize| -> Result<Linear> {
        Linear::from_tensors(matrix(name, rows, cols)?, None)
    };
    let router = lin(format!("blk.{l}.ffn_gate_inp"), m.experts, d)?;
    let mut experts = Vec::new();
    for x in 0..m.experts {
        experts.push(GatedMlp {
            gate: lin(format!("blk.{l}.ffn_gate_exps[{x}]"), ff, d)?,
            up: lin(format!("blk.{l}.ffn_up_exps[{x}]"), ff, d)?,
            down: lin(format!("blk.{l}.ffn_down_exps[{x}]"), d, ff)?,
        });
    }
    let shared = match m.shared_ffn {
        None => None,
        Some(sf) => Some((
            GatedMlp {
                gate: lin(format!("blk.{l}.ffn_gate_shexp"), sf, d)?,
                up: lin(format!("blk.{l}.ffn_up_shexp"), sf, d)?,
                down: lin(format!("blk.{l}.ffn_down_shexp"), d, sf)?,
            },
            vec![1.0 / d as f32; d],
        )),
    };
    Ok(MoeBlock {
        router,
        experts,
        shared,
    })
}

/// The scratch of a mixture-of-experts block for passes of up to `rows` positions.
pub struct MoeScratch {
    /// Router probabilities, `[rows, experts]`.
    probs: Vec<f32>,
    /// Per row, its `used` experts (ascending) and their weights.
    chosen: Vec<(u32, f32)>,
    /// Where each expert's run starts in `order` (one more than the experts).
    starts: Vec<usize>,
    /// Where the next row of each expert goes while `order` is filled.
    cursor: Vec<usize>,
    /// (row, weight) pairs grouped by expert.
    order: Vec<(u32, f32)>,
    /// The gathered input rows of one expert, `[rows, dim]`.
    xin: Vec<f32>,
    /// One expert's output rows, `[max(rows, used), dim]`.
    out: Vec<f32>,
    /// The block's output, `[rows, dim]`.
    pub(super) acc: Vec<f32>,
}

impl MoeScratch {
    /// Buffers for `rows` positions of `c`'s mixture `m`.
    pub(super) fn new(c: &DecoderConfig, m: &Moe, rows: usize) -> Result<MoeScratch> {
        let what = || format!("the expert scratch of a pass of {rows} positions");
        let z = |dims: &[usize]| super::super::zeroed_for::<f32>(dims, what);
        let pairs = || -> Result<Vec<(u32, f32)>> {
            let n = rows.saturating_mul(m.used);
            let mut v = Vec::new();
            v.try_reserve_exact(n)
                .map_err(|_| Error::AllocationRefused {
                    what: what(),
                    bytes: n.saturating_mul(8),
                })?;
            v.resize(n, (0, 0.0));
            Ok(v)
        };
        Ok(MoeScratch {
            probs: z(&[rows, m.experts])?,
            chosen: pairs()?,
            starts: vec![0; m.experts + 1],
            cursor: vec![0; m.experts],
            order: pairs()?,
            xin: z(&[rows, c.dim])?,
            out: z(&[rows.max(m.used), c.dim])?,
            acc: z(&[rows, c.dim])?,
        })
    }
}

/// Elements of the gate, up and hidden buffers a pass of `rows` positions needs.
pub(super) fn ffn_elems(c: &DecoderConfig, rows: usize) -> Option<usize> {
    match &c.moe {
        None => rows.checked_mul(c.ffn_dim),
        Some(m) => {
            let experts = rows.max(m.used).checked_mul(m.expert_ffn)?;
            let shared = rows.checked_mul(m.shared_ffn.unwrap_or(0))?;
            Some(experts.max(shared))
        }
    }
}

/// Most projections one [`linear_many`] call takes as one group (the kernels' limit).
const GROUP: usize = 8;

impl MoeBlock {
    /// The block over `t` rows of `xn` (`[t, dim]`, normalised), into `s.acc[..t·dim]`.
    /// `gate`, `up` and `hidden` are scratch of [`ffn_elems`] elements.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        m: &Moe,
        xn: &[f32],
        t: usize,
        d: usize,
        s: &mut MoeScratch,
        gate: &mut [f32],
        up: &mut [f32],
        hidden: &mut [f32],
    ) -> Result<()> {
        let (ne, k, ff) = (m.experts, m.used, m.expert_ffn);
        let probs = &mut s.probs[..t * ne];
        self.router.forward_into(xn, t, probs)?;
        let chosen = &mut s.chosen[..t * k];
        for (p, pick) in probs.chunks_exact_mut(ne).zip(chosen.chunks_exact_mut(k)) {
            route(p, pick, m.norm_topk);
        }
        let acc = &mut s.acc[..t * d];
        acc.fill(0.0);
        if t == 1 {
            // One token: every chosen expert reads the same input, so their gate and up
            // projections run as groups of one hand-off each.
            let (gate, up) = (&mut gate[..k * ff], &mut up[..k * ff]);
            let mut gs = gate.chunks_exact_mut(ff);
            let mut us = up.chunks_exact_mut(ff);
            for picks in chosen.chunks(GROUP / 2) {
                let mut group: [Projection<'_, '_>; GROUP] = std::array::from_fn(|_| Projection {
                    w: Weights::F32(&[]),
                    bias: None,
                    n: 0,
                    y: &mut [],
                });
                for (i, &(x, _)) in picks.iter().enumerate() {
                    let e = &self.experts[x as usize];
                    let (g, u) = (gs.next(), us.next());
                    let (Some(g), Some(u)) = (g, u) else {
                        return Err(Error::Shape("expert scratch too small".into()));
                    };
                    group[2 * i] = e.gate.projection(g);
                    group[2 * i + 1] = e.up.projection(u);
                }
                linear_many(xn, 1, d, &mut group[..2 * picks.len()])?;
            }
            let hidden = &mut hidden[..k * ff];
            swiglu(hidden, gate, up)?;
            let out = &mut s.out[..k * d];
            for ((&(x, _), h), o) in chosen
                .iter()
                .zip(hidden.chunks_exact(ff))
                .zip(out.chunks_exact_mut(d))
            {
                self.experts[x as usize].down.forward_into(h, 1, o)?;
            }
            for (&(_, w), o) in chosen.iter().zip(out.chunks_exact(d)) {
                acc.iter_mut().zip(o).for_each(|(a, v)| *a += w * v);
            }
        } else {
            // Group the rows by expert (a counting sort, rows ascending within each expert).
            let starts = &mut s.starts;
            starts.fill(0);
            for &(x, _) in chosen.iter() {
                starts[x as usize + 1] += 1;
            }
            for x in 0..ne {
                starts[x + 1] += starts[x];
            }
            let next = &mut s.cursor;
            next.copy_from_slice(&starts[..ne]);
            let order = &mut s.order[..t * k];
            for (r, pick) in chosen.chunks_exact(k).enumerate() {
                for &(x, w) in pick {
                    order[next[x as usize]] = (r as u32, w);
                    next[x as usize] += 1;
                }
            }
            for (x, expert) in self.experts.iter().enumerate() {
                let rows = &order[starts[x]..starts[x + 1]];
                let n = rows.len();
                if n == 0 {
                    continue;
                }
                let input: &[f32] = if n == t {
                    xn
                } else {
                    let xin = &mut s.xin[..n * d];
                    for (dst, &(r, _)) in xin.chunks_exact_mut(d).zip(rows) {
                        let r = r as usize;
                        dst.copy_from_slice(&xn[r * d..(r + 1) * d]);
                    }
                    xin
                };
                let (g, u, h) = (
                    &mut gate[..n * ff],
                    &mut up[..n * ff],
                    &mut hidden[..n * ff],
                );
                linear_many(
                    input,
                    n,
                    d,
                    &mut [expert.gate.projection(g), expert.up.projection(u)],
                )?;
                swiglu(h, g, u)?;
                let out = &mut s.out[..n * d];
                expert.down.forward_into(h, n, out)?;
                for (o, &(r, w)) in out.chunks_exact(d).zip(rows) {
                    let r = r as usize;
                    acc[r * d..(r + 1) * d]
                        .iter_mut()
                        .zip(o)
                        .for_each(|(a, v)| *a += w * v);
                }
            }
        }
        if let Some((shared, gate_row)) = &self.shared {
            let sf = m.shared_ffn.unwrap_or(0);
            let (g, u, h) = (
                &mut gate[..t * sf],
                &mut up[..t * sf],
                &mut hidden[..t * sf],
            );
            linear_many(
                xn,
                t,
                d,
                &mut [shared.gate.projection(g), shared.up.projection(u)],
            )?;
            swiglu(h, g, u)?;
            let out = &mut s.out[..t * d];
            shared.down.forward_into(h, t, out)?;
            for ((a, o), x) in acc
                .chunks_exact_mut(d)
                .zip(out.chunks_exact(d))
                .zip(xn.chunks_exact(d))
            {
                let logit: f32 = x.iter().zip(gate_row).map(|(a, b)| a * b).sum();
                let g = 1.0 / (1.0 + (-logit).exp());
                a.iter_mut().zip(o).for_each(|(a, v)| *a += g * v);
            }
        }
        Ok(())
    }
}

/// One row's routing: `p` (router logits) becomes softmax probabilities; `pick` receives
/// the `pick.len()` most probable experts (the lower index first among equals) in ascending
/// expert order with their probabilities, divided by their sum when `norm`.
fn route(p: &mut [f32], pick: &mut [(u32, f32)], norm: bool) {
    softmax_inplace(p);
    let k = pick.len();
    for i in 0..k {
        let mut best: Option<usize> = None;
        for (x, &v) in p.iter().enumerate() {
            if pick[..i].iter().any(|&(y, _)| y as usize == x) {
                continue;
            }
            // NaN never wins; a row of NaN (a broken model) still picks distinct experts.
            if best.is_none_or(|b| v > p[b]) {
                best = Some(x);
            }
        }
        let b = best.unwrap_or(i);
        pick[i] = (b as u32, p[b]);
    }
    if norm {
        let sum: f32 = pick.iter().map(|&(_, w)| w).sum();
        pick.iter_mut().for_each(|(_, w)| *w /= sum);
    }
    pick.sort_unstable_by_key(|&(x, _)| x);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::FloatType;

    #[test]
    fn routing_is_softmax_then_top_k_in_expert_order() {
        let mut p = [1.0f32, 3.0, 2.0, 0.0];
        let mut pick = [(0u32, 0.0f32); 2];
        route(&mut p, &mut pick, false);
        let z: f32 = [1.0f32, 3.0, 2.0, 0.0].iter().map(|x| x.exp()).sum();
        assert_eq!([pick[0].0, pick[1].0], [1, 2]);
        assert!((pick[0].1 - 3f32.exp() / z).abs() < 1e-6);
        assert!((pick[1].1 - 2f32.exp() / z).abs() < 1e-6);
        let mut p = [1.0f32, 3.0, 2.0, 0.0];
        route(&mut p, &mut pick, true);
        let e = 1f32.exp();
        assert!((pick[0].1 - e / (e + 1.0)).abs() < 1e-6);
        assert!((pick[1].1 - 1.0 / (e + 1.0)).abs() < 1e-6);
        // Equal probabilities: the lower index first; a NaN row still picks distinct experts.
        let mut p = [0.0f32; 4];
        route(&mut p, &mut pick, true);
        assert_eq!([pick[0].0, pick[1].0], [0, 1]);
        let mut p = [f32::NAN; 4];
        route(&mut p, &mut pick, true);
        assert_ne!(pick[0].0, pick[1].0);
    }

    /// The block, row by row with every expert computed densely, against its grouped pass
    /// (many rows) and its decode pass (one row), with and without a shared expert.
    #[test]
    fn grouped_and_single_row_passes_equal_a_dense_reference() {
        for (shared, norm) in [(None, true), (Some(24), false)] {
            let m = Moe {
                experts: 6,
                used: 3,
                expert_ffn: 20,
                norm_topk: norm,
                shared_ffn: shared,
            };
            let c = DecoderConfig {
                moe: Some(m.clone()),
                ..DecoderConfig::llama(16, 1, 2, 2, 8, 10, 32, WeightLayout::Gguf)
            };
            let mut seed = 11u64;
            let mut matrix = |name: String, rows: usize, cols: usize| -> Result<Tensor> {
                let data = (0..rows * cols)
                    .map(|_| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        ((seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0) / (cols as f32).sqrt()
                    })
                    .collect();
                Tensor::from_f32(&name, vec![rows, cols], data)?.into_dtype(FloatType::F32)
            };
            let block = synthetic_moe(&c, &m, 0, &mut matrix).unwrap();
            let (t, d) = (7, c.dim);
            let xn: Vec<f32> = (0..t * d)
                .map(|i| ((i * 7919) % 23) as f32 / 11.0 - 1.0)
                .collect();
            // Reference: every row alone, every expert run, the chosen ones summed.
            let mut want = vec![0.0f32; t * d];
            for r in 0..t {
                let x = &xn[r * d..(r + 1) * d];
                let mut logits = vec![0.0; m.experts];
                block.router.forward_into(x, 1, &mut logits).unwrap();
                let mut pick = vec![(0, 0.0); m.used];
                route(&mut logits, &mut pick, norm);
                let run = |e: &GatedMlp, ff: usize| {
                    let (mut g, mut u, mut h) = (vec![0.0; ff], vec![0.0; ff], vec![0.0; ff]);
                    e.gate.forward_into(x, 1, &mut g).unwrap();
                    e.up.forward_into(x, 1, &mut u).unwrap();
                    swiglu(&mut h, &g, &u).unwrap();
                    let mut o = vec![0.0; d];
                    e.down.forward_into(&h, 1, &mut o).unwrap();
                    o
                };
                for (x_id, w) in pick {
                    let o = run(&block.experts[x_id as usize], m.expert_ffn);
                    for (a, v) in want[r * d..(r + 1) * d].iter_mut().zip(o) {
                        *a += w * v;
                    }
                }
                if let Some((s, gate_row)) = &block.shared {
                    let o = run(s, shared.unwrap());
                    let z: f32 = x.iter().zip(gate_row).map(|(a, b)| a * b).sum();
                    let g = 1.0 / (1.0 + (-z).exp());
                    for (a, v) in want[r * d..(r + 1) * d].iter_mut().zip(o) {
                        *a += g * v;
                    }
                }
            }
            let mut s = MoeScratch::new(&c, &m, t).unwrap();
            let n = ffn_elems(&c, t).unwrap();
            let (mut g, mut u, mut h) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            block
                .forward(&m, &xn, t, d, &mut s, &mut g, &mut u, &mut h)
                .unwrap();
            let close = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
            };
            assert!(close(&s.acc[..t * d], &want), "grouped, shared {shared:?}");
            for r in 0..t {
                block
                    .forward(
                        &m,
                        &xn[r * d..(r + 1) * d],
                        1,
                        d,
                        &mut s,
                        &mut g,
                        &mut u,
                        &mut h,
                    )
                    .unwrap();
                assert!(
                    close(&s.acc[..d], &want[r * d..(r + 1) * d]),
                    "row {r}, shared {shared:?}"
                );
            }
        }
    }
}
