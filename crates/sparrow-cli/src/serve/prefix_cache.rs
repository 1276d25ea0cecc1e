//! `serve`'s prefix cache flags (llama-server's `--cache-ram` spelling, sizes in MiB when
//! given as a bare number as it takes them) and the report of what the cache directory
//! held at start.

use sparrow::prefix_cache::{PrefixCacheConfig, ScanReport, DEFAULT_BLOCK};
use std::path::{Path, PathBuf};

/// Cap of the default RAM budget: llama-server's default `--cache-ram`.
const DEFAULT_RAM_CAP: u64 = 8 << 30;
/// Default disk budget.
const DEFAULT_DISK: u64 = 16 << 30;

/// The prefix cache every slot shares.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Prefix cache")]
pub struct PrefixCacheArgs {
    /// RAM for prompt prefixes shared by every slot: a size (`2G`, `512M`) or a number of
    /// MiB as llama-server takes it; 0: none (only each slot's own prefix is reused, and
    /// --cache-dir alone still caches on disk); -1: no limit. Default: a quarter of the
    /// memory available at start, at most 8 GiB.
    #[arg(long = "cache-ram", visible_alias = "cram", value_name = "SIZE", value_parser = parse_budget, allow_hyphen_values = true)]
    pub cache_ram: Option<u64>,
    /// Also keep cached prefixes in this directory (written as they are made, read back
    /// when RAM no longer holds them, and found again after a restart).
    #[arg(long = "cache-dir", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Bytes of cached prefixes --cache-dir may hold (older ones are removed first) [default: 16G].
    #[arg(long = "cache-disk", value_name = "SIZE", value_parser = parse_budget, requires = "cache_dir")]
    pub cache_disk: Option<u64>,
    /// Positions per cached block: a prompt reuses the cache in whole blocks.
    #[arg(long = "cache-block", value_name = "N", default_value_t = DEFAULT_BLOCK as u64, value_parser = clap::value_parser!(u64).range(16..=8192))]
    pub cache_block: u64,
}

/// A budget as `--cache-ram`/`--cache-disk` take it: a size with a unit, a bare number of
/// MiB, or -1 for no limit.
pub fn parse_budget(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t == "-1" {
        return Ok(u64::MAX);
    }
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
        let mib: u64 = t
            .parse()
            .map_err(|_| format!("size '{text}' is out of range"))?;
        return mib
            .checked_mul(1 << 20)
            .ok_or_else(|| format!("size '{text}' is out of range"));
    }
    sparrow::memory::parse_size(t)
        .map(|b| b as u64)
        .map_err(|_| {
            format!(
                "'{text}' is not a size (use e.g. 2G, 512M, 4096 for 4096 MiB, or -1 for no limit)"
            )
        })
}

impl PrefixCacheArgs {
    /// The cache's settings, or `None` when it is off (no RAM and no directory).
    pub fn config(&self) -> Option<PrefixCacheConfig> {
        let ram = self.cache_ram.unwrap_or_else(|| {
            sparrow::memory::available_memory().map_or(1 << 30, |a| (a / 4).min(DEFAULT_RAM_CAP))
        });
        if ram == 0 && self.cache_dir.is_none() {
            return None;
        }
        Some(PrefixCacheConfig {
            ram_bytes: ram,
            dir: self.cache_dir.clone(),
            disk_bytes: self.cache_disk.unwrap_or(DEFAULT_DISK),
            block: self.cache_block as usize,
        })
    }
}

fn mib(b: u64) -> String {
    if b == u64::MAX {
        "no limit".into()
    } else {
        format!("{:.0} MiB", b as f64 / (1 << 20) as f64)
    }
}

/// The startup lines: the budgets, and what the directory held.
pub fn describe(
    cfg: &PrefixCacheConfig,
    scan: Option<&ScanReport>,
    disk_bytes: u64,
) -> Vec<String> {
    let mut lines = vec![format!(
        "prefix cache: blocks of {} tokens, RAM {}{}",
        cfg.block,
        mib(cfg.ram_bytes),
        match &cfg.dir {
            Some(d) => format!(", disk {} in {}", mib(cfg.disk_bytes), d.display()),
            None => String::new(),
        }
    )];
    if let (Some(s), Some(dir)) = (scan, cfg.dir.as_deref()) {
        lines.extend(scan_lines(s, dir, disk_bytes));
    }
    lines
}

fn scan_lines(s: &ScanReport, dir: &Path, disk_bytes: u64) -> Vec<String> {
    let mut lines = vec![format!(
        "prefix cache: {} blocks ({}) found in {}",
        s.blocks,
        mib(disk_bytes),
        dir.display()
    )];
    if s.foreign > 0 {
        lines.push(format!(
            "warning: prefix cache: {} files in {} belong to another model, KV type, block size or prefill policy: left alone, never used",
            s.foreign,
            dir.display()
        ));
    }
    if s.removed > 0 {
        lines.push(format!(
            "warning: prefix cache: {} damaged files in {} removed",
            s.removed,
            dir.display()
        ));
    }
    if s.evicted > 0 {
        lines.push(format!(
            "prefix cache: {} blocks removed to keep to --cache-disk",
            s.evicted
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_like_llama_server_and_like_sizes() {
        assert_eq!(parse_budget("4096").unwrap(), 4096 << 20);
        assert_eq!(parse_budget("0").unwrap(), 0);
        assert_eq!(parse_budget("-1").unwrap(), u64::MAX);
        assert_eq!(parse_budget("2G").unwrap(), 2 << 30);
        assert_eq!(parse_budget("512MiB").unwrap(), 512 << 20);
        assert!(parse_budget("lots").unwrap_err().contains("not a size"));
        assert!(parse_budget("-5").is_err());
        assert!(parse_budget("99999999999999999999").is_err());
    }
}
