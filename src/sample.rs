//! Choosing the next token from a logits vector: greedy, temperature, top-k, top-p (nucleus),
//! min-p and a repetition penalty, with a seeded RNG of our own so that the same seed gives
//! the same text on every machine.
//!
//! The filters run in this order, on a copy of the logits:
//!
//! 1. repetition penalty over the last `repeat_last_n` tokens (a positive logit is divided by
//!    the penalty, a negative one multiplied, as in llama.cpp and `transformers`);
//! 2. temperature 0 stops here and takes the argmax (greedy), as does a temperature so small
//!    that dividing by it overflows (its limit);
//! 3. logits divided by the temperature;
//! 4. top-k: only the `k` largest logits stay (0 = off);
//! 5. softmax over the survivors, then top-p: the smallest set of most likely tokens whose
//!    probability reaches `p` stays (1 = off);
//! 6. min-p: tokens less likely than `min_p` × the most likely one are dropped (0 = off);
//! 7. one draw from what is left, renormalized.
//!
//! A [`Sampler`] keeps its scratch buffers, so sampling allocates nothing after the first call.
//! Configurations outside the ranges above, empty logits and logits that are not all finite
//! are errors ([`Error::Config`], [`Error::Shape`], [`Error::NonFiniteLogits`]).
//!
//! ```
//! use qkv::sample::{Sampler, SamplerConfig};
//! # fn main() -> qkv::Result<()> {
//! let logits = [0.0, 3.0, 1.0, 2.0];
//! let mut greedy = Sampler::new(SamplerConfig::greedy())?;
//! assert_eq!(greedy.sample(&logits, &[])?.id, 1);
//!
//! let config = SamplerConfig { temperature: 0.8, top_k: 2, seed: 7, ..SamplerConfig::default() };
//! let mut s = Sampler::new(config.clone())?;
//! let draws = (0..20).map(|_| Ok(s.sample(&logits, &[])?.id)).collect::<qkv::Result<Vec<u32>>>()?;
//! assert!(draws.iter().all(|&id| id == 1 || id == 3)); // top-2 only
//! let mut again = Sampler::new(config)?;
//! for &id in &draws {
//!     assert_eq!(again.sample(&logits, &[])?.id, id); // same seed, same draws
//! }
//! assert!(Sampler::new(SamplerConfig { top_p: 0.0, ..SamplerConfig::default() }).is_err());
//! # Ok(())
//! # }
//! ```

use crate::error::{Error, Result};
use qkv_kernels::activation::{log_sum_exp, softmax_inplace};

/// How to pick tokens. `Default` is temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
/// no repetition penalty, seed 0.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature, finite and ≥ 0; 0 means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the most likely tokens up to cumulative probability `top_p`, in (0, 1]; 1
    /// disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely, in [0, 1]; 0 disables.
    pub min_p: f32,
    /// Penalty for tokens among the last `repeat_last_n`, finite and > 0; 1 disables.
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    /// RNG seed: the same seed, config and logits give the same tokens.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Always the most likely token (after the repetition penalty, which is off here).
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// True when no randomness is involved: temperature 0, or so small that dividing by it
    /// overflows.
    pub fn is_greedy(&self) -> bool {
        !(self.temperature > 0.0 && (1.0 / self.temperature).is_finite())
    }

    /// [`Error::Config`] naming the first field outside its documented range.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: f32, range: &str| {
            Err(Error::Config(format!("sampler: {what} {v} is not {range}")))
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", self.temperature, "a finite number ≥ 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top-p", self.top_p, "in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min-p", self.min_p, "in [0, 1]");
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad(
                "repetition penalty",
                self.repeat_penalty,
                "a finite number > 0",
            );
        }
        Ok(())
    }
}

/// A small, fast, seedable PRNG (xoshiro256** by Blackman and Vigna, seeded through
/// SplitMix64). Not for cryptography; the same seed gives the same stream everywhere.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose whole stream is determined by `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut split = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [split(), split(), split(), split()],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform float in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
}

/// A chosen token and the model's log-probability of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// The token id.
    pub id: u32,
    /// `ln p(id)` under the model's own distribution (softmax of the raw logits, before any
    /// penalty, temperature or filter).
    pub logprob: f32,
}

/// Applies a [`SamplerConfig`] to logits vectors; owns the RNG and scratch buffers.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplerConfig,
    rng: Rng,
    /// Working copy of the logits.
    work: Vec<f32>,
    /// Candidate token ids, best first once sorted.
    ids: Vec<u32>,
    /// Their probabilities.
    probs: Vec<f32>,
}

