//! The one error type of the kernel crate.

use std::fmt;

/// What a kernel refused, and why. Every public kernel validates its slices and shapes
/// before it touches memory, so bad input becomes one of these instead of a panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// A slice is shorter (or longer) than the shape it was passed with says.
    Length {
        /// Which argument, e.g. `"x"`, `"weights"`, `"key_keep"`.
        what: &'static str,
        /// Elements the shape requires.
        expected: usize,
        /// Elements the slice has.
        actual: usize,
    },
    /// A dimension that must be non-zero is zero.
    ZeroDim(&'static str),
    /// Two dimensions that must agree do not.
    Mismatch {
        /// What the disagreement is about, e.g. `"heads must be a multiple of kv_heads"`.
        what: &'static str,
        /// The left-hand value.
        left: usize,
        /// The right-hand value.
        right: usize,
    },
    /// Any other invalid argument, with a sentence that says which.
    Invalid(String),
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::Length {
                what,
                expected,
                actual,
            } => write!(
                f,
                "`{what}` has {actual} elements but its shape needs {expected}"
            ),
            KernelError::ZeroDim(what) => write!(f, "dimension `{what}` must not be zero"),
            KernelError::Mismatch { what, left, right } => {
                write!(f, "{what}: {left} does not agree with {right}")
            }
            KernelError::Invalid(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for KernelError {}

/// Result alias for the kernels.
pub type Result<T> = std::result::Result<T, KernelError>;

/// Checks that a slice of `actual` elements holds exactly `needed` (strided views check that
/// they are covered with `check_covers` instead).
pub(crate) fn check_len(what: &'static str, needed: usize, actual: usize) -> Result<()> {
    if actual != needed {
        return Err(KernelError::Length {
            what,
            expected: needed,
            actual,
        });
    }
    Ok(())
}

/// Checks that a strided view of `actual` elements covers `needed` elements.
pub(crate) fn check_covers(what: &'static str, needed: usize, actual: usize) -> Result<()> {
    if actual < needed {
        return Err(KernelError::Length {
            what,
            expected: needed,
            actual,
        });
    }
    Ok(())
}

pub(crate) fn check_nonzero(what: &'static str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(KernelError::ZeroDim(what));
    }
    Ok(())
}

/// `len` zeros (`None`: the element count itself overflowed), allocated fallibly: a size that overflows or cannot be allocated becomes
/// [`KernelError::Invalid`] naming `what` needed it and how many bytes, instead of a
/// capacity-overflow panic or an allocation-failure abort.
pub(crate) fn try_zeros_f32(len: Option<usize>, what: impl Fn() -> String) -> Result<Vec<f32>> {
    let bytes = len.and_then(|n| n.checked_mul(std::mem::size_of::<f32>()));
    let err = || {
        let bytes = bytes.map_or_else(|| "more than usize::MAX".to_string(), |b| b.to_string());
        KernelError::Invalid(format!(
            "{} needs {bytes} bytes, which cannot be allocated",
            what()
        ))
    };
    let len = len.filter(|_| bytes.is_some()).ok_or_else(err)?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| err())?;
    v.resize(len, 0.0);
    Ok(v)
}
