//! Memory use of this process as the kernel reports it (Linux `/proc/self/status`), split
//! into anonymous memory (heap: KV cache, scratch) and file-backed pages (the mapped model,
//! which the OS can drop and re-read at will).

/// Peak and current resident memory, in KiB.
pub struct MemoryReport {
    pub peak_rss_kib: u64,
    pub anon_kib: u64,
    pub file_kib: u64,
}

/// The report, or `None` where `/proc` is not available.
pub fn memory_report() -> Option<MemoryReport> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some(MemoryReport {
        peak_rss_kib: field("VmHWM:")?,
        anon_kib: field("RssAnon:")?,
        file_kib: field("RssFile:")?,
    })
}
