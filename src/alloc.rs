//! Allocation that reports refusal as an [`Error`] instead of aborting: the bottom of the
//! crate, beside [`error`](crate::error), which every other layer may use.

use crate::error::{Error, Result};
pub(crate) use qkv_kernels::pages::Pages;

/// FNV-1a over `bytes`, continuing from `state` (start from [`FNV_START`]): a 64-bit
/// checksum of saved state and a fingerprint of a model's identity, not a defence against
/// a forger.
pub(crate) fn fnv1a(mut state: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        state ^= u64::from(b);
        state = state.wrapping_mul(0x0000_0100_0000_01b3);
    }
    state
}

/// FNV-1a's offset basis.
pub(crate) const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// An empty vector of `U` that keeps `v`'s buffer when the two layouts agree, as for one
/// type at two lifetimes (a vector of borrowing items kept between steps, empty, so that a
/// step does not allocate): collecting an emptied `Vec` into one of the same layout reuses
/// its allocation.
pub(crate) fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| unreachable!("emptied")).collect()
}

/// `len` zeros for a large buffer (a KV cache, scratch, logits, widened weights), or
/// [`Error::AllocationRefused`] naming `what()` and the bytes asked for when the allocator
/// refuses, instead of the abort of `vec![0; len]`. The pages come zeroed from the OS as with
/// `vec!`, so a large cache costs memory only as positions fill.
pub(crate) fn zeroed<T: bytemuck::Zeroable>(
    len: usize,
    what: impl Fn() -> String,
) -> Result<Vec<T>> {
    bytemuck::allocation::try_zeroed_vec(len).map_err(|()| Error::AllocationRefused {
        what: what(),
        bytes: len.saturating_mul(std::mem::size_of::<T>()),
    })
}

/// As [`zeroed`], for `dims.iter().product()` elements; a product that overflows is refused
/// as well (with `bytes` saturated to `usize::MAX`).
pub(crate) fn zeroed_for<T: bytemuck::Zeroable>(
    dims: &[usize],
    what: impl Fn() -> String,
) -> Result<Vec<T>> {
    match dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) {
        Some(len) => zeroed(len, what),
        None => Err(Error::AllocationRefused {
            what: what(),
            bytes: usize::MAX,
        }),
    }
}

/// `len` zero bytes on pages of their own, huge where the kernel grants them
/// ([`qkv_kernels::pages::Pages`]): for weights a decode step streams every token. Or
/// [`Error::AllocationRefused`] naming `what()`.
pub(crate) fn pages(len: usize, what: impl Fn() -> String) -> Result<Pages> {
    Pages::zeroed(len).ok_or_else(|| Error::AllocationRefused {
        what: what(),
        bytes: len,
    })
}
