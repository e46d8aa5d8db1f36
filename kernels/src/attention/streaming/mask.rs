//! The one place masks meet scores, below both the blocked pass ([`super::driver`]) and
//! the exact rule ([`super::exact`]).

use crate::attention::AttentionMask;

/// Sets to −∞ the scores in `row` (keys `jb..jb + row.len()` of query `i`) that the mask
/// blocks: future keys, keys before the query's sliding window, padded keys and pairs the
/// dense mask blocks. The one place masks meet scores. `pads` says whether the block's keys
/// hold padding (`key_keep` is read only then).
pub(super) fn mask_row(
    mask: &AttentionMask<'_>,
    i: usize,
    jb: usize,
    tk: usize,
    pads: bool,
    row: &mut [f32],
) {
    let nk = row.len();
    if let Some(p0) = mask.causal_offset {
        // Keys j ≤ p0 + i are visible; the first blocked column in this block:
        let first_blocked = (p0 + i + 1).saturating_sub(jb).min(nk);
        row[first_blocked..].fill(f32::NEG_INFINITY);
        // Keys j ≥ window_start(i) are visible; the first visible column in this block:
        let first_visible = mask.window_start(i).saturating_sub(jb).min(nk);
        row[..first_visible].fill(f32::NEG_INFINITY);
    }
    if let (true, Some(keep)) = (pads, mask.key_keep) {
        for (x, &k) in row.iter_mut().zip(&keep[jb..jb + nk]) {
            if !k {
                *x = f32::NEG_INFINITY;
            }
        }
    }
    if let Some(dense) = mask.dense_keep {
        let keep = &dense[i * tk + jb..i * tk + jb + nk];
        for (x, &k) in row.iter_mut().zip(keep) {
            if !k {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}
