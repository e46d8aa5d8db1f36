//! LoRA adapters, applied at run time without touching the base weights.
//!
//! An adapter holds, for some of a model's matrices `W` (`[out, in]`), two small matrices
//! `A` (`[rank, in]`) and `B` (`[out, rank]`). A projection with adapters `(Aᵢ, Bᵢ)` at
//! scales `sᵢ` computes
//!
//! ```text
//! y = W·x + Σᵢ sᵢ·fᵢ · Bᵢ·(Aᵢ·x)          fᵢ = alphaᵢ / rankᵢ, or 1 when alphaᵢ is 0 or absent
//! ```
//!
//! (llama.cpp's convention for `adapter.lora.alpha`; peft's `scaling` is the same `alpha / r`).
//! `W·x` runs exactly as without adapters, so a sequence with none, or only with scale 0,
//! gets the base model's bits. Each sequence of a batched pass carries its own adapters and
//! scales ([`Segment::lora`](super::Segment::lora)): the rows of every sequence that uses an
//! adapter go through its `A` and `B` together, and a row's deltas are added in the order
//! of the adapters' load (not of the batch), so a row gets the same bits alone as in any
//! batch.
//!
//! Adapters are read from GGUF files as llama.cpp's `convert_lora_to_gguf.py` writes them
//! from a peft adapter (`general.type = adapter`, `adapter.type = lora`,
//! `adapter.lora.alpha`, tensors `<base tensor>.lora_a` and `.lora_b` in f32, f16, q8_0 or
//! another format qkv dequantizes; they are widened to f32 at load, being small). They
//! apply to q, k, v, o, gate, up and down of every layer (Phi-3's fused `attn_qkv` and
//! gate-up matrices split by rows as the base weights are) and to an untied output head.
//! Norm vectors that some tools add to adapters are skipped, as llama.cpp skips them.

use super::{Decoder, WeightLayout};
use crate::error::{Error, Result};
use crate::models::decoder::config::in_file;
use crate::models::decoder::moe::Ffn;
use crate::nn::Linear;
use crate::weights::gguf::GgufFile;
use crate::weights::{Tensor, TensorSource};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The projections of a block an adapter may change, in a block's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Proj {
    Q = 0,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

const PROJS: usize = 7;

/// Where a pair of adapter matrices applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// A projection of block `l`.
    Layer(usize, Proj),
    /// The output head.
    Output,
}

/// `A` (`[rank, in]`) and `B` (`[out, rank]`) of one matrix, in f32, and `alpha / rank`.
#[derive(Debug)]
struct Pair {
    a: Tensor,
    b: Tensor,
    rank: usize,
    factor: f32,
}

/// A LoRA adapter checked against one [`Decoder`] (see the [module docs](self)). Immutable
/// and shared: hold it in an [`Arc`] and hand it to as many sequences as use it, each with
/// its own scale ([`ScaledLora`]).
pub struct LoraAdapter {
    /// Unique in the process: the order in which a row's deltas are added.
    id: u64,
    /// The decoder it was checked against.
    model: u64,
    path: PathBuf,
    alpha: f32,
    layers: Vec<[Option<Pair>; PROJS]>,
    output: Option<Pair>,
}

impl std::fmt::Debug for LoraAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraAdapter")
            .field("path", &self.path)
            .field("alpha", &self.alpha)
            .field("matrices", &self.matrices())
            .finish()
    }
}

/// An adapter and the scale a sequence applies it at (the user's scale, before
/// `alpha / rank`).
#[derive(Clone, Debug)]
pub struct ScaledLora {
    /// The adapter.
    pub adapter: Arc<LoraAdapter>,
    /// The user's scale: 1 applies the adapter as trained, 0 not at all.
    pub scale: f32,
}

impl LoraAdapter {
    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `adapter.lora.alpha` (0 when the file has none).
    pub fn alpha(&self) -> f32 {
        self.alpha
    }

    /// How many matrices of the model it changes.
    pub fn matrices(&self) -> usize {
        let layers: usize = self.layers.iter().map(|l| l.iter().flatten().count()).sum();
        layers + usize::from(self.output.is_some())
    }

