//! Speculative decoding in the batch engine (a module of the `engine` test binary): sequences
//! that speculate, batched with plain ones and with prompts being read, get exactly the
//! greedy tokens each gets alone without speculation, on the synthetic model in several
//! weight formats at both precisions of the activations, and on the default model (the
//! `network_…` test); rejected drafts leave the cache as if they had never run (a later
//! prompt reuses the prefix and gets the tokens of a fresh run), also when a sequence is
//! cancelled right after a verify pass; a constraint checks every kept draft; the counts of
//! drafted and kept tokens match what the events show.

use super::{collect, common, OnlyThese};
use common::synthetic::{self, Storage};
use qkv::engine::{Engine, EngineOptions, Event, FinishReason, GenRequest, SeqId};
use qkv::kernels::quant::act::ActPrecision;
use qkv::kernels::QuantFormat;
use qkv::load::{Model, ModelOptions};
use qkv::models::decoder::{Decoder, DecoderConfig, KvType, WeightLayout};
use qkv::sample::SamplerConfig;
use qkv::speculative::{DraftOptions, NgramOptions, SpecStats, Speculation, MAX_DRAFT};
use qkv::weights::FloatType;
use qkv::Error;
use std::collections::HashMap;
use std::sync::Arc;

const PRECISIONS: [ActPrecision; 2] = [ActPrecision::Wide, ActPrecision::Byte];

fn load_at(storage: Storage, act_precision: ActPrecision) -> Arc<Model> {
    let options = ModelOptions {
        act_precision,
        ..ModelOptions::default()
    };
    Arc::new(Model::load(&synthetic::model_file(storage), &options).unwrap())
}

fn ngram(max_draft: usize, min_ngram: usize, max_ngram: usize) -> Speculation {
    Speculation::Ngram(NgramOptions {
        max_draft,
        min_ngram,
        max_ngram,
        min_draft: 0,
    })
}

/// An engine of 4 sequences of 256 positions, whose steps take at most 8 rows besides the
/// decode tokens. Prompt chunks of up to 8 rows attend row by row, as decode steps do, so
/// that a prompt's cache holds the same bits however the steps of a batch split it (taller
/// chunks attend together and round otherwise: a sequence whose prompt is read in chunks
/// of 8 and one whose prompt is read in chunks of 16 may part at a near-tie, with or
/// without speculation).
fn engine(m: &Arc<Model>, kv: KvType) -> Engine {
    Engine::new(
        m.clone(),
        EngineOptions {
            max_sequences: 4,
            context: 256,
            step_tokens: 8,
            prefill_step_tokens: 8,
            kv_dtype: Some(kv),
            ..EngineOptions::default()
        },
    )
    .unwrap()
}

/// A greedy request for `n` tokens past the end of text, speculating as `spec` says.
fn request(prompt: &[u32], n: usize, spec: Speculation) -> GenRequest {
    GenRequest {
        ignore_eos: true,
        speculation: spec,
        ..GenRequest::new(prompt.to_vec(), SamplerConfig::greedy(), n)
    }
}

fn ids(tokens: &HashMap<SeqId, Vec<(u32, f32)>>, seq: SeqId) -> Vec<u32> {
    tokens
        .get(&seq)
        .map_or_else(Vec::new, |v| v.iter().map(|t| t.0).collect())
}

/// Runs the engine until it is idle; the events, and for each step how many tokens each
/// sequence got in it.
fn run(e: &mut Engine) -> (Vec<Event>, Vec<HashMap<SeqId, usize>>) {
    let (mut events, mut per_step) = (Vec::new(), Vec::new());
    while !e.is_idle() {
        let from = events.len();
        e.step(&mut events).unwrap();
        let mut got = HashMap::new();
        for ev in &events[from..] {
            if let Event::Token { seq, .. } = ev {
                *got.entry(*seq).or_insert(0) += 1;
            }
        }
        per_step.push(got);
        assert!(per_step.len() < 2000, "the engine does not finish");
    }
    (events, per_step)
}

/// The greedy tokens of `prompt`, alone in an engine, without speculation.
fn alone(m: &Arc<Model>, kv: KvType, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut e = engine(m, kv);
    let seq = e.submit(request(prompt, n, Speculation::Off)).unwrap();
    let (events, _) = run(&mut e);
    ids(&collect(&events).0, seq)
}

