//! The server's metrics: counters and gauges the engine thread and the handlers update,
//! latency histograms, recent-window summaries, and their Prometheus exposition
//! (`GET /metrics`, with vLLM's and llama-server's names when asked).

use qkv::engine::Engine;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// A Prometheus histogram with fixed buckets.
pub struct Histogram {
    bounds: &'static [f64],
    state: Mutex<(Vec<u64>, f64, u64)>,
}

/// Bucket bounds in seconds for latencies (fine between 10 ms and 1 s, where the
/// inter-token latencies of a loaded server fall).
const SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
    5.0, 10.0, 30.0,
];
/// Bucket bounds for batch sizes (tokens generated per step).
const COUNTS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            state: Mutex::new((vec![0; bounds.len()], 0.0, 0)),
        }
    }

    fn observe_value(&self, v: f64) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for (b, n) in self.bounds.iter().zip(s.0.iter_mut()) {
            if v <= *b {
                *n += 1;
            }
        }
        s.1 += v;
        s.2 += 1;
    }

    /// The sum and the count of the values observed.
    pub fn sum_count(&self) -> (f64, u64) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (s.1, s.2)
    }

    /// Records a duration.
    pub fn observe(&self, d: std::time::Duration) {
        self.observe_value(d.as_secs_f64());
    }

    pub(crate) fn observe_count(&self, n: u64) {
        if n > 0 {
            self.observe_value(n as f64);
        }
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        use std::fmt::Write;
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, n) in self.bounds.iter().zip(&s.0) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {n}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", s.2);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", s.1, s.2);
    }
}

/// How many of the latest observations a [`Recent`] summary keeps.
const RECENT: usize = 4096;

/// A Prometheus summary over the latest [`RECENT`] observations: their median and 99th
/// percentile, exact (sorted on each scrape), so a dashboard gets p50/p99 without
/// interpolating between histogram buckets. `_sum` and `_count` cover every observation.
pub struct Recent {
    state: Mutex<RecentState>,
}

#[derive(Default)]
struct RecentState {
    ring: Vec<f64>,
    next: usize,
    sum: f64,
    count: u64,
}

impl Recent {
    fn new() -> Recent {
        Recent {
            state: Mutex::new(RecentState::default()),
        }
    }

    /// Records a duration in seconds.
    pub fn observe(&self, d: std::time::Duration) {
        let v = d.as_secs_f64();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.ring.len() < RECENT {
            s.ring.push(v);
        } else {
            let i = s.next;
            s.ring[i] = v;
        }
        s.next = (s.next + 1) % RECENT;
        s.sum += v;
        s.count += 1;
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        use std::fmt::Write;
        let (mut v, sum, count) = {
            let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            (s.ring.clone(), s.sum, s.count)
        };
        let _ = writeln!(
            out,
            "# HELP {name} {help} (quantiles over the latest {RECENT})\n# TYPE {name} summary"
        );
        for q in [0.5, 0.9, 0.99] {
            let x = nearest_rank(&mut v, q).unwrap_or(f64::NAN);
            let _ = writeln!(out, "{name}{{quantile=\"{q}\"}} {x}");
        }
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// The nearest-rank `q` quantile of `v` (sorted in place); `None` when empty.
fn nearest_rank(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let k = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[k - 1])
}

/// The server's counters, gauges and histograms (`GET /metrics`).
pub struct Metrics {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub disconnects: AtomicU64,
    pub cancelled: AtomicU64,
    pub steps: AtomicU64,
    /// Speculative decoding, over finished sequences: tokens drafted, of those kept, and
    /// drafts (verify passes).
    pub spec_draft_tokens: AtomicU64,
    pub spec_accepted_tokens: AtomicU64,
    pub spec_drafts: AtomicU64,
    pub running: AtomicU64,
    pub queued: AtomicU64,
    /// KV cache positions the running sequences hold, and all that may be held at once.
    pub kv_used: AtomicU64,
    pub kv_capacity: AtomicU64,
    /// The most tokens generated in one step.
    pub max_batch: AtomicU64,
    pub ttft: Histogram,
    pub inter_token: Histogram,
    /// p50/p90/p99 of the latest times to first token.
    pub ttft_recent: Recent,
    /// p50/p90/p99 of the latest inter-token latencies.
    pub inter_token_recent: Recent,
    pub step_seconds: Histogram,
    pub batch: Histogram,
    /// The engine is asleep (`--sleep-idle-seconds`): its idle KV caches are freed.
    pub sleeping: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            disconnects: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            spec_draft_tokens: AtomicU64::new(0),
            spec_accepted_tokens: AtomicU64::new(0),
            spec_drafts: AtomicU64::new(0),
            running: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            kv_used: AtomicU64::new(0),
            kv_capacity: AtomicU64::new(0),
            max_batch: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            ttft: Histogram::new(SECONDS),
            inter_token: Histogram::new(SECONDS),
            ttft_recent: Recent::new(),
            inter_token_recent: Recent::new(),
            step_seconds: Histogram::new(SECONDS),
            batch: Histogram::new(COUNTS),
        }
    }
}