    /// Whether it was checked against `decoder` (adapters apply to that model only).
    pub fn is_for(&self, decoder: &Decoder) -> bool {
        self.model == decoder.id
    }

    fn pair(&self, target: Target) -> Option<&Pair> {
        match target {
            Target::Layer(l, p) => self.layers.get(l)?[p as usize].as_ref(),
            Target::Output => self.output.as_ref(),
        }
    }
}

/// A projection's shape, for the checks.
fn dims(l: &Linear) -> (usize, usize) {
    (l.out_dim(), l.in_dim())
}

/// The matrices a GGUF base tensor name stands for in `b`, each with its rows of the
/// tensor: one, or the row blocks of Phi-3's fused matrices.
fn targets_of(d: &Decoder, name: &str) -> std::result::Result<Vec<(Target, usize, usize)>, Error> {
    let c = &d.config;
    let unsupported = || {
        Error::Unsupported(format!(
            "LoRA on `{name}`: qkv applies adapters to the attention and feed-forward \
             projections and the output head (not to embeddings or experts)"
        ))
    };
    if name == "output.weight" {
        if d.output.is_none() {
            return Err(Error::MissingTensor {
                name: "output.weight (the model's output head is its embedding)".into(),
            });
        }
        return Ok(vec![(Target::Output, c.vocab, c.dim)]);
    }
    let Some(rest) = name.strip_prefix("blk.") else {
        return Err(unsupported());
    };
    let Some((layer, part)) = rest.split_once('.') else {
        return Err(unsupported());
    };
    let Some(part) = part.strip_suffix(".weight") else {
        return Err(unsupported());
    };
    let layer: usize = layer.parse().map_err(|_| unsupported())?;
    let Some(b) = d.blocks.get(layer) else {
        return Err(Error::MissingTensor {
            name: format!("{name} (the model has {} layers)", c.layers),
        });
    };
    let fused = c.family.traits().fused_projections;
    let one = |p: Proj, l: &Linear| {
        let (o, i) = dims(l);
        vec![(Target::Layer(layer, p), o, i)]
    };
    let dense = || match &b.ffn {
        Ffn::Dense(f) => Ok(f),
        Ffn::Moe(_) => Err(Error::MissingTensor {
            name: format!("{name} (layer {layer} is a mixture of experts)"),
        }),
    };
    Ok(match part {
        "attn_q" if !fused => one(Proj::Q, &b.wq),
        "attn_k" if !fused => one(Proj::K, &b.wk),
        "attn_v" if !fused => one(Proj::V, &b.wv),
        "attn_qkv" if fused => [(Proj::Q, &b.wq), (Proj::K, &b.wk), (Proj::V, &b.wv)]
            .into_iter()
            .map(|(p, l)| (Target::Layer(layer, p), l.out_dim(), l.in_dim()))
            .collect(),
        "attn_output" => one(Proj::O, &b.wo),
        "ffn_gate" if !fused => one(Proj::Gate, &dense()?.gate),
        "ffn_up" if !fused => one(Proj::Up, &dense()?.up),
        "ffn_up" => {
            let f = dense()?;
            vec![
                (
                    Target::Layer(layer, Proj::Gate),
                    f.gate.out_dim(),
                    f.gate.in_dim(),
                ),
                (
                    Target::Layer(layer, Proj::Up),
                    f.up.out_dim(),
                    f.up.in_dim(),
                ),
            ]
        }
        "ffn_down" => one(Proj::Down, &dense()?.down),
        "attn_q" | "attn_k" | "attn_v" | "attn_qkv" | "ffn_gate" => {
            return Err(Error::MissingTensor {
                name: format!("{name} (not a tensor of this architecture's files)"),
            })
        }
        _ => return Err(unsupported()),
    })
}

/// A tensor of the adapter as f32 values of `[rows, cols]`, finite.
fn matrix(t: Tensor, rows: usize, cols: usize) -> Result<Tensor> {
    t.expect_shape(&[rows, cols])?;
    let name = t.name().to_owned();
    let data = t.to_f32_vec()?;
    if let Some(bad) = data.iter().find(|v| !v.is_finite()) {
        return Err(Error::Config(format!("LoRA tensor `{name}` holds {bad}")));
    }
    Tensor::from_f32(&name, vec![rows, cols], data)
}

