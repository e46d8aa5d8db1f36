//! What the examples that stream a model's layers from memory share: the seven matrices of
//! a Llama layer at the 1B or 8B shapes, stored in one format on huge pages as qkv holds the
//! weights it streams ([`Pages`]), and one decode step's products over many copies of them
//! for `m` rows of activations (Q/K/V and gate/up through `linear_many`, as the decoder
//! calls them).

use qkv_kernels::pages::Pages;
use qkv_kernels::quant::act::ActPrecision;
use qkv_kernels::quant::testing::{weight_blocks, Rng};
use qkv_kernels::quant::x8;
use qkv_kernels::{f16, linear, linear_many, Projection, QuantFormat, Weights};

/// One layer's matrices as (rows, columns): Q, K, V, output, gate, up, down.
pub type Shapes = [(usize, usize); 7];

/// The layer of `shape` (`1b`: Llama 3.2 1B; `8b`: Llama 3.1 8B), or `None` for another name.
pub fn layer(shape: &str) -> Option<Shapes> {
    let (d, kv, ff) = match shape {
        "1b" => (2048, 512, 8192),
        "8b" => (4096, 1024, 14336),
        _ => return None,
    };
    Some([(d, d), (kv, d), (kv, d), (d, d), (ff, d), (ff, d), (d, ff)])
}

/// A layer's matrices stored in one format, each on huge pages: f16 values or quantized
/// blocks, in GGUF's layout or interleaved ([`x8`]).
pub enum Stored {
    F16(Vec<Pages>),
    Quant(QuantFormat, Vec<Pages>),
    QuantX8(QuantFormat, Vec<Pages>),
}

/// `bytes` copied onto huge pages.
fn on_pages(bytes: &[u8]) -> Pages {
    let mut p = Pages::zeroed(bytes.len()).expect("memory for the weights");
    p.copy_from_slice(bytes);
    p
}

impl Stored {
    /// Random weights of `shapes` in the layout `name` names: `f16`, a quantized format's
    /// name (`q4_k`), or one with `x8` appended (`q4_kx8`, interleaved). An error names a
    /// format that is unknown or has no interleaved layout.
    pub fn make(name: &str, shapes: &Shapes, rng: &mut Rng) -> Result<Stored, String> {
        if name == "f16" {
            return Ok(Stored::F16(
                shapes
                    .iter()
                    .map(|&(n, k)| {
                        let bytes: Vec<u8> = (0..n * k)
                            .flat_map(|_| f16::from_f32(rng.uniform()).to_le_bytes())
                            .collect();
                        on_pages(&bytes)
                    })
                    .collect(),
            ));
        }
        let (format, interleave) = match name.strip_suffix("x8") {
            Some(f) => (f, true),
            None => (name, false),
        };
        let q = QuantFormat::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(format))
            .ok_or_else(|| format!("unknown format {format:?}"))?;
        let mut matrices = Vec::with_capacity(shapes.len());
        for &(n, k) in shapes {
            let w = weight_blocks(q, n, k, rng);
            if !interleave {
                matrices.push(on_pages(&w));
                continue;
            }
            let mut p = Pages::zeroed(w.len()).expect("memory for the weights");
            x8::pack(q, &w, n, k, &mut p).map_err(|e| e.to_string())?;
            matrices.push(p);
        }
        Ok(match interleave {
            true => Stored::QuantX8(q, matrices),
            false => Stored::Quant(q, matrices),
        })
    }

    fn matrices(&self) -> &[Pages] {
        match self {
            Stored::F16(m) | Stored::Quant(_, m) | Stored::QuantX8(_, m) => m,
        }
    }

    /// Bytes of the layer's weights.
    pub fn bytes(&self) -> usize {
        self.matrices().iter().map(|m| m.len()).sum()
    }

    /// A copy at other addresses, so that a step over many copies reads each from memory.
    pub fn copy(&self) -> Stored {
        let m = self.matrices().iter().map(|m| on_pages(m)).collect();
        match self {
            Stored::F16(_) => Stored::F16(m),
            Stored::Quant(f, _) => Stored::Quant(*f, m),
            Stored::QuantX8(f, _) => Stored::QuantX8(*f, m),
        }
    }

    /// Matrix `i` as the kernels take it; interleaved weights meet activations at
    /// `precision`.
    pub fn weights(&self, i: usize, precision: ActPrecision) -> Weights<'_> {
        match self {
            Stored::F16(m) => {
                // SAFETY: the pages start on a 2 MiB boundary (aligned for f16) and hold
                // whole f16 values (two plain bytes, any pattern valid), only read here.
                Weights::F16(unsafe {
                    std::slice::from_raw_parts(m[i].as_ptr().cast::<f16>(), m[i].len() / 2)
                })
            }
            Stored::Quant(f, m) => Weights::Quant(*f, &m[i]),
            Stored::QuantX8(f, m) => Weights::QuantX8(*f, precision, &m[i]),
        }
    }
}

