//! The seeds' attention modules against PyTorch (fixtures from `tools/seq2seq_fixtures.py`),
//! the safetensors loader, and the typed errors.

use qkv::nn::{
    Attention, AttentionScratch, CrossAttention, DenseMask, KeyPadding, Mask, MultiHeadAttention,
    MultiHeadAttentionWithProbs, MultiHeadCrossAttention, SelfAttention, Seq, TransformerAttention,
};
use qkv::weights::safetensors::SafeTensorsFile;
use qkv::weights::{Scope, TensorSource, WeightFormat};
use qkv::Error;

mod common;
use common::{assert_close, fixture, Case, F16_TOL, F32_TOL};
use std::path::PathBuf;

fn scope(c: &Case) -> Scope<'_> {
    Scope::new(&c.weights)
}

fn seq<'a>(data: &'a [f32], shape: &[usize]) -> Seq<'a> {
    Seq::new(data, shape[0], shape[1], shape[2]).unwrap()
}

#[test]
fn safetensors_f32_views_are_mapped_and_named_as_pytorch() {
    let c = Case::open("self000");
    let w = c.weights.tensor("q.weight").unwrap();
    assert_eq!(w.shape(), &[8, 12]);
    assert_eq!(w.format(), WeightFormat::F32);
    assert!(w.is_mapped());
    let mut names = c.weights.names();
    names.sort();
    assert_eq!(
        names,
        ["k.bias", "k.weight", "q.bias", "q.weight", "v.bias", "v.weight"]
    );
}

#[test]
fn safetensors_f16_and_bf16_are_mapped() {
    let c = Case::open("mha000_f16");
    let w = c.weights.tensor("out.weight").unwrap();
    assert_eq!(w.format(), WeightFormat::F16);
    assert!(w.is_mapped());
    let c = Case::open("attn001_bf16");
    let w = c.weights.tensor("query.weight").unwrap();
    assert_eq!(w.format(), WeightFormat::BF16);
    assert!(w.is_mapped());
}

#[test]
fn scope_prefixes_names() {
    let c = Case::open("seq2seq");
    let s = scope(&c).pp("Encoder").pp("Layers.1");
    assert_eq!(s.name("attn.wq.weight"), "Encoder.Layers.1.attn.wq.weight");
    assert_eq!(s.tensor("attn.wq.weight").unwrap().shape(), &[16, 16]);
    match s.tensor("attn.nope") {
        Err(Error::MissingTensor { name }) => assert_eq!(name, "Encoder.Layers.1.attn.nope"),
        other => panic!("{other:?}"),
    }
}

fn write_tmp(tag: &str, bytes: &[u8]) -> PathBuf {
    let p = std::env::temp_dir().join(format!("qkv-s2s-{}-{tag}.safetensors", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    p
}

fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    b
}

#[test]
fn hostile_safetensors_files_are_format_errors() {
    let good = std::fs::read(fixture("self000.safetensors")).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() - 7].to_vec()),
        ("header-cut", good[..20].to_vec()),
        ("tiny", vec![1, 2, 3]),
        ("huge-header", u64::MAX.to_le_bytes().to_vec()),
        ("not-json", with_header("{nope", &[0; 8])),
        (
            "overlap",
            with_header(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                &[0; 12],
            ),
        ),
        (
            "short-data",
            with_header(
                r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
                &[0; 8],
            ),
        ),
        (
            "shape-lies",
            with_header(
                r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
        ),
        (
            "overflow",
            with_header(
                r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
        ),
    ];
    for (tag, bytes) in cases {
        let p = write_tmp(tag, &bytes);
        let r = SafeTensorsFile::open(&p);
        std::fs::remove_file(&p).ok();
        assert!(matches!(r, Err(Error::Format { .. })), "{tag}: {r:?}");
    }
}

#[test]
fn unsupported_dtype_and_missing_tensor_are_typed() {
    let bytes = with_header(
        r#"{"i":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}"#,
        &[0; 8],
    );
    let p = write_tmp("i32", &bytes);
    let f = SafeTensorsFile::open(&p).unwrap();
    std::fs::remove_file(&p).ok();
    assert!(matches!(f.tensor("i"), Err(Error::UnsupportedDType { .. })));
    assert!(matches!(f.tensor("j"), Err(Error::MissingTensor { .. })));
    assert!(matches!(
        SafeTensorsFile::open("/nonexistent/x.safetensors"),
        Err(Error::Io { .. })
    ));
}