/// A Prometheus label value with `\\`, `"` and newlines escaped.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// Takes the engine's sequence counts and KV cache use.
    pub(crate) fn set_gauges(&self, engine: &Engine) {
        self.running
            .store(engine.running() as u64, Ordering::Relaxed);
        self.queued.store(engine.queued() as u64, Ordering::Relaxed);
        self.kv_used
            .store(engine.kv_positions_used() as u64, Ordering::Relaxed);
        self.kv_capacity
            .store(engine.kv_positions_capacity() as u64, Ordering::Relaxed);
    }

    /// KV cache positions in use over capacity, in [0, 1] (0 without a KV cache).
    pub fn kv_usage(&self) -> f64 {
        let cap = self.kv_capacity.load(Ordering::Relaxed);
        let used = self.kv_used.load(Ordering::Relaxed);
        if cap == 0 {
            0.0
        } else {
            (used as f64 / cap as f64).clamp(0.0, 1.0)
        }
    }

    /// The counters and gauges llama-server exports (`llamacpp:…`, with `--metrics` there),
    /// from qkv's own: prompt tokens read (cached ones apart), tokens generated, the
    /// seconds each took (time to first token, and between tokens), engine steps, and the
    /// running and waiting requests, and the tokens speculative decoding drafted and kept.
    pub fn render_llamacpp(&self) -> String {
        use std::fmt::Write;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let (prompt_s, prompt_n) = self.ttft.sum_count();
        let (gen_s, _) = self.inter_token.sum_count();
        let processed = (load(&self.prompt_tokens) - load(&self.cached_tokens)).max(0.0);
        let generated = load(&self.generated_tokens);
        let rate = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
        let (batch_sum, batch_n) = self.batch.sum_count();
        let mut out = String::new();
        let families: [(&str, &str, &str, f64); 15] = [
            (
                "prompt_tokens_total",
                "counter",
                "prompt tokens read (cached ones apart)",
                processed,
            ),
            (
                "prompt_tokens_cached_total",
                "counter",
                "prompt tokens reused from the cache",
                load(&self.cached_tokens),
            ),
            (
                "prompt_seconds_total",
                "counter",
                "seconds from submission to first token",
                prompt_s,
            ),
            (
                "tokens_predicted_total",
                "counter",
                "tokens generated",
                generated,
            ),
            (
                "tokens_predicted_seconds_total",
                "counter",
                "seconds between generated tokens",
                gen_s,
            ),
            (
                "n_decode_total",
                "counter",
                "engine steps",
                load(&self.steps),
            ),
            (
                "n_tokens_max",
                "counter",
                "most tokens generated in one step",
                load(&self.max_batch),
            ),
            (
                "spec_decode_num_draft_tokens_total",
                "counter",
                "tokens drafted by speculative decoding",
                load(&self.spec_draft_tokens),
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "counter",
                "drafted tokens the model kept",
                load(&self.spec_accepted_tokens),
            ),
            (
                "spec_decode_num_drafts_total",
                "counter",
                "drafts verified",
                load(&self.spec_drafts),
            ),
            (
                "prompt_tokens_seconds",
                "gauge",
                "prompt tokens per second",
                rate(processed, prompt_s),
            ),
            (
                "predicted_tokens_seconds",
                "gauge",
                "generated tokens per second",
                rate(generated - prompt_n as f64, gen_s),
            ),
            (
                "requests_processing",
                "gauge",
                "requests generating",
                load(&self.running),
            ),
            (
                "requests_deferred",
                "gauge",
                "requests waiting",
                load(&self.queued),
            ),
            (
                "n_busy_slots_per_decode",
                "gauge",
                "sequences per engine step, on average",
                rate(batch_sum, batch_n as f64),
            ),
        ];
        for (name, kind, help, v) in families {
            let _ = writeln!(
                out,
                "# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {v}"
            );
        }
        out
    }

    /// The Prometheus text exposition of everything; with `vllm_model_name`, the request
    /// and KV cache gauges are also written under vLLM's names (`vllm:…`), labelled with
    /// `model_name` as vLLM labels them, for dashboards made for vLLM.
    pub fn render(&self, vllm_model_name: Option<&str>) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let counters = [
            (
                "qkv_requests_total",
                "HTTP requests received",
                &self.requests,
            ),
            (
                "qkv_request_errors_total",
                "requests answered with an error",
                &self.errors,
            ),
            (
                "qkv_prompt_tokens_total",
                "prompt tokens of finished sequences",
                &self.prompt_tokens,
            ),
            (
                "qkv_prompt_tokens_cached_total",
                "prompt tokens reused from a cached prefix",
                &self.cached_tokens,
            ),
            (
                "qkv_generated_tokens_total",
                "tokens generated",
                &self.generated_tokens,
            ),
            (
                "qkv_client_disconnects_total",
                "tokens that found their client gone (its sequence is then cancelled)",
                &self.disconnects,
            ),
            (
                "qkv_sequences_cancelled_total",
                "sequences ended early: client gone, stop string, shutdown",
                &self.cancelled,
            ),
            ("qkv_steps_total", "engine steps", &self.steps),
            (
                "qkv_spec_draft_tokens_total",
                "tokens drafted by speculative decoding (finished sequences)",
                &self.spec_draft_tokens,
            ),
            (
                "qkv_spec_accepted_tokens_total",
                "drafted tokens the model kept (finished sequences)",
                &self.spec_accepted_tokens,
            ),
            (
                "qkv_spec_drafts_total",
                "drafts verified, one pass each (finished sequences)",
                &self.spec_drafts,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        for (name, help, v) in [
            ("qkv_running_sequences", "sequences running", &self.running),
            (
                "qkv_queue_depth",
                "requests waiting for a slot",
                &self.queued,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        let running = self.running.load(Ordering::Relaxed) as f64;
        let waiting = self.queued.load(Ordering::Relaxed) as f64;
        let kv = self.kv_usage();
        let gauges = [
            (
                "qkv_requests_running",
                "vllm:num_requests_running",
                "requests being served now (sequences generating, or embedding requests in the pass that runs)",
                running,
            ),
            (
                "qkv_requests_waiting",
                "vllm:num_requests_waiting",
                "requests waiting for their turn",
                waiting,
            ),
            (
                "qkv_kv_cache_usage_ratio",
                "vllm:gpu_cache_usage_perc",
                "KV cache positions held by running sequences over all positions the caches may hold (0 to 1)",
                kv,
            ),
        ];
        for (name, _, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        if let Some(model) = vllm_model_name {
            let model = label_value(model);
            for (_, name, help, v) in gauges {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help} (qkv's value under vLLM's name)\n# TYPE {name} gauge\n\
                     {name}{{model_name=\"{model}\"}} {v}"
                );
            }
        }
        self.ttft.render(
            "qkv_time_to_first_token_seconds",
            "from submission to the first token",
            &mut out,
        );
        self.inter_token.render(
            "qkv_inter_token_seconds",
            "between a sequence's tokens",
            &mut out,
        );
        self.ttft_recent.render(
            "qkv_time_to_first_token_recent_seconds",
            "from submission to the first token",
            &mut out,
        );
        self.inter_token_recent.render(
            "qkv_inter_token_recent_seconds",
            "between a sequence's tokens",
            &mut out,
        );
        self.step_seconds
            .render("qkv_step_seconds", "one engine step", &mut out);
        self.batch.render(
            "qkv_batch_size",
            "tokens generated per engine step",
            &mut out,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn nearest_rank_quantiles() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(nearest_rank(&mut v, 0.5), Some(50.0));
        assert_eq!(nearest_rank(&mut v, 0.99), Some(99.0));
        assert_eq!(nearest_rank(&mut v, 1.0), Some(100.0));
        assert_eq!(nearest_rank(&mut [], 0.5), None);
    }

    #[test]
    fn recent_summary_keeps_the_latest_window() {
        let r = Recent::new();
        // An old slow spell, then a full window of fast tokens: the slow ones age out.
        for _ in 0..100 {
            r.observe(Duration::from_secs(2));
        }
        for _ in 0..RECENT {
            r.observe(Duration::from_millis(10));
        }
        let mut out = String::new();
        r.render("x_seconds", "test", &mut out);
        assert!(out.contains("# TYPE x_seconds summary"), "{out}");
        assert!(out.contains("x_seconds{quantile=\"0.99\"} 0.01\n"), "{out}");
        assert!(
            out.contains(&format!("x_seconds_count {}", RECENT + 100)),
            "{out}"
        );
    }
}
