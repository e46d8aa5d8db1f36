//! The attention modules of the seeds, as one table over [`AttentionCore`].
//!
//! Each module is a row of [`SEED_MODULES`]: its seed, its PyTorch weight names, and how the
//! sizes its constructor takes become the core's [`AttentionDims`] (a [`SeedShape`]). Loading
//! and the core's accessors are the same code for all of them; only `forward` differs, since
//! the seeds call their modules with different arguments.
//!
//! | module | seed | weight names | constructor | output projection |
//! |---|---|---|---|---|
//! | [`SelfAttention`] | 000 | `q`, `k`, `v` | `(input_dim, dim_qk, dim_v)`, 1 head | none, output `[B, T, dim_v]` |
//! | [`MultiHeadAttention`] | 000 | `q`, `k`, `v`, `out` | `(input_dim, heads, dim_qk, dim_v)` | `out: dim_v → input_dim` |
//! | [`CrossAttention`] | 000 | `q`, `k`, `v` | `(input_dim, dim_qk, dim_v)`, 1 head | none |
//! | [`Attention`] | 001 | `query`, `key`, `value`, `out` | `(dim, heads)` | `dim → dim` |
//! | [`MultiHeadAttentionWithProbs`] | 002 | `w_q`, `w_k`, `w_v`, `w_o` | `(d_model, h)` | `d_model → d_model`, also returns the probabilities |
//! | [`MultiHeadCrossAttention`] | 003 | `q_proj`, `k_proj`, `v_proj`, `out_proj` | `(embed_dim, heads)` | `embed_dim → embed_dim` |
//! | [`TransformerAttention`] | 004 | `wq`, `wk`, `wv`, `output_layer` | `(hidden, heads)` | `hidden → hidden` |
//!
//! Heads split the projected features as PyTorch's `view(B, T, h, d/h).transpose(1, 2)`
//! does: head `i` owns columns `[i·d_h, (i+1)·d_h)`. Scores are scaled by `1/√d_h` (the
//! per-head query/key size; `1/√dim_qk` for one head). Masks follow [`super::mask`]:
//! `true` = visible, and a query row with no visible key gives zeros before the output
//! projection.
//!
//! ```
//! use qkv::nn::{Mask, MultiHeadAttention, Seq};
//! use qkv::weights::{Scope, Tensor, TensorSource};
//! use std::collections::HashMap;
//!
//! // A tiny in-memory state_dict: identity projections of size 2, two heads.
//! struct Dict(HashMap<String, (Vec<usize>, Vec<f32>)>);
//! impl TensorSource for Dict {
//!     fn tensor(&self, name: &str) -> qkv::Result<Tensor> {
//!         let missing = || qkv::Error::MissingTensor { name: name.into() };
//!         let (shape, data) = self.0.get(name).ok_or_else(missing)?;
//!         Tensor::from_f32(name, shape.clone(), data.clone())
//!     }
//!     fn contains(&self, name: &str) -> bool {
//!         self.0.contains_key(name)
//!     }
//!     fn names(&self) -> Vec<String> {
//!         self.0.keys().cloned().collect()
//!     }
//! }
//! let eye = (vec![2, 2], vec![1.0, 0.0, 0.0, 1.0]);
//! let names = ["q", "k", "v", "out"].iter();
//! let dict = Dict(names.map(|n| (format!("{n}.weight"), eye.clone())).collect());
//!
//! let mha = MultiHeadAttention::load(&Scope::new(&dict), 2, 2, 2, 2).unwrap();
//! let x = [1.0, 2.0, 3.0, 4.0]; // B = 1, T = 2, D = 2
//! let y = mha.forward(Seq::new(&x, 1, 2, 2).unwrap(), &Mask::none().with_causal()).unwrap();
//! assert_eq!(&y.data()[..2], &[1.0, 2.0]); // position 0 sees only itself
//! ```

use super::attention::{AttentionCore, AttentionDims, ProjectionNames};
use super::{Mask, Seq, SeqBuf};
use crate::error::Result;
use crate::weights::Scope;

/// How a seed module's constructor sizes become [`AttentionDims`]. Query and key/value
/// inputs always have the same width in the seeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeedShape {
    /// `(input_dim, dim_qk, dim_v)`: one head and no output projection.
    OneHead,
    /// `(input_dim, heads, dim_qk, dim_v)`: an output projection `dim_v → input_dim`.
    Projected,
    /// `(dim, heads)`: every projection `dim → dim`.
    Square,
}

