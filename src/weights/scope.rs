//! [`Scope`]: a tensor source seen through a name prefix, which is how every module finds its
//! weights by their PyTorch names.

use super::{Tensor, TensorSource};
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;

/// A [`TensorSource`] seen through a name prefix: `scope.pp("layers.0").tensor("q.weight")`
/// reads `layers.0.q.weight` (candle's `VarBuilder::pp` idea). Modules load their weights
/// through one of these, so a module never needs to know where in a model it sits.
///
/// ```
/// # use qkv::weights::Scope;
/// # fn demo(src: &dyn qkv::weights::TensorSource) {
/// let layer = Scope::new(src).pp("Encoder").pp("Layers.0");
/// assert_eq!(layer.name("attn.wq.weight"), "Encoder.Layers.0.attn.wq.weight");
/// # }
/// ```
#[derive(Clone)]
pub struct Scope<'a> {
    source: &'a dyn TensorSource,
    prefix: String,
}

impl std::fmt::Debug for Scope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl<'a> Scope<'a> {
    /// The root scope: names are looked up as given.
    pub fn new(source: &'a dyn TensorSource) -> Self {
        Scope {
            source,
            prefix: String::new(),
        }
    }

    /// The full name `prefix.name` (or `name` at the root).
    pub fn name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// A child scope: `self.pp("attn")` resolves `x` as `prefix.attn.x`.
    pub fn pp(&self, sub: &str) -> Scope<'a> {
        Scope {
            source: self.source,
            prefix: self.name(sub),
        }
    }

    /// The tensor `prefix.name`, or [`Error::MissingTensor`] naming the full name.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        self.source.tensor(&self.name(name))
    }

    /// The tensor `prefix.name`, checked to have `shape` ([`Error::TensorShape`] otherwise).
    pub fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.tensor(name)?;
        t.expect_shape(shape)?;
        Ok(t)
    }

    /// True when `prefix.name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.source.contains(&self.name(name))
    }
}
