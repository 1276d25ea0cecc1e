//! Server counters, rendered in the Prometheus text format at `GET /metrics`: the HTTP
//! side's (responses by status) and the scheduler's ([`SchedulerStats`]: completions,
//! tokens, passes, queue, KV bytes).

use sparrow::scheduler::SchedulerStats;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// The HTTP side's counters, the server's fixed settings, and the scheduler's counters.
pub struct Metrics {
    pub requests_ok: AtomicU64,
    pub requests_bad: AtomicU64,
    pub requests_unauthorized: AtomicU64,
    pub requests_busy: AtomicU64,
    pub requests_failed: AtomicU64,
    /// The server's fixed settings, reported as `sparrow_info`.
    pub info: Info,
    /// What the generation thread counts.
    pub scheduler: Arc<SchedulerStats>,
}

/// Settings fixed at startup, shown as the labels of the `sparrow_info` gauge.
#[derive(Clone, Debug)]
pub struct Info {
    /// The policy as results name it (`--attn` and the phase overrides).
    pub attention: String,
    /// The policy prompt processing runs.
    pub attention_prefill: String,
    /// The policy generation runs.
    pub attention_decode: String,
    pub cache_type_k: String,
    pub cache_type_v: String,
}

impl Default for Info {
    fn default() -> Self {
        Info {
            attention: "full".into(),
            attention_prefill: "full".into(),
            attention_decode: "full".into(),
            cache_type_k: "f16".into(),
            cache_type_v: "f16".into(),
        }
    }
}

