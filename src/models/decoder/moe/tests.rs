use super::*;
use crate::weights::FloatType;

#[test]
fn routing_is_softmax_then_top_k_in_expert_order() {
    let mut p = [1.0f32, 3.0, 2.0, 0.0];
    let mut pick = [(0u32, 0.0f32); 2];
    route(&mut p, &mut pick, false);
    let z: f32 = [1.0f32, 3.0, 2.0, 0.0].iter().map(|x| x.exp()).sum();
    assert_eq!([pick[0].0, pick[1].0], [1, 2]);
    assert!((pick[0].1 - 3f32.exp() / z).abs() < 1e-6);
    assert!((pick[1].1 - 2f32.exp() / z).abs() < 1e-6);
    let mut p = [1.0f32, 3.0, 2.0, 0.0];
    route(&mut p, &mut pick, true);
    let e = 1f32.exp();
    assert!((pick[0].1 - e / (e + 1.0)).abs() < 1e-6);
    assert!((pick[1].1 - 1.0 / (e + 1.0)).abs() < 1e-6);
    // Equal probabilities: the lower index first; a NaN row still picks distinct experts.
    let mut p = [0.0f32; 4];
    route(&mut p, &mut pick, true);
    assert_eq!([pick[0].0, pick[1].0], [0, 1]);
    let mut p = [f32::NAN; 4];
    route(&mut p, &mut pick, true);
    assert_ne!(pick[0].0, pick[1].0);
}

/// Runs `block` over the `t` rows of `xn` as one grouped pass and row by row, and
/// compares both with a reference that takes each row alone and each chosen expert
/// through `expert(e, x)`, within `tol` of the largest output.
fn check_block(
    c: &DecoderConfig,
    m: &Moe,
    block: &MoeBlock,
    xn: &[f32],
    t: usize,
    expert: &dyn Fn(usize, &[f32]) -> Vec<f32>,
    tol: f32,
) {
    let d = c.dim;
    let mut want = vec![0.0f32; t * d];
    for r in 0..t {
        let x = &xn[r * d..(r + 1) * d];
        let mut logits = vec![0.0; m.experts];
        block.router.forward_into(x, 1, &mut logits).unwrap();
        let mut pick = vec![(0, 0.0); m.used];
        route(&mut logits, &mut pick, m.norm_topk);
        for (x_id, w) in pick {
            let o = expert(x_id as usize, x);
            for (a, v) in want[r * d..(r + 1) * d].iter_mut().zip(o) {
                *a += w * v;
            }
        }
        if let Some((s, gate_row)) = &block.shared {
            let sf = m.shared_ffn.unwrap();
            let (mut g, mut u, mut h) = (vec![0.0; sf], vec![0.0; sf], vec![0.0; sf]);
            s.gate.forward_into(x, 1, &mut g).unwrap();
            s.up.forward_into(x, 1, &mut u).unwrap();
            swiglu(&mut h, &g, &u).unwrap();
            let mut o = vec![0.0; d];
            s.down.forward_into(&h, 1, &mut o).unwrap();
            let z: f32 = x.iter().zip(gate_row).map(|(a, b)| a * b).sum();
            let g = 1.0 / (1.0 + (-z).exp());
            for (a, v) in want[r * d..(r + 1) * d].iter_mut().zip(o) {
                *a += g * v;
            }
        }
    }
    let mut s = MoeScratch::new(c, m, t).unwrap();
    let n = ffn_elems(c, t).unwrap();
    let (mut g, mut u, mut h) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    block
        .forward(m, xn, t, d, &mut s, [&mut g[..], &mut u[..], &mut h[..]])
        .unwrap();
    // Errors relative to the largest output (plus one): single outputs that nearly
    // cancel carry the rounding of the large terms they sum.
    let scale = 1.0 + want.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let worst = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / scale)
            .fold(0.0f32, f32::max)
    };
    let e = worst(&s.acc[..t * d], &want);
    assert!(e <= tol, "grouped pass of {t} rows: error {e}");
    for r in 0..t {
        let x = &xn[r * d..(r + 1) * d];
        block
            .forward(m, x, 1, d, &mut s, [&mut g[..], &mut u[..], &mut h[..]])
            .unwrap();
        let e = worst(&s.acc[..d], &want[r * d..(r + 1) * d]);
        assert!(e <= tol, "row {r}: error {e}");
    }
}

