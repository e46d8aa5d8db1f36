//! Speculative decoding with sampling (a module of the `speculative` test binary): the
//! tokens come out with exactly the distribution of plain sampling.
//!
//! - n-gram drafts (not drawn at random) are verified with the random numbers plain sampling
//!   uses, so for every seed the tokens are those of plain sampling, in the session and in
//!   the batch engine.
//! - A draft model (another, random model of the synthetic vocabulary, far from the target)
//!   samples its drafts; over many seeds, the first [`T`] tokens follow the exact joint
//!   distribution of plain sampling, computed from the target's rows (top-k keeps it to at
//!   most `K^T` sequences): a chi-square test whose threshold a correct implementation
//!   exceeds with probability about 1e-6. Plain sampling passes the same test (the
//!   reference is right), and so does the rule simulated from the exact rows; two broken
//!   rules simulated the same way (keeping every draft; replacing a rejected draft from the
//!   target's distribution instead of the residual) fail it, so the test has the power to
//!   catch them.

use super::{common, load};
use common::synthetic::{self, Storage};
use qkv::engine::{Engine, EngineOptions, Event, GenRequest, SeqId, TokenConstraint};
use qkv::load::Model;
use qkv::models::decoder::{Decoder, DecoderConfig, WeightLayout};
use qkv::sample::{Rng, Sampler, SamplerConfig};
use qkv::session::{Session, SessionOptions};
use qkv::speculative::sampling::{verify_draft, Verdict};
use qkv::speculative::{DraftOptions, NgramOptions, Speculation};
use qkv::weights::FloatType;
use std::collections::HashMap;
use std::sync::Arc;

/// Tokens per sample.
const T: usize = 4;
/// Samples per distribution tested.
const N: usize = 4000;
/// Top-k of the sampler: at most `K^T` sequences.
const K: usize = 3;
/// The standard normal quantile of 1 − 1e-6.
const Z: f64 = 4.753;

/// The sampling settings of sample `seed`: flat enough that every kept token is likely.
fn config(seed: u64, penalty: f32) -> SamplerConfig {
    SamplerConfig {
        temperature: 1.5,
        top_k: K,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: penalty,
        repeat_last_n: 64,
        seed,
    }
}

/// A random model of the synthetic vocabulary and no tokenizer: a drafter whose
/// distributions are far from the target's.
fn drafter() -> Arc<Model> {
    let c = DecoderConfig::llama(64, 1, 2, 1, 128, synthetic::VOCAB, 512, WeightLayout::Gguf);
    Arc::new(Model::from_parts(
        Decoder::synthetic(c, 99, FloatType::F32).unwrap(),
        None,
    ))
}

fn session(model: &Arc<Model>) -> Session {
    let options = SessionOptions {
        context: Some(64),
        ..SessionOptions::default()
    };
    Session::new(model.clone(), options).unwrap()
}

/// The distribution `config` samples from after `prompt` and `prefix` on `model`, for
/// every prefix asked, computed once (one-row steps from the prompt, as plain decoding runs).
struct Rows {
    session: Session,
    prompt_len: usize,
    sampler: Sampler,
    cache: HashMap<Vec<u32>, Vec<f32>>,
    /// Sampled under [`Even`], as the engine samples under a constraint: a draw the
    /// constraint refuses is drawn again from the masked logits.
    even: bool,
}

impl Rows {
    fn new(model: &Arc<Model>, prompt: &[u32], config: SamplerConfig) -> Rows {
        let mut session = session(model);
        session.prefill(prompt).unwrap();
        Rows {
            session,
            prompt_len: prompt.len(),
            sampler: Sampler::new(config).unwrap(),
            cache: HashMap::new(),
            even: false,
        }
    }

    fn at(&mut self, prefix: &[u32]) -> &[f32] {
        if !self.cache.contains_key(prefix) {
            let s = &mut self.session;
            // The prompt's last token runs again as a step, as a session continuing after
            // a truncate runs it; then the prefix, one step at a time.
            let last = s.tokens()[self.prompt_len - 1];
            s.truncate(self.prompt_len - 1).unwrap();
            let mut logits = s.step(last).unwrap().to_vec();
            for &t in prefix {
                logits = s.step(t).unwrap().to_vec();
            }
            let mut p = vec![0.0; logits.len()];
            self.sampler
                .distribution(&logits, s.tokens(), &mut p)
                .unwrap();
            if self.even {
                // P(x) = p(x)·[x allowed] + P(refused)·p_masked(x).
                let refused: f32 = p.iter().skip(1).step_by(2).sum();
                let mut masked = logits.clone();
                Even.mask(&mut masked).unwrap();
                let mut again = vec![0.0; logits.len()];
                self.sampler
                    .distribution(&masked, s.tokens(), &mut again)
                    .unwrap();
                for (i, x) in p.iter_mut().enumerate() {
                    *x = if i % 2 == 0 {
                        *x + refused * again[i]
                    } else {
                        0.0
                    };
                }
            }
            self.cache.insert(prefix.to_vec(), p);
        }
        &self.cache[prefix]
    }