/// The speculation counts of each sequence's Done event.
fn spec_of(done: &HashMap<SeqId, Event>, seq: SeqId) -> SpecStats {
    match &done[&seq] {
        Event::Done { spec, .. } => *spec,
        other => panic!("{other:?}"),
    }
}

/// Checks the counts against the events: in a step, a sequence that kept `a` drafts got
/// `a + 1` tokens (or `a`, when its last kept draft ended it), so the tokens past one per
/// step add up to the kept drafts, give or take the last step; the engine's totals are the
/// sum of the sequences'.
fn check_counts(
    e: &Engine,
    seqs: &[SeqId],
    done: &HashMap<SeqId, Event>,
    per_step: &[HashMap<SeqId, usize>],
) {
    let mut total = SpecStats::default();
    for &seq in seqs {
        let s = spec_of(done, seq);
        assert!(s.accepted_tokens <= s.draft_tokens, "{seq:?}: {s:?}");
        let extra: usize = per_step
            .iter()
            .filter_map(|g| g.get(&seq))
            .map(|n| n - 1)
            .sum();
        assert!(
            extra <= s.accepted_tokens && s.accepted_tokens <= extra + 1,
            "{seq:?}: {extra} tokens past one a step, {s:?}"
        );
        assert!(
            per_step
                .iter()
                .filter_map(|g| g.get(&seq))
                .all(|&n| n <= MAX_DRAFT + 1),
            "{seq:?}: more than a draft and its bonus token in a step"
        );
        total.draft_tokens += s.draft_tokens;
        total.accepted_tokens += s.accepted_tokens;
        total.verify_passes += s.verify_passes;
    }
    assert_eq!(e.spec_stats(), total);
}

/// Speculating sequences (two kinds of drafts, on prompts that repeat themselves and on one
/// that does not) and a plain one, joining at different steps while others read their
/// prompts, get exactly the tokens each gets alone without speculation.
fn check_batched_speculation(m: &Arc<Model>, kv: KvType, what: &str) {
    let n = 40;
    let tok = m.tokenizer().unwrap();
    let repeating = synthetic::text_tokens(tok, 70);
    let shifted = synthetic::text_tokens(tok, 90)[13..].to_vec();
    let scattered: Vec<u32> = (0..30).map(|i| (i * 37 + 11) % 260).collect();
    let cases = [
        (&repeating, ngram(MAX_DRAFT, 1, 4)),
        (&shifted, Speculation::Off),
        (&scattered, ngram(4, 1, 2)),
        (&shifted, ngram(3, 2, 3)),
    ];
    let mut e = engine(m, kv);
    let mut seqs = Vec::new();
    let mut events = Vec::new();
    let mut per_step = Vec::new();
    for step in 0.. {
        // Two join at once, the others at steps 3 and 7.
        while seqs.len() < cases.len() && [0, 0, 3, 7][seqs.len()] == step {
            let (prompt, spec) = cases[seqs.len()];
            seqs.push(e.submit(request(prompt, n, spec)).unwrap());
        }
        if seqs.len() == cases.len() && e.is_idle() {
            break;
        }
        let from = events.len();
        e.step(&mut events).unwrap();
        let mut got = HashMap::new();
        for ev in &events[from..] {
            if let Event::Token { seq, .. } = ev {
                *got.entry(*seq).or_insert(0) += 1;
            }
        }
        per_step.push(got);
        assert!(step < 2000, "the engine does not finish");
    }
    let (tokens, done) = collect(&events);
    for (&seq, (prompt, spec)) in seqs.iter().zip(cases) {
        assert_eq!(
            ids(&tokens, seq),
            alone(m, kv, prompt, n),
            "{what}, {kv}: {spec:?}"
        );
        assert!(matches!(
            done[&seq],
            Event::Done {
                reason: FinishReason::Length,
                generated: 40,
                ..
            }
        ));
        if spec == Speculation::Off {
            assert_eq!(spec_of(&done, seq), SpecStats::default());
        }
    }
    check_counts(&e, &seqs, &done, &per_step);
    // The repeating prompt's drafts ran (the test exercises verify passes).
    assert!(spec_of(&done, seqs[0]).verify_passes > 0, "{what}");
}

