//! What the examples that run interleaved weights share: the activations' precision, read
//! from their environment (the library reads none).

use qkv_kernels::quant::{act::ActPrecision, x8};

/// The activations' precision for interleaved weights: `QKV_ACT_BITS` (8 or 16) when set,
/// else the library's default. An example is a program, so it reads its environment and
/// passes the choice in with the operand.
pub fn act_precision() -> ActPrecision {
    match std::env::var("QKV_ACT_BITS") {
        Ok(bits) => bits.parse().unwrap_or_else(|e| {
            eprintln!("QKV_ACT_BITS: {e}");
            std::process::exit(2)
        }),
        Err(_) => x8::DEFAULT_ACT_PRECISION,
    }
}
