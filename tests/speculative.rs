//! Speculative decoding on the synthetic model (every weight format, both precisions of
//! the activations): the verify pass that runs drafted tokens as one matrix pass gives,
//! row for row, the logits of decode steps bit for bit;
//! rejected tokens roll back in the f16, f32 and q8_0 caches; and speculative generation
//! at temperature 0 yields exactly the tokens of plain decoding, there and on the default
//! model (the tests named `network_…`, which skip with a printed reason without it).
//! Run in release mode: `cargo test --release --test speculative`.

mod common;
#[path = "speculative/sampling.rs"]
mod sampling;

use common::synthetic::{self, Storage};
use qkv::kernels::quant::act::ActPrecision;
use qkv::kernels::QuantFormat;
use qkv::load::{Model, ModelOptions};
use qkv::models::decoder::{KvType, Segment};
use qkv::sample::SamplerConfig;
use qkv::session::{Session, SessionOptions};
use qkv::speculative::{DraftOptions, NgramOptions, SpecStats, Speculation, MAX_DRAFT};
use std::sync::Arc;

fn load_at(storage: Storage, act_precision: ActPrecision) -> Arc<Model> {
    let path = synthetic::model_file(storage);
    let options = ModelOptions {
        act_precision,
        ..ModelOptions::default()
    };
    Arc::new(Model::load(&path, &options).unwrap())
}

/// The model at the default precision.
fn load(storage: Storage) -> Arc<Model> {
    load_at(storage, ModelOptions::default().act_precision)
}

const PRECISIONS: [ActPrecision; 2] = [ActPrecision::Wide, ActPrecision::Byte];

const KV_TYPES: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// The logits after each of `steps`, run one decode step at a time after `prompt`.
fn stepped(model: &Model, kv: KvType, prompt: &[u32], steps: &[u32]) -> Vec<Vec<f32>> {
    let d = model.decoder();
    let vocab = model.vocab_size();
    let mut state = d.new_state(128, kv, 64).unwrap();
    let mut logits = vec![0.0; vocab];
    d.forward(&mut state, prompt, 0, Some(&mut logits)).unwrap();
    steps
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            d.forward(&mut state, &[t], prompt.len() + i, Some(&mut logits))
                .unwrap();
            logits.clone()
        })
        .collect()
}

