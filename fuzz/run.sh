#!/usr/bin/env bash
# Runs every cargo-fuzz target of qkv for SECONDS seconds (default 60) on a copy of its
# committed corpus (fuzz/corpus/<target>/), so that a run never grows the committed corpus.
#
#   fuzz/run.sh 60                      # all targets, 60 s each
#   TARGETS="gguf template" fuzz/run.sh 600
#
# Needs the nightly toolchain and cargo-fuzz. Without nightly it prints why and exits 0;
# without cargo-fuzz it tries `cargo install cargo-fuzz` first, and exits 0 with the reason
# when that fails. A target that crashes, hangs past -timeout or passes -rss_limit_mb makes
# the script exit 1 after the other targets ran; the input is left in fuzz/artifacts/<target>/.
set -u

secs=${1:-60}
here=$(cd "$(dirname "$0")" && pwd)
targets=${TARGETS:-"gguf safetensors tokenizer template server_request"}

skip() {
    echo "fuzz/run.sh: skipped: $*"
    exit 0
}

command -v cargo >/dev/null 2>&1 || skip "cargo is not installed"
cargo +nightly --version >/dev/null 2>&1 ||
    skip "no nightly toolchain (rustup toolchain install nightly), which cargo-fuzz needs"
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz/run.sh: cargo-fuzz is missing; running cargo install cargo-fuzz"
    cargo install cargo-fuzz >/dev/null 2>&1 || skip "cargo install cargo-fuzz failed (offline?)"
fi

cd "$here" || exit 1
# The crate builds against its own target dir, never the workspace's: fuzz/target, or
# QKV_FUZZ_TARGET (which .ci/run keeps in its cache, so that reruns skip the ASan build).
export CARGO_TARGET_DIR="${QKV_FUZZ_TARGET:-$here/target}"
if ! cargo +nightly fuzz build -O -a --fuzz-dir "$here"; then
    echo "fuzz/run.sh: the fuzz targets do not build" >&2
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/qkv-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=""
for t in $targets; do
    mkdir -p "$work/$t"
    cp -r "$here/corpus/$t/." "$work/$t/"
    echo "== fuzz target $t: $secs s on $(ls "$work/$t" | wc -l) seeds"
    # -timeout: one input may take 10 s at most (a hang otherwise); -rss_limit_mb: 2 GB.
    if ! cargo +nightly fuzz run -O -a --fuzz-dir "$here" "$t" "$work/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        2>"$work/$t.log"; then
        failed="$failed $t"
    fi
    # libFuzzer's last status line (executions, coverage, features) and its final stats.
    grep -E '^#[0-9]+' "$work/$t.log" | tail -n 1
    grep -E '^stat::' "$work/$t.log"
    grep -E 'ERROR|SUMMARY|panicked' "$work/$t.log" | head -n 5
done

if [ -n "$failed" ]; then
    echo "fuzz/run.sh: failures in:$failed (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz/run.sh: every target ran $secs s with no crash, timeout or OOM"
