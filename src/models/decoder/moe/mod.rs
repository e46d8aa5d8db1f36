//! The feed-forward block of a decoder layer: one gated MLP, or a mixture of experts.
//!
//! A mixture of experts ([`Moe`]) routes each token: `p = softmax(W_router · x)` over the
//! `E` experts, the `k` most probable are kept (their probabilities divided by their sum
//! when the family renormalises), and the block's output is `Σ pᵢ · expertᵢ(x)` over them,
//! each expert a SwiGLU of its own, plus `sigmoid(w_g · x) · shared(x)` where there is a
//! shared expert (Qwen2-MoE).
//!
//! Experts are matrices of their own, cut from the rows of the file's 3-D tensors (GGUF's
//! `ffn_{gate,up,down}_exps`) or the per-expert tensors of a Hugging Face directory
//! ([`ExpertMatrices`]). Only the chosen experts are read. A pass groups its rows by expert,
//! so each expert that any row chose runs once, as one product over exactly those rows, and
//! its weights are read once per pass; the chosen experts run side by side on the threads
//! (one hand-off for the whole block, however many experts), each writing its own rows,
//! which are then summed with their weights.

use super::config::{DecoderConfig, Family, Moe, WeightLayout};
use crate::alloc::Pages;
use crate::error::{Error, Result};
use crate::nn::Linear;
use crate::weights::{MatrixOptions, Tensor, TensorSource, WeightFormat};
use qkv_kernels::activation::{softmax_inplace, swiglu};
use qkv_kernels::quant::act::ActPrecision;
use qkv_kernels::{linear, linear_many, Projection, QuantFormat, Weights};

/// What the model's summary needs of one weight matrix (or of a bank of experts' matrices).
pub(super) struct Matrix<'a> {
    pub(super) name: &'a str,
    pub(super) format: WeightFormat,
    pub(super) numel: usize,
    pub(super) bytes: usize,
}

impl<'a> From<&'a Tensor> for Matrix<'a> {
    fn from(t: &'a Tensor) -> Matrix<'a> {
        Matrix {
            name: t.name(),
            format: t.format(),
            numel: t.numel(),
            bytes: t.bytes(),
        }
    }
}

/// `down · (act(gate · x) ⊙ up · x)`: a dense feed-forward block, or a shared expert.
pub(super) struct GatedMlp {
    pub(super) gate: Linear,
    pub(super) up: Linear,
    pub(super) down: Linear,
}

impl GatedMlp {
    fn matrices(&self) -> [&Tensor; 3] {
        [self.gate.weight(), self.up.weight(), self.down.weight()]
    }
}

/// One kind of matrix (gate, up or down) of every routed expert of a layer.
pub(super) enum ExpertMatrices {
    /// A layer per expert: formats without an interleaved layout, and floats.
    Each(Vec<Linear>),
    /// Every expert's matrix interleaved ([`Tensor::interleaved`]), end to end in one
    /// buffer that the kernel is asked to back with huge pages ([`Pages`]): a decode step streams
    /// `k` scattered experts, and with 4 KiB pages each of their pages costs a TLB miss and
    /// stops the hardware prefetcher (BENCHMARKS.md, Mixtures of experts).
    Bank(Box<Bank>),
}

/// The bytes of `experts` interleaved `[rows, cols]` matrices of `format`, `each` bytes apart.
pub(super) struct Bank {
    /// The name of expert 0's matrix.
    name: String,
    map: Pages,
    format: QuantFormat,
    /// The activations' precision every expert's matrix meets (the model's option).
    precision: ActPrecision,
    experts: usize,
    rows: usize,
    cols: usize,
    each: usize,
}

