//! NaN is never hidden by the layers built on the attention kernel: the seq2seq model's
//! encoder and decoder, and the seed modules. A NaN in an input reaches every output row
//! whose attention sees it, as in PyTorch, and no row whose attention masks it: masked keys
//! take no part in the kernel (see `qkv_kernels::attention`), where PyTorch's math path
//! would also leak a masked NaN through `0·V`.

use qkv::models::seq2seq::{Seq2Seq, Seq2SeqConfig};
use qkv::nn::{
    CrossAttention, KeyPadding, Mask, MultiHeadAttention, MultiHeadAttentionWithProbs, Seq,
};
use qkv::weights::Scope;

mod common;
use common::Case;

/// Deterministic inputs in [-1, 1).
fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// For each row of `dim` values: `true` when NaN, `false` when finite; panics on a row that
/// is partly NaN or holds an infinity.
fn nan_rows(data: &[f32], dim: usize) -> Vec<bool> {
    data.chunks(dim)
        .enumerate()
        .map(|(r, row)| {
            if row.iter().all(|x| x.is_nan()) {
                true
            } else {
                assert!(row.iter().all(|x| x.is_finite()), "row {r}: {row:?}");
                false
            }
        })
        .collect()
}

/// `[B, T]` flags: `rows(b, t)` for every row, batch-major.
fn expect(batch: usize, len: usize, rows: impl Fn(usize, usize) -> bool) -> Vec<bool> {
    (0..batch)
        .flat_map(|b| (0..len).map(move |t| (b, t)))
        .map(|(b, t)| rows(b, t))
        .collect()
}

fn seq2seq() -> (Seq2Seq, usize) {
    let c = Case::open("seq2seq");
    let cfg = Seq2SeqConfig::from_metadata(&c.weights.metadata()).unwrap();
    let d = cfg.d_model;
    (Seq2Seq::load(&c.weights, cfg).unwrap(), d)
}

const B: usize = 2;
const S: usize = 7;
const T: usize = 6;

#[test]
fn seq2seq_encoder_propagates_nan_to_the_rows_that_see_it() {
    let (m, d) = seq2seq();
    let padding = KeyPadding::from_lengths(&[S, 5], S).unwrap();
    let clean = inputs(B * S * d, 1);
    let out = m
        .encode_embedded(Seq::new(&clean, B, S, d).unwrap(), &padding)
        .unwrap();
    assert!(nan_rows(out.data(), d).iter().all(|&x| !x));

    // A NaN in a real token of sequence 0: every row of sequence 0 attends to it.
    let mut x = clean.clone();
    x[3 * d] = f32::NAN;
    let out = m
        .encode_embedded(Seq::new(&x, B, S, d).unwrap(), &padding)
        .unwrap();
    assert_eq!(nan_rows(out.data(), d), expect(B, S, |b, _| b == 0));

    // A NaN in a padded token of sequence 1: only that token's own row (its residual) is
    // NaN; no real row attends to it.
    let mut x = clean;
    x[(S + 6) * d + 2] = f32::NAN;
    let out = m
        .encode_embedded(Seq::new(&x, B, S, d).unwrap(), &padding)
        .unwrap();
    assert_eq!(
        nan_rows(out.data(), d),
        expect(B, S, |b, t| b == 1 && t == 6)
    );
}

#[test]
fn seq2seq_decoder_propagates_nan_causally_and_across() {
    let (m, d) = seq2seq();
    let src_pad = KeyPadding::from_lengths(&[S, 5], S).unwrap();
    let tgt_pad = KeyPadding::all(B, T).unwrap();
    let enc = inputs(B * S * d, 2);
    let y = inputs(B * T * d, 3);
    let run = |y: &[f32], enc: &[f32]| {
        let out = m
            .decode_embedded(
                Seq::new(y, B, T, d).unwrap(),
                Seq::new(enc, B, S, d).unwrap(),
                &src_pad,
                &tgt_pad,
            )
            .unwrap();
        nan_rows(out.data(), d)
    };
    assert_eq!(run(&y, &enc), vec![false; B * T]);

    // A NaN in target token 2 of sequence 0: the causal self-attention of positions 2.. sees
    // it, positions 0 and 1 do not.
    let mut y2 = y.clone();
    y2[2 * d + 1] = f32::NAN;
    assert_eq!(run(&y2, &enc), expect(B, T, |b, t| b == 0 && t >= 2));

    // A NaN in a real source position of sequence 1: its every target row (cross-attention).
    let mut e = enc.clone();
    e[(S + 4) * d] = f32::NAN;
    assert_eq!(run(&y, &e), expect(B, T, |b, _| b == 1));

    // In a padded source position: masked for every target row.
    let mut e = enc;
    e[(S + 5) * d] = f32::NAN;
    assert_eq!(run(&y, &e), vec![false; B * T]);
}

