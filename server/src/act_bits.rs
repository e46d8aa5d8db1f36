//! `--act-bits`: the precision at which activations meet interleaved weights (Q4_0, Q4_1,
//! Q4_K, Q6_K, Q8_0), for the whole process: 16 bits by default, 8 as llama.cpp's CPU kernels
//! (faster prompts and batched steps; see
//! [`qkv::kernels::quant::x8::set_act_precision`]).
//!
//! qkv-cli has the same module for `decode`: neither program's crate depends on the other.

use qkv::kernels::quant::{act::ActPrecision, x8};

/// Applies `--act-bits BITS` (8 or 16; `None` leaves the default, or `QKV_ACT_BITS`) for this
/// process. Call it before a model runs. Errors name the flag: another value, or a precision
/// already fixed otherwise.
///
/// ```
/// assert!(qkv_server::act_bits::apply(Some(12)).is_err());
/// qkv_server::act_bits::apply(None).unwrap();
/// ```
pub fn apply(bits: Option<u8>) -> Result<(), String> {
    let precision = match bits {
        None => return Ok(()),
        Some(16) => ActPrecision::Wide,
        Some(8) => ActPrecision::Byte,
        Some(b) => return Err(format!("--act-bits {b}: must be 8 or 16")),
    };
    x8::set_act_precision(precision).map_err(|e| format!("--act-bits {}: {e}", bits.unwrap_or(0)))
}
