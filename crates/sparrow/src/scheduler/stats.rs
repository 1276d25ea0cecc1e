//! The scheduler's counters and gauges, updated by its thread and read by anyone (the
//! server's `/metrics`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Counters (since start) and gauges (now) of a [`super::Scheduler`]; relaxed atomics, so
/// a reader may see one update before another.
#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Jobs generated to the end.
    pub completed: AtomicU64,
    /// Jobs stopped because their caller gave up ([`super::Reply::is_cancelled`]).
    pub cancelled: AtomicU64,
    /// Prompt tokens run (reused prefixes excluded) and the time their prefill took.
    pub prompt_tokens: AtomicU64,
    pub prompt_micros: AtomicU64,
    /// Prompt tokens found already in a slot's cache.
    pub prompt_tokens_cached: AtomicU64,
    /// Tokens generated, and the wall time of each job's generation phase, summed.
    pub generated_tokens: AtomicU64,
    pub generation_micros: AtomicU64,
    /// Forward passes run, the sequences they carried, and their token rows (several jobs
    /// share a pass).
    pub passes: AtomicU64,
    pub pass_sequences: AtomicU64,
    pub pass_tokens: AtomicU64,
    /// Jobs waiting for a slot.
    pub queue_depth: AtomicUsize,
    /// Jobs being generated.
    pub active: AtomicUsize,
    /// Slots (sequences served at once), as configured.
    pub slots: AtomicUsize,
    /// Bytes of keys and values in RAM, over every slot (the hot tier under a RAM budget).
    pub kv_hot_bytes: AtomicUsize,
    /// Bytes of keys and values in the slots' cold KV files.
    pub kv_cold_bytes: AtomicUsize,
    /// Draft tokens checked, and those kept (speculative decoding).
    pub drafted_tokens: AtomicU64,
    pub accepted_tokens: AtomicU64,
    /// Siblings (a draft's second choice) checked, and those the generation took.
    pub sibling_tokens: AtomicU64,
    pub siblings_taken: AtomicU64,
    /// The shared prefix cache's counters (`enabled` false without one).
    pub prefix_cache: std::sync::Arc<crate::prefix_cache::PrefixCacheStats>,
}

impl SchedulerStats {
    /// `n` prompt tokens were prefilled in `dt`.
    pub fn add_prompt(&self, n: usize, dt: Duration) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
        self.prompt_micros
            .fetch_add(dt.as_micros() as u64, Ordering::Relaxed);
    }

    /// A check of `drafted` drafts kept `kept`; it carried `siblings` siblings, one of
    /// them taken or not.
    pub fn add_speculation(&self, drafted: usize, kept: usize, siblings: usize, taken: bool) {
        self.drafted_tokens
            .fetch_add(drafted as u64, Ordering::Relaxed);
        self.accepted_tokens
            .fetch_add(kept as u64, Ordering::Relaxed);
        self.sibling_tokens
            .fetch_add(siblings as u64, Ordering::Relaxed);
        self.siblings_taken
            .fetch_add(u64::from(taken), Ordering::Relaxed);
    }

    /// A job's generation phase took `dt`.
    pub fn add_generation(&self, dt: Duration) {
        self.generation_micros
            .fetch_add(dt.as_micros() as u64, Ordering::Relaxed);
    }
}