impl SeedShape {
    /// The core's sizes for an input width, a head count and the projection sizes (the
    /// ones a shape does not take are ignored: a square module's are all `input`, a
    /// one-head module has one head).
    pub fn dims(self, input: usize, heads: usize, dim_qk: usize, dim_v: usize) -> AttentionDims {
        let (heads, dim_qk, dim_v, out_dim) = match self {
            SeedShape::OneHead => (1, dim_qk, dim_v, None),
            SeedShape::Projected => (heads, dim_qk, dim_v, Some(input)),
            SeedShape::Square => (heads, input, input, Some(input)),
        };
        AttentionDims {
            q_in: input,
            kv_in: input,
            dim_qk,
            dim_v,
            heads,
            out_dim,
        }
    }
}

/// One row of [`SEED_MODULES`]: a seed's attention module.
#[derive(Clone, Copy, Debug)]
pub struct SeedModule {
    /// qkv's name of the module (the Rust type).
    pub module: &'static str,
    /// The seed it comes from (`"000"` … `"004"`).
    pub seed: &'static str,
    /// The class name in the seed's PyTorch code.
    pub class: &'static str,
    /// The PyTorch names of its projections.
    pub names: ProjectionNames<'static>,
    /// How its constructor's sizes become the core's.
    pub shape: SeedShape,
}

impl SeedModule {
    /// Loads the module's core under `scope` (see [`SeedShape::dims`] for the sizes).
    ///
    /// Errors: as [`AttentionCore::load`].
    pub fn load_core(
        &self,
        scope: &Scope<'_>,
        input: usize,
        heads: usize,
        dim_qk: usize,
        dim_v: usize,
    ) -> Result<AttentionCore> {
        let dims = self.shape.dims(input, heads, dim_qk, dim_v);
        AttentionCore::load(scope, self.names, dims)
    }
}

/// The constructor of a module of the given shape.
macro_rules! seed_load {
    (OneHead) => {
        /// Loads the projections under `scope`.
        ///
        /// Errors: as [`AttentionCore::load`].
        pub fn load(
            scope: &Scope<'_>,
            input_dim: usize,
            dim_qk: usize,
            dim_v: usize,
        ) -> Result<Self> {
            Self::from_row(scope, input_dim, 1, dim_qk, dim_v)
        }
    };
    (Projected) => {
        /// Loads the projections under `scope`.
        ///
        /// Errors: as [`AttentionCore::load`]; [`Error::Config`](crate::Error::Config) when
        /// `num_heads` does not divide `dim_qk` and `dim_v`.
        pub fn load(
            scope: &Scope<'_>,
            input_dim: usize,
            num_heads: usize,
            dim_qk: usize,
            dim_v: usize,
        ) -> Result<Self> {
            Self::from_row(scope, input_dim, num_heads, dim_qk, dim_v)
        }
    };
    (Square) => {
        /// Loads the four projections under `scope`.
        ///
        /// Errors: as [`AttentionCore::load`]; [`Error::Config`](crate::Error::Config) when
        /// `num_heads` does not divide `dim`.
        pub fn load(scope: &Scope<'_>, dim: usize, num_heads: usize) -> Result<Self> {
            Self::from_row(scope, dim, num_heads, dim, dim)
        }
    };
}

/// The optional output projection name of a table row.
macro_rules! seed_out {
    () => {
        None
    };
    ($o:literal) => {
        Some($o)
    };
}