impl Decoder {
    /// Reads a LoRA adapter from a GGUF file (see the [`lora`](crate::models::decoder::lora) module) and
    /// checks it against this model: the file must say `general.type = adapter` and
    /// `adapter.type = lora` and name this model's architecture, and every tensor must pair
    /// an `A` and a `B` whose shapes fit the base matrix it names. Errors, all inside
    /// [`Error::InFile`] naming the file: [`Error::Config`] for the metadata (or a value
    /// that is not finite), [`Error::MissingTensor`] for a half of a pair or a base matrix
    /// the model lacks, [`Error::TensorShape`] for a shape that does not fit,
    /// [`Error::Unsupported`] for a target qkv does not adapt (embeddings, experts) or a
    /// model loaded from a Hugging Face directory (whose Q and K rows are not in the order
    /// the converter writes `B`'s in).
    ///
    /// ```no_run
    /// use qkv::load::{Model, ModelOptions};
    /// use qkv::models::decoder::ScaledLora;
    /// use qkv::session::{Session, SessionOptions};
    /// use std::path::Path;
    /// use std::sync::Arc;
    /// let model = Arc::new(Model::load(Path::new("base.gguf"), &ModelOptions::default())?);
    /// let adapter = Arc::new(model.decoder().load_lora(Path::new("adapter.gguf"))?);
    /// let mut session = Session::new(model, SessionOptions::default())?;
    /// session.set_lora(vec![ScaledLora { adapter, scale: 0.5 }])?;
    /// println!("{}", session.generate("Look in thy glass", Default::default())?.finish());
    /// # Ok::<(), qkv::Error>(())
    /// ```
    pub fn load_lora(&self, path: &Path) -> Result<LoraAdapter> {
        let file = GgufFile::open(path)?;
        self.lora_from(&file, path).map_err(|e| match e {
            Error::Unsupported(_) => Error::InFile {
                path: path.to_owned(),
                source: Box::new(e),
            },
            e => in_file(path, e),
        })
    }

    fn lora_from(&self, file: &GgufFile, path: &Path) -> Result<LoraAdapter> {
        let c = &self.config;
        let key = |k: &str| file.metadata(k).and_then(|v| v.as_str()).unwrap_or("");
        if key("general.type") != "adapter" {
            return Err(Error::Config(format!(
                "general.type is `{}`, not `adapter`: not an adapter file",
                key("general.type")
            )));
        }
        if key("adapter.type") != "lora" {
            return Err(Error::Config(format!(
                "adapter.type is `{}`, not `lora`",
                key("adapter.type")
            )));
        }
        let arch = c.family.traits().gguf_arch;
        if key("general.architecture") != arch {
            return Err(Error::Config(format!(
                "the adapter is for architecture `{}`, the model is `{arch}`",
                key("general.architecture")
            )));
        }
        if c.layout != WeightLayout::Gguf {
            return Err(Error::Unsupported(
                "LoRA adapters apply to models loaded from GGUF files".into(),
            ));
        }
        let alpha = match file.metadata("adapter.lora.alpha") {
            None => 0.0,
            Some(v) => v
                .as_f32()
                .filter(|a| a.is_finite())
                .ok_or_else(|| Error::Config("adapter.lora.alpha is not a finite number".into()))?,
        };
        let mut layers: Vec<[Option<Pair>; PROJS]> = Vec::new();
        layers.resize_with(c.layers, Default::default);
        let mut output = None;
        for name in file.names() {
            let (base, is_a) = if let Some(b) = name.strip_suffix(".lora_a") {
                (b, true)
            } else if let Some(b) = name.strip_suffix(".lora_b") {
                (b, false)
            } else if name.ends_with("_norm.weight") {
                continue;
            } else {
                return Err(Error::Unsupported(format!(
                    "tensor `{name}`: an adapter's tensors end in .lora_a or .lora_b"
                )));
            };
            if !is_a {
                // Each pair is read once, from its `A`; a lone `B` is refused here.
                let a = format!("{base}.lora_a");
                if !file.contains(&a) {
                    return Err(Error::MissingTensor { name: a });
                }
                continue;
            }
            let b_name = format!("{base}.lora_b");
            if !file.contains(&b_name) {
                return Err(Error::MissingTensor { name: b_name });
            }
            let (a, b) = (file.tensor(&name)?, file.tensor(&b_name)?);
            let rank = match *a.shape() {
                [r, _] if r > 0 => r,
                _ => {
                    return Err(Error::TensorShape {
                        name,
                        expected: vec![0, 0],
                        actual: a.shape().to_vec(),
                    })
                }
            };
            let parts = targets_of(self, base)?;
            let cols = parts[0].2;
            let rows: usize = parts.iter().map(|p| p.1).sum();
            let a = matrix(a, rank, cols)?;
            let b = matrix(b, rows, rank)?;
            let factor = if alpha != 0.0 {
                alpha / rank as f32
            } else {
                1.0
            };
            // Owned f32 parts (a fused matrix's `B` splits by rows; its `A` serves each).
            let b_parts = b.split_rows(&parts.iter().map(|p| p.1).collect::<Vec<_>>())?;
            for ((target, ..), b) in parts.iter().zip(b_parts) {
                let pair = Pair {
                    a: Tensor::from_f32(a.name(), a.shape().to_vec(), a.to_f32_vec()?)?,
                    b,
                    rank,
                    factor,
                };
                match *target {
                    Target::Layer(l, p) => layers[l][p as usize] = Some(pair),
                    Target::Output => output = Some(pair),
                }
            }
        }
        Ok(LoraAdapter {
            id: super::super::next_model_id(),
            model: self.id,
            path: path.to_owned(),
            alpha,
            layers,
            output,
        })
    }