    /// The exact probability of every sequence of `T` tokens.
    fn joint(&mut self) -> HashMap<Vec<u32>, f64> {
        self.joint_of(T)
    }

    /// The exact probability of every sequence of `len` tokens.
    fn joint_of(&mut self, len: usize) -> HashMap<Vec<u32>, f64> {
        let mut out = HashMap::new();
        let mut stack = vec![(Vec::new(), 1.0f64)];
        while let Some((prefix, prob)) = stack.pop() {
            if prefix.len() == len {
                out.insert(prefix, prob);
                continue;
            }
            let p = self.at(&prefix).to_vec();
            for (t, &pt) in p.iter().enumerate() {
                if pt > 0.0 {
                    let mut next = prefix.clone();
                    next.push(t as u32);
                    stack.push((next, prob * pt as f64));
                }
            }
        }
        out
    }
}

/// Pearson's chi-square of `counts` (of `n` samples) against `exact`, cells of expected
/// count below 5 pooled; and the statistic's 1 − 1e-6 quantile for its degrees of freedom
/// (Wilson and Hilferty's approximation). A sequence `exact` gives no probability makes the
/// statistic infinite.
fn chi_square(counts: &HashMap<Vec<u32>, usize>, exact: &HashMap<Vec<u32>, f64>) -> (f64, f64) {
    let n: usize = counts.values().sum();
    if counts.keys().any(|s| !exact.contains_key(s)) {
        return (f64::INFINITY, 0.0);
    }
    let mut cells: Vec<(f64, f64)> = exact
        .iter()
        .map(|(s, &p)| (p * n as f64, *counts.get(s).unwrap_or(&0) as f64))
        .collect();
    cells.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut pooled: Vec<(f64, f64)> = Vec::new();
    let mut acc = (0.0, 0.0);
    for (e, o) in cells {
        acc = (acc.0 + e, acc.1 + o);
        if acc.0 >= 5.0 {
            pooled.push(acc);
            acc = (0.0, 0.0);
        }
    }
    match pooled.last_mut() {
        Some(last) => *last = (last.0 + acc.0, last.1 + acc.1),
        None => pooled.push(acc),
    }
    let stat = pooled.iter().map(|(e, o)| (o - e) * (o - e) / e).sum();
    let df = (pooled.len() - 1).max(1) as f64;
    let h = 2.0 / (9.0 * df);
    let quantile = df * (1.0 - h + Z * h.sqrt()).powi(3);
    (stat, quantile)
}

fn tally(samples: impl IntoIterator<Item = Vec<u32>>) -> HashMap<Vec<u32>, usize> {
    let mut counts = HashMap::new();
    for s in samples {
        *counts.entry(s).or_insert(0) += 1;
    }
    counts
}

fn assert_follows(what: &str, counts: &HashMap<Vec<u32>, usize>, exact: &HashMap<Vec<u32>, f64>) {
    let (stat, quantile) = chi_square(counts, exact);
    assert!(
        stat <= quantile,
        "{what}: chi-square {stat:.1} above its 1e-6 quantile {quantile:.1} ({} sequences)",
        exact.len()
    );
}

/// The first `T` tokens after `prompt` in a session, sampled with `seed`, speculating as
/// `spec` says (drafting on `draft` when it is given).
fn session_sample(
    target: &mut Session,
    draft: Option<&mut Session>,
    prompt_len: usize,
    config: SamplerConfig,
    spec: Speculation,
) -> Vec<u32> {
    target.truncate(prompt_len).unwrap();
    let stream = target
        .generate_tokens(&[], config)
        .unwrap()
        .max_tokens(T)
        .ignore_eos(true);
    let stream = match draft {
        Some(d) => stream.speculate_with_draft(spec, d).unwrap(),
        None => stream.speculate(spec).unwrap(),
    };
    stream.map(|p| p.unwrap().id).collect()
}