/// A pass over k drafted tokens writes, for each, exactly the logits a one-token step gives
/// there (bit for bit), whatever the weight format, the activations' precision and the
/// cache's type, for every length a verify pass may have, and whether it asks for the last
/// row only or all of them.
#[test]
fn a_verify_pass_gives_the_bits_of_decode_steps() {
    for storage in Storage::all() {
        for precision in PRECISIONS {
            let model = load_at(storage, precision);
            let d = model.decoder();
            let vocab = model.vocab_size();
            let all = synthetic::text_tokens(model.tokenizer().unwrap(), 40);
            let (prompt, draft) = all.split_at(17);
            for kv in KV_TYPES {
                let want = stepped(&model, kv, prompt, draft);
                for k in 1..=MAX_DRAFT + 1 {
                    let mut state = d.new_state(128, kv, 64).unwrap();
                    d.forward(&mut state, prompt, 0, None).unwrap();
                    for r in [1, k] {
                        let mut got = vec![0.0; r * vocab];
                        d.forward_tail(&mut state, &draft[..k], prompt.len(), r, &mut got)
                            .unwrap();
                        for (i, row) in got.chunks_exact(vocab).enumerate() {
                            let at = k - r + i;
                            assert_eq!(
                                bits(row),
                                bits(&want[at]),
                                "{storage:?}, {precision}, {kv}: row {at} of a {k}-row pass"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// A batched pass gives each segment the logits of its last `logits` rows, in order, equal
/// to those of the sequence run alone.
#[test]
fn a_batched_pass_returns_the_tail_rows_of_each_segment() {
    let model = load(Storage::F16);
    let d = model.decoder();
    let vocab = model.vocab_size();
    let all = synthetic::text_tokens(model.tokenizer().unwrap(), 40);
    let want_a = stepped(&model, KvType::F16, &all[..10], &all[10..15]);
    let want_b = stepped(&model, KvType::F16, &all[20..27], &all[27..30]);
    let mut a = d.new_cache(64, KvType::F16).unwrap();
    let mut b = d.new_cache(64, KvType::F16).unwrap();
    let mut scratch = d.new_scratch(32).unwrap();
    let mut logits = vec![0.0; 2 * vocab];
    d.forward_batch(
        &mut [
            Segment {
                cache: &mut a,
                tokens: &all[..10],
                pos0: 0,
                logits: 1,
                lora: &[],
            },
            Segment {
                cache: &mut b,
                tokens: &all[20..27],
                pos0: 0,
                logits: 1,
                lora: &[],
            },
        ],
        &mut scratch,
        &mut logits,
    )
    .unwrap();
    let mut logits = vec![0.0; (4 + 3) * vocab];
    d.forward_batch(
        &mut [
            Segment {
                cache: &mut a,
                tokens: &all[10..15],
                pos0: 10,
                logits: 4,
                lora: &[],
            },
            Segment {
                cache: &mut b,
                tokens: &all[27..30],
                pos0: 7,
                logits: 3,
                lora: &[],
            },
        ],
        &mut scratch,
        &mut logits,
    )
    .unwrap();
    let rows: Vec<&[f32]> = logits.chunks_exact(vocab).collect();
    for i in 0..4 {
        assert_eq!(bits(rows[i]), bits(&want_a[1 + i]), "a, row {}", 1 + i);
    }
    for i in 0..3 {
        assert_eq!(bits(rows[4 + i]), bits(&want_b[i]), "b, row {i}");
    }
    // More rows than the segment has, or a buffer of another size: typed errors.
    for (n, len) in [(4, 4 * vocab), (1, 2 * vocab)] {
        let err = d
            .forward_batch(
                &mut [Segment {
                    cache: &mut a,
                    tokens: &all[15..18],
                    pos0: 15,
                    logits: n,
                    lora: &[],
                }],
                &mut scratch,
                &mut vec![0.0; len],
            )
            .unwrap_err();
        assert!(matches!(err, qkv::Error::Shape(_)), "{err}");
    }
    assert_eq!(a.filled(), 15, "a refused pass runs nothing");
    let mut state = d.new_state(64, KvType::F16, 8).unwrap();
    let err = d
        .forward_tail(&mut state, &all[..3], 0, 0, &mut [])
        .unwrap_err();
    assert!(matches!(err, qkv::Error::Shape(_)), "{err}");
}

/// Rejected drafts roll back by running at an earlier position: what follows is computed as
/// if they had never been there, bit for bit, in every cache type; and a prefix kept after
/// the rollback serves another continuation as a fresh sequence would.
#[test]
fn rejected_drafts_roll_back_in_every_cache() {
    for storage in [
        Storage::F32,
        Storage::F16,
        Storage::Quant(QuantFormat::Q4_K),
    ] {
        let model = load(storage);
        let d = model.decoder();
        let vocab = model.vocab_size();
        let all = synthetic::text_tokens(model.tokenizer().unwrap(), 60);
        let prompt = &all[..12];
        // Two tokens kept, then a pass of 5 drafts the model rejects, then the true tokens.
        let kept = [101u32, 7];
        let rejected: Vec<u32> = (0..5).map(|i| 40 + 7 * i).collect();
        let after = &all[30..36];
        let other: Vec<u32> = (0..4).map(|i| 90 + 3 * i).collect();
        for kv in KV_TYPES {
            let want = stepped(&model, kv, prompt, &[&kept[..], after].concat());
            let want_other = stepped(&model, kv, prompt, &[&kept[..1], &other].concat());
            let mut state = d.new_state(128, kv, 64).unwrap();
            let mut one = vec![0.0; vocab];
            d.forward(&mut state, prompt, 0, None).unwrap();
            let mut pos = prompt.len();
            for &t in &kept {
                d.forward(&mut state, &[t], pos, Some(&mut one)).unwrap();
                pos += 1;
            }
            let mut verify = vec![0.0; rejected.len() * vocab];
            d.forward_all(&mut state, &rejected, pos, &mut verify)
                .unwrap();
            assert_eq!(state.cache().filled(), pos + rejected.len());
            // Rewind past the rejected tokens and go on stepping.
            for (i, &t) in after.iter().enumerate() {
                d.forward(&mut state, &[t], pos, Some(&mut one)).unwrap();
                pos += 1;
                assert_eq!(
                    bits(&one),
                    bits(&want[kept.len() + i]),
                    "{storage:?}, {kv}: step {i} after the rollback"
                );
            }
            assert_eq!(state.cache().filled(), pos);
            // Prefix reuse after the rollback: keep the prompt and the first kept token, and
            // continue another way.
            for (i, &t) in other.iter().enumerate() {
                let pos = prompt.len() + 1 + i;
                d.forward(&mut state, &[t], pos, Some(&mut one)).unwrap();
                assert_eq!(
                    bits(&one),
                    bits(&want_other[1 + i]),
                    "{storage:?}, {kv}: step {i} on the reused prefix"
                );
            }
        }
    }
}

/// `n` tokens generated greedily after `prompt` (past the end of text), speculating or not,
/// with the speculation's statistics; the session's tokens are checked to be the prompt and
/// those yielded.
fn generate(
    model: &Arc<Model>,
    kv: KvType,
    prompt: &[u32],
    n: usize,
    config: SamplerConfig,
    spec: Speculation,
) -> (Vec<u32>, SpecStats) {
    let options = SessionOptions {
        context: Some(256),
        kv_dtype: Some(kv),
        ..SessionOptions::default()
    };
    let mut session = Session::new(model.clone(), options).unwrap();
    let mut stream = session
        .generate_tokens(prompt, config)
        .unwrap()
        .max_tokens(n)
        .ignore_eos(true)
        .speculate(spec)
        .unwrap();
    let ids: Vec<u32> = stream.by_ref().map(|p| p.unwrap().id).collect();
    let stats = stream.spec_stats();
    drop(stream);
    assert_eq!(&session.tokens()[..prompt.len()], prompt);
    assert_eq!(&session.tokens()[prompt.len()..], &ids[..]);
    (ids, stats)
}

fn ngram(max_draft: usize, min_ngram: usize, max_ngram: usize) -> Speculation {
    Speculation::Ngram(NgramOptions {
        max_draft,
        min_ngram,
        max_ngram,
        min_draft: 0,
    })
}

/// At temperature 0, speculative generation yields exactly the tokens of plain decoding,
/// in every weight format and cache type, on a prompt that repeats itself (drafts are
/// found and kept) and on one that does not; with the repetition penalty too, which reads
/// the kept drafts as history.
#[test]
fn greedy_speculation_yields_the_tokens_of_plain_decoding() {
    for (storage, precision) in Storage::all()
        .into_iter()
        .flat_map(|s| PRECISIONS.map(|p| (s, p)))
    {
        let model = load_at(storage, precision);
        let repeating = synthetic::text_tokens(model.tokenizer().unwrap(), 90);
        let scattered: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 260).collect();
        let penalised = SamplerConfig {
            repeat_penalty: 1.3,
            ..SamplerConfig::greedy()
        };
        for kv in KV_TYPES {
            for (prompt, config) in [
                (&repeating, SamplerConfig::greedy()),
                (&scattered, SamplerConfig::greedy()),
                (&repeating, penalised.clone()),
            ] {
                let (plain, none) =
                    generate(&model, kv, prompt, 60, config.clone(), Speculation::Off);
                assert_eq!(none, SpecStats::default());
                for spec in [ngram(7, 2, 4), ngram(3, 1, 2), ngram(MAX_DRAFT, 1, 6)] {
                    let (fast, stats) = generate(&model, kv, prompt, 60, config.clone(), spec);
                    assert_eq!(
                        fast, plain,
                        "{storage:?}, {precision}, {kv}, {spec:?}, {config:?}"
                    );
                    assert!(stats.accepted_tokens <= stats.draft_tokens, "{stats:?}");
                }
            }
        }
        // The repeating prompt does give drafts the model keeps (the test exercises them).
        let (_, stats) = generate(
            &model,
            KvType::F16,
            &repeating,
            60,
            SamplerConfig::greedy(),
            ngram(7, 1, 4),
        );
        assert!(
            stats.draft_tokens > 0 && stats.verify_passes > 0,
            "{stats:?}"
        );
    }
}

/// Kept drafts are yielded one per call; an iterator dropped before they all are leaves the
/// session holding exactly the tokens yielded, and generation goes on from there as plain
/// decoding would.
#[test]
fn a_dropped_stream_takes_back_the_drafts_it_did_not_yield() {
    let model = load(Storage::F32);
    let prompt = synthetic::text_tokens(model.tokenizer().unwrap(), 90);
    let (plain, _) = generate(
        &model,
        KvType::F32,
        &prompt,
        40,
        SamplerConfig::greedy(),
        Speculation::Off,
    );
    let mut session = Session::new(model.clone(), SessionOptions::default()).unwrap();
    let mut got = Vec::new();
    for take in [1, 2, 3, 5, 8, 21] {
        let ids = if got.is_empty() { &prompt[..] } else { &[][..] };
        let mut stream = session
            .generate_tokens(ids, SamplerConfig::greedy())
            .unwrap()
            .ignore_eos(true)
            .speculate(ngram(7, 1, 4))
            .unwrap();
        got.extend(stream.by_ref().take(take).map(|p| p.unwrap().id));
        drop(stream);
        assert_eq!(session.tokens().len(), prompt.len() + got.len());
    }
    assert_eq!(got, plain);
}

/// `min_draft`: drafts shorter than it are not verified (every verify pass runs at least
/// that many), the tokens unchanged; shorter drafts are verified without it.
#[test]
fn drafts_shorter_than_the_minimum_are_not_verified() {
    let model = load(Storage::F32);
    let prompt = synthetic::text_tokens(model.tokenizer().unwrap(), 90);
    let run = |min_draft| {
        let spec = Speculation::Ngram(NgramOptions {
            max_draft: 6,
            min_ngram: 1,
            max_ngram: 3,
            min_draft,
        });
        generate(
            &model,
            KvType::F32,
            &prompt,
            60,
            SamplerConfig::greedy(),
            spec,
        )
    };
    let (plain, _) = generate(
        &model,
        KvType::F32,
        &prompt,
        60,
        SamplerConfig::greedy(),
        Speculation::Off,
    );
    let (any, all) = run(0);
    let (long, some) = run(4);
    assert_eq!(any, plain);
    assert_eq!(long, plain);
    assert!(some.verify_passes > 0, "{some:?}");
    assert!(some.draft_tokens >= 4 * some.verify_passes, "{some:?}");
    assert!(
        all.draft_tokens < 4 * all.verify_passes,
        "short drafts ran: {all:?}"
    );
}

/// Settings out of range are typed errors: draft lengths, n-gram lengths, a minimum draft
/// above the most; sampling is verified (tests/speculative/sampling.rs), not refused.
#[test]
fn speculation_refuses_bad_settings() {
    let model = load(Storage::F32);
    let mut session = Session::new(model.clone(), SessionOptions::default()).unwrap();
    let sampled = SamplerConfig {
        temperature: 0.7,
        ..SamplerConfig::default()
    };
    assert!(session
        .generate_tokens(&[1, 2, 3], sampled)
        .unwrap()
        .speculate(ngram(4, 1, 2))
        .is_ok());
    let above = Speculation::Ngram(NgramOptions {
        min_draft: MAX_DRAFT + 1,
        ..NgramOptions::default()
    });
    let draft_above = Speculation::Draft(DraftOptions {
        max_draft: 3,
        min_draft: 4,
    });
    for bad in [above, draft_above] {
        assert!(
            matches!(bad.validate(), Err(qkv::Error::Config(_))),
            "{bad:?}"
        );
    }
    for bad in [
        ngram(0, 1, 2),
        ngram(MAX_DRAFT + 1, 1, 2),
        ngram(4, 0, 2),
        ngram(4, 3, 2),
    ] {
        let err = session
            .generate_tokens(&[], SamplerConfig::greedy())
            .unwrap()
            .speculate(bad)
            .unwrap_err();
        assert!(matches!(err, qkv::Error::Config(_)), "{bad:?}: {err}");
    }
}

/// On the default model, at both precisions of its activations, greedy speculation yields
/// the tokens plain decoding yields, on a prompt that copies a passage (most drafts are
/// kept) and on an open-ended one, with the model's own (f16) cache and with q8_0.
#[test]
fn network_greedy_speculation_yields_the_tokens_of_plain_decoding() {
    let Some(path) = common::default_gguf() else {
        return;
    };
    for act_precision in PRECISIONS {
        let options = ModelOptions {
            act_precision,
            ..ModelOptions::default()
        };
        greedy_on_the_default_model(&Arc::new(Model::load(&path, &options).unwrap()));
    }
}

fn greedy_on_the_default_model(model: &Arc<Model>) {
    let tok = model.tokenizer().unwrap();
    let passage = "The lighthouse keeper climbed the spiral stairs every evening at dusk, \
        trimmed the wick, polished the great lens, and wrote the state of the sea in a \
        leather logbook that had belonged to his grandfather.";
    let copy = format!(
        "Copy this passage exactly, twice.\n\nPassage: {passage}\n\nCopy 1: {passage}\n\nCopy 2:"
    );
    let open = "Once upon a time, in a small village by the mountains, there lived a";
    for (text, copies) in [(&copy[..], true), (open, false)] {
        let prompt = tok.encode(text).unwrap();
        for kv in [KvType::F16, KvType::Q8_0] {
            let (plain, _) = generate(
                model,
                kv,
                &prompt,
                64,
                SamplerConfig::greedy(),
                Speculation::Off,
            );
            for spec in [ngram(7, 2, 4), ngram(4, 1, 3)] {
                let (fast, stats) = generate(model, kv, &prompt, 64, SamplerConfig::greedy(), spec);
                assert_eq!(fast, plain, "{kv}, {spec:?} on {text:?}");
                if copies {
                    assert!(stats.accepted_tokens > 16, "{kv}, {spec:?}: {stats:?}");
                }
            }
        }
    }
}

/// `n` greedy tokens after `prompt`, drafted by `draft` (a model of the same vocabulary),
/// with the speculation's statistics.
fn generate_drafted(
    model: &Arc<Model>,
    draft: &Arc<Model>,
    kv: KvType,
    prompt: &[u32],
    n: usize,
    max_draft: usize,
) -> (Vec<u32>, SpecStats) {
    let options = SessionOptions {
        context: Some(256),
        kv_dtype: Some(kv),
        ..SessionOptions::default()
    };
    let mut session = Session::new(model.clone(), options.clone()).unwrap();
    let mut drafter = Session::new(draft.clone(), options).unwrap();
    let mut stream = session
        .generate_tokens(prompt, SamplerConfig::greedy())
        .unwrap()
        .max_tokens(n)
        .ignore_eos(true)
        .speculate_with_draft(
            Speculation::Draft(DraftOptions {
                max_draft,
                min_draft: 0,
            }),
            &mut drafter,
        )
        .unwrap();
    let ids: Vec<u32> = stream.by_ref().map(|p| p.unwrap().id).collect();
    let stats = stream.spec_stats();
    drop(stream);
    assert_eq!(&session.tokens()[prompt.len()..], &ids[..]);
    (ids, stats)
}

/// Drafting with a second model of the same vocabulary yields exactly the tokens of plain
/// decoding (the synthetic model's Q4_0 file drafting for its other files); a model
/// drafting for itself has every draft kept, its decode steps giving the verify pass's
/// bits.
#[test]
fn drafting_with_a_second_model_yields_the_tokens_of_plain_decoding() {
    let other = load(Storage::Quant(QuantFormat::Q4_0));
    for storage in [Storage::F32, Storage::Quant(QuantFormat::Q4_K)] {
        for precision in PRECISIONS {
            let model = load_at(storage, precision);
            let prompt = synthetic::text_tokens(model.tokenizer().unwrap(), 50);
            for kv in [KvType::F16, KvType::Q8_0] {
                let config = SamplerConfig::greedy();
                let (plain, _) = generate(&model, kv, &prompt, 40, config, Speculation::Off);
                for (draft, max_draft) in [(&other, MAX_DRAFT), (&other, 2), (&model, 4)] {
                    let (fast, stats) = generate_drafted(&model, draft, kv, &prompt, 40, max_draft);
                    let what = format!("{storage:?}, {precision}, {kv}, {max_draft}");
                    assert_eq!(fast, plain, "{what}");
                    assert!(stats.draft_tokens > 0, "{what}: {stats:?}");
                    if Arc::ptr_eq(draft, &model) {
                        assert_eq!(stats.accepted_tokens, stats.draft_tokens, "{what}");
                    }
                }
            }
        }
    }
}

/// A draft model of another vocabulary is refused, naming both models; drafting with a
/// model needs its session.
#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    use qkv::models::decoder::{Decoder, DecoderConfig, WeightLayout};
    let model = load(Storage::F32);
    let config = DecoderConfig::llama(16, 2, 4, 2, 32, 50, 256, WeightLayout::Gguf);
    let small = Decoder::synthetic(config, 7, qkv::weights::FloatType::F32).unwrap();
    let small = Arc::new(Model::from_parts(small, None));
    let mut session = Session::new(model.clone(), SessionOptions::default()).unwrap();
    let mut drafter = Session::new(small, SessionOptions::default()).unwrap();
    let spec = Speculation::Draft(DraftOptions::default());
    let err = session
        .generate_tokens(&[1, 2, 3], SamplerConfig::greedy())
        .unwrap()
        .speculate_with_draft(spec, &mut drafter)
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, qkv::Error::Config(_)), "{msg}");
    assert!(
        msg.contains("a model built in memory") && msg.contains("synthetic-F32"),
        "{msg}"
    );
    let err = session
        .generate_tokens(&[], SamplerConfig::greedy())
        .unwrap()
        .speculate(spec)
        .unwrap_err();
    assert!(matches!(err, qkv::Error::Config(_)), "{err}");
}

/// The default model drafting for itself: every draft kept, the tokens of plain decoding.
#[test]
fn network_the_default_model_drafting_for_itself_keeps_every_draft() {
    let Some(path) = common::default_gguf() else {
        return;
    };
    let model = Arc::new(Model::load(&path, &ModelOptions::default()).unwrap());
    let prompt = model
        .tokenizer()
        .unwrap()
        .encode("Once upon a time, in a small village by the mountains, there lived a")
        .unwrap();
    let kv = model.decoder().kv_dtype().into();
    let (plain, _) = generate(
        &model,
        kv,
        &prompt,
        48,
        SamplerConfig::greedy(),
        Speculation::Off,
    );
    let (fast, stats) = generate_drafted(&model, &model, kv, &prompt, 48, MAX_DRAFT);
    assert_eq!(fast, plain);
    assert!(stats.draft_tokens > 0, "{stats:?}");
    assert_eq!(stats.accepted_tokens, stats.draft_tokens, "{stats:?}");
}