#[test]
fn speculating_and_plain_sequences_batched_get_the_tokens_they_get_alone() {
    let storages = [
        Storage::F32,
        Storage::F16,
        Storage::Quant(QuantFormat::Q4_0),
        Storage::Quant(QuantFormat::Q4_K),
        Storage::Quant(QuantFormat::Q5_K),
        Storage::Quant(QuantFormat::Q6_K),
        Storage::Quant(QuantFormat::Q8_0),
    ];
    for storage in storages {
        for precision in PRECISIONS {
            let m = load_at(storage, precision);
            let kv = m.decoder().kv_dtype().into();
            check_batched_speculation(&m, kv, &format!("{storage:?}, {precision}"));
        }
    }
    let m = load_at(Storage::Quant(QuantFormat::Q4_K), ActPrecision::Byte);
    check_batched_speculation(&m, KvType::Q8_0, "Q4_K, 8 bits");
}

/// Rejected drafts leave the cache: a finished speculating sequence's tokens serve a later
/// prompt that goes on from them, which gets the tokens of a fresh run, in the f16 and the
/// q8_0 cache.
#[test]
fn rejected_drafts_roll_back_and_the_prefix_serves_a_later_prompt() {
    let m = load_at(Storage::Quant(QuantFormat::Q4_0), ActPrecision::Wide);
    let prompt = synthetic::text_tokens(m.tokenizer().unwrap(), 90)[13..].to_vec();
    for kv in [KvType::F16, KvType::Q8_0] {
        let mut e = engine(&m, kv);
        let a = e
            .submit(request(&prompt, 30, ngram(MAX_DRAFT, 1, 4)))
            .unwrap();
        let (events, _) = run(&mut e);
        let (tokens, done) = collect(&events);
        let got = ids(&tokens, a);
        assert_eq!(got, alone(&m, kv, &prompt, 30), "{kv}");
        let s = spec_of(&done, a);
        assert!(
            s.draft_tokens > s.accepted_tokens,
            "{kv}: no draft rejected: {s:?}"
        );
        // Go on from 20 of the generated tokens with a token of another choice.
        let other = (0..260).find(|&t| t != got[20]).unwrap();
        let next: Vec<u32> = [&prompt[..], &got[..20], &[other, 33, 47]].concat();
        let b = e.submit(request(&next, 12, ngram(4, 1, 3))).unwrap();
        let (events, _) = run(&mut e);
        let (tokens, done) = collect(&events);
        match done[&b] {
            Event::Done { cached_tokens, .. } => {
                assert_eq!(cached_tokens, prompt.len() + 20, "{kv}")
            }
            ref other => panic!("{other:?}"),
        }
        assert_eq!(ids(&tokens, b), alone(&m, kv, &next, 12), "{kv}");
    }
}

/// A sequence cancelled right after a pass that kept drafts gets no token more, and its
/// cache serves the next prompt as a fresh run would.
#[test]
fn a_sequence_cancelled_after_a_verify_pass_leaves_a_sound_cache() {
    let m = load_at(Storage::F16, ActPrecision::Wide);
    let kv = KvType::F16;
    let prompt = synthetic::text_tokens(m.tokenizer().unwrap(), 60);
    let mut e = engine(&m, kv);
    let a = e
        .submit(request(&prompt, 100, ngram(MAX_DRAFT, 1, 4)))
        .unwrap();
    let mut events = Vec::new();
    let mut steps = 0;
    loop {
        let from = events.len();
        e.step(&mut events).unwrap();
        let got = events[from..]
            .iter()
            .filter(|ev| matches!(ev, Event::Token { seq, .. } if *seq == a))
            .count();
        steps += 1;
        if got > 1 {
            break;
        }
        assert!(steps < 100, "no pass kept a draft");
    }
    assert!(e.cancel(a));
    let before = collect(&events).0[&a].len();
    while !e.is_idle() {
        e.step(&mut events).unwrap();
    }
    let (tokens, done) = collect(&events);
    assert_eq!(tokens[&a].len(), before, "tokens after the cancel");
    match done[&a] {
        Event::Done {
            reason: FinishReason::Cancelled,
            generated,
            spec,
            ..
        } => {
            assert_eq!(generated, before);
            assert!(spec.accepted_tokens > 0, "{spec:?}");
        }
        ref other => panic!("{other:?}"),
    }
    let got = ids(&tokens, a);
    let next: Vec<u32> = [&prompt[..], &got[..]].concat();
    let b = e.submit(request(&next, 10, ngram(4, 1, 3))).unwrap();
    let (events, _) = run(&mut e);
    let (tokens, done) = collect(&events);
    match done[&b] {
        // The last generated token never ran: all but it is reused.
        Event::Done { cached_tokens, .. } => assert_eq!(cached_tokens, next.len() - 1),
        ref other => panic!("{other:?}"),
    }
    assert_eq!(ids(&tokens, b), alone(&m, kv, &next, 10));
}

