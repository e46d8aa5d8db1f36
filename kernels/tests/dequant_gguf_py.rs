//! `QuantFormat::dequantize` (the SIMD path where the CPU has one) and `dequantize_scalar`
//! against gguf-py, bit for bit, on the random blocks of every format in
//! `tests/fixtures/quant` (written by `tools/quant_fixtures.py`); and the two paths against
//! each other on many more random blocks, including extreme and subnormal scales.
//!
//! `dequantize_speed` (ignored by default) prints both paths' speed:
//! `cargo test --release -p qkv-kernels --test dequant_gguf_py -- --ignored --nocapture`.

use qkv_kernels::quant::testing::{any_blocks, Rng};
use qkv_kernels::quant::QuantFormat;
use std::path::PathBuf;
use std::time::Instant;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/quant")
}

/// The unsigned integer after `"key":` in `line`.
fn field(line: &str, key: &str) -> usize {
    let pat = format!("\"{key}\":");
    let at = line
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        + pat.len();
    let digits: String = line[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or_else(|_| panic!("{key} in {line}"))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

// Reads the committed fixture files: under Miri that needs `-Zmiri-disable-isolation`, which
// the Miri script does not pass (isolation stays on for everything else), so it is skipped
// there; the decoders it checks run under Miri in the test below on random blocks.
#[test]
#[cfg_attr(
    miri,
    ignore = "reads fixture files (Miri's isolation forbids file I/O)"
)]
fn every_format_matches_gguf_py_bit_for_bit() {
    let dir = fixture_dir();
    let index = std::fs::read_to_string(dir.join("index.json")).expect("index.json");
    let data = std::fs::read(dir.join("blocks.bin")).expect("blocks.bin");
    let mut seen = Vec::new();
    for line in index.lines().filter(|l| l.contains("\"format\"")) {
        let format = *QuantFormat::ALL
            .iter()
            .find(|f| line.contains(&format!("\"format\": \"{}\"", f.name())))
            .unwrap_or_else(|| panic!("unknown format in {line}"));
        let (src_at, src_len) = (field(line, "src_offset"), field(line, "src_bytes"));
        let (dst_at, dst_len) = (field(line, "dst_offset"), field(line, "dst_values"));
        assert_eq!(
            src_len,
            field(line, "blocks") * format.block_bytes(),
            "{format}"
        );
        let src = &data[src_at..src_at + src_len];
        let want: Vec<f32> = data[dst_at..dst_at + 4 * dst_len]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let mut got = vec![f32::NAN; dst_len];
        format.dequantize(src, &mut got).unwrap();
        assert_eq!(bits(&got), bits(&want), "{format}: dequantize vs gguf-py");
        got.fill(f32::NAN);
        format.dequantize_scalar(src, &mut got).unwrap();
        assert_eq!(
            bits(&got),
            bits(&want),
            "{format}: dequantize_scalar vs gguf-py"
        );
        seen.push(format);
    }
    for f in QuantFormat::ALL {
        assert!(seen.contains(&f), "the fixture has no {f} entry");
    }
}

#[test]
fn dequantize_matches_the_scalar_reference_on_random_blocks() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for format in QuantFormat::ALL {
        // Under Miri, block counts up to a few (the decoders' loops are per block).
        let many: &[usize] = if cfg!(miri) {
            &[]
        } else {
            &[31, 64, 257, 1000]
        };
        let few = if cfg!(miri) { 3 } else { 20 };
        for n in (1..=few).chain(many.iter().copied()) {
            let src = any_blocks(format, n, &mut rng);
            let len = n * format.block_elems();
            let mut fast = vec![f32::NAN; len];
            let mut want = vec![f32::NAN; len];
            format.dequantize(&src, &mut fast).unwrap();
            format.dequantize_scalar(&src, &mut want).unwrap();
            assert_eq!(bits(&fast), bits(&want), "{format}, {n} blocks");
        }
        // Both refuse the same wrong lengths.
        let src = any_blocks(format, 2, &mut rng);
        let mut short = vec![0.0; 2 * format.block_elems() - 1];
        assert!(format.dequantize(&src, &mut short).is_err());
        assert!(format.dequantize_scalar(&src, &mut short).is_err());
        assert!(format.dequantize(&src[1..], &mut short).is_err());
    }
}

/// Elements per second of `dequantize` and `dequantize_scalar` on a panel of 64 Ki values
/// (what one task of the prefill's panel widening decodes; it stays in L2), per format.
#[test]
#[ignore = "timing; run with --ignored --nocapture"]
fn dequantize_speed() {
    let mut rng = Rng(7);
    const ELEMS: usize = 1 << 16;
    println!("format   scalar Gelem/s   dequantize Gelem/s   speed-up");
    for format in QuantFormat::ALL {
        let n = ELEMS / format.block_elems();
        let src = any_blocks(format, n, &mut rng);
        let mut dst = vec![0.0f32; ELEMS];
        let mut rate = |f: &dyn Fn(&[u8], &mut [f32])| {
            let mut best = f64::INFINITY;
            for _ in 0..7 {
                let reps = 50;
                let t = Instant::now();
                for _ in 0..reps {
                    f(std::hint::black_box(&src), &mut dst);
                    std::hint::black_box(&mut dst);
                }
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            ELEMS as f64 / best / 1e9
        };
        let scalar = rate(&|s, d| format.dequantize_scalar(s, d).unwrap());
        let fast = rate(&|s, d| format.dequantize(s, d).unwrap());
        println!(
            "{:<8} {scalar:>14.2} {fast:>20.2} {:>10.1}x",
            format.name(),
            fast / scalar
        );
    }
}