#[test]
fn seed000_self_attention() {
    let c = Case::open("self000");
    let m = SelfAttention::load(&scope(&c), 12, 8, 6).unwrap();
    let x = c.get("x");
    let y = m.forward(seq(&x, &c.shape("x")), &Mask::none()).unwrap();
    assert_eq!(y.shape(), [3, 5, 6]);
    assert_close(y.data(), &c.get("out"), F32_TOL, "self000");
}

fn check_mha000(name: &str, tol: f32) {
    let c = Case::open(name);
    let m = MultiHeadAttention::load(&scope(&c), 16, 8, 16, 24).unwrap();
    let x = c.get("x");
    let xs = seq(&x, &c.shape("x"));
    let y = m.forward(xs, &Mask::none()).unwrap();
    assert_close(y.data(), &c.get("out"), tol, name);
    // Pads in the middle and at the head, from explicit flags.
    let pads = KeyPadding::from_flags(c.flags("keep"), 3, 5).unwrap();
    let y = m.forward(xs, &Mask::none().with_padding(&pads)).unwrap();
    assert_close(y.data(), &c.get("out_padded"), tol, name);

    // The same through `forward_into` with one scratch for both calls (and a smaller batch
    // in between, so that the buffers are reused at another size): the same numbers.
    let mut scratch = AttentionScratch::default();
    let core = m.core();
    let mut out = vec![f32::NAN; y.data().len()];
    let masks = [Mask::none(), Mask::none().with_padding(&pads)];
    for (mask, want) in masks.iter().zip(["out", "out_padded"]) {
        core.forward_into(xs, xs, xs, mask, &mut scratch, &mut out)
            .unwrap();
        assert_eq!(&out, m.forward(xs, mask).unwrap().data(), "{name} {want}");
        assert_close(&out, &c.get(want), tol, name);
        let one = seq(&x[..xs.len() * xs.dim()], &[1, xs.len(), xs.dim()]);
        let mut small = vec![0.0; out.len() / 3];
        core.forward_into(one, one, one, &Mask::none(), &mut scratch, &mut small)
            .unwrap();
        assert_eq!(&small, m.forward(one, &Mask::none()).unwrap().data());
    }
    // An output of the wrong length is a shape error, not a panic.
    let mut short = vec![0.0; out.len() - 1];
    assert!(matches!(
        core.forward_into(xs, xs, xs, &Mask::none(), &mut scratch, &mut short),
        Err(Error::Shape(m)) if m.contains("output holds")
    ));
}

#[test]
fn seed000_multi_head_attention_8_heads_dim_qk_ne_dim_v() {
    check_mha000("mha000", F32_TOL);
}

#[test]
fn seed000_multi_head_attention_f16_weights() {
    check_mha000("mha000_f16", F16_TOL);
}

#[test]
fn seed000_cross_attention_tq_ne_tk() {
    let c = Case::open("cross000");
    let m = CrossAttention::load(&scope(&c), 12, 8, 10).unwrap();
    let (enc, dec) = (c.get("enc"), c.get("dec"));
    let (e, d) = (seq(&enc, &c.shape("enc")), seq(&dec, &c.shape("dec")));
    let y = m.forward(e, d, &Mask::none()).unwrap();
    assert_eq!(y.shape(), [3, 4, 10]);
    assert_close(y.data(), &c.get("out"), F32_TOL, "cross000");
    let pads = KeyPadding::from_lengths(&c.lengths("src_lengths"), 7).unwrap();
    let y = m.forward(e, d, &Mask::none().with_padding(&pads)).unwrap();
    assert_close(y.data(), &c.get("out_padded"), F32_TOL, "cross000 padded");
}

fn check_attn001(name: &str, tol: f32) {
    let c = Case::open(name);
    let m = Attention::load(&scope(&c), 16, 2).unwrap();
    let (q, kv) = (c.get("q"), c.get("kv"));
    let (q, kv) = (seq(&q, &c.shape("q")), seq(&kv, &c.shape("kv")));
    let none = Mask::none();
    let run = |a, b, mask: &Mask<'_>, causal| m.forward(a, b, b, mask, causal).unwrap();
    assert_close(run(q, q, &none, false).data(), &c.get("self"), tol, "self");
    assert_close(
        run(q, kv, &none, false).data(),
        &c.get("cross"),
        tol,
        "cross",
    );
    assert_close(
        run(q, q, &none, true).data(),
        &c.get("causal"),
        tol,
        "causal",
    );
    assert_close(
        run(q, kv, &none, true).data(),
        &c.get("causal_cross"),
        tol,
        "causal, Tq≠Tk",
    );
    let dense = DenseMask::shared(c.flags("dense_keep"), 4, 6).unwrap();
    let dm = Mask::none().with_dense(&dense);
    assert_close(run(q, kv, &dm, false).data(), &c.get("dense"), tol, "dense");
    assert_close(
        run(q, kv, &dm, true).data(),
        &c.get("dense_causal"),
        tol,
        "dense+causal",
    );
}

