//! The sampler's tests: each filter, the RNG, the distribution `sample` draws from, and
//! bad input.

use super::*;

fn counts(config: SamplerConfig, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut s = Sampler::new(config).unwrap();
    let mut c = vec![0; logits.len()];
    for _ in 0..draws {
        c[s.sample(logits, &[]).unwrap().id as usize] += 1;
    }
    c
}

fn free(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        seed,
    }
}

#[test]
fn rng_is_deterministic_and_uniform() {
    let a: Vec<u64> = (0..5)
        .scan(Rng::new(42), |r, _| Some(r.next_u64()))
        .collect();
    let b: Vec<u64> = (0..5)
        .scan(Rng::new(42), |r, _| Some(r.next_u64()))
        .collect();
    let c: Vec<u64> = (0..5)
        .scan(Rng::new(43), |r, _| Some(r.next_u64()))
        .collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
    let mut r = Rng::new(1);
    let n = 100_000;
    let mut mean = 0.0f64;
    for _ in 0..n {
        let x = r.next_f32();
        assert!((0.0..1.0).contains(&x));
        mean += x as f64 / n as f64;
    }
    assert!((mean - 0.5).abs() < 0.01, "{mean}");
}

#[test]
fn greedy_takes_the_argmax_and_reports_its_logprob() {
    let logits = [1.0, 5.0, 2.0, 5.0 - 1e-3];
    let s = Sampler::new(SamplerConfig::greedy())
        .unwrap()
        .sample(&logits, &[])
        .unwrap();
    assert_eq!(s.id, 1);
    let lse = logits.iter().map(|x| x.exp()).sum::<f32>().ln();
    assert!((s.logprob - (5.0 - lse)).abs() < 1e-5);
}

#[test]
fn temperature_sharpens_and_flattens() {
    let logits = [0.0, 1.0];
    let cold = counts(
        SamplerConfig {
            temperature: 0.25,
            ..free(1)
        },
        &logits,
        4000,
    );
    let hot = counts(
        SamplerConfig {
            temperature: 4.0,
            ..free(1)
        },
        &logits,
        4000,
    );
    // p(1) = σ(4) ≈ 0.98 when cold, σ(0.25) ≈ 0.56 when hot.
    assert!(cold[1] > 3800, "{cold:?}");
    assert!((2000..2600).contains(&hot[1]), "{hot:?}");
}

#[test]
fn unfiltered_sampling_follows_the_softmax() {
    let logits = [0.0, (2.0f32).ln(), (3.0f32).ln()]; // p = 1/6, 2/6, 3/6
    let c = counts(free(9), &logits, 60_000);
    for (k, want) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].iter().enumerate() {
        let got = c[k] as f64 / 60_000.0;
        assert!((got - want).abs() < 0.01, "{k}: {got} vs {want}");
    }
}

#[test]
fn top_k_keeps_only_the_k_best() {
    let logits = [3.0, 0.0, 2.9, 1.0, 2.8];
    let c = counts(
        SamplerConfig {
            top_k: 2,
            ..free(3)
        },
        &logits,
        2000,
    );
    assert_eq!(c[1] + c[3] + c[4], 0, "{c:?}");
    assert!(c[0] > 0 && c[2] > 0);
    let c = counts(
        SamplerConfig {
            top_k: 1,
            ..free(3)
        },
        &logits,
        100,
    );
    assert_eq!(c[0], 100);
}

#[test]
fn top_p_keeps_the_nucleus() {
    assert_eq!(filtered_len(&[0.5, 0.3, 0.15, 0.05], 0.8, 0.0), 2);
    assert_eq!(filtered_len(&[0.5, 0.3, 0.15, 0.05], 0.81, 0.0), 3);
    assert_eq!(filtered_len(&[0.5, 0.3, 0.15, 0.05], 1.0, 0.0), 4);
    assert_eq!(filtered_len(&[0.9, 0.1], 0.1, 0.0), 1);
    let logits = [(0.5f32).ln(), (0.3f32).ln(), (0.15f32).ln(), (0.05f32).ln()];
    let c = counts(
        SamplerConfig {
            top_p: 0.75, // 0.5 + 0.3 reach it; 0.8 itself would sit on a rounding edge
            ..free(5)
        },
        &logits,
        3000,
    );
    assert_eq!(c[2] + c[3], 0, "{c:?}");
    assert!(c[0] > 0 && c[1] > 0, "the nucleus keeps both: {c:?}");
}

#[test]
fn min_p_drops_the_unlikely() {
    assert_eq!(filtered_len(&[0.5, 0.3, 0.15, 0.05], 1.0, 0.2), 3);
    assert_eq!(filtered_len(&[0.5, 0.3, 0.15, 0.05], 1.0, 0.7), 1);
    let logits = [(0.5f32).ln(), (0.3f32).ln(), (0.15f32).ln(), (0.05f32).ln()];
    let c = counts(
        SamplerConfig {
            min_p: 0.5,
            ..free(5)
        },
        &logits,
        3000,
    );
    assert_eq!(c[2] + c[3], 0, "{c:?}");
    assert!(c[1] > 0);
}

