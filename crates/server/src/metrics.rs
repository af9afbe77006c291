//! Counters and gauges for `GET /metrics` (Prometheus text format 0.0.4).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

#[derive(Default)]
pub struct Metrics {
    /// HTTP responses by (route, status code).
    http: Mutex<BTreeMap<(String, u16), u64>>,
    /// Generations finished normally (stop or length).
    pub completed: AtomicU64,
    /// Generations cancelled (client disconnect or shutdown).
    pub cancelled: AtomicU64,
    /// Generations that failed with an engine error.
    pub failed: AtomicU64,
    /// Requests refused because the queue was full.
    pub rejected_queue_full: AtomicU64,
    /// Connections closed at accept because `max_connections` were open.
    pub rejected_connections: AtomicU64,
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens reused from the kept KV cache.
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Microseconds spent in prefill and in decoding.
    pub prefill_us: AtomicU64,
    pub decode_us: AtomicU64,
    /// Decode steps (generated tokens minus the first of each request).
    pub decode_steps: AtomicU64,
    /// Requests waiting for the engine.
    pub queue_depth: AtomicI64,
    /// Generations running (slots busy).
    pub busy: AtomicI64,
    /// Slots (`--parallel`).
    pub slots: AtomicI64,
    /// Batched forwards, their rows and sequences (sum), and their time.
    pub steps: AtomicU64,
    pub step_rows: AtomicU64,
    pub step_sequences: AtomicU64,
    pub step_us: AtomicU64,
    /// Requests that reused a cached prompt prefix.
    pub prefix_hits: AtomicU64,
    /// Prompt prefixes kept outside the slots, and bytes of their K/V rows.
    pub kept_prefixes: AtomicI64,
    pub kept_bytes: AtomicI64,
    /// Bytes of K/V rows held by the slots.
    pub live_bytes: AtomicI64,
    /// Requests given a slot, and their total time in the queue.
    pub admitted: AtomicU64,
    pub queue_wait_us: AtomicU64,
    /// The drafter's name, when speculating.
    pub drafter: std::sync::OnceLock<String>,
    /// Last request's decode rate, in milli-tokens per second.
    pub last_decode_mtps: AtomicU64,
    pub spec_cycles: AtomicU64,
    pub spec_drafted: AtomicU64,
    pub spec_accepted: AtomicU64,
    /// The suffix cache of recent outputs, when the server speculates with it.
    pub suffix: std::sync::OnceLock<tandem_engine::SuffixCache>,
}

impl Metrics {
    pub fn record_http(&self, route: &str, status: u16) {
        let mut m = self.http.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((route.to_string(), status)).or_insert(0) += 1;
    }

