//! Slots on disk and context shift in the engine, on the synthetic model: a slot saved and
//! restored into another slot of another engine (a restart) continues exactly as the
//! original (same tokens, same log-probabilities, bit for bit) in every KV cache type; bytes
//! of another model, KV type or shape, truncated, padded or corrupt are refused with a typed
//! error and change nothing; a context shift gives exactly the tokens of a fresh sequence
//! whose prompt is the shifted tokens.

use super::{collect, ids, request, synthetic_model};
use qkv::engine::{Engine, EngineOptions, Event, FinishReason, GenRequest, SeqId};
use qkv::load::{Model, ModelOptions};
use qkv::models::decoder::KvType;
use qkv::Error;
use std::sync::Arc;

fn engine_kv(m: &Arc<Model>, kv: KvType, sequences: usize) -> Engine {
    Engine::new(
        m.clone(),
        EngineOptions {
            context: 96,
            max_sequences: sequences,
            kv_dtype: Some(kv),
            step_tokens: 16,
            ..EngineOptions::default()
        },
    )
    .unwrap()
}

/// Runs the engine until idle; returns the events.
fn run(e: &mut Engine) -> Vec<Event> {
    let mut events = Vec::new();
    for _ in 0..2000 {
        if e.is_idle() {
            return events;
        }
        e.step(&mut events).unwrap();
    }
    panic!("the engine does not finish");
}

/// A request pinned to `slot`.
fn pinned(prompt: Vec<u32>, n: usize, slot: usize) -> GenRequest {
    GenRequest {
        slot: Some(slot),
        ..request(prompt, n)
    }
}

/// One sequence's (token, log-probability bits) and its cached prompt tokens.
fn one(e: &mut Engine, r: GenRequest) -> (Vec<(u32, u32)>, usize) {
    let seq = e.submit(r).unwrap();
    let events = run(e);
    let (tokens, done) = collect(&events);
    let cached = match &done[&seq] {
        Event::Done { cached_tokens, .. } => *cached_tokens,
        other => panic!("{other:?}"),
    };
    let t = tokens[&seq]
        .iter()
        .map(|&(t, l)| (t, l.to_bits()))
        .collect();
    (t, cached)
}

const FIRST: &str = "The capital of France is";
const SECOND: &str = "The capital of France is not";

#[test]
fn a_saved_slot_restores_into_another_engine_and_continues_bit_for_bit() {
    let m = synthetic_model();
    for kv in [KvType::F32, KvType::F16, KvType::Q8_0] {
        let mut a = engine_kv(&m, kv, 2);
        let (_, cached) = one(&mut a, pinned(ids(&m, FIRST), 9, 1));
        assert_eq!(cached, 0);
        let saved = a.save_slot(1).unwrap();
        // The prompt and the generated tokens but the last, which never ran.
        assert_eq!(saved.tokens, ids(&m, FIRST).len() + 8, "{kv}");
        // Slot 0 was never used: it saves empty.
        assert_eq!(a.save_slot(0).unwrap().tokens, 0);
        // The original goes on from its cache…
        let prompt = ids(&m, SECOND);
        let common = prompt
            .iter()
            .zip(&ids(&m, FIRST))
            .take_while(|(x, y)| x == y)
            .count();
        let (want, cached) = one(&mut a, pinned(prompt.clone(), 6, 1));
        assert_eq!(cached, common, "{kv}");
        // …and a fresh engine (a restarted server) restored from the bytes, in another slot,
        // gets the same tokens and log-probabilities bit for bit.
        let mut b = engine_kv(&m, kv, 2);
        assert_eq!(b.restore_slot(0, &saved.bytes).unwrap(), saved.tokens);
        let (got, cached) = one(&mut b, pinned(prompt, 6, 0));
        assert_eq!(cached, common, "{kv}");
        assert_eq!(got, want, "{kv}");
        // Saved again, the bytes are the same as the first save's when the slot holds the
        // same tokens.
        b.restore_slot(1, &saved.bytes).unwrap();
        assert_eq!(b.save_slot(1).unwrap().bytes, saved.bytes, "{kv}");
    }
}

