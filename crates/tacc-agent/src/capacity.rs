//! What this machine offers: CPUs, memory and GPUs.

use tacc_core::Resources;

use crate::gpus::detect_gpus;

/// CPUs and memory of this machine, and its NVIDIA GPUs if NVML finds any.
pub fn detect_capacity() -> (Resources, Option<String>) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_mem_total(&text))
        .unwrap_or(1 << 30);
    let (gpus, gpu_type) = detect_gpus();
    (Resources::new(cpus * 1000, memory, gpus), gpu_type)
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_total() {
        assert_eq!(
            parse_mem_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
            Some(24_576_000 * 1024)
        );
        assert_eq!(parse_mem_total("nothing"), None);
    }
}