#[test]
fn top_p_sums_the_whole_vocabulary_before_min_p() {
    // 0.5, 0.3 and twenty tokens of 0.01. Top-p 0.6 keeps 0.5 and 0.3 (0.5 alone falls
    // short); min-p 0.05 then drops the 0.01s. Pruning by min-p first and renormalising
    // would make 0.5 into 0.625 and let top-p keep it alone.
    let mut logits = vec![(0.01f32).ln(); 22];
    logits[0] = (0.5f32).ln();
    logits[1] = (0.3f32).ln();
    let config = SamplerConfig {
        top_p: 0.6,
        min_p: 0.05,
        ..free(9)
    };
    let c = counts(config, &logits, 2000);
    assert!(c[0] > 0 && c[1] > 0, "{c:?}");
    assert_eq!(c[2..].iter().sum::<usize>(), 0, "{c:?}");
    // With top-k on, top-p reads the top-k survivors renormalised, as documented.
    let c = counts(
        SamplerConfig {
            top_k: 2,
            top_p: 0.6,
            ..free(9)
        },
        &logits,
        2000,
    );
    assert!(c[0] > 0 && c[1] == 0, "{c:?}");
}

#[test]
fn repeat_penalty_pushes_recent_tokens_down_once() {
    let mut l = [2.0, -1.0, 3.0];
    apply_repeat_penalty(&mut l, &[0, 1, 0, 7], 2.0).unwrap();
    assert_eq!(l, [1.0, -2.0, 3.0]);
    for bad in [0.0, -2.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            apply_repeat_penalty(&mut l, &[0], bad),
            Err(Error::Config(_))
        ));
    }
    assert_eq!(l, [1.0, -2.0, 3.0]);
    assert_eq!(filtered_len(&[], 0.5, 0.5), 0);
    assert_eq!(filtered_len(&[1.0], 0.0, 0.0), 1);
    // Greedy with the penalty over the last 1 token only.
    let config = SamplerConfig {
        repeat_penalty: 10.0,
        repeat_last_n: 1,
        ..SamplerConfig::greedy()
    };
    let mut s = Sampler::new(config).unwrap();
    assert_eq!(s.sample(&[5.0, 4.0], &[0]).unwrap().id, 1);
    assert_eq!(s.sample(&[5.0, 4.0], &[0, 1]).unwrap().id, 0);
}

#[test]
fn same_seed_same_tokens_other_seed_other_tokens() {
    let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
    let run = |seed| -> Vec<u32> {
        let mut s = Sampler::new(free(seed)).unwrap();
        (0..50)
            .map(|_| s.sample(&logits, &[]).unwrap().id)
            .collect()
    };
    assert_eq!(run(11), run(11));
    assert_ne!(run(11), run(12));
}

#[test]
fn bad_configurations_and_logits_are_errors() {
    for bad in [
        SamplerConfig {
            temperature: -1.0,
            ..free(0)
        },
        SamplerConfig {
            temperature: f32::NAN,
            ..free(0)
        },
        SamplerConfig {
            temperature: f32::INFINITY,
            ..free(0)
        },
        SamplerConfig {
            top_p: 0.0,
            ..free(0)
        },
        SamplerConfig {
            top_p: 1.5,
            ..free(0)
        },
        SamplerConfig {
            top_p: f32::NAN,
            ..free(0)
        },
        SamplerConfig {
            min_p: -0.1,
            ..free(0)
        },
        SamplerConfig {
            min_p: f32::NAN,
            ..free(0)
        },
        SamplerConfig {
            min_p: 2.0,
            ..free(0)
        },
        SamplerConfig {
            repeat_penalty: 0.0,
            ..free(0)
        },
        SamplerConfig {
            repeat_penalty: -1.0,
            ..free(0)
        },
        SamplerConfig {
            repeat_penalty: f32::NAN,
            ..free(0)
        },
    ] {
        assert!(
            matches!(Sampler::new(bad.clone()), Err(Error::Config(_))),
            "{bad:?}"
        );
    }
    let mut s = Sampler::new(SamplerConfig::default()).unwrap();
    assert!(matches!(s.sample(&[], &[]), Err(Error::Shape(_))));
}