fn prompt(model: &Model) -> Vec<u32> {
    synthetic::text_tokens(model.tokenizer().unwrap(), 24)
}

fn two_drafts() -> Speculation {
    Speculation::Draft(DraftOptions {
        max_draft: 2,
        min_draft: 0,
    })
}

/// n-gram drafts with sampling: for every seed, the very tokens of plain sampling, with and
/// without the repetition penalty (which reads the kept drafts as history), in a session.
#[test]
fn sampled_ngram_speculation_yields_the_tokens_of_plain_sampling() {
    let model = load(Storage::F32);
    let prompt = synthetic::text_tokens(model.tokenizer().unwrap(), 90);
    let mut s = Session::new(model.clone(), SessionOptions::default()).unwrap();
    s.prefill(&prompt).unwrap();
    let spec = Speculation::Ngram(NgramOptions {
        max_draft: 5,
        min_ngram: 1,
        max_ngram: 3,
        min_draft: 0,
    });
    let mut drafted = 0;
    for seed in 0..40 {
        for penalty in [1.0, 1.3] {
            let c = SamplerConfig {
                top_k: 0,
                min_p: 0.02,
                temperature: 0.7,
                ..config(seed, penalty)
            };
            let plain = {
                s.truncate(prompt.len()).unwrap();
                let g = s.generate_tokens(&[], c.clone()).unwrap();
                let ids: Vec<u32> = g
                    .max_tokens(24)
                    .ignore_eos(true)
                    .map(|p| p.unwrap().id)
                    .collect();
                ids
            };
            s.truncate(prompt.len()).unwrap();
            let mut g = s
                .generate_tokens(&[], c.clone())
                .unwrap()
                .max_tokens(24)
                .ignore_eos(true)
                .speculate(spec)
                .unwrap();
            let fast: Vec<u32> = g.by_ref().map(|p| p.unwrap().id).collect();
            drafted += g.spec_stats().draft_tokens;
            drop(g);
            assert_eq!(fast, plain, "seed {seed}, penalty {penalty}");
        }
    }
    assert!(drafted > 0, "no draft was verified");
}