/// Expert `e` of `experts` over one row, through its own products.
fn one_expert(experts: &Experts, e: usize, x: &[f32]) -> Vec<f32> {
    let (_, ff, d) = experts.gate.operand(e);
    let (mut g, mut u, mut h) = (vec![0.0; ff], vec![0.0; ff], vec![0.0; ff]);
    experts.gate.forward(e, x, 1, &mut g).unwrap();
    experts.up.forward(e, x, 1, &mut u).unwrap();
    swiglu(&mut h, &g, &u).unwrap();
    let mut o = vec![0.0; d];
    experts.down.forward(e, &h, 1, &mut o).unwrap();
    o
}

/// The block, row by row with every expert computed alone, against its grouped pass
/// (many rows, the experts side by side) and its decode pass (one row), with and
/// without a shared expert.
#[test]
fn grouped_and_single_row_passes_equal_a_dense_reference() {
    for (shared, norm) in [(None, true), (Some(24), false)] {
        let m = Moe {
            experts: 6,
            used: 3,
            expert_ffn: 20,
            norm_topk: norm,
            shared_ffn: shared,
        };
        let c = DecoderConfig {
            moe: Some(m.clone()),
            ..DecoderConfig::llama(16, 1, 2, 2, 8, 10, 32, WeightLayout::Gguf)
        };
        let mut seed = 11u64;
        let mut matrix = |name: String, rows: usize, cols: usize| -> Result<Tensor> {
            let data = (0..rows * cols)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0) / (cols as f32).sqrt()
                })
                .collect();
            Tensor::from_f32(&name, vec![rows, cols], data)?.into_dtype(FloatType::F32)
        };
        let block = synthetic_moe(&c, &m, 0, &mut matrix).unwrap();
        assert!(matches!(block.experts.gate, ExpertMatrices::Each(_)));
        let t = 7;
        let xn: Vec<f32> = (0..t * c.dim)
            .map(|i| ((i * 7919) % 23) as f32 / 11.0 - 1.0)
            .collect();
        let experts = &block.experts;
        check_block(
            &c,
            &m,
            &block,
            &xn,
            t,
            &|e, x| one_expert(experts, e, x),
            1e-5,
        );
    }
}

/// Quantized experts in banks (one interleaved map per kind of matrix), against each
/// expert's blocks in the file's layout multiplied on their own: 5 experts, 3 chosen per
/// row, matrices of 32 and 64 rows (whole groups of 8), passes of 1, 2 and 13 rows (an
/// expert may meet no row, some of them, or every one).
/// Q6_K and Q8_0 banks too (at 16 bits, the default, their kernels read the integers, not
/// the byte split the 4-bit ones read).
#[test]
fn banked_quantized_experts_equal_each_expert_alone() {
    quantized_experts(QuantFormat::Q4_0, 5, 3, 32, 64, &[1, 2, 13], true);
    quantized_experts(QuantFormat::Q8_0, 4, 2, 32, 64, &[1, 17], true);
    quantized_experts(QuantFormat::Q6_K, 3, 2, 256, 256, &[1, 24], true);
    quantized_experts(QuantFormat::Q5_K, 3, 2, 256, 256, &[1, 24], true);
}

/// Experts in a format without an interleaved layout (Q2_K), whose passes of 17 to 32
/// rows run as two products: 3 experts, 2 chosen, passes of 1, 24 (every expert that a
/// row chose meets most rows) and 40 rows. The reference is exact (the blocks widened
/// to f32, f32 products), so the tolerance covers the kernels' rounding of the inputs to
/// 16 bits, which sums of 256 random terms that largely cancel magnify.
#[test]
fn gguf_layout_experts_in_split_passes_equal_each_expert_alone() {
    quantized_experts(QuantFormat::Q2_K, 3, 2, 256, 256, &[1, 24, 40], false);
}

