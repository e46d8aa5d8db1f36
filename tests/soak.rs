//! Soak tests on the real default model, ignored by default (minutes of work in release mode;
//! `.ci/run` runs them):
//!
//! ```sh
//! cargo test --release --test soak -- --ignored --nocapture
//! ```
//!
//! - eight sessions decode 2,000 steps each on their own threads, all at once over one
//!   shared model, and every step's logits are bit-identical to the same session run alone;
//! - one session decodes 10,000 steps (the cache is cut back to the prompt whenever it fills)
//!   while its resident memory is sampled: it may grow only by the KV cache pages the steps
//!   touch for the first time.

mod common;

use qkv::load::{Model, ModelOptions};
use qkv::sample::argmax;
use qkv::session::{Session, SessionOptions};
use std::sync::Arc;

/// The default model, or `None` after a printed skip when it cannot be fetched.
fn model() -> Option<Arc<Model>> {
    let path = common::default_gguf()?;
    let model = Model::load(&path, &ModelOptions::default()).expect("the default model loads");
    Some(Arc::new(model))
}

/// One greedy run's trace: the chosen token and a hash of the logits' bits at every step.
#[derive(PartialEq, Eq, Debug)]
struct Trace {
    tokens: Vec<u32>,
    hashes: Vec<u64>,
}

/// FNV-1a over the logits' bit patterns: equal hashes for bit-identical logits.
fn hash_bits(logits: &[f32]) -> u64 {
    logits.iter().fold(0xcbf2_9ce4_8422_2325, |h, v| {
        (h ^ u64::from(v.to_bits())).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Prompt `i` of the soak: a few ids that differ between sessions, so that no two traces
/// are alike and a mixed-up cache would show.
fn prompt(i: usize) -> Vec<u32> {
    let i = i as u32;
    vec![504, 3575 + i, 282, 4649 + 7 * i, 314, 1350 + 3 * i]
}

/// Greedy decoding from `prompt` for `steps` steps.
fn run(model: &Arc<Model>, prompt: &[u32], steps: usize) -> Trace {
    let options = SessionOptions {
        context: Some(prompt.len() + steps + 1),
        ..SessionOptions::default()
    };
    let mut s = Session::new(model.clone(), options).expect("a session");
    let mut logits = s.prefill(prompt).expect("prefill").to_vec();
    let mut trace = Trace {
        tokens: Vec::with_capacity(steps),
        hashes: Vec::with_capacity(steps),
    };
    for _ in 0..steps {
        let next = argmax(&logits) as u32;
        trace.tokens.push(next);
        logits.copy_from_slice(s.step(next).expect("a step"));
        trace.hashes.push(hash_bits(&logits));
    }
    trace
}

#[test]
#[ignore = "soak: minutes in release mode; run with --ignored"]
fn network_eight_concurrent_sessions_equal_their_solo_runs_bit_for_bit() {
    const SESSIONS: usize = 8;
    const STEPS: usize = 2000;
    let Some(model) = model() else { return };
    let t0 = std::time::Instant::now();
    let together: Vec<Trace> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..SESSIONS)
            .map(|i| {
                let model = &model;
                scope.spawn(move || run(model, &prompt(i), STEPS))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let concurrent = t0.elapsed();
    let t1 = std::time::Instant::now();
    for (i, trace) in together.iter().enumerate() {
        let alone = run(&model, &prompt(i), STEPS);
        assert_eq!(alone.tokens.len(), STEPS);
        if let Some(step) = (0..STEPS).find(|&t| alone.hashes[t] != trace.hashes[t]) {
            panic!(
                "session {i}: the logits after step {step} differ from the session run alone \
                 (tokens so far equal: {})",
                alone.tokens[..=step] == trace.tokens[..=step]
            );
        }
        assert_eq!(alone.tokens, trace.tokens, "session {i}: tokens");
    }
    eprintln!(
        "soak: {SESSIONS} sessions x {STEPS} steps, concurrent {:.1} s, solo {:.1} s, all \
         bit-identical",
        concurrent.as_secs_f64(),
        t1.elapsed().as_secs_f64()
    );
}

/// The process's resident memory in bytes (`VmRSS` in /proc/self/status).
fn rss_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
#[ignore = "soak: minutes in release mode; run with --ignored"]
fn network_resident_memory_stays_flat_over_ten_thousand_decode_steps() {
    const STEPS: usize = 10_000;
    const SAMPLE_EVERY: usize = 500;
    /// Slack for the allocator's and the OS's own bookkeeping, beyond the cache pages.
    const SLACK: usize = 16 << 20;
    let Some(start_rss) = rss_bytes() else {
        eprintln!("skipped: no /proc/self/status on this system");
        return;
    };
    let Some(model) = model() else { return };
    let context = 4096;
    let options = SessionOptions {
        context: Some(context),
        ..SessionOptions::default()
    };
    let mut s = Session::new(model, options).expect("a session");
    let per_position = s.cache_bytes() / s.capacity();
    let prompt = prompt(0);
    let mut logits = s.prefill(&prompt).expect("prefill").to_vec();
    // Measured from after the first sample window, once every lazy buffer (scratch, the
    // kernels' per-thread buffers, the pool's stacks) has been touched.
    let mut base: Option<(usize, usize)> = None; // (rss, highest position reached)
    let mut highest = s.position();
    let mut worst_excess: isize = isize::MIN;
    let mut samples = Vec::new();
    for step in 1..=STEPS {
        if s.position() == s.capacity() {
            // The logits in hand are the last position's; the next step follows from them.
            s.truncate(prompt.len()).expect("truncate to the prompt");
        }
        let next = argmax(&logits) as u32;
        logits.copy_from_slice(s.step(next).expect("a step"));
        highest = highest.max(s.position());
        if step % SAMPLE_EVERY == 0 {
            let rss = rss_bytes().expect("VmRSS");
            samples.push((step, rss));
            match base {
                None => base = Some((rss, highest)),
                Some((base_rss, base_pos)) => {
                    // Allowed: the cache pages of positions first reached since the base.
                    let allowed = (highest - base_pos) * per_position + SLACK;
                    let grown = rss as isize - base_rss as isize;
                    worst_excess = worst_excess.max(grown - (allowed - SLACK) as isize);
                    assert!(
                        grown <= allowed as isize,
                        "step {step}: resident memory grew {grown} bytes since step \
                         {SAMPLE_EVERY}, more than the {} bytes of newly reached cache \
                         positions plus {SLACK} of slack",
                        allowed - SLACK
                    );
                }
            }
        }
    }
    let (first_step, first) = samples[0];
    let (last_step, last) = *samples.last().unwrap();
    eprintln!(
        "soak: RSS {:.1} MB before loading, {:.1} MB at step {first_step}, {:.1} MB at step \
         {last_step}; cache {:.1} MB for {context} positions ({per_position} bytes each); \
         worst growth beyond the newly reached cache pages: {:.2} MB",
        start_rss as f64 / 1e6,
        first as f64 / 1e6,
        last as f64 / 1e6,
        (per_position * context) as f64 / 1e6,
        worst_excess as f64 / 1e6
    );
}
