//! How much memory the machine has, so a state too big for it is refused up front with the
//! bytes it needs — instead of an allocation that aborts the process, or one the kernel
//! overcommits and kills later.

/// RAM plus swap in bytes (`MemTotal + SwapTotal` of `/proc/meminfo`), or `None` where that
/// cannot be read (then nothing is refused on this ground).
pub fn machine_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo_total(&text)
}

/// `MemTotal + SwapTotal` from the text of `/proc/meminfo` (values in KiB).
fn parse_meminfo_total(text: &str) -> Option<u64> {
    let ram = meminfo_field(text, "MemTotal:")?;
    Some(ram.saturating_add(meminfo_field(text, "SwapTotal:").unwrap_or(0)))
}

/// Memory this process could still take without pushing others out: the kernel's
/// `MemAvailable` (free memory plus what the page cache can give back), lowered to what
/// the process's memory cgroup still allows when it has a limit (a container on a small
/// board). `None` where neither can be read.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let avail = meminfo
        .as_deref()
        .and_then(|t| meminfo_field(t, "MemAvailable:"));
    match (avail, cgroup_headroom()) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// What this process's memory cgroup still allows, if it has a limit: cgroup v2
/// (`memory.max`, `memory.current`) or v1 (`memory.limit_in_bytes`,
/// `memory.usage_in_bytes`), counting the inactive page cache the cgroup would reclaim
/// first as available.
fn cgroup_headroom() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |dir: &std::path::Path, f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let at = |root: &str, rel: &str| std::path::Path::new(root).join(rel.trim_start_matches('/'));
    for line in own.lines() {
        // "0::/path" (v2), "4:memory:/path" (v1)
        let mut parts = line.splitn(3, ':');
        let (_, controllers, rel) = (parts.next()?, parts.next()?, parts.next()?);
        let (dir, files) = if controllers.is_empty() {
            let dir = at("/sys/fs/cgroup", rel);
            let dir = if dir.join("memory.max").exists() {
                dir
            } else {
                at("/sys/fs/cgroup/unified", rel)
            };
            (dir, ("memory.max", "memory.current", "inactive_file"))
        } else if controllers.split(',').any(|c| c == "memory") {
            let dir = at("/sys/fs/cgroup/memory", rel);
            (
                dir,
                (
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                    "total_inactive_file",
                ),
            )
        } else {
            continue;
        };
        let (Some(max), Some(cur)) = (read(&dir, files.0), read(&dir, files.1)) else {
            continue;
        };
        let stat = read(&dir, "memory.stat").unwrap_or_default();
        if let Some(h) = cgroup_headroom_from(&max, &cur, &stat, files.2) {
            return Some(h);
        }
    }
    None
}

/// The headroom from the text of the limit (`max`, or v1's huge "unlimited" value, for
/// none), the usage and `memory.stat` (whose `inactive` field counts as free).
fn cgroup_headroom_from(max: &str, current: &str, stat: &str, inactive: &str) -> Option<u64> {
    let max: u64 = max.trim().parse().ok()?; // "max": no limit
    if max >= 1 << 60 {
        return None; // v1's "no limit" (PAGE_COUNTER_MAX pages)
    }
    let current: u64 = current.trim().parse().ok()?;
    let reclaimable: u64 = stat
        .lines()
        .find_map(|l| {
            l.strip_prefix(inactive)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0);
    Some(max.saturating_sub(current.saturating_sub(reclaimable)))
}

/// A `/proc/meminfo` field in bytes (the file gives KiB).
fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// `bytes` for people: `512 B`, `3.0 KiB`, `12.5 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A size as people write it: bytes, or a number with a binary unit — `64M`, `1.5G`,
/// `512K`, `64MiB`, `2g` (K/M/G/T = 2¹⁰…2⁴⁰). For `--kv-ram-budget`.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit
        .to_ascii_lowercase()
        .trim_end_matches("ib")
        .trim_end_matches('b')
    {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(format!("'{text}' is not a size (use e.g. 64M, 1.5G, 4096)")),
    };
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a size (use e.g. 64M, 1.5G, 4096)"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= usize::MAX as f64 {
        return Err(format!("size '{text}' is out of range"));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units_and_refuse_junk() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size(" 512K "), Ok(512 << 10));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        for bad in ["", "M", "64X", "-1M", "1e400", "six"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains(bad.trim()), "{bad}: {e}");
        }
    }

    #[test]
    fn meminfo_totals_ram_and_swap() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nSwapTotal:       1024 kB\n";
        assert_eq!(parse_meminfo_total(text), Some((24_576_000 + 1024) * 1024));
        assert_eq!(parse_meminfo_total("MemTotal: 4 kB\n"), Some(4096));
        assert_eq!(parse_meminfo_total("SwapTotal: 4 kB\n"), None);
        assert_eq!(parse_meminfo_total("MemTotal: lots\n"), None);
    }

    #[test]
    fn available_memory_reads_meminfo_and_cgroup_limits() {
        let text = "MemTotal: 1000 kB\nMemAvailable:   300 kB\n";
        assert_eq!(meminfo_field(text, "MemAvailable:"), Some(300 * 1024));
        assert_eq!(meminfo_field(text, "SwapTotal:"), None);
        let f = "inactive_file";
        assert_eq!(cgroup_headroom_from("max\n", "123\n", "", f), None);
        assert_eq!(
            cgroup_headroom_from("9223372036854771712\n", "1\n", "", f),
            None
        );
        assert_eq!(cgroup_headroom_from("1000\n", "400\n", "", f), Some(600));
        assert_eq!(cgroup_headroom_from("1000\n", "4000\n", "", f), Some(0));
        assert_eq!(cgroup_headroom_from("junk", "1", "", f), None);
        // inactive page cache counts as available; a longer field name is not it
        let stat = "active_file 50\ninactive_file 300\n";
        assert_eq!(cgroup_headroom_from("1000\n", "900\n", stat, f), Some(400));
        let v1 = "inactive_file 7\ntotal_inactive_file 300\n";
        assert_eq!(
            cgroup_headroom_from("1000", "900", v1, "total_inactive_file"),
            Some(400)
        );
    }

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 10), "3.0 KiB");
        assert_eq!(human_bytes((25 << 30) / 2), "12.5 GiB");
        assert_eq!(human_bytes(u64::MAX), "16384.0 PiB");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_has_memory() {
        assert!(machine_memory().is_some_and(|b| b > 1 << 20));
        assert!(available_memory().is_some_and(|b| b > 0));
    }
}