#[test]
fn a_bad_save_is_refused_by_name_and_changes_nothing() {
    let m = synthetic_model();
    let mut a = engine_kv(&m, KvType::F16, 2);
    one(&mut a, pinned(ids(&m, FIRST), 5, 0));
    let saved = a.save_slot(0).unwrap();
    let good = saved.bytes.clone();
    let mut b = engine_kv(&m, KvType::F16, 2);
    one(&mut b, pinned(ids(&m, SECOND), 3, 1));
    let before = b.save_slot(1).unwrap().bytes;
    let refused = |b: &mut Engine, bytes: &[u8], words: &str| match b.restore_slot(1, bytes) {
        Err(Error::SlotState(msg)) => assert!(msg.contains(words), "{words}: {msg}"),
        other => panic!("{words}: {other:?}"),
    };
    // Every truncation, and padding.
    for cut in [
        0,
        4,
        8,
        20,
        51,
        52,
        60,
        good.len() / 2,
        good.len() - 9,
        good.len() - 1,
    ] {
        let words = if cut < 60 { "" } else { "truncated" };
        refused(&mut b, &good[..cut], words);
    }
    let mut padded = good.clone();
    padded.push(0);
    refused(&mut b, &padded, "truncated or padded");
    // A flipped bit anywhere in the body.
    for at in [13, 30, 60, good.len() / 2, good.len() - 10] {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        refused(&mut b, &bad, "");
    }
    let mut bad = good.clone();
    bad[good.len() - 20] ^= 1;
    refused(&mut b, &bad, "checksum");
    // A header that claims a huge count.
    let mut bad = good.clone();
    bad[36..40].copy_from_slice(&u32::MAX.to_le_bytes());
    refused(&mut b, &bad, "truncated or padded");
    let mut bad = good.clone();
    bad[8] = 2;
    refused(&mut b, &bad, "version 2");
    refused(
        &mut b,
        b"GGUF and then some bytes that are not a slot at all, long enough..",
        "not a qkv slot file",
    );
    // Another KV type, another model.
    let mut q8 = engine_kv(&m, KvType::Q8_0, 2);
    refused(&mut q8, &good, "its KV cache is f16, this server's is q8_0");
    let path = qkv::testing::synthetic::model_file(qkv::testing::synthetic::Storage::F16);
    let other = Arc::new(Model::load(&path, &ModelOptions::default()).unwrap());
    let mut o = engine_kv(&other, KvType::F16, 2);
    refused(&mut o, &good, "another model");
    // Slot 1 of `b` holds what it held.
    assert_eq!(b.save_slot(1).unwrap().bytes, before);
    // No such slot; a busy one.
    assert!(matches!(
        b.restore_slot(2, &good),
        Err(Error::Slot { slot: 2, .. })
    ));
    assert!(matches!(
        b.submit(pinned(vec![1, 2], 1, 7)),
        Err(Error::Slot { slot: 7, .. })
    ));
    b.submit(pinned(ids(&m, FIRST), 4, 0)).unwrap();
    let mut events = Vec::new();
    b.step(&mut events).unwrap();
    assert!(matches!(b.save_slot(0), Err(Error::Slot { slot: 0, .. })));
    assert!(matches!(
        b.restore_slot(0, &good),
        Err(Error::Slot { slot: 0, .. })
    ));
    assert!(matches!(b.erase_slot(0), Err(Error::Slot { slot: 0, .. })));
    run(&mut b);
}

