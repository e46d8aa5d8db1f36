//! Speculative decoding: tokens proposed cheaply (a draft) and checked by the model in one
//! pass over several rows, which reads the weights once for all of them. A decode step is
//! bound by reading the weights, so a pass of k + 1 rows costs little more than one row, and
//! every drafted token the model agrees with is a step saved.
//!
//! It is lossless. Greedy (temperature 0): a drafted token is kept only when the model's
//! own choice at its position is that very token, and the model's choice after the last
//! kept one comes from the same pass, so the tokens are those of plain decoding. Sampling:
//! drafted tokens are kept or replaced by the speculative-sampling rule ([`sampling`]), so
//! the tokens have the distribution of plain sampling (and, with n-gram drafts, are the
//! very tokens plain sampling draws with the same seed). Drafts come from n-gram lookup over
//! the sequence itself ([`ngram`]) or from a second, smaller model
//! ([`Speculation::Draft`]), which samples its drafts under the same sampler settings. While
//! a sequence generates, the draft length follows what the model keeps, and drafting pauses
//! when the kept tokens do not make up for the cost of the pass's extra rows, timed on this
//! machine against a one-row step. Drafts shorter than a minimum
//! ([`NgramOptions::min_draft`], [`DraftOptions::min_draft`]) are not verified: the token
//! runs alone.

mod governor;
pub mod ngram;
pub mod sampling;

pub(crate) use governor::Governor;

use crate::error::{Error, Result};

/// Most tokens one draft may propose: a verify pass of a draft and its bonus row stays within
/// the GEMV's rows ([`GEMV_MAX_ROWS`](qkv_kernels::matmul::GEMV_MAX_ROWS)), where each row's
/// products take the integer path a decode step takes; taller passes go to the prompt
/// paths (the integer GEMM, widened panels), which round otherwise.
pub const MAX_DRAFT: usize = qkv_kernels::matmul::GEMV_MAX_ROWS - 1;

/// How a generation drafts tokens, if at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speculation {
    /// One token per pass.
    #[default]
    Off,
    /// Prompt-lookup drafting: the tokens that followed the most recent earlier occurrence
    /// of the sequence's last n tokens ([`ngram::draft`]).
    Ngram(NgramOptions),
    /// Drafting with a second, smaller model of the same vocabulary: its greedy tokens,
    /// from a session of its own that follows the sequence (see
    /// [`Generate::speculate_with_draft`](crate::session::Generate::speculate_with_draft)).
    Draft(DraftOptions),
}

/// The settings of drafting with a second model. `Default`: drafts of up to
/// [`MAX_DRAFT`] tokens, any length verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftOptions {
    /// Most tokens per draft, 1..=[`MAX_DRAFT`].
    pub max_draft: usize,
    /// Fewest tokens a draft must hold to be verified, 0..=`max_draft` (0 and 1 verify any
    /// draft); a shorter one is dropped and the token runs alone (llama-server's
    /// `--spec-draft-n-min`, `speculative.n_min`). The governor's shorter draft lengths
    /// are raised to it.
    pub min_draft: usize,
}

impl Default for DraftOptions {
    fn default() -> Self {
        DraftOptions {
            max_draft: MAX_DRAFT,
            min_draft: 0,
        }
    }
}

/// [`Error::Config`] unless `1 ≤ max ≤ MAX_DRAFT` and `min ≤ max`.
fn check_lengths(min: usize, max: usize) -> Result<()> {
    if !(1..=MAX_DRAFT).contains(&max) {
        return Err(Error::Config(format!(
            "speculation: a draft of at most {max} tokens is not in 1..={MAX_DRAFT}"
        )));
    }
    if min > max {
        return Err(Error::Config(format!(
            "speculation: drafts of at least {min} tokens but at most {max}"
        )));
    }
    Ok(())
}

/// The settings of n-gram drafting. `Default`: drafts of up to [`MAX_DRAFT`] tokens, after a
/// match of 4 down to 2 tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramOptions {
    /// Most tokens per draft, 1..=[`MAX_DRAFT`].
    pub max_draft: usize,
    /// Shortest suffix of the sequence to look up, ≥ 1.
    pub min_ngram: usize,
    /// Longest suffix tried first, ≥ `min_ngram`.
    pub max_ngram: usize,
    /// Fewest tokens a draft must hold to be verified, as [`DraftOptions::min_draft`].
    pub min_draft: usize,
}

impl Default for NgramOptions {
    fn default() -> Self {
        NgramOptions {
            max_draft: MAX_DRAFT,
            min_ngram: 2,
            max_ngram: 4,
            min_draft: 0,
        }
    }
}

impl NgramOptions {
    /// [`Error::Config`] naming the first setting out of its range.
    pub fn validate(&self) -> Result<()> {
        check_lengths(self.min_draft, self.max_draft)?;
        if self.min_ngram == 0 || self.min_ngram > self.max_ngram {
            return Err(Error::Config(format!(
                "speculation: n-grams of {} down to {} tokens (need max ≥ min ≥ 1)",
                self.max_ngram, self.min_ngram
            )));
        }
        Ok(())
    }
}

impl Speculation {
    /// [`Error::Config`] when the settings are out of range.
    pub fn validate(&self) -> Result<()> {
        match self {
            Speculation::Off => Ok(()),
            Speculation::Ngram(o) => o.validate(),
            Speculation::Draft(o) => check_lengths(o.min_draft, o.max_draft),
        }
    }

    /// Fewest tokens a draft must hold to be verified: 0 when off.
    pub fn min_draft(&self) -> usize {
        match self {
            Speculation::Off => 0,
            Speculation::Ngram(o) => o.min_draft,
            Speculation::Draft(o) => o.min_draft,
        }
    }

    /// The draft length to ask for when the governor allows `limit` tokens (0: no draft
    /// this step): at least the minimum a draft must hold.
    pub(crate) fn ask(&self, limit: usize) -> usize {
        if limit == 0 {
            0
        } else {
            limit.max(self.min_draft())
        }
    }

    /// Most tokens a draft may hold: 0 when off.
    pub fn max_draft(&self) -> usize {
        match self {
            Speculation::Off => 0,
            Speculation::Ngram(o) => o.max_draft,
            Speculation::Draft(o) => o.max_draft,
        }
    }
}

/// What speculation did over a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Tokens proposed by drafts and run in verify passes.
    pub draft_tokens: usize,
    /// Of those, tokens the model agreed with (kept).
    pub accepted_tokens: usize,
    /// Verify passes run (passes of more than one row).
    pub verify_passes: usize,
}
