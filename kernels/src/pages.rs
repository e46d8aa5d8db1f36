//! Owned buffers on huge pages, for bytes that are streamed again and again: the weights a
//! decode step reads every token, and the probe that measures how fast memory gives them.
//!
//! A read over 4 KiB pages pays a TLB miss every 4 KiB (two levels of page walk in a
//! virtual machine), over 2 MiB pages one per 2 MiB: on the virtual machines qkv is measured
//! on, reads from huge pages ran about 15% faster, and decode with them.
//!
//! ```
//! let mut p = qkv_kernels::pages::Pages::zeroed(5 << 20).unwrap();
//! assert_eq!(p.len(), 5 << 20);
//! assert_eq!(p.as_ptr() as usize % (2 << 20), 0);
//! p[0] = 1;
//! assert_eq!(p.iter().map(|&b| b as u32).sum::<u32>(), 1);
//! ```

use std::ops::{Deref, DerefMut};

/// The huge page size the buffers align to.
pub const HUGE: usize = 2 << 20;

/// A zeroed, owned byte buffer from an anonymous map of its own, starting on a 2 MiB
/// boundary, whose whole 2 MiB pages the kernel is asked to back with huge pages.
///
/// The map is 2 MiB longer than the bytes, and the advice covers only their whole 2 MiB
/// pages: the partial page at their end stays in 4 KiB pages and the map's slack is never
/// touched, so the buffer holds no more memory than its bytes (rounded to 4 KiB). Advice
/// only: where the kernel has no transparent huge pages, or refuses, the buffer works the
/// same on small pages.
pub struct Pages {
    map: memmap2::MmapMut,
    start: usize,
    len: usize,
}

impl Pages {
    /// `len` zero bytes, or `None` when the memory cannot be had.
    pub fn zeroed(len: usize) -> Option<Pages> {
        let map = memmap2::MmapMut::map_anon(len.checked_add(HUGE)?).ok()?;
        let at = map.as_ptr() as usize;
        let start = at.next_multiple_of(HUGE) - at;
        // Advice only, over the whole huge pages: without it the bytes are the same.
        #[cfg(target_os = "linux")]
        if len >= HUGE {
            let _ = map.advise_range(memmap2::Advice::HugePage, start, len / HUGE * HUGE);
        }
        Some(Pages { map, start, len })
    }
}

impl Deref for Pages {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

impl DerefMut for Pages {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_start_on_a_huge_page_and_hold_exactly_their_bytes() {
        for len in [0, 1, 4095, HUGE - 1, HUGE, 3 * HUGE + 12345] {
            let mut p = Pages::zeroed(len).unwrap();
            assert_eq!(p.len(), len);
            assert!(p.iter().all(|&b| b == 0));
            if len > 0 {
                assert_eq!(p.as_ptr() as usize % HUGE, 0);
                p[len - 1] = 7;
                assert_eq!(p[len - 1], 7);
            }
        }
        assert!(Pages::zeroed(usize::MAX - 1).is_none());
    }
}