/// A block of `experts` experts of `format` (`used` chosen per row, `[ff, d]` gate and
/// up, `[d, ff]` down, random blocks mapped from a file as GGUF's 3-D tensors are),
/// checked by [`check_block`] over passes of each of `passes` rows, against each expert's
/// blocks multiplied in the file's layout; `bank` says whether they must be banked.
fn quantized_experts(
    format: QuantFormat,
    experts: usize,
    used: usize,
    ff: usize,
    d: usize,
    passes: &[usize],
    bank: bool,
) {
    use qkv_kernels::quant::testing::{weight_blocks, Rng};
    let m = Moe {
        experts,
        used,
        expert_ffn: ff,
        norm_topk: true,
        shared_ffn: None,
    };
    let c = DecoderConfig {
        moe: Some(m.clone()),
        ..DecoderConfig::llama(d, 1, 2, 2, 8, 10, 32, WeightLayout::Gguf)
    };
    // Every expert's blocks in one file, as a GGUF file holds a 3-D tensor.
    let mut rng = Rng(0x2545F4914F6CDD1D);
    let kinds = [(ff, d), (ff, d), (d, ff)];
    let blocks: Vec<Vec<Vec<u8>>> = kinds
        .iter()
        .map(|&(rows, cols)| {
            (0..m.experts)
                .map(|_| weight_blocks(format, rows, cols, &mut rng))
                .collect()
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("qkv-moe-{format}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("experts.bin");
    let all: Vec<u8> = blocks.iter().flatten().flatten().copied().collect();
    std::fs::write(&path, &all).unwrap();
    let file = crate::weights::map_file(&path).unwrap();
    let mut offset = 0;
    let mut views = Vec::new();
    for (kind, &(rows, cols)) in ["gate", "up", "down"].iter().zip(&kinds) {
        let len = m.experts * format.row_bytes(cols).unwrap() * rows;
        let t = Tensor::from_mapped_quant(
            &format!("blk.0.ffn_{kind}_exps.weight"),
            vec![m.experts, rows, cols],
            file.clone(),
            offset,
            format,
        )
        .unwrap();
        views.push(t.split_outer().unwrap());
        offset += len;
    }
    let downs = views.pop().unwrap();
    let ups = views.pop().unwrap();
    let gates = views.pop().unwrap();
    // The exact mode (16-bit activations): the bound checks the banking against each
    // expert widened, which 8-bit activations would blur by more than it allows.
    let exact = MatrixOptions {
        act_precision: qkv_kernels::quant::act::ActPrecision::Wide,
        ..MatrixOptions::default()
    };
    let experts = Experts::build(gates, ups, downs, &Ok, &exact).unwrap();
    for e in [&experts.gate, &experts.up, &experts.down] {
        assert_eq!(
            matches!(e, ExpertMatrices::Bank(_)),
            bank,
            "{format} experts"
        );
    }
    if bank {
        let names = experts.matrices();
        assert_eq!(names[0].name, "blk.0.ffn_gate_exps.weight");
    }
    let mut seed = 5u64;
    let router = (0..m.experts * d)
        .map(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    let block = MoeBlock {
        router: Linear::from_tensors(
            Tensor::from_f32("router", vec![m.experts, d], router).unwrap(),
            None,
        )
        .unwrap(),
        experts: Box::new(experts),
        shared: None,
    };
    // The reference: each expert's own blocks, in the file's layout, through the
    // kernels' one-row product (banks) or exactly (the others, split into passes).
    let plain = |kind: usize, e: usize| Weights::Quant(format, &blocks[kind][e]);
    let product = if bank {
        linear
    } else {
        qkv_kernels::matmul::linear_scalar
    };
    let expert = |e: usize, x: &[f32]| {
        let (mut g, mut u, mut h) = (vec![0.0; ff], vec![0.0; ff], vec![0.0; ff]);
        product(&mut g, x, plain(0, e), None, 1, d, ff).unwrap();
        product(&mut u, x, plain(1, e), None, 1, d, ff).unwrap();
        swiglu(&mut h, &g, &u).unwrap();
        let mut o = vec![0.0; d];
        product(&mut o, &h, plain(2, e), None, 1, ff, d).unwrap();
        o
    };
    let tol = if bank { 1e-5 } else { 1e-3 };
    for &t in passes {
        let xn: Vec<f32> = (0..t * d)
            .map(|i| ((i * 7919 + t) % 29) as f32 / 14.0 - 1.0)
            .collect();
        check_block(&c, &m, &block, &xn, t, &expert, tol);
    }
    drop(block);
    std::fs::remove_dir_all(&dir).ok();
}