    pub fn render(&self, speculative: bool) -> String {
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(s, "{name}{labels} {v}");
            }
        };
        let one = |v: String| vec![(String::new(), v)];
        let c = |a: &AtomicU64| a.load(Relaxed).to_string();
        let g = |a: &AtomicI64| a.load(Relaxed).to_string();

        let http: Vec<(String, String)> = {
            let m = self.http.lock().unwrap_or_else(|e| e.into_inner());
            m.iter().map(|((r, code), n)| (format!("{{route=\"{r}\",code=\"{code}\"}}"), n.to_string())).collect()
        };
        metric("tandem_http_requests_total", "counter", "HTTP requests answered, by route and status code.", &http);
        metric(
            "tandem_generations_total",
            "counter",
            "Generations run by the engine worker, by outcome.",
            &[
                ("{outcome=\"completed\"}".into(), c(&self.completed)),
                ("{outcome=\"cancelled\"}".into(), c(&self.cancelled)),
                ("{outcome=\"failed\"}".into(), c(&self.failed)),
            ],
        );
        metric(
            "tandem_requests_rejected_total",
            "counter",
            "Requests refused with 503 because the queue was full.",
            &one(c(&self.rejected_queue_full)),
        );
        metric(
            "tandem_connections_rejected_total",
            "counter",
            "Connections closed on accept because --max-connections were open.",
            &one(c(&self.rejected_connections)),
        );
        metric("tandem_prompt_tokens_total", "counter", "Prompt tokens received (tokens in).", &one(c(&self.prompt_tokens)));
        metric(
            "tandem_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from the kept KV cache.",
            &one(c(&self.cached_tokens)),
        );
        metric("tandem_generated_tokens_total", "counter", "Tokens generated (tokens out).", &one(c(&self.generated_tokens)));
        let secs = |a: &AtomicU64| format!("{:.6}", a.load(Relaxed) as f64 / 1e6);
        metric("tandem_prefill_seconds_total", "counter", "Time spent evaluating prompts.", &one(secs(&self.prefill_us)));
        metric("tandem_decode_seconds_total", "counter", "Time spent generating.", &one(secs(&self.decode_us)));
        let steps = self.decode_steps.load(Relaxed) as f64;
        let dsecs = self.decode_us.load(Relaxed) as f64 / 1e6;
        let avg = if dsecs > 0.0 { steps / dsecs } else { 0.0 };
        metric("tandem_decode_tokens_per_second", "gauge", "Decode rate over all requests so far.", &one(format!("{avg:.3}")));
        metric(
            "tandem_last_decode_tokens_per_second",
            "gauge",
            "Decode rate of the last finished request.",
            &one(format!("{:.3}", self.last_decode_mtps.load(Relaxed) as f64 / 1e3)),
        );
        metric("tandem_queue_depth", "gauge", "Requests waiting for the engine worker.", &one(g(&self.queue_depth)));
        metric("tandem_requests_running", "gauge", "Generations running (slots busy).", &one(g(&self.busy)));
        metric("tandem_slots", "gauge", "Sequences decoded together (--parallel).", &one(g(&self.slots)));
        metric("tandem_batch_steps_total", "counter", "Batched forwards run.", &one(c(&self.steps)));
        metric(
            "tandem_batch_rows_total",
            "counter",
            "Rows of all batched forwards (decode, verify and prompt rows).",
            &one(c(&self.step_rows)),
        );
        metric(
            "tandem_batch_sequences_total",
            "counter",
            "Sequences in all batched forwards (over steps: the mean batch size).",
            &one(c(&self.step_sequences)),
        );
        metric("tandem_batch_seconds_total", "counter", "Time in batched forwards.", &one(secs(&self.step_us)));
        metric("tandem_prefix_cache_hits_total", "counter", "Requests that reused a cached prompt prefix.", &one(c(&self.prefix_hits)));
        metric("tandem_prefix_cache_entries", "gauge", "Prompt prefixes kept outside the slots.", &one(g(&self.kept_prefixes)));
        metric("tandem_prefix_cache_bytes", "gauge", "Bytes of K/V rows of kept prompt prefixes.", &one(g(&self.kept_bytes)));
        metric("tandem_kv_live_bytes", "gauge", "Bytes of K/V rows held by the slots.", &one(g(&self.live_bytes)));
        metric("tandem_queue_admitted_total", "counter", "Requests given a slot.", &one(c(&self.admitted)));
        metric("tandem_queue_wait_seconds_total", "counter", "Time requests waited for a slot, summed.", &one(secs(&self.queue_wait_us)));
        metric("tandem_speculative_enabled", "gauge", "1 when the server speculates.", &one((speculative as u8).to_string()));
        metric("tandem_spec_cycles_total", "counter", "Speculative verify cycles.", &one(c(&self.spec_cycles)));
        metric("tandem_spec_drafted_tokens_total", "counter", "Draft tokens sent to verification.", &one(c(&self.spec_drafted)));
        metric("tandem_spec_accepted_tokens_total", "counter", "Draft tokens accepted by verification.", &one(c(&self.spec_accepted)));
        let (d, a) = (self.spec_drafted.load(Relaxed), self.spec_accepted.load(Relaxed));
        let rate = if d > 0 { a as f64 / d as f64 } else { 0.0 };
        metric("tandem_spec_acceptance_rate", "gauge", "Accepted / drafted tokens over all requests.", &one(format!("{rate:.4}")));
        if let Some(sc) = self.suffix.get() {
            metric("tandem_suffix_cache_tokens", "gauge", "Tokens of recent outputs in the suffix cache.", &one(sc.tokens().to_string()));
            metric(
                "tandem_suffix_cache_capacity_tokens",
                "gauge",
                "Most tokens the suffix cache holds (--suffix-cache-tokens).",
                &one(sc.capacity().to_string()),
            );
            metric("tandem_suffix_cache_sequences", "gauge", "Outputs in the suffix cache.", &one(sc.sequences().to_string()));
            metric("tandem_suffix_cache_nodes", "gauge", "Suffix tree nodes of the suffix cache.", &one(sc.nodes().to_string()));
        }
        s
    }
}
