//! The IQ formats' lattice tables, as data (`tools/iq_grids.py` writes them from gguf-py's
//! grids).

mod iq1;
mod iq2;
mod iq3;

pub use iq1::IQ1S_GRID;
pub use iq2::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS};
pub use iq3::{IQ3S_GRID, IQ3XXS_GRID};
