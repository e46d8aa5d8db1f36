//! Speculative decoding: tokens proposed cheaply (a draft) and checked by the model in one
//! pass over several rows, which reads the weights once for all of them. A decode step is
//! bound by reading the weights, so a pass of k + 1 rows costs little more than one row, and
//! every drafted token the model agrees with is a step saved.
//!
//! It is lossless: a drafted token is kept only when the model's own choice at its position
//! is that very token, and the model's choice after the last kept one comes from the same
//! pass. Drafts come from n-gram lookup over the sequence itself ([`ngram`]) or from a
//! second, smaller model ([`Speculation::Draft`]), and only greedy decoding (temperature 0)
//! is verified; [`Session`](crate::session::Session)'s
//! generation refuses it with sampling. While a sequence generates, the draft length
//! follows what the model keeps, and drafting pauses when the kept tokens do not make up
//! for the cost of the pass's extra rows, timed on this machine against a one-row step.

mod governor;
pub mod ngram;

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
/// [`MAX_DRAFT`] tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftOptions {
    /// Most tokens per draft, 1..=[`MAX_DRAFT`].
    pub max_draft: usize,
}

impl Default for DraftOptions {
    fn default() -> Self {
        DraftOptions {
            max_draft: MAX_DRAFT,
        }
    }
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
}

impl Default for NgramOptions {
    fn default() -> Self {
        NgramOptions {
            max_draft: MAX_DRAFT,
            min_ngram: 2,
            max_ngram: 4,
        }
    }
}

impl NgramOptions {
    /// [`Error::Config`] naming the first setting out of its range.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_DRAFT).contains(&self.max_draft) {
            return Err(Error::Config(format!(
                "speculation: a draft of at most {} tokens is not in 1..={MAX_DRAFT}",
                self.max_draft
            )));
        }
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
            Speculation::Draft(o) if !(1..=MAX_DRAFT).contains(&o.max_draft) => {
                Err(Error::Config(format!(
                    "speculation: a draft of at most {} tokens is not in 1..={MAX_DRAFT}",
                    o.max_draft
                )))
            }
            Speculation::Draft(_) => Ok(()),
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
