//! The speculative-sampling rule (Leviathan, Kalman and Matias; Chen et al., 2023): how a
//! drafted token is kept or replaced so that, with sampling, the tokens come out with
//! exactly the distribution of plain sampling.
//!
//! Let `p` be the target model's distribution at a position, after every transform the
//! sampler applies (penalties, temperature, top-k, top-p, min-p, a constraint), and `q` the
//! distribution the drafter drew its token `x` from. Keeping `x` with probability
//! `min(1, p(x) / q(x))`, and otherwise drawing from `max(p − q, 0)` renormalised, gives
//! a token distributed as `p`: `P(y) = min(p(y), q(y)) + max(p(y) − q(y), 0) = p(y)`. The
//! position after a kept draft is judged the same way against the next row; after the last
//! kept draft of a pass, the next token is drawn from the target's row there.
//!
//! A draft that is not drawn at random (n-gram lookup, greedy drafting) has `q` one-hot on
//! `x`: the rule keeps it with probability `p(x)` and otherwise draws from `p` without `x`.
//! Drawing `y` from `p` as plain sampling does, and keeping `x` when `y = x` (else taking
//! `y`), does exactly that with the random numbers plain sampling would use, so there the
//! tokens are those of plain sampling with the same seed; that is how the sessions and the
//! engine verify such drafts. [`verify_draft`] is the rule for drafts drawn from a `q`.

use crate::sample::Sampler;

/// What [`verify_draft`] decided about a drafted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The drafted token stands.
    Kept,
    /// The drafted token is rejected; this token takes its place (and the draft ends).
    Replaced(u32),
}

/// Judges the drafted token `x`, drawn from the drafter's distribution `q`, against the
/// target's distribution `p` (both one entry per token of the vocabulary, summing to 1):
/// kept with probability `min(1, p(x) / q(x))`, else replaced by a token drawn from
/// `max(p − q, 0)` renormalised (built in `residual`, as long as `p`). The random numbers
/// are `sampler`'s, so the same seed gives the same verdicts. Should rounding leave the
/// residual with no mass, the replacement is drawn from `p`.
///
/// ```
/// use qkv::sample::{Sampler, SamplerConfig};
/// use qkv::speculative::sampling::{verify_draft, Verdict};
/// let mut s = Sampler::new(SamplerConfig { seed: 3, ..SamplerConfig::default() })?;
/// let mut residual = [0.0; 3];
/// // The target is at least as sure of token 1 as the drafter: always kept.
/// assert_eq!(verify_draft(&[0.2, 0.8, 0.0], &[0.5, 0.5, 0.0], 1, &mut s, &mut residual), Verdict::Kept);
/// // The target never takes token 2: replaced, by token 0 (the only one p favours over q).
/// let v = verify_draft(&[0.6, 0.4, 0.0], &[0.2, 0.3, 0.5], 2, &mut s, &mut residual);
/// assert_eq!(v, Verdict::Replaced(0));
/// # Ok::<(), qkv::Error>(())
/// ```
pub fn verify_draft(
    p: &[f32],
    q: &[f32],
    x: u32,
    sampler: &mut Sampler,
    residual: &mut [f32],
) -> Verdict {
    let i = x as usize;
    let (px, qx) = (
        p.get(i).copied().unwrap_or(0.0),
        q.get(i).copied().unwrap_or(0.0),
    );
    // u < p/q without dividing: a q(x) of 0 (the drafter never draws x) keeps it when p
    // has it, and p(x) = 0 never does.
    if sampler.uniform() * qx < px {
        return Verdict::Kept;
    }
    for ((r, &a), &b) in residual.iter_mut().zip(p).zip(q) {
        *r = (a - b).max(0.0);
    }
    let y = sampler
        .draw_from(residual)
        .or_else(|| sampler.draw_from(p))
        .unwrap_or(x);
    Verdict::Replaced(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::SamplerConfig;

    /// Over many draws of x from q and the verdict on it, the token that comes out (x when
    /// kept, the replacement otherwise) is distributed as p: within 5 standard errors of
    /// each probability.
    #[test]
    fn the_token_that_comes_out_follows_the_target() {
        let p = [0.5, 0.05, 0.3, 0.0, 0.15];
        let q = [0.1, 0.4, 0.1, 0.3, 0.1];
        let mut drafter = Sampler::new(SamplerConfig {
            seed: 1,
            ..SamplerConfig::default()
        })
        .unwrap();
        let mut verifier = Sampler::new(SamplerConfig {
            seed: 2,
            ..SamplerConfig::default()
        })
        .unwrap();
        let mut residual = [0.0; 5];
        let n = 200_000;
        let mut counts = [0usize; 5];
        for _ in 0..n {
            let x = drafter.draw_from(&q).unwrap();
            let y = match verify_draft(&p, &q, x, &mut verifier, &mut residual) {
                Verdict::Kept => x,
                Verdict::Replaced(y) => y,
            };
            counts[y as usize] += 1;
        }
        for (k, &want) in p.iter().enumerate() {
            let got = counts[k] as f64 / n as f64;
            let se = (want as f64 * (1.0 - want as f64) / n as f64)
                .sqrt()
                .max(1e-9);
            assert!(
                (got - want as f64).abs() <= 5.0 * se,
                "token {k}: {got} against {want} ({counts:?})"
            );
        }
    }
}