/// As many distinct copies of `one` as make at least `bytes`: a step over all of them
/// streams every weight from memory, never from the caches.
pub fn copies(one: Stored, bytes: usize) -> Vec<Stored> {
    let n = bytes.div_ceil(one.bytes().max(1));
    let mut all: Vec<Stored> = (1..n).map(|_| one.copy()).collect();
    all.push(one);
    all
}

/// The outputs of a step of up to `m` rows: queries, keys, values, gate, up.
pub struct Outputs([Vec<f32>; 5]);

impl Outputs {
    /// Room for `m` rows of `shapes`' products.
    pub fn new(shapes: &Shapes, m: usize) -> Outputs {
        let (q_n, kv_n, ff) = (shapes[0].0, shapes[1].0, shapes[4].0);
        Outputs([
            vec![0.0; m * q_n],
            vec![0.0; m * kv_n],
            vec![0.0; m * kv_n],
            vec![0.0; m * ff],
            vec![0.0; m * ff],
        ])
    }
}

/// A decode step's products over every layer of `layers` for `m` rows of `x` (at least
/// `m` rows of the feed-forward width), as the decoder runs them: Q, K and V as one group,
/// the output projection, gate and up as one group, down.
pub fn step(
    layers: &[Stored],
    shapes: &Shapes,
    precision: ActPrecision,
    x: &[f32],
    m: usize,
    out: &mut Outputs,
) {
    let (d, ff) = (shapes[0].1, shapes[4].0);
    let (q_n, kv_n) = (shapes[0].0, shapes[1].0);
    let [q, k, v, g, u] = &mut out.0;
    let (q, k, v) = (&mut q[..m * q_n], &mut k[..m * kv_n], &mut v[..m * kv_n]);
    let (g, u) = (&mut g[..m * ff], &mut u[..m * ff]);
    let (xd, xf) = (&x[..m * d], &x[..m * ff]);
    for l in layers {
        let w = |i| l.weights(i, precision);
        #[rustfmt::skip]
        let mut qkv = [
            Projection { w: w(0), bias: None, n: q_n, y: &mut q[..] },
            Projection { w: w(1), bias: None, n: kv_n, y: &mut k[..] },
            Projection { w: w(2), bias: None, n: kv_n, y: &mut v[..] },
        ];
        linear_many(xd, m, d, &mut qkv).expect("shapes agree");
        linear(&mut q[..m * d], xd, w(3), None, m, d, d).expect("shapes agree");
        #[rustfmt::skip]
        let mut gate_up = [
            Projection { w: w(4), bias: None, n: ff, y: &mut g[..] },
            Projection { w: w(5), bias: None, n: ff, y: &mut u[..] },
        ];
        linear_many(xd, m, d, &mut gate_up).expect("shapes agree");
        linear(&mut q[..m * d], xf, w(6), None, m, ff, d).expect("shapes agree");
    }
}
