//! Helpers shared by the fuzz targets: qkv opens weights and tokenizers by path, so each
//! target writes its input to a scratch file of its own (one per process, rewritten on every
//! run) and opens that, which exercises the same mapping and reading code as real files.

use std::path::PathBuf;

/// A per-process scratch directory, in memory (`/dev/shm`) when the machine has one.
pub fn scratch_dir() -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("qkv-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the fuzz scratch directory");
    dir
}

/// Writes `bytes` to the scratch file `name` (replacing the last run's) and returns its path.
pub fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    std::fs::write(&path, bytes).expect("writing the fuzz scratch file");
    path
}

/// Elements widened per tensor at most, so that one input cannot make a run slow: the
/// fuzzer's inputs are a few KB, and a tensor of zero-size rows can claim far more elements
/// than its bytes.
pub const MAX_WIDEN: usize = 1 << 16;

/// Reads every tensor of `source` the way a model load does: the whole tensor widened to f32
/// and to f16 (through row panels), its first row alone, and a matrix split in two row blocks
/// (Phi-3's fused projections), for tensors small enough; errors are fine (typed errors are
/// the contract), panics and crashes are what the fuzzer looks for.
pub fn exercise_tensors(source: &dyn qkv::weights::TensorSource) {
    use qkv::weights::FloatType;
    for name in source.names() {
        assert!(
            source.contains(&name),
            "`{name}` is listed but not contained"
        );
        let Ok(t) = source.tensor(&name) else {
            continue;
        };
        let _ = format!("{t:?}");
        let _ = (t.shape(), t.format(), t.is_mapped(), t.bytes(), t.as_f32());
        if t.numel() > MAX_WIDEN {
            continue;
        }
        if let Ok(v) = t.to_f32_vec() {
            assert_eq!(
                v.len(),
                t.numel(),
                "tensor `{name}` widened to the wrong length"
            );
        }
        let row = t.shape().last().copied().unwrap_or(1).max(1);
        if row <= MAX_WIDEN {
            let mut out = vec![0.0f32; row];
            let _ = t.rows_to_f32(0, &mut out);
        }
        if let Ok(h) = t.into_dtype(FloatType::F16) {
            assert!(h.as_f32().is_none(), "tensor `{name}` in f16 reads as f32");
            let _ = h.into_dtype(FloatType::F32);
        }
        if let Ok(t) = source.tensor(&name) {
            if let [n, _] = *t.shape() {
                if n >= 2 {
                    if let Ok(parts) = t.split_rows(&[1, n - 1]) {
                        for p in parts {
                            let _ = p.to_f32_vec();
                        }
                    }
                }
            }
        }
    }
}
