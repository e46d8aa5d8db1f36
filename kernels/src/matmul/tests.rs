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

/// A row of `x` gets the same bits whatever rows share its call: the property a verify pass
/// of speculative decoding, a batched step and a cached prefix rely on (their rows must
/// equal the one-row steps of plain decoding). Every kind of weights, both precisions, at
/// the heights where the dispatch changes path: interleaved weights at every height, GGUF's
/// layout up to [`QUANT_GEMV_MAX_ROWS`], f32, f16 and bf16 while [`one_pass`] takes them.
#[test]
fn a_row_gets_the_same_bits_in_any_pass() {
    let mut rng = Rng(0x0b17_5a3e);
    let mut failures = Vec::new();
    for k in [256usize, 768] {
        let n = 24;
        let heights = [2, 3, 5, 8, 9, 12, 16, 17, 24, 65, 130];
        let m_max = *heights.iter().max().unwrap();
        let x: Vec<f32> = (0..m_max * k).map(|_| rng.uniform()).collect();
        let f32w: Vec<f32> = (0..n * k).map(|_| rng.uniform()).collect();
        let f16w: Vec<f16> = f32w.iter().map(|&v| f16::from_f32(v)).collect();
        let bf16w: Vec<bf16> = f32w.iter().map(|&v| bf16::from_f32(v)).collect();
        // Each case: its name, its format and bytes (none for f32, f16 and bf16), interleaved
        // or not.
        let mut cases = vec![
            ("f32".to_string(), None, Vec::new(), false),
            ("f16".to_string(), None, Vec::new(), false),
            ("bf16".to_string(), None, Vec::new(), false),
        ];
        for format in QuantFormat::ALL {
            if !k.is_multiple_of(format.block_elems()) {
                continue;
            }
            let blocks = weight_blocks(format, n, k, &mut rng);
            if quant::x8::supports(format) {
                let mut packed = vec![0; blocks.len()];
                quant::x8::pack(format, &blocks, n, k, &mut packed).unwrap();
                cases.push((format!("{format} x8"), Some(format), packed, true));
            }
            cases.push((format!("{format}"), Some(format), blocks, false));
        }
        for (name, format, bytes, interleaved) in &cases {
            for precision in [ActPrecision::Wide, ActPrecision::Byte] {
                let w = match (format, interleaved) {
                    (None, _) if name == "f32" => Weights::F32(&f32w),
                    (None, _) if name == "f16" => Weights::F16(&f16w),
                    (None, _) => Weights::BF16(&bf16w),
                    (Some(f), false) => Weights::Quant(*f, bytes),
                    (Some(f), true) => Weights::QuantX8(*f, precision, bytes),
                };
                if precision == ActPrecision::Byte && !matches!(w, Weights::QuantX8(..)) {
                    continue;
                }
                let mut solo = vec![0.0; m_max * n];
                for i in 0..m_max {
                    let (xi, yi) = (&x[i * k..(i + 1) * k], &mut solo[i * n..(i + 1) * n]);
                    linear(yi, xi, w, None, 1, k, n).unwrap();
                }
                for m in heights {
                    let promised = match w {
                        Weights::QuantX8(..) => true,
                        Weights::Quant(..) => m <= QUANT_GEMV_MAX_ROWS,
                        _ => one_pass(w, m, k),
                    };
                    if !promised {
                        continue;
                    }
                    let mut y = vec![0.0; m * n];
                    linear(&mut y, &x[..m * k], w, None, m, k, n).unwrap();
                    if let Some(at) = (0..m * n).find(|&i| y[i].to_bits() != solo[i].to_bits()) {
                        failures.push(format!(
                            "{name} {precision} k = {k} m = {m}: row {} column {}",
                            at / n,
                            at % n
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// bf16 weights are f32 weights with the low 16 bits of each value zero: widened in
/// registers, they must give every output the bits the same values stored in f32 give, on
/// the GEMV and the one pass, at every height these take, on this CPU's kernels (and under
/// `QKV_ISA=avx2` and `scalar`, the others'). Past the one pass both go to a GEMM of their
/// own, bf16 to the 16-bit one, and only closeness is asked (`tests/matmul.rs`).
#[test]
fn bf16_gives_the_bits_of_its_values_in_f32() {
    let mut rng = Rng(0xbf16_0001);
    let mut failures = Vec::new();
    // k around the 8-lane width and past the tail; n across the 3-row tile and a thread
    // split; heights from decode to the last the one pass takes at the largest k.
    for (k, n) in [(1, 5), (7, 4), (9, 3), (64, 17), (577, 65), (1030, 250)] {
        let mut heights: Vec<usize> = vec![1, 2, 3, 4, 5, 8, 9, 13, 64, 130];
        heights.push(FLOAT_ONE_PASS_MAX_ROWS.min(ONE_PASS_X_ELEMS / k));
        let m_max = *heights.iter().max().unwrap();
        let x: Vec<f32> = (0..m_max * k).map(|_| rng.uniform()).collect();
        let bias: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
        // Some values at the edges of the format: ±0, subnormals, large magnitudes.
        let mut wb: Vec<bf16> = (0..n * k)
            .map(|_| bf16::from_f32(rng.uniform() * 4.0))
            .collect();
        for (i, v) in [0x0000u16, 0x8000, 0x0001, 0x807f, 0x7f00, 0xff00]
            .into_iter()
            .enumerate()
        {
            if let Some(w) = wb.get_mut(i * 7) {
                *w = bf16::from_bits(v);
            }
        }
        let wf: Vec<f32> = wb.iter().map(|v| v.to_f32()).collect();
        for m in heights {
            let xs = &x[..m * k];
            if !one_pass(Weights::F32(&wf), m, k) && m > GEMV_MAX_ROWS {
                continue;
            }
            for b in [None, Some(&bias[..])] {
                let (mut got, mut want) = (vec![0.0; m * n], vec![0.0; m * n]);
                linear(&mut got, xs, Weights::BF16(&wb), b, m, k, n).unwrap();
                linear(&mut want, xs, Weights::F32(&wf), b, m, k, n).unwrap();
                if let Some(at) = (0..m * n).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                    failures.push(format!(
                        "k = {k} n = {n} m = {m} bias = {}: row {} column {}: {} against {}",
                        b.is_some(),
                        at / n,
                        at % n,
                        got[at],
                        want[at]
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