#[test]
fn seed001_attention_self_cross_causal_dense() {
    check_attn001("attn001", F32_TOL);
}

#[test]
fn seed001_attention_bf16_weights() {
    check_attn001("attn001_bf16", F16_TOL);
}

#[test]
fn seed002_returns_probabilities() {
    let c = Case::open("mha002");
    let m = MultiHeadAttentionWithProbs::load(&scope(&c), 16, 4).unwrap();
    let x = c.get("x");
    let xs = seq(&x, &c.shape("x"));
    let pads = KeyPadding::from_flags(c.flags("keep"), 3, 5).unwrap();
    let (y, a) = m.forward(xs, &Mask::none().with_padding(&pads)).unwrap();
    assert_close(y.data(), &c.get("out"), F32_TOL, "mha002 out");
    assert_eq!(c.shape("probs"), [3, 4, 5, 5]);
    assert_close(&a, &c.get("probs"), F32_TOL, "mha002 probs");
    let mask = Mask::none().with_padding(&pads).with_causal();
    let (y, a) = m.forward(xs, &mask).unwrap();
    assert_close(y.data(), &c.get("out_causal"), F32_TOL, "mha002 causal out");
    assert_close(&a, &c.get("probs_causal"), F32_TOL, "mha002 causal probs");
}

#[test]
fn seed002_per_sequence_masks_over_more_than_one_key_block() {
    let c = Case::open("mha002_wide");
    let (b, l) = (2, 100);
    let m = MultiHeadAttentionWithProbs::load(&scope(&c), 16, 4).unwrap();
    let x = c.get("x");
    let dense = DenseMask::per_batch(c.flags("keep"), b, l, l).unwrap();
    let (y, a) = m
        .forward(seq(&x, &c.shape("x")), &Mask::none().with_dense(&dense))
        .unwrap();
    assert_close(y.data(), &c.get("out"), F32_TOL, "mha002_wide out");
    assert_eq!(c.shape("probs"), [b, 4, l, l]);
    assert_close(&a, &c.get("probs"), F32_TOL, "mha002_wide probs");
}

#[test]
fn seed001_causal_with_more_queries_than_keys() {
    let c = Case::open("attn001_tall");
    let m = Attention::load(&scope(&c), 16, 2).unwrap();
    let (q, kv) = (c.get("q"), c.get("kv"));
    let (q, kv) = (seq(&q, &c.shape("q")), seq(&kv, &c.shape("kv")));
    let y = m.forward(q, kv, kv, &Mask::none(), true).unwrap();
    assert_close(y.data(), &c.get("causal_tall"), F32_TOL, "causal, Tq > Tk");
}

#[test]
fn seed003_multi_head_cross_attention_8_heads() {
    let c = Case::open("cross003");
    let m = MultiHeadCrossAttention::load(&scope(&c), 16, 8).unwrap();
    let (q, kv) = (c.get("q"), c.get("kv"));
    let (q, kv) = (seq(&q, &c.shape("q")), seq(&kv, &c.shape("kv")));
    let pads = KeyPadding::from_lengths(&c.lengths("src_lengths"), 7).unwrap();
    let y = m
        .forward(q, kv, kv, &Mask::none().with_padding(&pads))
        .unwrap();
    assert_close(y.data(), &c.get("out"), F32_TOL, "cross003");
    let y = m.forward(q, kv, kv, &Mask::none()).unwrap();
    assert_close(
        y.data(),
        &c.get("out_unmasked"),
        F32_TOL,
        "cross003 unmasked",
    );
}

#[test]
fn seed004_attention_padding_and_causal() {
    let c = Case::open("mha004");
    let m = TransformerAttention::load(&scope(&c), 16, 4).unwrap();
    let x = c.get("x");
    let xs = seq(&x, &c.shape("x"));
    let pads = KeyPadding::from_lengths(&c.lengths("lengths"), 5).unwrap();
    let y = m
        .forward(xs, xs, xs, &Mask::none().with_padding(&pads))
        .unwrap();
    assert_close(y.data(), &c.get("out_padded"), F32_TOL, "mha004 padded");
    let y = m
        .forward(xs, xs, xs, &Mask::none().with_padding(&pads).with_causal())
        .unwrap();
    assert_close(y.data(), &c.get("out_causal"), F32_TOL, "mha004 causal");
}

