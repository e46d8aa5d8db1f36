//! [`attention_many`] against [`attention`] on each of its calls alone: bit for bit, on
//! batches that mix decode calls short and long (split keys from 512 keys on), short and
//! long prompts (the latter pack key blocks up front and run alone), GQA and MHA, f16 and f32
//! caches, causal and sliding masks and a soft-cap, on pools of 1 to 3 threads.

use super::{Kv, Rng, F16};
use qkv_kernels::{attention, attention_many, AttentionCall, AttentionMask, KvView, QueryView};

/// One call's inputs: `tq` queries over `tk` keys.
struct Input {
    tq: usize,
    tk: usize,
    q: Vec<f32>,
    kv: Kv,
    mask: AttentionMask<'static>,
}

/// The shapes of one batch: heads, KV heads, d (keys and values).
fn inputs(heads: usize, kv_heads: usize, d: usize, half: bool, rng: &mut Rng) -> Vec<Input> {
    let shapes: &[(usize, usize)] = if cfg!(miri) {
        &[(1, 1), (1, 65), (3, 9)]
    } else {
        &[
            (1, 1),
            (1, 63),
            (1, 65),
            (1, 300),
            (1, 511),
            (1, 512),
            (1, 700),
            (1, 2048),
            (1, 3001),
            (5, 40),
            (200, 260),
        ]
    };
    shapes
        .iter()
        .enumerate()
        .map(|(n, &(tq, tk))| {
            let q = rng.vec(tq * heads * d, 1.0);
            let kv = Kv::new(
                rng.vec(tk * kv_heads * d, 1.0),
                rng.vec(tk * kv_heads * d, 1.0),
                half,
            );
            let mut mask = match n % 3 {
                2 => AttentionMask::sliding(tk - tq, 1 + tk / 3),
                _ => AttentionMask::causal(tk - tq),
            };
            if n % 4 == 3 {
                mask.softcap = Some(5.0);
            }
            Input {
                tq,
                tk,
                q,
                kv,
                mask,
            }
        })
        .collect()
}

#[test]
fn many_calls_equal_each_call_alone() {
    let mut rng = Rng(404);
    let shapes: &[(usize, usize, usize)] = &[(9, 3, 64), (4, 1, 8), (2, 2, 16)];
    for &(heads, kv_heads, d) in shapes {
        for half in [false, F16] {
            let inputs = inputs(heads, kv_heads, d, half, &mut rng);
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("a thread pool");
                pool.install(|| {
                    let views: Vec<(QueryView<'_>, KvView<'_>, KvView<'_>)> = inputs
                        .iter()
                        .map(|i| {
                            let (k, v) = i.kv.views(i.tk, kv_heads, d, d);
                            (QueryView::contiguous(&i.q, i.tq, heads, d), k, v)
                        })
                        .collect();
                    let alone: Vec<Vec<f32>> = inputs
                        .iter()
                        .zip(&views)
                        .map(|(i, (q, k, v))| {
                            let mut out = vec![0.0f32; i.tq * heads * d];
                            attention(q, k, v, &i.mask, Some(0.3), &mut out).unwrap();
                            out
                        })
                        .collect();
                    let mut outs: Vec<Vec<f32>> =
                        alone.iter().map(|a| vec![f32::NAN; a.len()]).collect();
                    let mut calls: Vec<AttentionCall<'_>> = inputs
                        .iter()
                        .zip(&views)
                        .zip(outs.iter_mut())
                        .map(|((i, (q, k, v)), out)| AttentionCall {
                            q: *q,
                            k: *k,
                            v: *v,
                            mask: i.mask,
                            scale: Some(0.3),
                            out,
                        })
                        .collect();
                    attention_many(&mut calls).unwrap();
                    for ((i, got), want) in inputs.iter().zip(&outs).zip(&alone) {
                        let same = got
                            .iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "heads {heads}/{kv_heads}, d {d}, f16 {half}, {threads} threads: \
                             tq {} tk {} differs from the call alone",
                            i.tq, i.tk
                        );
                    }
                });
            }
        }
    }
}

/// A bad call anywhere in the batch is a typed error before any call runs.
#[test]
fn a_bad_call_fails_the_batch_before_it_runs() {
    let q = [0.5f32; 8];
    let k = [0.25f32; 12];
    let (mut a, mut b) = (vec![7.0f32; 8], vec![7.0f32; 7]);
    let mut calls = [
        AttentionCall {
            q: QueryView::contiguous(&q, 1, 2, 4),
            k: KvView::contiguous_f32(&k, 3, 1, 4),
            v: KvView::contiguous_f32(&k, 3, 1, 4),
            mask: AttentionMask::causal(2),
            scale: None,
            out: &mut a,
        },
        AttentionCall {
            q: QueryView::contiguous(&q, 1, 2, 4),
            k: KvView::contiguous_f32(&k, 3, 1, 4),
            v: KvView::contiguous_f32(&k, 3, 1, 4),
            mask: AttentionMask::causal(2),
            scale: None,
            out: &mut b,
        },
    ];
    let err = attention_many(&mut calls).unwrap_err();
    assert!(err.to_string().contains("out"), "{err}");
    assert!(a.iter().all(|&x| x == 7.0), "the first call ran: {a:?}");
}