impl ExpertMatrices {
    /// The experts' matrices from one `[rows, cols]` tensor per expert (views of a 3-D
    /// tensor's rows, or separate tensors), each passed through `widen` and then interleaved
    /// as `matrices` say when its format has that layout, in which case all of them go into
    /// one [`Bank`].
    /// Errors when the experts disagree in shape or format, or memory is refused.
    fn build(
        parts: Vec<Tensor>,
        widen: &dyn Fn(Tensor) -> Result<Tensor>,
        matrices: &MatrixOptions,
    ) -> Result<ExpertMatrices> {
        let experts = parts.len();
        let mut parts = parts.into_iter();
        let Some(first) = parts.next() else {
            return Ok(ExpertMatrices::Each(Vec::new()));
        };
        let first = widen(first)?.interleaved(matrices)?;
        let (format, precision, each) = match first.weights() {
            Weights::QuantX8(f, p, b) => (f, p, b.len()),
            _ => {
                let mut all = Vec::with_capacity(experts);
                all.push(Linear::from_tensors_with(first, None, matrices)?);
                for t in parts {
                    all.push(Linear::from_tensors_with(widen(t)?, None, matrices)?);
                }
                return Ok(ExpertMatrices::Each(all));
            }
        };
        let (rows, cols) = match *first.shape() {
            [r, c] => (r, c),
            _ => return Err(Error::Shape(format!("{}: not a matrix", first.name()))),
        };
        // Expert 0 of a 3-D tensor is named `name[0]`: the bank goes by the tensor's name.
        let name = first.name();
        let name = name.strip_suffix("[0]").unwrap_or(name).to_owned();
        let what = || format!("the {experts} experts of `{name}`");
        let total = each
            .checked_mul(experts)
            .ok_or_else(|| Error::AllocationRefused {
                what: what(),
                bytes: usize::MAX,
            })?;
        let mut map = crate::alloc::pages(total, what)?;
        let mut put = |i: usize, t: &Tensor| -> Result<()> {
            match t.weights() {
                Weights::QuantX8(f, p, b)
                    if f == format
                        && p == precision
                        && b.len() == each
                        && t.shape() == [rows, cols] =>
                {
                    map[i * each..(i + 1) * each].copy_from_slice(b);
                    Ok(())
                }
                _ => Err(Error::TensorShape {
                    name: t.name().to_owned(),
                    expected: vec![rows, cols],
                    actual: t.shape().to_vec(),
                }),
            }
        };
        put(0, &first)?;
        drop(first);
        for (i, t) in parts.enumerate() {
            // One expert at a time: its interleaved copy is dropped once it is in the bank.
            put(i + 1, &widen(t)?.interleaved(matrices)?)?;
        }
        Ok(ExpertMatrices::Bank(Box::new(Bank {
            name,
            map,
            format,
            precision,
            experts,
            rows,
            cols,
            each,
        })))
    }

    /// Expert `e`'s matrix as the kernels' operand, with its output and input features.
    fn operand(&self, e: usize) -> (Weights<'_>, usize, usize) {
        match self {
            ExpertMatrices::Each(v) => {
                let l = &v[e];
                (l.weight().weights(), l.out_dim(), l.in_dim())
            }
            ExpertMatrices::Bank(b) => (
                Weights::QuantX8(b.format, b.precision, &b.map[e * b.each..(e + 1) * b.each]),
                b.rows,
                b.cols,
            ),
        }
    }

    /// Expert `e`'s product as one of a group's projections, into `y`.
    fn projection<'a, 'y>(&'a self, e: usize, y: &'y mut [f32]) -> Projection<'a, 'y> {
        let (w, n, _) = self.operand(e);
        Projection {
            w,
            bias: None,
            n,
            y,
        }
    }

    /// `y[rows, out] = x[rows, in] · Wₑᵀ` for expert `e`, in products of at most
    /// [`ExpertMatrices::step`] rows.
    fn forward(&self, e: usize, x: &[f32], rows: usize, y: &mut [f32]) -> Result<()> {
        let (w, n, k) = self.operand(e);
        let step = self.step(rows);
        for r0 in (0..rows).step_by(step) {
            let r1 = (r0 + step).min(rows);
            linear(
                &mut y[r0 * n..r1 * n],
                &x[r0 * k..r1 * k],
                w,
                None,
                r1 - r0,
                k,
                n,
            )?;
        }
        Ok(())
    }

