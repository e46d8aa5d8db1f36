//! The crate's macros, declared first in lib.rs so that every module below can use them.

/// Declares a scalar reference `pub fn …_scalar`: public for tests and with the `testing`
/// feature, so that the tests and benches can compare the SIMD kernels with it, and private
/// to the crate otherwise, where the kernels' own fallbacks (CPUs without AVX2, the tails of
/// vectors, `QKV_ISA=scalar`) call it. Not part of the API programs see.
macro_rules! scalar_reference {
    ($(#[$meta:meta])* pub fn $($rest:tt)*) => {
        #[cfg(any(test, feature = "testing"))]
        $(#[$meta])*
        pub fn $($rest)*

        #[cfg(not(any(test, feature = "testing")))]
        $(#[$meta])*
        pub(crate) fn $($rest)*
    };
}