#[test]
fn fully_masked_rows_return_zeros() {
    // Documented behaviour: a query that sees no key gets zeros (before any output projection).
    let c = Case::open("self000");
    let m = SelfAttention::load(&scope(&c), 12, 8, 6).unwrap();
    let x = c.get("x");
    let mut keep = vec![true; 15];
    keep[5..10].fill(false); // sequence 1: every key is padding
    let pads = KeyPadding::from_flags(keep, 3, 5).unwrap();
    let y = m
        .forward(seq(&x, &[3, 5, 12]), &Mask::none().with_padding(&pads))
        .unwrap();
    assert!(y.data()[30..60].iter().all(|&v| v == 0.0));
    assert!(
        y.data()[..30].iter().all(|v| v.is_finite()) && y.data()[..30].iter().any(|&v| v != 0.0)
    );
}

#[test]
fn errors_are_typed_and_name_the_culprit() {
    let c = Case::open("mha000");
    let s = scope(&c);
    // Heads that do not divide the projection sizes.
    assert!(
        matches!(MultiHeadAttention::load(&s, 16, 3, 16, 24), Err(Error::Config(m)) if m.contains("dim_qk"))
    );
    assert!(matches!(
        MultiHeadAttention::load(&s, 16, 0, 16, 24),
        Err(Error::Config(_))
    ));
    // A shape that disagrees with the configuration.
    match MultiHeadAttention::load(&s, 16, 8, 16, 16) {
        Err(Error::TensorShape {
            name,
            expected,
            actual,
        }) => {
            assert_eq!(name, "v.weight");
            assert_eq!((expected, actual), (vec![16, 16], vec![24, 16]));
        }
        other => panic!("{other:?}"),
    }
    // A missing tensor, named in full.
    match MultiHeadAttention::load(&s.pp("layer"), 16, 8, 16, 24) {
        Err(Error::MissingTensor { name }) => assert_eq!(name, "layer.q.weight"),
        other => panic!("{other:?}"),
    }
    let m = MultiHeadAttention::load(&s, 16, 8, 16, 24).unwrap();
    let x = c.get("x");
    let xs = seq(&x, &[3, 5, 16]);
    // Masks of the wrong shape.
    let pads = KeyPadding::from_lengths(&[5, 5], 5).unwrap();
    assert!(matches!(
        m.forward(xs, &Mask::none().with_padding(&pads)),
        Err(Error::Shape(_))
    ));
    let pads = KeyPadding::from_lengths(&[5, 5, 5], 6).unwrap();
    assert!(matches!(
        m.forward(xs, &Mask::none().with_padding(&pads)),
        Err(Error::Shape(_))
    ));
    let dense = DenseMask::shared(vec![true; 20], 4, 5).unwrap();
    assert!(matches!(
        m.forward(xs, &Mask::none().with_dense(&dense)),
        Err(Error::Shape(_))
    ));
    let dense = DenseMask::per_batch(vec![true; 50], 2, 5, 5).unwrap();
    assert!(matches!(
        m.forward(xs, &Mask::none().with_dense(&dense)),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        KeyPadding::from_lengths(&[6], 5),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        KeyPadding::from_flags(vec![true; 4], 1, 5),
        Err(Error::Shape(_))
    ));
    // Inputs of the wrong shape.
    assert!(matches!(Seq::new(&x, 3, 5, 15), Err(Error::Shape(_))));
    assert!(matches!(
        m.forward(seq(&x[..60], &[1, 5, 12]), &Mask::none()),
        Err(Error::Shape(_))
    ));
    let cross = CrossAttention::load(&scope(&Case::open("cross000")), 12, 8, 10).unwrap();
    let a = vec![0.0; 2 * 3 * 12];
    let b = vec![0.0; 3 * 3 * 12];
    assert!(matches!(
        cross.forward(seq(&a, &[2, 3, 12]), seq(&b, &[3, 3, 12]), &Mask::none()),
        Err(Error::Shape(_))
    ));
}