/// A constrained sequence speculates too: each row's choice is the constrained one, so the
/// tokens are those of the constrained sequence without speculation, and it ends when the
/// constraint is complete, mid-draft or not.
#[test]
fn a_constrained_sequence_speculates_within_its_constraint() {
    let m = load_at(Storage::Quant(QuantFormat::Q8_0), ActPrecision::Byte);
    let kv = KvType::F16;
    let prompt = synthetic::text_tokens(m.tokenizer().unwrap(), 50);
    let mut allowed = prompt.clone();
    allowed.sort_unstable();
    allowed.dedup();
    allowed.truncate(allowed.len() - 2);
    let constrained = |len| {
        let c = OnlyThese {
            allowed: allowed.clone(),
            len,
            seen: 0,
            masks: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        };
        Some(Box::new(c) as Box<dyn qkv::engine::TokenConstraint>)
    };
    for len in [17, 40] {
        let mut got = Vec::new();
        for spec in [Speculation::Off, ngram(MAX_DRAFT, 1, 4)] {
            let mut e = engine(&m, kv);
            let seq = e
                .submit_constrained(request(&prompt, 60, spec), constrained(len))
                .unwrap();
            let (events, per_step) = run(&mut e);
            let (tokens, done) = collect(&events);
            assert!(matches!(
                done[&seq],
                Event::Done {
                    reason: FinishReason::Complete,
                    ..
                }
            ));
            check_counts(&e, &[seq], &done, &per_step);
            got.push(ids(&tokens, seq));
        }
        assert_eq!(got[0].len(), len);
        assert!(got[0].iter().all(|t| allowed.contains(t)));
        assert_eq!(got[1], got[0], "a constraint complete after {len}");
    }
}

/// Settings out of range, and a draft model's speculation on an engine without one, are
/// refused with typed errors; sampling is verified, not refused
/// (tests/speculative/sampling.rs); a draft model of another vocabulary is refused naming
/// both models.
#[test]
fn speculation_refuses_bad_settings_and_a_missing_draft_model() {
    let m = load_at(Storage::F32, ActPrecision::Wide);
    let mut e = engine(&m, KvType::F32);
    let sampled = GenRequest {
        sampler: SamplerConfig {
            temperature: 0.7,
            ..SamplerConfig::default()
        },
        ..request(&[1, 2, 3], 4, ngram(4, 1, 2))
    };
    e.submit(sampled).unwrap();
    for bad in [ngram(0, 1, 2), ngram(MAX_DRAFT + 1, 1, 2), ngram(4, 3, 2)] {
        let err = e.submit(request(&[1, 2, 3], 4, bad)).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{bad:?}: {err}");
    }
    let drafted = request(&[1, 2, 3], 4, Speculation::Draft(DraftOptions::default()));
    let err = e.submit(drafted).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    assert!(err.to_string().contains("draft model"), "{err}");
    assert_eq!(e.queued(), 1);
    let config = DecoderConfig::llama(16, 1, 2, 1, 32, 50, 64, WeightLayout::Gguf);
    let other = Model::from_parts(Decoder::synthetic(config, 1, FloatType::F32).unwrap(), None);
    let err = e.set_draft_model(Arc::new(other)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Config(_)), "{text}");
    assert!(
        text.contains("a model built in memory") && text.contains(&m.path().display().to_string()),
        "{text}"
    );
    assert!(e.draft_model().is_none());
}