    /// An adapter with deterministic pseudo-random `A` and `B` (uniform in ±1/√fan-in) of
    /// `rank` on every projection of every layer and on an untied output head, for tests,
    /// documentation and benchmarks that must not need a file. Its path is empty.
    /// The feed-forward blocks of a mixture of experts get none (adapters do not reach
    /// experts). [`Error::Config`] when `rank` is 0.
    pub fn synthetic_lora(&self, rank: usize, alpha: f32, seed: u64) -> Result<LoraAdapter> {
        if rank == 0 {
            return Err(Error::Config("a LoRA adapter of rank 0".into()));
        }
        let mut state = seed ^ 0x2545_F491_4F6C_DD1D;
        let mut uniform = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        let factor = if alpha != 0.0 {
            alpha / rank as f32
        } else {
            1.0
        };
        let mut pair = |name: String, out: usize, inp: usize| -> Result<Pair> {
            let mut m = |rows: usize, cols: usize, what: &str| {
                let k = 1.0 / (cols as f32).sqrt();
                let data = (0..rows * cols).map(|_| uniform() * k).collect();
                Tensor::from_f32(&format!("{name}.{what}"), vec![rows, cols], data)
            };
            Ok(Pair {
                a: m(rank, inp, "lora_a")?,
                b: m(out, rank, "lora_b")?,
                rank,
                factor,
            })
        };
        let mut layers = Vec::with_capacity(self.blocks.len());
        for (l, b) in self.blocks.iter().enumerate() {
            let mut layer: [Option<Pair>; PROJS] = Default::default();
            let mut linears = vec![(Proj::Q, &b.wq), (Proj::K, &b.wk), (Proj::V, &b.wv)];
            linears.push((Proj::O, &b.wo));
            if let Ffn::Dense(f) = &b.ffn {
                linears.extend([
                    (Proj::Gate, &f.gate),
                    (Proj::Up, &f.up),
                    (Proj::Down, &f.down),
                ]);
            }
            for (p, lin) in linears {
                let (o, i) = dims(lin);
                layer[p as usize] = Some(pair(format!("blk.{l}.{p:?}"), o, i)?);
            }
            layers.push(layer);
        }
        let c = &self.config;
        let output = match self.output {
            Some(_) => Some(pair("output.weight".into(), c.vocab, c.dim)?),
            None => None,
        };
        Ok(LoraAdapter {
            id: super::super::next_model_id(),
            model: self.id,
            path: PathBuf::new(),
            alpha,
            layers,
            output,
        })
    }

