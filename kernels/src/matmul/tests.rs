//! What the dispatch in [`super`] decides on its own: how tall `x` is cut into calls.

use super::*;
use crate::quant::testing::{weight_blocks, Rng};

/// Tall `x` over interleaved weights runs as several one-pass calls (`one_pass_chunk_rows`);
/// every row must get the bits it gets from one call over all rows, at both widths of `k`
/// the chunk size depends on, for every interleaved format that takes the one-pass path at
/// this many rows here (at 16 bits with the integer GEMM only Q6_K; all of them at 8 bits,
/// or without AVX-512 VNNI), at both precisions.
#[test]
fn tall_x_in_chunks_gives_the_bits_of_one_call() {
    let mut rng = Rng(0x5eed_c4a1);
    for k in [2048, 8192] {
        let chunk = one_pass_chunk_rows(k);
        assert!(chunk.is_multiple_of(quant::act::TILE_ROWS) && chunk >= 64);
        // Two whole chunks and a ragged end of 3 rows past a tile.
        let (m, n) = (2 * chunk + 8 * 5 + 3, 24);
        let x: Vec<f32> = (0..m * k).map(|_| rng.uniform()).collect();
        for format in QuantFormat::ALL
            .into_iter()
            .filter(|&f| quant::x8::supports(f))
        {
            let blocks = weight_blocks(format, n, k, &mut rng);
            let mut packed = vec![0; blocks.len()];
            quant::x8::pack(format, &blocks, n, k, &mut packed).unwrap();
            for precision in [ActPrecision::Wide, ActPrecision::Byte] {
                let w = Weights::QuantX8(format, precision, &packed);
                if !one_pass(w, m, k) {
                    continue;
                }
                let (mut chunked, mut whole) = (vec![0.0; m * n], vec![0.0; m * n]);
                linear(&mut chunked, &x, w, None, m, k, n).unwrap();
                gemv(&mut whole, &x, w, None, m, k, n);
                let differ = (0..m * n).find(|&i| chunked[i].to_bits() != whole[i].to_bits());
                assert_eq!(
                    differ, None,
                    "{format} {precision} k = {k}: chunked against one call"
                );
            }
        }
    }
}