impl Sampler {
    /// A sampler seeded with `config.seed`; [`Error::Config`] when the configuration is out
    /// of range (see [`SamplerConfig::validate`]).
    pub fn new(config: SamplerConfig) -> Result<Sampler> {
        config.validate()?;
        let rng = Rng::new(config.seed);
        Ok(Sampler {
            config,
            rng,
            work: Vec::new(),
            ids: Vec::new(),
            probs: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Picks a token from `logits`; `recent` is the token history the repetition penalty
    /// looks at (its last `repeat_last_n` entries). Ids in `recent` outside `logits` are
    /// ignored. [`Error::Shape`] when `logits` is empty or holds more entries than token ids
    /// can number; [`Error::NonFiniteLogits`] (with no position: the sampler does not know
    /// it) when a value is not finite (a model that produced NaN or ±∞), greedy or not.
    pub fn sample(&mut self, logits: &[f32], recent: &[u32]) -> Result<Sampled> {
        check_logits(logits)?;
        let c = &self.config;
        let penalty = c.repeat_penalty != 1.0 && c.repeat_last_n > 0;
        let id = if c.is_greedy() && !penalty {
            // The common greedy case reads the logits in place: no copy, no softmax.
            argmax(logits)
        } else if self.prepare(logits, recent)? {
            argmax(&self.work)
        } else {
            self.draw()
        };
        // The model's log-probability of `id`, from the raw logits.
        Ok(Sampled {
            id,
            logprob: logprob(logits, id),
        })
    }

    /// The probabilities [`sample`](Self::sample) draws from, given the same `logits` and
    /// `recent`: written into `out` (one entry per logit, 0 for every token the filters
    /// drop), summing to 1. Greedy sampling puts all of it on the token it takes. No random
    /// number is drawn. What speculative sampling needs: the target's and the drafter's
    /// distributions after every transform, to accept or replace a drafted token.
    /// Errors as `sample`, and [`Error::Shape`] when `out` is not as long as `logits`.
    pub fn distribution(&mut self, logits: &[f32], recent: &[u32], out: &mut [f32]) -> Result<()> {
        if out.len() != logits.len() {
            return Err(Error::Shape(format!(
                "sampler: a distribution of {} entries for {} logits",
                out.len(),
                logits.len()
            )));
        }
        check_logits(logits)?;
        out.fill(0.0);
        if self.prepare(logits, recent)? {
            out[argmax(&self.work) as usize] = 1.0;
            return Ok(());
        }
        let keep = self.filter();
        let total: f32 = self.probs[..keep].iter().sum();
        for (&id, &p) in self.ids[..keep].iter().zip(&self.probs[..keep]) {
            out[id as usize] = p / total;
        }
        Ok(())
    }

    /// One token drawn from `probs` (non-negative weights, one per token, not all 0; they
    /// need not sum to 1) with this sampler's random numbers; `None` when nothing has weight.
    pub fn draw_from(&mut self, probs: &[f32]) -> Option<u32> {
        draw_weighted(probs, self.rng.next_f32())
    }

    /// A uniform number in `[0, 1)` from this sampler's random numbers.
    pub fn uniform(&mut self) -> f32 {
        self.rng.next_f32()
    }

    /// Copies `logits` into `work` and applies the repetition penalty; true when the choice
    /// is greedy (the argmax of `work`).
    fn prepare(&mut self, logits: &[f32], recent: &[u32]) -> Result<bool> {
        let c = &self.config;
        let penalty = c.repeat_penalty != 1.0 && c.repeat_last_n > 0;
        self.work.clear();
        self.work.extend_from_slice(logits);
        if penalty {
            let start = recent.len().saturating_sub(c.repeat_last_n);
            apply_repeat_penalty(&mut self.work, &recent[start..], c.repeat_penalty)?;
        }
        Ok(c.is_greedy())
    }

    /// Temperature, top-k, top-p, min-p and one draw over `self.work`.
    fn draw(&mut self) -> u32 {
        let keep = self.filter();
        let total: f32 = self.probs[..keep].iter().sum();
        let mut target = self.rng.next_f32() * total;
        for (k, &p) in self.probs[..keep].iter().enumerate() {
            if target < p {
                return self.ids[k];
            }
            target -= p;
        }
        self.ids[keep - 1]
    }

    /// Temperature, top-k, top-p and min-p over `self.work`: leaves the candidates in
    /// `ids`, best first, their probabilities in `probs`, and returns how many of them
    /// survive (≥ 1; a draw picks among the first that many, weighted by `probs`).
    fn filter(&mut self) -> usize {
        let c = &self.config;
        let inv_t = 1.0 / c.temperature;
        // Shifted so that the largest is 0 before scaling: a small temperature then sends the
        // others towards −∞ (probability 0) instead of the largest to +∞ (NaN in the softmax).
        let max = self.work.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for x in self.work.iter_mut() {
            *x = (*x - max) * inv_t;
        }
        let work = &self.work;
        self.ids.clear();
        self.ids.extend(0..work.len() as u32);
        let by_logit = |a: &u32, b: &u32| work[*b as usize].total_cmp(&work[*a as usize]);
        // Without top-k, the softmax that top-p reads spans the whole vocabulary.
        let mut whole_vocab_lse = None;
        if c.top_k > 0 && c.top_k < self.ids.len() {
            self.ids.select_nth_unstable_by(c.top_k - 1, by_logit);
            self.ids.truncate(c.top_k);
        } else if c.min_p > 0.0 && c.min_p <= 1.0 {
            // min-p in logit space prunes most of the vocabulary before the sort:
            // p_i ≥ min_p · p_max  ⇔  z_i ≥ z_max + ln(min_p). Top-p still comes first:
            // the pruned tokens are the least likely, so they would have come last in its
            // running sum, which must still divide by the whole vocabulary's total.
            whole_vocab_lse = Some(log_sum_exp(work));
            let max = work.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let floor = max + c.min_p.ln();
            self.ids.retain(|&i| work[i as usize] >= floor);
        }
        self.ids.sort_unstable_by(by_logit);
        self.probs.clear();
        self.probs
            .extend(self.ids.iter().map(|&i| work[i as usize]));
        match whole_vocab_lse {
            Some(lse) => self.probs.iter_mut().for_each(|z| *z = (*z - lse).exp()),
            None => softmax_inplace(&mut self.probs),
        }
        filtered_len(&self.probs, c.top_p, c.min_p)
    }
}

/// The token `u` (uniform in `[0, 1)`) picks from `weights` by their running sum: token
/// `i` for `u · total` in its share. `None` when no weight is positive.
fn draw_weighted(weights: &[f32], u: f32) -> Option<u32> {
    let total: f32 = weights.iter().sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let mut target = u * total;
    let mut last = None;
    for (i, &w) in weights.iter().enumerate() {
        if w <= 0.0 {
            continue;
        }
        if target < w {
            return Some(i as u32);
        }
        target -= w;
        last = Some(i as u32);
    }
    // Rounding left the target past the running sum: the last token with weight.
    last
}

/// [`Error::Shape`] for empty logits or more than token ids can number,
/// [`Error::NonFiniteLogits`] (no position) for a value that is not finite.
fn check_logits(logits: &[f32]) -> Result<()> {
    if logits.is_empty() || u32::try_from(logits.len()).is_err() {
        return Err(Error::Shape(format!(
            "sampler: {} logits (need 1..=2^32)",
            logits.len()
        )));
    }
    if let Some(token) = first_non_finite(logits) {
        return Err(Error::NonFiniteLogits {
            sequence: None,
            position: None,
            token,
            value: logits[token],
        });
    }
    Ok(())
}

/// Divides positive logits by `penalty` and multiplies negative ones, once per distinct
/// token of `recent`; ids outside `logits` are skipped. [`Error::Config`] (and the logits
/// untouched) unless `penalty` is finite and positive: NaN would poison the logits and a
/// negative penalty would turn the least likely tokens into the most likely.
pub fn apply_repeat_penalty(logits: &mut [f32], recent: &[u32], penalty: f32) -> Result<()> {
    if !(penalty.is_finite() && penalty > 0.0) {
        return Err(Error::Config(format!(
            "repeat penalty must be finite and > 0, got {penalty}"
        )));
    }
    for (k, &id) in recent.iter().enumerate() {
        let i = id as usize;
        if i >= logits.len() || recent[..k].contains(&id) {
            continue;
        }
        let x = &mut logits[i];
        let y = if *x > 0.0 { *x / penalty } else { *x * penalty };
        // A tiny penalty must not push a finite logit to ±∞.
        *x = y.clamp(f32::MIN, f32::MAX);
    }
    Ok(())
}

/// The index of the first value of `logits` that is NaN or infinite, if any: what every place
/// that picks or scores a token checks first, so that broken logits are reported
/// ([`Error::NonFiniteLogits`]) instead of yielding a token.
pub fn first_non_finite(logits: &[f32]) -> Option<usize> {
    // One branch-free pass, which the compiler vectorises (an early-exit search cannot be);
    // the culprit is looked up only when there is one.
    if logits.iter().fold(true, |ok, x| ok & x.is_finite()) {
        return None;
    }
    logits.iter().position(|x| !x.is_finite())
}

/// `ln p(id)` under the softmax of `logits` (≤ 0, as rounding must not make it
/// positive): the log-probability a [`Sampled`] reports.
pub fn logprob(logits: &[f32], id: u32) -> f32 {
    (logits[id as usize] - log_sum_exp(logits)).min(0.0)
}

/// The index of the largest value (the first on ties; NaN never wins; 0 if nothing is a
/// number). Vectorised: see [`qkv_kernels::activation::argmax`].
pub fn argmax(x: &[f32]) -> u32 {
    qkv_kernels::activation::argmax(x) as u32
}

/// How many of `probs` (sorted descending, summing to 1) survive top-p and min-p: at least 1,
/// at most `probs.len()` (so 0 for no probabilities).
pub fn filtered_len(probs: &[f32], top_p: f32, min_p: f32) -> usize {
    let mut keep = probs.len();
    if top_p < 1.0 {
        let mut acc = 0.0;
        for (k, &p) in probs.iter().enumerate() {
            acc += p;
            if acc >= top_p {
                keep = k + 1;
                break;
            }
        }
    }
    if min_p > 0.0 {
        let floor = probs.first().copied().unwrap_or(0.0) * min_p;
        keep = keep.min(probs.iter().take_while(|&&p| p >= floor).count());
    }
    keep.max(1).min(probs.len())
}

#[cfg(test)]
mod tests;