#[test]
fn non_finite_logits_are_refused_greedy_or_sampled() {
    for config in [SamplerConfig::default(), SamplerConfig::greedy(), free(1)] {
        let mut s = Sampler::new(config.clone()).unwrap();
        for (logits, at) in [
            (&[f32::NAN, 1.0][..], 0),
            (&[0.0, 5.0, f32::INFINITY], 2),
            (&[f32::NEG_INFINITY], 0),
            (&[1.0, f32::NAN, f32::INFINITY], 1),
        ] {
            match s.sample(logits, &[]) {
                Err(Error::NonFiniteLogits {
                    sequence: None,
                    position: None,
                    token,
                    value,
                }) => {
                    assert_eq!(token, at, "{config:?} {logits:?}");
                    assert_eq!(value.to_bits(), logits[at].to_bits());
                }
                other => panic!("{config:?} {logits:?}: {other:?}"),
            }
        }
    }
    assert_eq!(first_non_finite(&[0.0, -1.0, 3.5]), None);
    assert_eq!(first_non_finite(&[0.0, f32::NAN]), Some(1));
}

#[test]
fn extreme_but_valid_settings_give_a_token() {
    let logits = [0.0, 0.0, 1e-30, -3.0];
    // So cold that 1/t overflows: greedy.
    let mut s = Sampler::new(SamplerConfig {
        temperature: 1e-45,
        ..free(3)
    })
    .unwrap();
    assert_eq!(s.sample(&logits, &[]).unwrap().id, 2);
    // Cold enough that the scaled logits overflow: still the best token, never NaN.
    let mut s = Sampler::new(SamplerConfig {
        temperature: 1e-37,
        ..free(3)
    })
    .unwrap();
    assert_eq!(s.sample(&[1e3, 2e3, -1e3], &[]).unwrap().id, 1);
    // min-p with every logit equal keeps them all.
    let c = counts(
        SamplerConfig {
            min_p: 1.0,
            ..free(3)
        },
        &[0.0; 4],
        400,
    );
    assert!(c.iter().all(|&n| n > 0), "{c:?}");
    // A tiny penalty keeps the logits finite.
    let cfg = SamplerConfig {
        repeat_penalty: 1e-38,
        temperature: 0.0,
        ..free(3)
    };
    let picked = Sampler::new(cfg)
        .unwrap()
        .sample(&[3e3, 1.0], &[0])
        .unwrap();
    assert_eq!(picked.id, 0);
    assert!(picked.logprob.is_finite());
}

/// `distribution` gives the probabilities `sample` draws from: the draws' frequencies
/// are within 5 standard errors of them, with every filter and the penalty, and greedy
/// sampling is one-hot on its choice.
#[test]
fn the_distribution_is_what_sample_draws_from() {
    let logits: Vec<f32> = (0..12)
        .map(|i| ((i * 7 % 12) as f32 * 0.4).sin() * 2.0)
        .collect();
    let recent = [3u32, 5, 3];
    for config in [
        free(1),
        SamplerConfig {
            top_k: 4,
            ..free(2)
        },
        SamplerConfig {
            top_p: 0.7,
            ..free(3)
        },
        SamplerConfig {
            min_p: 0.2,
            temperature: 0.7,
            ..free(4)
        },
        SamplerConfig {
            repeat_penalty: 1.7,
            top_k: 6,
            top_p: 0.9,
            ..free(5)
        },
        SamplerConfig {
            repeat_penalty: 1.7,
            ..SamplerConfig::greedy()
        },
    ] {
        let mut s = Sampler::new(config.clone()).unwrap();
        let mut p = vec![0.0; logits.len()];
        s.distribution(&logits, &recent, &mut p).unwrap();
        assert!(
            (p.iter().sum::<f32>() - 1.0).abs() < 1e-5,
            "{config:?}: {p:?}"
        );
        let n = 40_000;
        let mut c = vec![0usize; logits.len()];
        for _ in 0..n {
            c[s.sample(&logits, &recent).unwrap().id as usize] += 1;
        }
        for (k, &want) in p.iter().enumerate() {
            let got = c[k] as f64 / n as f64;
            let se = (want as f64 * (1.0 - want as f64) / n as f64).sqrt();
            assert!(
                (got - want as f64).abs() <= 5.0 * se + 1e-9,
                "{config:?}: token {k}: {got} against {want}"
            );
        }
    }
    let mut s = Sampler::new(free(1)).unwrap();
    assert!(matches!(
        s.distribution(&logits, &[], &mut [0.0; 3]),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        s.distribution(&[0.0, f32::NAN], &[], &mut [0.0; 2]),
        Err(Error::NonFiniteLogits { .. })
    ));
    assert_eq!(s.draw_from(&[0.0, 0.0]), None);
    assert_eq!(s.draw_from(&[0.0, 2.0, 0.0]), Some(1));
}

#[test]
fn argmax_ignores_nan() {
    assert_eq!(argmax(&[f32::NAN, 1.0, 0.5]), 1);
    assert_eq!(argmax(&[0.0, 2.0, 2.0]), 1);
}