/// A Prometheus label value with `\`, `"` and newlines escaped.
fn label_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// No responses counted yet; `scheduler`'s counters are read at each rendering.
    pub fn new(info: Info, scheduler: Arc<SchedulerStats>) -> Self {
        Metrics {
            requests_ok: AtomicU64::new(0),
            requests_bad: AtomicU64::new(0),
            requests_unauthorized: AtomicU64::new(0),
            requests_busy: AtomicU64::new(0),
            requests_failed: AtomicU64::new(0),
            info,
            scheduler,
        }
    }

    /// Count a response by HTTP status.
    pub fn count_status(&self, status: u16) {
        let c = match status {
            200..=299 => &self.requests_ok,
            401 => &self.requests_unauthorized,
            503 => &self.requests_busy,
            400..=499 => &self.requests_bad,
            _ => &self.requests_failed,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus exposition text.
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let sc = &*self.scheduler;
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: &[(&str, f64)]| {
            let _ = writeln!(s, "# HELP {name} {help}");
            let _ = writeln!(s, "# TYPE {name} {kind}");
            for (labels, v) in lines {
                let _ = writeln!(s, "{name}{labels} {v}");
            }
        };
        metric(
            "sparrow_requests_total",
            "counter",
            "HTTP requests answered, by status code.",
            &[
                ("{code=\"200\"}", g(&self.requests_ok) as f64),
                ("{code=\"400\"}", g(&self.requests_bad) as f64),
                ("{code=\"401\"}", g(&self.requests_unauthorized) as f64),
                ("{code=\"503\"}", g(&self.requests_busy) as f64),
                ("{code=\"500\"}", g(&self.requests_failed) as f64),
            ],
        );
        let gu = |a: &AtomicUsize| a.load(Ordering::Relaxed) as f64;
        metric(
            "sparrow_kv_bytes",
            "gauge",
            "Keys and values held over all slots: in RAM (hot) and in cold KV files.",
            &[
                ("{tier=\"hot\"}", gu(&sc.kv_hot_bytes)),
                ("{tier=\"cold\"}", gu(&sc.kv_cold_bytes)),
            ],
        );
        metric(
            "sparrow_draft_tokens_total",
            "counter",
            "Speculative decoding: draft tokens checked, and those the model kept; siblings (a draft's second choice) checked, and those taken.",
            &[
                ("{result=\"drafted\"}", g(&sc.drafted_tokens) as f64),
                ("{result=\"accepted\"}", g(&sc.accepted_tokens) as f64),
                ("{result=\"sibling\"}", g(&sc.sibling_tokens) as f64),
                ("{result=\"sibling_taken\"}", g(&sc.siblings_taken) as f64),
            ],
        );
        let pc = &*sc.prefix_cache;
        if pc.enabled.load(Ordering::Relaxed) {
            metric(
                "sparrow_prefix_cache_lookups_total",
                "counter",
                "Prompts looked up in the shared prefix cache: a hit started from a cached prefix.",
                &[
                    ("{result=\"hit\"}", g(&pc.hits) as f64),
                    ("{result=\"miss\"}", g(&pc.misses) as f64),
                ],
            );
            metric(
                "sparrow_prefix_cache_tokens_reused_total",
                "counter",
                "Prompt tokens taken from the shared prefix cache instead of computed.",
                &[("", g(&pc.tokens_reused) as f64)],
            );
            metric(
                "sparrow_prefix_cache_bytes",
                "gauge",
                "Bytes of cached prefix blocks, in RAM and in --cache-dir.",
                &[
                    ("{tier=\"ram\"}", g(&pc.ram_bytes) as f64),
                    ("{tier=\"disk\"}", g(&pc.disk_bytes) as f64),
                ],
            );
            metric(
                "sparrow_prefix_cache_blocks",
                "gauge",
                "Cached prefix blocks, in RAM and in --cache-dir.",
                &[
                    ("{tier=\"ram\"}", gu(&pc.ram_blocks)),
                    ("{tier=\"disk\"}", gu(&pc.disk_blocks)),
                ],
            );
        }
        metric(
            "sparrow_completions_total",
            "counter",
            "Generations run to the end.",
            &[("", g(&sc.completed) as f64)],
        );
        metric(
            "sparrow_cancelled_total",
            "counter",
            "Generations stopped because the client went away.",
            &[("", g(&sc.cancelled) as f64)],
        );
        metric(
            "sparrow_prompt_tokens_total",
            "counter",
            "Prompt tokens prefilled (excluding reused cached prefixes).",
            &[("", g(&sc.prompt_tokens) as f64)],
        );
        metric(
            "sparrow_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a cached prefix.",
            &[("", g(&sc.prompt_tokens_cached) as f64)],
        );
        metric(
            "sparrow_generated_tokens_total",
            "counter",
            "Tokens generated.",
            &[("", g(&sc.generated_tokens) as f64)],
        );
        metric(
            "sparrow_forward_passes_total",
            "counter",
            "Forward passes run (each carries every active request's next tokens).",
            &[("", g(&sc.passes) as f64)],
        );
        metric(
            "sparrow_forward_sequences_total",
            "counter",
            "Requests carried by forward passes, summed over the passes.",
            &[("", g(&sc.pass_sequences) as f64)],
        );
        metric(
            "sparrow_forward_tokens_total",
            "counter",
            "Token rows carried by forward passes, summed over the passes.",
            &[("", g(&sc.pass_tokens) as f64)],
        );
        let ps = g(&sc.prompt_micros) as f64 / 1e6;
        let gs = g(&sc.generation_micros) as f64 / 1e6;
        metric(
            "sparrow_prompt_seconds_total",
            "counter",
            "Time spent in prefill.",
            &[("", ps)],
        );
        metric(
            "sparrow_generation_seconds_total",
            "counter",
            "Time spent generating (wall time per request, summed).",
            &[("", gs)],
        );
        let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        metric(
            "sparrow_prompt_tokens_per_second",
            "gauge",
            "Average prefill speed since start.",
            &[("", rate(g(&sc.prompt_tokens), ps))],
        );
        metric(
            "sparrow_generation_tokens_per_second",
            "gauge",
            "Average generation speed per request since start.",
            &[("", rate(g(&sc.generated_tokens), gs))],
        );
        metric(
            "sparrow_queue_depth",
            "gauge",
            "Requests waiting for a slot.",
            &[("", sc.queue_depth.load(Ordering::Relaxed) as f64)],
        );
        metric(
            "sparrow_active_requests",
            "gauge",
            "Requests being generated.",
            &[("", sc.active.load(Ordering::Relaxed) as f64)],
        );
        let i = &self.info;
        let info = format!(
            "{{attention=\"{}\",attention_prefill=\"{}\",attention_decode=\"{}\",cache_type_k=\"{}\",cache_type_v=\"{}\"}}",
            label_value(&i.attention),
            label_value(&i.attention_prefill),
            label_value(&i.attention_decode),
            label_value(&i.cache_type_k),
            label_value(&i.cache_type_v),
        );
        metric(
            "sparrow_info",
            "gauge",
            "The server's attention policy and KV cache types (always 1).",
            &[(info.as_str(), 1.0)],
        );
        metric(
            "sparrow_slots",
            "gauge",
            "Concurrent generation slots.",
            &[("", sc.slots.load(Ordering::Relaxed) as f64)],
        );
        s
    }
}