    /// Checks adapters before they run: [`Error::ForeignState`] for one loaded for another
    /// model, [`Error::Config`] for a scale that is not finite.
    pub fn check_lora(&self, lora: &[ScaledLora]) -> Result<()> {
        for l in lora {
            if !l.adapter.is_for(self) {
                return Err(Error::ForeignState {
                    state: "LoRA adapter",
                    made_by: l.adapter.model,
                    used_with: self.id,
                });
            }
            if !l.scale.is_finite() {
                return Err(Error::Config(format!(
                    "LoRA scale {} for {}",
                    l.scale,
                    l.adapter.path.display()
                )));
            }
        }
        Ok(())
    }
}

/// Buffers of the adapters' products, grown on first use and kept with the pass's scratch.
#[derive(Default)]
pub(super) struct LoraScratch {
    x: Vec<f32>,
    t: Vec<f32>,
    u: Vec<f32>,
}

/// Grows `v` to at least `n` values (only the first pass that needs them allocates).
fn at_least(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// Adds the adapters' deltas of `target` to `y` (`rows × out`), whose input was `x`
/// (`rows × in`). `groups` lists consecutive runs of rows, each with its sequence's
/// adapters. Adapters run in the order of their load, each over the rows of every group
/// that uses it at a non-zero scale, gathered together.
pub(super) fn add_lora<'a, G>(
    target: Target,
    groups: G,
    x: &[f32],
    in_dim: usize,
    y: &mut [f32],
    out_dim: usize,
    s: &mut LoraScratch,
) -> Result<()>
where
    G: Iterator<Item = (usize, &'a [ScaledLora])> + Clone,
{
    let active = |l: &&ScaledLora| l.scale != 0.0 && l.adapter.pair(target).is_some();
    let mut last = None::<u64>;
    loop {
        // The next adapter by load order that some row uses here.
        let next = groups
            .clone()
            .flat_map(|(_, l)| l.iter().filter(active))
            .map(|l| l.adapter.id)
            .filter(|&id| last.is_none_or(|last| id > last))
            .min();
        let Some(id) = next else { return Ok(()) };
        last = Some(id);
        let scale_in = |l: &[ScaledLora]| -> f32 {
            l.iter()
                .filter(|l| l.adapter.id == id)
                .map(|l| l.scale)
                .sum()
        };
        let adapter = groups
            .clone()
            .flat_map(|(_, l)| l.iter())
            .find(|l| l.adapter.id == id)
            .map(|l| l.adapter.clone())
            .expect("found above");
        let pair = adapter.pair(target).expect("active");
        let rows: usize = groups
            .clone()
            .filter(|(_, l)| scale_in(l) != 0.0)
            .map(|(n, _)| n)
            .sum();
        if rows == 0 {
            // Its entries cancel out (scales that sum to 0) on every row.
            continue;
        }
        // Gather the rows that use it.
        let xs = at_least(&mut s.x, rows * in_dim);
        let (mut from, mut to) = (0, 0);
        for (n, l) in groups.clone() {
            if scale_in(l) != 0.0 {
                xs[to * in_dim..(to + n) * in_dim]
                    .copy_from_slice(&x[from * in_dim..(from + n) * in_dim]);
                to += n;
            }
            from += n;
        }
        let t = at_least(&mut s.t, rows * pair.rank);
        qkv_kernels::linear(t, xs, pair.a.weights(), None, rows, in_dim, pair.rank)?;
        let mut at = 0;
        for (n, l) in groups.clone() {
            let scale = scale_in(l);
            if scale != 0.0 {
                let k = scale * pair.factor;
                t[at * pair.rank..(at + n) * pair.rank]
                    .iter_mut()
                    .for_each(|v| *v *= k);
                at += n;
            }
        }
        let u = at_least(&mut s.u, rows * out_dim);
        qkv_kernels::linear(u, t, pair.b.weights(), None, rows, pair.rank, out_dim)?;
        // Scatter the deltas back onto their rows.
        let (mut from, mut to) = (0, 0);
        for (n, l) in groups.clone() {
            if scale_in(l) != 0.0 {
                let dst = &mut y[to * out_dim..(to + n) * out_dim];
                let src = &u[from * out_dim..(from + n) * out_dim];
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
                from += n;
            }
            to += n;
        }
    }
}