#[test]
fn seed_self_attention_propagates_nan_unless_masked() {
    let c = Case::open("mha000");
    let m = MultiHeadAttention::load(&Scope::new(&c.weights), 16, 8, 16, 24).unwrap();
    let (b, l, dim) = (3, 5, 16);
    let mut x = c.get("x");
    assert_eq!(x.len(), b * l * dim);
    x[(l + 2) * dim] = f32::NAN; // sequence 1, position 2
    let xs = Seq::new(&x, b, l, dim).unwrap();
    let y = m.forward(xs, &Mask::none()).unwrap();
    assert_eq!(nan_rows(y.data(), dim), expect(b, l, |s, _| s == 1));
    // Position 2 of sequence 1 padded: only its own query row is NaN.
    let pads = KeyPadding::from_lengths(&[5, 2, 5], 5).unwrap();
    let y = m.forward(xs, &Mask::none().with_padding(&pads)).unwrap();
    assert_eq!(
        nan_rows(y.data(), dim),
        expect(b, l, |s, t| s == 1 && t == 2)
    );
}

#[test]
fn seed_cross_attention_propagates_nan_from_queries_and_keys() {
    let c = Case::open("cross000");
    let m = CrossAttention::load(&Scope::new(&c.weights), 12, 8, 10).unwrap();
    let (b, tk, tq, dim, dv) = (3, 7, 4, 12, 10);
    let (enc, dec) = (c.get("enc"), c.get("dec"));
    let lengths = c.lengths("src_lengths");
    let pads = KeyPadding::from_lengths(&lengths, tk).unwrap();
    let run = |enc: &[f32], dec: &[f32], mask: &Mask<'_>| {
        let e = Seq::new(enc, b, tk, dim).unwrap();
        let d = Seq::new(dec, b, tq, dim).unwrap();
        nan_rows(m.forward(e, d, mask).unwrap().data(), dv)
    };
    // A NaN query: that row only (before, it came out as the value projection's bias).
    let mut d2 = dec.clone();
    d2[dim + 3] = f32::NAN; // sequence 0, query 1
    assert_eq!(
        run(&enc, &d2, &Mask::none()),
        expect(b, tq, |s, t| s == 0 && t == 1)
    );
    // A NaN key in sequence 2: every query of sequence 2.
    let mut e2 = enc.clone();
    e2[2 * tk * dim] = f32::NAN;
    assert_eq!(run(&e2, &dec, &Mask::none()), expect(b, tq, |s, _| s == 2));
    // The same NaN in a padded source position changes nothing.
    let (s, len) = lengths
        .iter()
        .enumerate()
        .find(|(_, &n)| n < tk)
        .map(|(s, &n)| (s, n))
        .expect("a padded source sequence");
    let mut e3 = enc;
    e3[(s * tk + len) * dim] = f32::NAN;
    let mask = Mask::none().with_padding(&pads);
    assert_eq!(run(&e3, &dec, &mask), vec![false; b * tq]);
}

#[test]
fn seed_attention_probabilities_show_nan_where_the_output_does() {
    let c = Case::open("mha002");
    let m = MultiHeadAttentionWithProbs::load(&Scope::new(&c.weights), 16, 4).unwrap();
    let (b, l, dim, h) = (3, 5, 16, 4);
    let mut x = c.get("x");
    x[4 * dim + 5] = f32::NAN; // sequence 0, position 4
    let xs = Seq::new(&x, b, l, dim).unwrap();
    let (y, a) = m.forward(xs, &Mask::none().with_causal()).unwrap();
    // Causal: only position 4 of sequence 0 sees itself.
    assert_eq!(
        nan_rows(y.data(), dim),
        expect(b, l, |s, t| s == 0 && t == 4)
    );
    // A is [B, h, L, L]: row (0, head, 4) is NaN, the other rows of sequence 0 are finite
    // and give key 4 no weight.
    for head in 0..h {
        for i in 0..l {
            let row = &a[((head) * l + i) * l..][..l];
            if i == 4 {
                assert!(row.iter().all(|p| p.is_nan()), "{row:?}");
            } else {
                assert!(
                    row.iter().all(|p| p.is_finite()) && row[4] == 0.0,
                    "{row:?}"
                );
            }
        }
    }
    assert!(a[h * l * l..].iter().all(|p| p.is_finite()));
}