    /// Rows per product over `rows` rows: all of them, but for quantized matrices in GGUF's
    /// layout (the formats without an interleaved one: Q5_0, Q5_1, Q5_K) from 17 to 32
    /// rows, where the kernels would widen the matrix to f32 for gemm, two integer GEMV
    /// passes of at most 16 rows cost less (an expert's matrix is small, and widening all of
    /// it for a few rows costs more than a second pass). Where AVX-512 VNNI runs the
    /// integer GEMM, all rows at once.
    fn step(&self, rows: usize) -> usize {
        let gguf = match self {
            ExpertMatrices::Each(v) => v
                .first()
                .is_some_and(|l| matches!(l.weight().weights(), Weights::Quant(..))),
            ExpertMatrices::Bank(_) => false,
        };
        let gemv = qkv_kernels::matmul::QUANT_GEMV_MAX_ROWS;
        if gguf && rows > gemv && rows <= 2 * gemv && !qkv_kernels::quant::gemm::available() {
            gemv
        } else {
            rows.max(1)
        }
    }

    /// The matrices as the model's summary lists them: a bank as one entry.
    fn matrices(&self) -> Vec<Matrix<'_>> {
        match self {
            ExpertMatrices::Each(v) => v.iter().map(|l| Matrix::from(l.weight())).collect(),
            ExpertMatrices::Bank(b) => vec![Matrix {
                name: &b.name,
                format: WeightFormat::Quant(b.format),
                numel: b.experts * b.rows * b.cols,
                bytes: b.map.len(),
            }],
        }
    }
}

/// The routed experts of a layer.
pub(super) struct Experts {
    pub(super) gate: ExpertMatrices,
    pub(super) up: ExpertMatrices,
    pub(super) down: ExpertMatrices,
}

impl Experts {
    fn build(
        gates: Vec<Tensor>,
        ups: Vec<Tensor>,
        downs: Vec<Tensor>,
        widen: &dyn Fn(Tensor) -> Result<Tensor>,
        matrices: &MatrixOptions,
    ) -> Result<Experts> {
        Ok(Experts {
            gate: ExpertMatrices::build(gates, widen, matrices)?,
            up: ExpertMatrices::build(ups, widen, matrices)?,
            down: ExpertMatrices::build(downs, widen, matrices)?,
        })
    }

    fn matrices(&self) -> Vec<Matrix<'_>> {
        let mut all = self.gate.matrices();
        all.extend(self.up.matrices());
        all.extend(self.down.matrices());
        all
    }

    /// Expert `e` over the `n` rows of `x`: `down · swiglu(gate · x, up · x)` into `y`
    /// (`[n, dim]`), with `g`, `u` and `h` (`n · expert_ffn` each) as scratch.
    fn run(
        &self,
        e: usize,
        x: &[f32],
        n: usize,
        d: usize,
        [g, u, h]: [&mut [f32]; 3],
        y: &mut [f32],
    ) -> Result<()> {
        self.gate_up(e, x, n, d, g, u)?;
        swiglu(h, g, u)?;
        self.down.forward(e, h, n, y)
    }

    /// Expert `e`'s gate and up products over the `n` rows of `x` into `g` and `u`, as one
    /// group per [`ExpertMatrices::step`] rows.
    fn gate_up(
        &self,
        e: usize,
        x: &[f32],
        n: usize,
        d: usize,
        g: &mut [f32],
        u: &mut [f32],
    ) -> Result<()> {
        let step = self.gate.step(n).min(self.up.step(n));
        let (ff_g, ff_u) = (self.gate.operand(e).1, self.up.operand(e).1);
        for r0 in (0..n).step_by(step) {
            let r1 = (r0 + step).min(n);
            linear_many(
                &x[r0 * d..r1 * d],
                r1 - r0,
                d,
                &mut [
                    self.gate.projection(e, &mut g[r0 * ff_g..r1 * ff_g]),
                    self.up.projection(e, &mut u[r0 * ff_u..r1 * ff_u]),
                ],
            )?;
        }
        Ok(())
    }
}