/// Sequences drafting with a draft model (one close to the model, one far from it), batched
/// with n-gram drafting and plain ones, greedy: each gets exactly the tokens it gets alone
/// without speculation; the close drafter's drafts are mostly kept; the counts match the
/// events.
#[test]
fn sequences_drafting_with_a_draft_model_get_the_tokens_they_get_alone() {
    let m = load_at(Storage::F32, ActPrecision::Wide);
    let kv = KvType::F32;
    let tok = m.tokenizer().unwrap();
    let repeating = synthetic::text_tokens(tok, 70);
    let shifted = synthetic::text_tokens(tok, 90)[13..].to_vec();
    let scattered: Vec<u32> = (0..30).map(|i| (i * 37 + 11) % 260).collect();
    let draft = |max_draft| {
        Speculation::Draft(DraftOptions {
            max_draft,
            min_draft: 0,
        })
    };
    for (drafter, close) in [
        (Storage::F16, true),
        (Storage::Quant(QuantFormat::Q4_0), false),
    ] {
        let mut e = engine(&m, kv);
        e.set_draft_model(load_at(drafter, ActPrecision::Wide))
            .unwrap();
        let n = 30;
        let cases = [
            (&scattered, draft(MAX_DRAFT)),
            (&shifted, Speculation::Off),
            (&repeating, draft(3)),
            (&shifted, ngram(3, 2, 3)),
        ];
        let seqs: Vec<SeqId> = cases
            .iter()
            .map(|(p, s)| e.submit(request(p, n, *s)).unwrap())
            .collect();
        let (events, per_step) = run(&mut e);
        let (tokens, done) = collect(&events);
        for (&seq, (prompt, spec)) in seqs.iter().zip(cases) {
            assert_eq!(
                ids(&tokens, seq),
                alone(&m, kv, prompt, n),
                "{drafter:?}: {spec:?}"
            );
        }
        check_counts(&e, &seqs, &done, &per_step);
        let s = spec_of(&done, seqs[0]);
        assert!(s.verify_passes > 0, "{drafter:?}: {s:?}");
        if close {
            assert!(s.accepted_tokens * 2 > s.draft_tokens, "{s:?}");
        }
    }
}

/// On the default model (as published, at both precisions): a prompt that copies a passage
/// and an open-ended one, speculating, batched with the same prompts decoded plainly, get
/// the tokens each gets alone without speculation; the copying one keeps many drafts.
#[test]
fn network_speculating_sequences_batched_get_the_tokens_they_get_alone() {
    let Some(path) = common::default_gguf() else {
        return;
    };
    let passage = "The lighthouse keeper climbed the spiral stairs every evening at dusk, \
        trimmed the wick, polished the great lens, and wrote the state of the sea in a \
        leather logbook that had belonged to his grandfather.";
    let copy = format!(
        "Copy this passage exactly, twice.\n\nPassage: {passage}\n\nCopy 1: {passage}\n\nCopy 2:"
    );
    let open = "Once upon a time, in a small village by the mountains, there lived a";
    for act_precision in PRECISIONS {
        let options = ModelOptions {
            act_precision,
            ..ModelOptions::default()
        };
        let m = Arc::new(Model::load(&path, &options).unwrap());
        let tok = m.tokenizer().unwrap();
        let (copy, open) = (tok.encode(&copy).unwrap(), tok.encode(open).unwrap());
        let kv = m.decoder().kv_dtype().into();
        let n = 48;
        let mut e = engine(&m, kv);
        let cases = [
            (&copy, ngram(MAX_DRAFT, 2, 4)),
            (&open, ngram(MAX_DRAFT, 2, 4)),
            (&copy, Speculation::Off),
            (&open, Speculation::Off),
        ];
        let seqs: Vec<SeqId> = cases
            .iter()
            .map(|(p, s)| e.submit(request(p, n, *s)).unwrap())
            .collect();
        let (events, per_step) = run(&mut e);
        let (tokens, done) = collect(&events);
        let want = [alone(&m, kv, &copy, n), alone(&m, kv, &open, n)];
        for (i, &seq) in seqs.iter().enumerate() {
            assert_eq!(ids(&tokens, seq), want[i % 2], "{act_precision}, case {i}");
        }
        check_counts(&e, &seqs, &done, &per_step);
        let s = spec_of(&done, seqs[0]);
        assert!(s.accepted_tokens > 16, "{act_precision}: {s:?}");
    }
}