/// Sizes whose products overflow, or that no machine could hold, are shape or context
/// errors, never a wrapped product that lets a short slice through.
#[test]
fn overflowing_shapes_are_errors() {
    let weight = qkv::weights::Tensor::from_f32("w", vec![4, 2], vec![0.5; 8]).unwrap();
    let linear = qkv::nn::Linear::from_tensors(weight, None).unwrap();
    let err = linear.forward_into(&[], 1 << 63, &mut []).unwrap_err();
    assert!(matches!(err, Error::Shape(_)), "{err}");

    let huge = 1usize << 32;
    assert!(matches!(
        KeyPadding::from_flags(vec![], huge, huge),
        Err(Error::Shape(_))
    ));
    assert!(matches!(KeyPadding::all(huge, huge), Err(Error::Shape(_))));
    assert!(matches!(
        KeyPadding::from_lengths(&[1; 3], usize::MAX),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        DenseMask::shared(vec![], huge, huge),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        DenseMask::per_batch(vec![], 2, huge, huge),
        Err(Error::Shape(_))
    ));

    let pe = qkv::nn::PositionalEncoding::new(4, 16).unwrap();
    let err = pe.add_into(&mut [0.0; 4], 1, usize::MAX).unwrap_err();
    assert!(matches!(err, Error::ContextFull { .. }), "{err}");
}

#[test]
fn a_stored_positional_table_is_added_as_it_is() {
    use qkv::nn::PositionalEncoding;
    let (d, max_len) = (4, 3);
    let table: Vec<f32> = (0..d * max_len).map(|i| i as f32 * 0.5).collect();
    let pe = PositionalEncoding::from_table(d, max_len, table.clone()).unwrap();
    let mut x = vec![1.0; 2 * d];
    pe.add_into(&mut x, 2, 1).unwrap();
    let want: Vec<f32> = table[d..3 * d].iter().map(|v| v + 1.0).collect();
    assert_eq!(x, want);
    assert!(matches!(
        pe.add_into(&mut [0.0; 4], 1, 3),
        Err(Error::ContextFull { .. })
    ));
    assert!(matches!(
        pe.add_into(&mut [0.0; 3], 1, 0),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        PositionalEncoding::from_table(d, max_len, vec![0.0; 11]),
        Err(Error::Shape(_))
    ));
    // The computed encoding and a table of the same values agree exactly.
    let computed = PositionalEncoding::new(d, max_len).unwrap();
    let mut from_new = vec![0.0; max_len * d];
    computed.add_into(&mut from_new, max_len, 0).unwrap();
    let stored = PositionalEncoding::from_table(d, max_len, from_new.clone()).unwrap();
    let mut from_table = vec![0.0; max_len * d];
    stored.add_into(&mut from_table, max_len, 0).unwrap();
    assert_eq!(from_new, from_table);
}

/// A linear layer kept transposed for gemm computes what the stored layout computes, for one
/// row (the gemm path even there), a few and many; f16 weights are left as they are, and a
/// second call changes nothing.
#[test]
fn a_linear_kept_for_many_rows_computes_the_same() {
    use qkv::nn::Linear;
    use qkv::weights::Tensor;
    let (n, k) = (37, 19);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919 % 113) as f32 - 56.0) / 64.0)
        .collect();
    let bias: Vec<f32> = (0..n).map(|j| j as f32 / 8.0).collect();
    let stored = Linear::from_tensors(
        Tensor::from_f32("w", vec![n, k], w.clone()).unwrap(),
        Some(bias.clone()),
    )
    .unwrap();
    let kept = Linear::from_tensors(Tensor::from_f32("w", vec![n, k], w).unwrap(), Some(bias))
        .unwrap()
        .for_many_rows()
        .unwrap()
        .for_many_rows()
        .unwrap();
    assert_eq!(kept.weight().shape(), &[k, n]);
    assert_eq!((kept.in_dim(), kept.out_dim()), (k, n));
    for rows in [1, 5, 40] {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 31 % 17) as f32 - 8.0) / 9.0)
            .collect();
        let (mut a, mut b) = (vec![0.0; rows * n], vec![0.0; rows * n]);
        stored.forward_into(&x, rows, &mut a).unwrap();
        kept.forward_into(&x, rows, &mut b).unwrap();
        assert_close(&b, &a, 1e-5, &format!("{rows} rows"));
    }
    let half = Tensor::from_f16("w16", vec![2, 3], vec![qkv_kernels::f16::ONE; 6]).unwrap();
    let half = Linear::from_tensors(half, None)
        .unwrap()
        .for_many_rows()
        .unwrap();
    assert_eq!(half.weight().shape(), &[2, 3]);
    assert_eq!(half.weight().format(), WeightFormat::F16);
}
