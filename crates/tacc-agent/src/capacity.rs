//! What this machine offers: CPUs, memory and GPUs.

use tacc_core::Resources;

/// CPUs and memory of this machine, and its NVIDIA GPUs if `nvidia-smi` finds any.
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

/// Count NVIDIA GPUs with `nvidia-smi`; none when it is missing or fails.
pub fn detect_gpus() -> (u32, Option<String>) {
    let output = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .output();
    match output {
        Ok(output) if output.status.success() => {
            parse_gpu_names(&String::from_utf8_lossy(&output.stdout))
        }
        _ => (0, None),
    }
}

fn parse_gpu_names(text: &str) -> (u32, Option<String>) {
    let names: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // "NVIDIA H100 80GB HBM3" → "H100": the model is what task files name in gpu_type.
    let model = names.first().map(|name| {
        name.split_whitespace()
            .find(|word| {
                word.chars().any(|c| c.is_ascii_digit())
                    && word.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            })
            .unwrap_or(name)
            .to_string()
    });
    (names.len() as u32, model)
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

    #[test]
    fn gpu_model_is_the_short_name() {
        assert_eq!(
            parse_gpu_names("NVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3\n"),
            (2, Some("H100".to_string()))
        );
        assert_eq!(
            parse_gpu_names("Tesla V100-SXM2-16GB\n"),
            (1, Some("V100-SXM2-16GB".to_string()))
        );
        assert_eq!(parse_gpu_names(""), (0, None));
    }
}