/// A layer's mixture of experts.
pub(super) struct MoeBlock {
    /// `[experts, dim]`.
    router: Linear,
    experts: Box<Experts>,
    /// The shared expert and its gate row `[dim]` (Qwen2-MoE).
    shared: Option<(GatedMlp, Vec<f32>)>,
}

/// A layer's feed-forward block.
pub(super) enum Ffn {
    Dense(GatedMlp),
    Moe(MoeBlock),
}

impl Ffn {
    /// Every weight matrix of the block (the routed experts' as one entry per bank).
    pub(super) fn matrices(&self) -> Vec<Matrix<'_>> {
        match self {
            Ffn::Dense(m) => m.matrices().into_iter().map(Matrix::from).collect(),
            Ffn::Moe(b) => {
                let mut all = vec![Matrix::from(b.router.weight())];
                all.extend(b.experts.matrices());
                if let Some((s, _)) = &b.shared {
                    all.extend(s.matrices().into_iter().map(Matrix::from));
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
                let experts: usize = b.experts.matrices().iter().map(|t| t.bytes).sum();
                b.router.weight().bytes()
                    + experts / m.experts.max(1) * m.used
                    + b.shared
                        .as_ref()
                        .map_or(0, |(s, _)| s.matrices().iter().map(|t| t.bytes()).sum())
            }
            _ => self.matrices().iter().map(|t| t.bytes).sum(),
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
        gate + self.matrices().iter().map(|t| t.numel).sum::<usize>()
    }
}

/// Loads layer `l`'s mixture of experts from `source`, each matrix passed through `widen`
/// and prepared as `matrices` say.
pub(super) fn load_moe(
    c: &DecoderConfig,
    m: &Moe,
    l: usize,
    source: &dyn TensorSource,
    widen: &dyn Fn(Tensor) -> Result<Tensor>,
    matrices: &MatrixOptions,
) -> Result<MoeBlock> {
    let d = c.dim;
    let tensor = |name: &str, shape: &[usize]| -> Result<Tensor> {
        let t = source.tensor(name)?;
        t.expect_shape(shape)?;
        Ok(t)
    };
    let linear = |t: Tensor| Linear::from_tensors_with(widen(t)?, None, matrices);
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
            let experts = Experts::build(
                tensor(&n("ffn_gate_exps"), &[e, ff, d])?.split_outer()?,
                tensor(&n("ffn_up_exps"), &[e, ff, d])?.split_outer()?,
                tensor(&n("ffn_down_exps"), &[e, d, ff])?.split_outer()?,
                widen,
                matrices,
            )?;
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
                experts: Box::new(experts),
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
            let (mut gates, mut ups) = (Vec::with_capacity(e), Vec::with_capacity(e));
            let downs = if source.contains(&fused) {
                // transformers 5's own layout: [E, 2·ff, dim] and [E, dim, ff].
                for gu in tensor(&fused, &[e, 2 * ff, d])?.split_outer()? {
                    let mut p = gu.split_rows(&[ff, ff])?.into_iter();
                    match (p.next(), p.next()) {
                        (Some(g), Some(u)) => {
                            gates.push(g);
                            ups.push(u);
                        }
                        _ => return Err(Error::Config(format!("{fused}: not two halves"))),
                    }
                }
                tensor(&format!("{block}.experts.down_proj"), &[e, d, ff])?.split_outer()?
            } else {
                let [g, u, dn] = if mixtral {
                    ["w1", "w3", "w2"]
                } else {
                    ["gate_proj", "up_proj", "down_proj"]
                };
                let mut downs = Vec::with_capacity(e);
                for x in 0..e {
                    let n = |p: &str| format!("{block}.experts.{x}.{p}.weight");
                    gates.push(tensor(&n(g), &[ff, d])?);
                    ups.push(tensor(&n(u), &[ff, d])?);
                    downs.push(tensor(&n(dn), &[d, ff])?);
                }
                downs
            };
            let experts = Experts::build(gates, ups, downs, widen, matrices)?;
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
                experts: Box::new(experts),
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
    let router =
        Linear::from_tensors(matrix(format!("blk.{l}.ffn_gate_inp"), m.experts, d)?, None)?;
    let (mut gates, mut ups, mut downs) = (Vec::new(), Vec::new(), Vec::new());
    for x in 0..m.experts {
        gates.push(matrix(format!("blk.{l}.ffn_gate_exps[{x}]"), ff, d)?);
        ups.push(matrix(format!("blk.{l}.ffn_up_exps[{x}]"), ff, d)?);
        downs.push(matrix(format!("blk.{l}.ffn_down_exps[{x}]"), d, ff)?);
    }
    let experts = Experts::build(gates, ups, downs, &Ok, &MatrixOptions::default())?;
    let mut lin = |name: String, rows: usize, cols: usize| -> Result<Linear> {
        Linear::from_tensors(matrix(name, rows, cols)?, None)
    };
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
        experts: Box::new(experts),
        shared,
    })
}

