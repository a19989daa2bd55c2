//! Memory readings calibration takes around each batch: the process's resident set and
//! its high-water mark (CPU), and a GPU's used memory (NVML).

/// Reads a `kB` field of /proc/self/status, in bytes.
fn status_field(name: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kb(&text, name)
}

/// Parses `Name:   1234 kB` out of a /proc status text, in bytes.
pub fn parse_status_kb(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix(':')?;
        let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kb * 1024)
    })
}

/// This process's resident memory now.
pub fn process_rss() -> Option<u64> {
    status_field("VmRSS")
}

/// This process's peak resident memory since start or the last [`reset_peak_rss`].
pub fn process_peak_rss() -> Option<u64> {
    status_field("VmHWM")
}

/// Resets the peak resident memory to the current one (Linux: `5` into clear_refs);
/// `false` where the kernel does not allow it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Memory used on GPU `index` now, through NVML (`None` without NVML or that GPU).
pub fn gpu_used_bytes(index: u32) -> Option<u64> {
    let nvml = nvml_wrapper::Nvml::init().ok()?;
    let dev = nvml.device_by_index(index).ok()?;
    dev.memory_info().ok().map(|m| m.used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_parse_in_bytes() {
        let t = "Name:\tnarrator\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(parse_status_kb(t, "VmRSS"), Some(1024 * 1024));
        assert_eq!(parse_status_kb(t, "VmHWM"), Some(2048 * 1024));
        assert_eq!(parse_status_kb(t, "VmSwap"), None);
    }

    #[test]
    fn the_peak_follows_a_large_allocation() {
        assert!(process_rss().is_some_and(|r| r > 0));
        let before = process_peak_rss().unwrap_or(0);
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        let after = process_peak_rss().unwrap_or(0);
        assert!(after >= before + (60 << 20), "{before} -> {after}");
        drop(big);
        if reset_peak_rss() {
            let reset = process_peak_rss().unwrap_or(u64::MAX);
            assert!(reset < after, "reset {reset} vs {after}");
        }
    }
}
