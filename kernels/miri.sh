#!/usr/bin/env bash
# Runs qkv-kernels' tests under Miri, the interpreter that reports undefined behaviour
# (out-of-bounds or misaligned accesses, aliasing violations, data races, uninitialised reads).
#
#   kernels/miri.sh [scalar|avx2|avx512|all]      (default: scalar avx2)
#
# - scalar: the tests as they are built for Miri, which reports no CPU feature at run time, so
#   every kernel takes its scalar path (and the GEMV's and gemm's raw-pointer splits across
#   rayon threads run for real).
# - avx2: built with AVX2, FMA and F16C enabled, which Miri then reports as present: the AVX2
#   kernels run, interpreted intrinsic by intrinsic. Miri implements every intrinsic they use
#   but F16C's f32 -> f16 narrowing (`vcvtps2ph`), which `convert::f32_to_f16` skips under Miri
#   and which `half` uses for every f32 -> f16 in such a build, so the tests that round to
#   f16 (tests/matmul.rs, the conversions, the hand-made blocks) run in the scalar mode only.
# - avx512: AVX-512 F, BW and VL on top: the 512-bit quantized GEMV. (Not VNNI: Miri does not
#   implement `vpdpwssd`, so the VNNI prefill product is not interpreted.)
#
# -Zmiri-ignore-leaks: rayon's global pool keeps its threads until the process ends, which
# Miri otherwise reports as the main thread leaving without joining them.
#
# -Zmiri-deterministic-floats: by default Miri perturbs `exp`, `ln`, `powf` and the like by a
# few ulp (to catch code that depends on one libm's exact results); the known-value tests of
# erf, GELU and SiLU check our kernels to 1-4 ulp against PyTorch, which holds only over an
# exact `exp` (`erf_known_values` and `gelu_silu_known_values` failed on that noise alone).
#
# Tree Borrows, not the default Stacked Borrows: rayon's crossbeam-epoch breaks Stacked
# Borrows' rules in its intrusive list (a known limitation of that crate, which follows Tree
# Borrows), and would stop the run before any of our code. Isolation stays on, so the test that
# reads the committed gguf-py fixtures is skipped under Miri (its decoders run on random blocks
# in the next test). The attention tests are left out unless QKV_MIRI_ATTENTION=1: they take
# Miri about 20 minutes more per mode, so raise QKV_MIRI_TIMEOUT with them.
#
# Environment: QKV_MIRI_TIMEOUT (seconds per mode, default 1800), CARGO_TARGET_DIR (default
# target-miri; each mode builds in its own subdirectory, since the target features change
# every crate). Needs the nightly toolchain with the miri component; without it the script
# says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "miri.sh: skipped: no Miri on the nightly toolchain" \
        "(rustup +nightly component add miri rust-src)"
    exit 0
fi

modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(scalar avx2)
[ "${modes[0]}" = all ] && modes=(scalar avx2 avx512)

limit=${QKV_MIRI_TIMEOUT:-1800}
base=${CARGO_TARGET_DIR:-target-miri}
attention=${QKV_MIRI_ATTENTION:-0}

status=0
for mode in "${modes[@]}"; do
    tests=(--lib --test ops --test matmul --test quant --test dequant_gguf_py)
    skip=()
    case $mode in
        scalar) features="" ;;
        avx2) features="-C target-feature=+avx2,+fma,+f16c" ;;
        avx512) features="-C target-feature=+avx2,+fma,+f16c,+avx512f,+avx512bw,+avx512vl" ;;
        *) echo "miri.sh: unknown mode $mode (scalar, avx2, avx512 or all)" >&2; exit 2 ;;
    esac
    if [ "$mode" != scalar ]; then
        # Built with F16C, `half` rounds every f32 -> f16 with `vcvtps2ph`, which Miri lacks:
        # the tests that make f16 values that way (the f16 matmuls, the conversions, the
        # hand-made blocks) run in the scalar mode only.
        tests=(--lib --test ops --test quant --test dequant_gguf_py)
        skip=(--skip quant::blocks:: --skip conversions_match_scalar_bitwise)
    fi
    if [ "$attention" != 0 ]; then
        tests+=(--test attention)
    else
        skip+=(--skip attention::)
    fi
    echo "miri.sh: $mode"
    start=$(date +%s)
    if ! CARGO_TARGET_DIR="$base/$mode" RUSTFLAGS="$features" \
        MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-ignore-leaks -Zmiri-deterministic-floats ${MIRIFLAGS:-}" \
        timeout "$limit" cargo +nightly miri test --no-fail-fast -p qkv-kernels "${tests[@]}" \
        -- "${skip[@]}"; then
        echo "miri.sh: $mode FAILED (or passed the ${limit} s limit)" >&2
        status=1
    fi
    echo "miri.sh: $mode took $(($(date +%s) - start)) s"
done
exit $status