/// The scratch of a mixture-of-experts block for passes of up to `rows` positions.
pub struct MoeScratch {
    /// Router probabilities, `[rows, experts]`.
    probs: Vec<f32>,
    /// Per row, its `used` experts (ascending) and their weights.
    chosen: Vec<(u32, f32)>,
    /// Per row and choice, where its (row, weight) pair went in `order`.
    slot: Vec<u32>,
    /// Where each expert's run starts in `order` (one more than the experts).
    starts: Vec<usize>,
    /// Where the next row of each expert goes while `order` is filled.
    cursor: Vec<usize>,
    /// (row, weight) pairs grouped by expert.
    order: Vec<(u32, f32)>,
    /// Per pair of `order`, its input row gathered, then the expert's output row,
    /// `[rows · used, dim]`.
    xo: Vec<f32>,
    /// The shared expert's output rows, `[rows, dim]` (empty without one).
    out: Vec<f32>,
    /// The block's output, `[rows, dim]`.
    pub(super) acc: Vec<f32>,
}

impl MoeScratch {
    /// Buffers for `rows` positions of `c`'s mixture `m`.
    pub(super) fn new(c: &DecoderConfig, m: &Moe, rows: usize) -> Result<MoeScratch> {
        let what = || format!("the expert scratch of a pass of {rows} positions");
        let z = |dims: &[usize]| crate::alloc::zeroed_for::<f32>(dims, what);
        let n = rows.saturating_mul(m.used);
        let pairs = || -> Result<Vec<(u32, f32)>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n)
                .map_err(|_| Error::AllocationRefused {
                    what: what(),
                    bytes: n.saturating_mul(8),
                })?;
            v.resize(n, (0, 0.0));
            Ok(v)
        };
        let mut slot = Vec::new();
        slot.try_reserve_exact(n)
            .map_err(|_| Error::AllocationRefused {
                what: what(),
                bytes: n.saturating_mul(4),
            })?;
        slot.resize(n, 0);
        Ok(MoeScratch {
            probs: z(&[rows, m.experts])?,
            chosen: pairs()?,
            slot,
            starts: vec![0; m.experts + 1],
            cursor: vec![0; m.experts],
            order: pairs()?,
            xo: z(&[n, c.dim])?,
            out: z(&[if m.shared_ffn.is_some() { rows } else { 0 }, c.dim])?,
            acc: z(&[rows, c.dim])?,
        })
    }
}

/// Elements of the gate, up and hidden buffers a pass of `rows` positions needs: for a
/// mixture, every chosen expert's rows at once.
pub(super) fn ffn_elems(c: &DecoderConfig, rows: usize) -> Option<usize> {
    match &c.moe {
        None => rows.checked_mul(c.ffn_dim),
        Some(m) => {
            let experts = rows.checked_mul(m.used)?.checked_mul(m.expert_ffn)?;
            let shared = rows.checked_mul(m.shared_ffn.unwrap_or(0))?;
            Some(experts.max(shared))
        }
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

mod forward;
#[cfg(test)]
mod tests;