#[test]
fn an_erased_slot_reuses_nothing_and_a_pinned_request_waits_for_its_slot() {
    let m = synthetic_model();
    let mut a = engine_kv(&m, KvType::F32, 2);
    let prompt = ids(&m, FIRST);
    let (first, _) = one(&mut a, pinned(prompt.clone(), 4, 1));
    assert_eq!(a.erase_slot(1).unwrap(), prompt.len() + 3);
    assert_eq!(a.erase_slot(1).unwrap(), 0);
    let (again, cached) = one(&mut a, pinned(prompt.clone(), 4, 1));
    assert_eq!((cached, &again), (0, &first));
    // Two requests pinned to one slot run one after the other; the second reuses the
    // first's cache.
    let s1 = a.submit(pinned(prompt.clone(), 4, 0)).unwrap();
    let s2 = a.submit(pinned(prompt.clone(), 4, 0)).unwrap();
    let events = run(&mut a);
    let (_, done) = collect(&events);
    let cached = |s: SeqId| match &done[&s] {
        Event::Done { cached_tokens, .. } => *cached_tokens,
        e => panic!("{e:?}"),
    };
    assert_eq!((cached(s1), cached(s2)), (0, prompt.len() - 1));
}

/// The tokens a shift left (the prompt of a fresh run), and the tokens generated after it.
type Segment = (Vec<u32>, Vec<(u32, u32)>);

/// Greedy tokens of `prompt` in a fresh engine without shift.
fn fresh(m: &Arc<Model>, prompt: &[u32], n: usize) -> Vec<(u32, u32)> {
    let mut e = engine_kv(m, KvType::F32, 1);
    one(&mut e, request(prompt.to_vec(), n)).0
}

#[test]
fn a_context_shift_gives_the_tokens_of_the_shifted_prompt() {
    let m = synthetic_model();
    for n_keep in [0, 5] {
        let mut e = Engine::new(
            m.clone(),
            EngineOptions {
                context: 40,
                max_sequences: 1,
                kv_dtype: Some(KvType::F32),
                step_tokens: 16,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        let prompt = ids(&m, "def fibonacci(n):\n    return");
        let n = 70;
        // Without shift, it does not fit.
        assert!(matches!(
            e.submit(request(prompt.clone(), n)),
            Err(Error::ContextFull { .. })
        ));
        let seq = e
            .submit(GenRequest {
                context_shift: Some(n_keep),
                ..request(prompt.clone(), n)
            })
            .unwrap();
        let events = run(&mut e);
        // Replay: the tokens as the sequence holds them (the pending one last), and after
        // each shift the tokens that follow until the next one.
        let mut cur = prompt.clone();
        let mut segments: Vec<Segment> = Vec::new();
        let mut shifts = 0;
        for ev in &events {
            match ev {
                Event::Token {
                    seq: s,
                    token,
                    logprob,
                    ..
                } if *s == seq => {
                    if let Some(last) = segments.last_mut() {
                        last.1.push((*token, logprob.to_bits()));
                    }
                    cur.push(*token);
                }
                Event::Shifted {
                    kept,
                    dropped,
                    seq: s,
                } if *s == seq => {
                    shifts += 1;
                    assert_eq!(*kept, n_keep);
                    // `cur` ends with the token to run next, not cached yet; the shift comes
                    // when the cached ones and it reach the context.
                    let cached = cur.len() - 1;
                    assert_eq!(cur.len(), 40, "shifted when the context filled");
                    assert_eq!(*dropped, (cached - kept) / 2);
                    cur.drain(*kept..*kept + *dropped);
                    segments.push((cur.clone(), Vec::new()));
                }
                Event::Done {
                    seq: s,
                    generated,
                    reason,
                    prompt_tokens,
                    ..
                } if *s == seq => {
                    assert_eq!((*generated, *reason), (n, FinishReason::Length));
                    assert_eq!(*prompt_tokens, prompt.len());
                }
                Event::Failed { error, .. } => panic!("{error}"),
                _ => {}
            }
        }
        assert!(shifts >= 2, "{shifts} shifts");
        for (shifted_prompt, after) in &segments {
            assert!(shifted_prompt.len() < 40);
            let want = fresh(&m, shifted_prompt, after.len());
            assert_eq!(
                after, &want,
                "n_keep {n_keep}, after a shift to {shifted_prompt:?}"
            );
        }
    }
}
