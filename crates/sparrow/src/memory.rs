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
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        kib.checked_mul(1024)
    };
    let ram = field("MemTotal:")?;
    Some(ram.saturating_add(field("SwapTotal:").unwrap_or(0)))
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
    }
}
