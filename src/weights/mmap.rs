//! Mapping files, and typed views of the mapped bytes.
//!
//! This is the one module of the `qkv` crate allowed `unsafe` code (the crate root denies it
//! everywhere else), for the two calls that need it: [`memmap2::Mmap::map`], and the advice
//! that lets go of pages already copied elsewhere ([`MappedSlice::release`]). Reading the map
//! as `f32` or `f16` goes through `bytemuck`'s checked casts, which refuse a misaligned or
//! ragged slice instead of reading it.

use crate::error::{Error, Result};
use bytemuck::Pod;
use memmap2::{Mmap, UncheckedAdvice};
use std::marker::PhantomData;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A whole file mapped read-only, with its path (errors about its bytes name it).
///
/// Derefs to the file's bytes. See [`map_file`] for what the file must not undergo while the
/// map lives.
pub struct MappedFile {
    path: PathBuf,
    map: Mmap,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("len", &self.map.len())
            .finish()
    }
}

impl MappedFile {
    /// The file's path, as it was opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

impl Deref for MappedFile {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map
    }
}

/// Maps a whole file read-only, with errors that name it.
///
/// The file must not change while the map lives: tensors read it in place, so a file that
/// another process truncates makes reads fault (SIGBUS), and one rewritten in place changes
/// the weights under the model. Replace model files by renaming a new file over the old
/// path (as `decode convert` does), which leaves existing maps on the old contents.
pub fn map_file(path: &Path) -> Result<Arc<MappedFile>> {
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    // SAFETY: the map is read-only and qkv never writes to it. A file truncated or rewritten
    // in place by another process while mapped is outside what any mmap-based reader can
    // defend against; this function's docs, `Model::load`'s and the README say so.
    let map = unsafe { Mmap::map(&file) }.map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(Arc::new(MappedFile {
        path: path.to_owned(),
        map,
    }))
}

/// `len` elements of `T` at byte `offset` of a mapped file, checked once when made: they lie
/// inside the file and are aligned for `T`. The fields are private to this module, so no
/// other code can make one that breaks either, and [`MappedSlice::get`] never fails.
pub(crate) struct MappedSlice<T> {
    file: Arc<MappedFile>,
    offset: usize,
    len: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T> Clone for MappedSlice<T> {
    fn clone(&self) -> Self {
        MappedSlice {
            file: self.file.clone(),
            offset: self.offset,
            len: self.len,
            _elem: PhantomData,
        }
    }
}

impl<T: Pod> MappedSlice<T> {
    /// `count` elements of `T` at byte `offset` of `file`, for the tensor `tensor`.
    ///
    /// [`Error::TensorPastEnd`] when they run past the end of the file;
    /// [`Error::MisalignedTensor`] when `offset` is not aligned for `T` (callers that can
    /// copy instead do so).
    pub(crate) fn new(
        file: Arc<MappedFile>,
        tensor: &str,
        offset: usize,
        count: usize,
    ) -> Result<Self> {
        let size = std::mem::size_of::<T>();
        let end = count
            .checked_mul(size)
            .and_then(|bytes| bytes.checked_add(offset))
            .filter(|&end| end <= file.len())
            .ok_or_else(|| Error::TensorPastEnd {
                path: file.path.clone(),
                tensor: tensor.to_owned(),
                offset: offset as u64,
                length: (count as u64).saturating_mul(size as u64),
                file_size: file.len() as u64,
            })?;
        if bytemuck::try_cast_slice::<u8, T>(&file[offset..end]).is_err() {
            return Err(Error::MisalignedTensor {
                path: file.path.clone(),
                tensor: tensor.to_owned(),
                offset: offset as u64,
                align: std::mem::align_of::<T>(),
            });
        }
        Ok(MappedSlice {
            file,
            offset,
            len: count,
            _elem: PhantomData,
        })
    }

    /// The elements.
    pub(crate) fn get(&self) -> &[T] {
        let bytes = &self.file[self.offset..self.offset + self.len * std::mem::size_of::<T>()];
        // `new` checked this very range with `try_cast_slice`, and the map never moves.
        bytemuck::cast_slice(bytes)
    }

    /// Lets go of the whole pages of this slice: they leave the process's resident memory
    /// (the page cache keeps them), and a later read faults them in again, unchanged. For a
    /// tensor whose bytes were copied into another layout, so that the process holds one
    /// copy, not two. Advice only: when the kernel refuses it, nothing changes.
    pub(crate) fn release(&self) {
        const PAGE: usize = 4096;
        let start = self.offset.next_multiple_of(PAGE);
        let end = (self.offset + self.len * std::mem::size_of::<T>()) / PAGE * PAGE;
        if end > start {
            // SAFETY: the map is a read-only, shared mapping of the file that no one writes
            // through, so its pages hold the file's bytes: dropping them changes no value
            // that any view of the map reads later (the next read maps the same page-cache
            // bytes back in). The range lies inside the map.
            let _ = unsafe {
                self.file
                    .map
                    .unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }

    /// Elements `start..start + len` of this slice, or `None` when they run past its end.
    pub(crate) fn sub(&self, start: usize, len: usize) -> Option<Self> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| MappedSlice {
            file: self.file.clone(),
            // Whole elements past an aligned start stay aligned.
            offset: self.offset + start * std::mem::size_of::<T>(),
            len,
            _elem: PhantomData,
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `bytes` written to a file of their own in a fresh temporary directory named after
    /// `tag`, and mapped: the directory (for the caller to remove) and the map.
    pub(in crate::weights) fn mapped_bytes(tag: &str, bytes: &[u8]) -> (PathBuf, Arc<MappedFile>) {
        let dir = std::env::temp_dir().join(format!("qkv-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.bin");
        std::fs::write(&path, bytes).unwrap();
        let file = map_file(&path).unwrap();
        (dir, file)
    }

    #[test]
    fn views_are_checked_for_bounds_and_alignment() {
        let values = [1.0f32, 2.0, 3.0, 4.0];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let (dir, file) = mapped_bytes("mmap", &bytes);
        let path = dir.join("f.bin");
        assert_eq!(file.path(), path);
        assert_eq!(file.bytes(), &bytes[..]);

        let all = MappedSlice::<f32>::new(file.clone(), "w", 0, 4).unwrap();
        assert_eq!(all.get(), &values);
        assert_eq!(all.sub(1, 2).unwrap().get(), &values[1..3]);
        assert!(all.sub(3, 2).is_none());
        assert!(all.sub(usize::MAX, 2).is_none());

        match MappedSlice::<f32>::new(file.clone(), "w", 4, 4) {
            Err(Error::TensorPastEnd {
                tensor,
                offset,
                length,
                file_size,
                ..
            }) => assert_eq!(
                (tensor.as_str(), offset, length, file_size),
                ("w", 4, 16, 16)
            ),
            other => panic!("{:?}", other.map(|s| s.len)),
        }
        assert!(matches!(
            MappedSlice::<f32>::new(file.clone(), "w", 8, usize::MAX),
            Err(Error::TensorPastEnd { .. })
        ));
        match MappedSlice::<f32>::new(file.clone(), "w", 2, 1) {
            Err(Error::MisalignedTensor { offset, align, .. }) => {
                assert_eq!((offset, align), (2, 4))
            }
            other => panic!("{:?}", other.map(|s| s.len)),
        }
        // Bytes have no alignment to keep.
        assert_eq!(
            MappedSlice::<u8>::new(file, "w", 3, 1).unwrap().get(),
            &bytes[3..4]
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