/// The table: for each row, a module type over [`AttentionCore`] with its constructor and
/// the core's accessors, and its entry in [`SEED_MODULES`].
macro_rules! seed_modules {
    ($(
        $(#[$doc:meta])*
        $name:ident: seed $seed:literal, $class:literal,
        [$q:literal, $k:literal, $v:literal $(, $o:literal)?], $shape:ident;
    )*) => {
        /// Every seed attention module, in the order of the table in the [module
        /// docs](self).
        pub const SEED_MODULES: &[SeedModule] = &[$($name::ROW),*];

        $(
            $(#[$doc])*
            #[derive(Debug)]
            pub struct $name {
                core: AttentionCore,
            }

            impl $name {
                /// The module's row of [`SEED_MODULES`].
                pub const ROW: SeedModule = SeedModule {
                    module: stringify!($name),
                    seed: $seed,
                    class: $class,
                    names: ProjectionNames {
                        q: $q,
                        k: $k,
                        v: $v,
                        out: seed_out!($($o)?),
                    },
                    shape: SeedShape::$shape,
                };

                fn from_row(
                    scope: &Scope<'_>,
                    input: usize,
                    heads: usize,
                    dim_qk: usize,
                    dim_v: usize,
                ) -> Result<Self> {
                    Ok(Self {
                        core: Self::ROW.load_core(scope, input, heads, dim_qk, dim_v)?,
                    })
                }

                seed_load!($shape);

                /// The underlying [`AttentionCore`].
                pub fn core(&self) -> &AttentionCore {
                    &self.core
                }

                /// The module with every projection kept for many rows
                /// ([`AttentionCore::for_many_rows`]).
                pub fn for_many_rows(self) -> Result<Self> {
                    Ok(Self {
                        core: self.core.for_many_rows()?,
                    })
                }

                /// The module with its K and V projections kept for many rows
                /// ([`AttentionCore::kv_for_many_rows`]).
                pub fn kv_for_many_rows(self) -> Result<Self> {
                    Ok(Self {
                        core: self.core.kv_for_many_rows()?,
                    })
                }
            }
        )*
    };
}

seed_modules! {
    /// Seed 000's `SelfAttention(input_dim, dim_qk, dim_v)`: one head, `q`, `k`, `v` with
    /// bias, no output projection; `[B, T, input_dim] → [B, T, dim_v]`, scale `1/√dim_qk`.
    SelfAttention: seed "000", "SelfAttention", ["q", "k", "v"], OneHead;
    /// Seed 000's `MultiHeadAttention(input_dim, num_heads, dim_qk, dim_v)`: `q`, `k`, `v`,
    /// and `out: Linear(dim_v → input_dim)`; scale `1/√(dim_qk / num_heads)`.
    MultiHeadAttention: seed "000", "MultiHeadAttention", ["q", "k", "v", "out"], Projected;
    /// Seed 000's single-head `CrossAttention(input_dim, dim_qk, dim_v)`: queries from the
    /// decoder input, keys and values from the encoder output; no output projection.
    CrossAttention: seed "000", "CrossAttention", ["q", "k", "v"], OneHead;
    /// Seed 001's `Attention(dim, num_heads)`: `query`, `key`, `value`, `out`, all
    /// `dim → dim`; one module for self-, cross- and causal attention.
    Attention: seed "001", "Attention", ["query", "key", "value", "out"], Square;
    /// Seed 002's `MultiHeadAttention(d_model, h)`: `w_q`, `w_k`, `w_v`, `w_o`; returns the
    /// output and the attention probabilities `A` `[B, h, L, L]`.
    MultiHeadAttentionWithProbs: seed "002", "MultiHeadAttention", ["w_q", "w_k", "w_v", "w_o"], Square;
    /// Seed 003's multi-head `CrossAttention(embed_dim, num_heads)`: `q_proj`, `k_proj`,
    /// `v_proj`, `out_proj`, all `embed_dim → embed_dim`. Dropout is the identity at
    /// inference.
    MultiHeadCrossAttention: seed "003", "CrossAttention", ["q_proj", "k_proj", "v_proj", "out_proj"], Square;
    /// Seed 004's `MutiHeadAttention(hidden_size, num_head)`: `wq`, `wk`, `wv`,
    /// `output_layer`, all `hidden → hidden`; the attention of the encoder–decoder
    /// Transformer.
    TransformerAttention: seed "004", "MutiHeadAttention", ["wq", "wk", "wv", "output_layer"], Square;
}

impl SelfAttention {
    /// Self-attention of `x` (the seed has no mask; pass [`Mask::none`] for it).
    pub fn forward(&self, x: Seq<'_>, mask: &Mask<'_>) -> Result<SeqBuf> {
        self.core.forward(x, x, x, mask)
    }
}

impl MultiHeadAttention {
    /// Multi-head self-attention of `x`.
    pub fn forward(&self, x: Seq<'_>, mask: &Mask<'_>) -> Result<SeqBuf> {
        self.core.forward(x, x, x, mask)
    }
}

impl CrossAttention {
    /// `[B, T_q, dim_v]` for `decoder_input` `[B, T_q, input_dim]` attending over
    /// `encoder_input` `[B, T_k, input_dim]` (argument order as in the seed).
    pub fn forward(
        &self,
        encoder_input: Seq<'_>,
        decoder_input: Seq<'_>,
        mask: &Mask<'_>,
    ) -> Result<SeqBuf> {
        self.core
            .forward(decoder_input, encoder_input, encoder_input, mask)
    }
}

impl Attention {
    /// `forward(query, key, value, mask, causal)`: `causal` adds top-left causal masking to
    /// `mask` (the seed's `True` = blocked mask becomes `false` here).
    ///
    /// One deliberate difference from the seed's code: there, `causal=True` replaces the
    /// caller's mask with the causal one, so padding passed alongside was silently dropped.
    /// Here both apply, as `tools/seq2seq_fixtures.py` does for its reference.
    pub fn forward(
        &self,
        query: Seq<'_>,
        key: Seq<'_>,
        value: Seq<'_>,
        mask: &Mask<'_>,
        causal: bool,
    ) -> Result<SeqBuf> {
        let m = mask.causal_if(mask.causal || causal);
        self.core.forward(query, key, value, &m)
    }
}

impl MultiHeadAttentionWithProbs {
    /// `(output [B, L, d_model], A [B, h, L, L])` for `x` `[B, L, d_model]`.
    pub fn forward(&self, x: Seq<'_>, mask: &Mask<'_>) -> Result<(SeqBuf, Vec<f32>)> {
        self.core.forward_with_probs(x, x, x, mask)
    }
}

impl MultiHeadCrossAttention {
    /// `query` `[B, T_q, E]` over `key`, `value` `[B, T_k, E]`. The seed's `mask == 0` means
    /// blocked; here build a [`Mask`] whose `true` means visible.
    pub fn forward(
        &self,
        query: Seq<'_>,
        key: Seq<'_>,
        value: Seq<'_>,
        mask: &Mask<'_>,
    ) -> Result<SeqBuf> {
        self.core.forward(query, key, value, mask)
    }
}

impl TransformerAttention {
    /// `q` `[B, q_len, hidden]` over `k`, `v` `[B, k_len, hidden]`. The seed's separate
    /// padding and causal masks (`True` = blocked) become one [`Mask`] (`true` = visible).
    pub fn forward(&self, q: Seq<'_>, k: Seq<'_>, v: Seq<'_>, mask: &Mask<'_>) -> Result<SeqBuf> {
        self.core.forward(q, k, v, mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table and SPEC.md's list agree: seven modules, each named once, with the
    /// weight names and shapes the seeds give them.
    #[test]
    fn the_table_lists_each_seed_module_once() {
        let names: Vec<_> = SEED_MODULES.iter().map(|m| m.module).collect();
        assert_eq!(
            names,
            [
                "SelfAttention",
                "MultiHeadAttention",
                "CrossAttention",
                "Attention",
                "MultiHeadAttentionWithProbs",
                "MultiHeadCrossAttention",
                "TransformerAttention",
            ]
        );
        let seeds: Vec<_> = SEED_MODULES.iter().map(|m| m.seed).collect();
        assert_eq!(seeds, ["000", "000", "000", "001", "002", "003", "004"]);
        for m in SEED_MODULES {
            // One-head modules have no output projection; the others all have one.
            assert_eq!(
                m.names.out.is_none(),
                m.shape == SeedShape::OneHead,
                "{}",
                m.module
            );
        }
        assert_eq!(TransformerAttention::ROW.names.out, Some("output_layer"));
    }

    #[test]
    fn shapes_map_constructor_sizes_to_the_core() {
        let d = SeedShape::OneHead.dims(12, 7, 8, 6);
        assert_eq!((d.heads, d.dim_qk, d.dim_v, d.out_dim), (1, 8, 6, None));
        let d = SeedShape::Projected.dims(16, 8, 16, 24);
        assert_eq!(
            (d.heads, d.dim_qk, d.dim_v, d.out_dim),
            (8, 16, 24, Some(16))
        );
        let d = SeedShape::Square.dims(16, 4, 0, 0);
        assert_eq!(
            (d.heads, d.dim_qk, d.dim_v, d.out_dim),
            (4, 16, 16, Some(16))
        );
        assert_eq!((d.q_in, d.kv_in), (16, 16));
    }
}