/// n-gram drafts with sampling in the batch engine, sequences of several seeds batched:
/// each gets the very tokens it gets without speculation.
#[test]
fn sampled_ngram_speculation_in_the_engine_yields_the_tokens_of_plain_sampling() {
    let model = load(Storage::F32);
    let prompt = synthetic::text_tokens(model.tokenizer().unwrap(), 90);
    let spec = Speculation::Ngram(NgramOptions {
        max_draft: 5,
        min_ngram: 1,
        max_ngram: 3,
        min_draft: 0,
    });
    let run = |spec| {
        let mut e = Engine::new(
            model.clone(),
            EngineOptions {
                max_sequences: 6,
                context: 256,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        let seqs: Vec<SeqId> = (0..12)
            .map(|seed| {
                let c = SamplerConfig {
                    top_k: 0,
                    min_p: 0.02,
                    temperature: 0.7,
                    ..config(seed, 1.2)
                };
                let r = GenRequest {
                    ignore_eos: true,
                    speculation: spec,
                    ..GenRequest::new(prompt.clone(), c, 24)
                };
                e.submit(r).unwrap()
            })
            .collect();
        let mut tokens: HashMap<SeqId, Vec<u32>> = HashMap::new();
        let mut drafted = 0;
        let mut events = Vec::new();
        while !e.is_idle() {
            events.clear();
            e.step(&mut events).unwrap();
            for ev in &events {
                match ev {
                    Event::Token { seq, token, .. } => tokens.entry(*seq).or_default().push(*token),
                    Event::Done { spec, .. } => drafted += spec.draft_tokens,
                    Event::Failed { error, .. } => panic!("{error}"),
                    Event::Prompt { .. } | Event::Shifted { .. } => {}
                }
            }
        }
        let ids: Vec<Vec<u32>> = seqs.iter().map(|s| tokens[s].clone()).collect();
        (ids, drafted)
    };
    let (plain, _) = run(Speculation::Off);
    let (fast, drafted) = run(spec);
    assert!(drafted > 0, "no draft was verified");
    assert_eq!(fast, plain);
}

/// A draft model's sampled drafts in a session: the first tokens follow plain sampling's
/// exact distribution, with and without the repetition penalty, with a drafter close to the
/// target (its weights rounded to f16: most drafts kept) and one far from it (random:
/// most replaced); plain sampling itself passes the same test.
#[test]
fn sampled_drafts_of_a_second_model_keep_the_distribution_of_plain_sampling() {
    let model = load(Storage::F32);
    let prompt = prompt(&model);
    let mut target = session(&model);
    target.prefill(&prompt).unwrap();
    // With a stronger penalty the far drafter's top tokens and the target's part for good.
    for (penalty, near) in [(1.0, true), (1.2, false)] {
        let small = if near { load(Storage::F16) } else { drafter() };
        let mut draft = session(&small);
        let exact = Rows::new(&model, &prompt, config(0, penalty)).joint();
        assert!(exact.len() > 20, "{} sequences", exact.len());
        let plain = tally((0..N as u64).map(|seed| {
            session_sample(
                &mut target,
                None,
                prompt.len(),
                config(seed, penalty),
                Speculation::Off,
            )
        }));
        assert_follows(
            &format!("plain sampling, penalty {penalty}"),
            &plain,
            &exact,
        );
        let (mut kept, mut drafted) = (0, 0);
        let fast = tally((0..N as u64).map(|seed| {
            target.truncate(prompt.len()).unwrap();
            let mut g = target
                .generate_tokens(&[], config(seed, penalty))
                .unwrap()
                .max_tokens(T)
                .ignore_eos(true)
                .speculate_with_draft(two_drafts(), &mut draft)
                .unwrap();
            let ids: Vec<u32> = g.by_ref().map(|p| p.unwrap().id).collect();
            kept += g.spec_stats().accepted_tokens;
            drafted += g.spec_stats().draft_tokens;
            ids
        }));
        assert_follows(&format!("drafted, penalty {penalty}"), &fast, &exact);
        // The near drafter's drafts are mostly kept; the far one's both kept and replaced:
        // the rule ran both ways.
        let ok = if near {
            kept > drafted / 2
        } else {
            kept > N / 20 && kept < drafted / 2
        };
        assert!(ok, "near {near}: kept {kept} of {drafted}");
    }
}

/// The same in the batch engine, many sequences at once (each sample a request of its own
/// seed), drafting with the second model on a KV cache per slot.
#[test]
fn the_engine_keeps_the_distribution_of_plain_sampling_with_sampled_drafts() {
    let model = load(Storage::F32);
    let prompt = prompt(&model);
    let exact = Rows::new(&model, &prompt, config(0, 1.2)).joint();
    let mut e = Engine::new(
        model.clone(),
        EngineOptions {
            max_sequences: 8,
            context: 64,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    e.set_draft_model(drafter()).unwrap();
    let mut samples: HashMap<SeqId, Vec<u32>> = HashMap::new();
    let mut events = Vec::new();
    let (mut drafted, mut kept) = (0, 0);
    for chunk in (0..N as u64).collect::<Vec<_>>().chunks(48) {
        for &seed in chunk {
            let r = GenRequest {
                ignore_eos: true,
                speculation: two_drafts(),
                ..GenRequest::new(prompt.clone(), config(seed, 1.2), T)
            };
            e.submit(r).unwrap();
        }
        while !e.is_idle() {
            events.clear();
            e.step(&mut events).unwrap();
            for ev in &events {
                match ev {
                    Event::Token { seq, token, .. } => {
                        samples.entry(*seq).or_default().push(*token)
                    }
                    Event::Done { spec, .. } => {
                        drafted += spec.draft_tokens;
                        kept += spec.accepted_tokens;
                    }
                    Event::Failed { error, .. } => panic!("{error}"),
                    Event::Prompt { .. } | Event::Shifted { .. } => {}
                }
            }
        }
    }
    assert_eq!(samples.len(), N);
    assert!(
        kept > N / 20 && kept < drafted / 2,
        "kept {kept} of {drafted}"
    );
    assert_follows("the engine, drafted", &tally(samples.into_values()), &exact);
}

/// A constraint that allows the tokens of even id only.
struct Even;

impl TokenConstraint for Even {
    fn allows(&mut self, token: u32) -> bool {
        token.is_multiple_of(2)
    }
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        logits
            .iter_mut()
            .skip(1)
            .step_by(2)
            .for_each(|l| *l = f32::MIN);
        Ok(())
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        match token % 2 {
            0 => Ok(()),
            _ => Err(format!("token {token} is odd")),
        }
    }
    fn is_complete(&self) -> bool {
        false
    }
}

/// The engine under a constraint: drafts drawn by the draft model without it are judged
/// against the target's distribution with it (a refused draw drawn again from the masked
/// row, as plain sampling does), so the first tokens follow plain constrained sampling's
/// exact distribution; plain constrained sampling passes the same test.
#[test]
fn a_constrained_sequence_keeps_its_distribution_with_sampled_drafts() {
    let model = load(Storage::F32);
    let prompt = prompt(&model);
    let len = 3;
    let mut rows = Rows::new(&model, &prompt, config(0, 1.0));
    rows.even = true;
    let exact = rows.joint_of(len);
    let mut e = Engine::new(
        model.clone(),
        EngineOptions {
            max_sequences: 8,
            context: 64,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    e.set_draft_model(drafter()).unwrap();
    for spec in [Speculation::Off, two_drafts()] {
        let mut samples: HashMap<SeqId, Vec<u32>> = HashMap::new();
        let mut events = Vec::new();
        for seed in 0..N as u64 {
            let r = GenRequest {
                ignore_eos: true,
                speculation: spec,
                ..GenRequest::new(prompt.clone(), config(seed, 1.0), len)
            };
            e.submit_constrained(r, Some(Box::new(Even))).unwrap();
            while e.queued() >= 32 || (seed + 1 == N as u64 && !e.is_idle()) {
                events.clear();
                e.step(&mut events).unwrap();
                for ev in &events {
                    match ev {
                        Event::Token { seq, token, .. } => {
                            samples.entry(*seq).or_default().push(*token)
                        }
                        Event::Failed { error, .. } => panic!("{error}"),
                        _ => {}
                    }
                }
            }
        }
        assert_eq!(samples.len(), N);
        assert_follows(
            &format!("{spec:?} under a constraint"),
            &tally(samples.into_values()),
            &exact,
        );
    }
}

/// The rule, simulated position by position from the exact rows of the target (`p`) and
/// of the drafter (`q`), passes the test; two broken rules fail it.
#[test]
fn the_test_catches_broken_acceptance_rules() {
    let model = load(Storage::F32);
    let small = drafter();
    let prompt = prompt(&model);
    let c = config(0, 1.0);
    let mut p_rows = Rows::new(&model, &prompt, c.clone());
    let mut q_rows = Rows::new(&small, &prompt, c.clone());
    let exact = p_rows.joint();
    #[derive(Clone, Copy, Debug)]
    enum Rule {
        Right,
        KeepAll,
        ReplaceFromP,
    }
    let mut verifier = Sampler::new(SamplerConfig {
        seed: 5,
        ..c.clone()
    })
    .unwrap();
    let mut rng = Rng::new(6);
    let vocab = synthetic::VOCAB;
    let mut residual = vec![0.0; vocab];
    for rule in [Rule::Right, Rule::KeepAll, Rule::ReplaceFromP] {
        let counts = tally((0..N).map(|_| {
            let mut seq = Vec::new();
            while seq.len() < T {
                let p = p_rows.at(&seq).to_vec();
                let q = q_rows.at(&seq).to_vec();
                let u = rng.next_f32();
                let x = pick(&q, u);
                let y = match rule {
                    Rule::Right => match verify_draft(&p, &q, x, &mut verifier, &mut residual) {
                        Verdict::Kept => x,
                        Verdict::Replaced(y) => y,
                    },
                    Rule::KeepAll => x,
                    Rule::ReplaceFromP => {
                        if verifier.uniform() * q[x as usize] < p[x as usize] {
                            x
                        } else {
                            verifier.draw_from(&p).unwrap()
                        }
                    }
                };
                seq.push(y);
            }
            seq
        }));
        let (stat, quantile) = chi_square(&counts, &exact);
        match rule {
            Rule::Right => assert!(stat <= quantile, "{rule:?}: {stat} > {quantile}"),
            _ => assert!(stat > quantile, "{rule:?} not caught: {stat} ≤ {quantile}"),
        }
    }
}

/// The token `u` picks from `probs` by their running sum.
fn pick(probs: &[f32], u: f32) -> u32 {
    let total: f32 = probs.iter().sum();
    let mut target = u * total;
    let mut last = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            if target < p {
                return i as u32;
            }
            target -= p;
            last = i as u32;
        }
    }
    last
}
