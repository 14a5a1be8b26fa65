//! Formatting for people: durations, relative times, sizes, tables, and stdout helpers.

use std::io::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use comfy_table::{ContentArrangement, Table, presets};
use tacc_core::{ByteSize, Resources, Timestamp};

/// Milliseconds since the Unix epoch, now.
pub fn now() -> Timestamp {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Timestamp::from_millis(millis)
}

/// The largest whole unit only: `5s`, `3m`, `2h`, `4d` (for AGE columns).
pub fn short_duration(millis: u64) -> String {
    let secs = millis / 1000;
    if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m", secs / 60)
    } else if secs < 86_400 {
        format!("{}h", secs / 3600)
    } else {
        format!("{}d", secs / 86_400)
    }
}

/// Two units at most: `45s`, `3m12s`, `2h5m`, `3d4h`.
pub fn precise_duration(millis: u64) -> String {
    let secs = millis / 1000;
    let (big, big_unit, small, small_unit) = if secs < 60 {
        return format!("{secs}s");
    } else if secs < 3600 {
        (secs / 60, "m", secs % 60, "s")
    } else if secs < 86_400 {
        (secs / 3600, "h", (secs % 3600) / 60, "m")
    } else {
        (secs / 86_400, "d", (secs % 86_400) / 3600, "h")
    };
    if small == 0 {
        format!("{big}{big_unit}")
    } else {
        format!("{big}{big_unit}{small}{small_unit}")
    }
}

/// `5.8s` below a minute (tenths: a task that ran for a moment is not `0s`), else as
/// [`precise_duration`].
pub fn tenths(millis: u64) -> String {
    if millis < 60_000 {
        format!("{:.1}s", millis as f64 / 1000.0)
    } else {
        precise_duration(millis)
    }
}

/// `3m ago` (or `in 3m` for a time in the future, from clock skew).
pub fn ago(at: Timestamp, now: Timestamp) -> String {
    if at > now {
        let ahead = at.millis_since(now);
        if ahead < 1000 {
            return "just now".to_string();
        }
        return format!("in {}", short_duration(ahead));
    }
    let age = now.millis_since(at);
    if age < 1000 {
        "just now".to_string()
    } else {
        format!("{} ago", short_duration(age))
    }
}

pub fn size(bytes: u64) -> String {
    ByteSize::from_bytes(bytes).to_string()
}

pub fn cpus(cpu_millis: u64) -> String {
    if cpu_millis % 1000 == 0 {
        (cpu_millis / 1000).to_string()
    } else {
        format!("{:.1}", cpu_millis as f64 / 1000.0)
    }
}

/// `16 cpu, 64GiB, 4 gpu`.
pub fn resources(r: &Resources) -> String {
    let mut text = format!("{} cpu, {}", cpus(r.cpu_millis), size(r.memory_bytes));
    if r.gpus > 0 {
        text.push_str(&format!(", {} gpu", r.gpus));
    }
    text
}

/// [`resources`] with a share of one GPU (`gpus: 0.5`, `share_percent` 50) shown as
/// `0.5 gpu (shared)`.
pub fn resources_with_share(r: &Resources, share_percent: Option<u32>) -> String {
    let mut text = resources(r);
    if let Some(share) = share_percent.and_then(tacc_core::GpuCount::share) {
        text.push_str(&format!(", {share} gpu (shared)"));
    }
    text
}

/// A borderless table with a header row.
pub fn table<I, S>(header: I) -> Table
where
    I: IntoIterator<Item = S>,
    S: Into<comfy_table::Cell>,
{
    let mut table = Table::new();
    table
        .load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header);
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
}

/// Writes a table to stdout, trimming the padding at the end of each line.
pub fn print_table(table: &Table) -> io::Result<()> {
    let mut out = io::stdout().lock();
    for line in table.lines() {
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// Writes one line to stdout, reporting a closed pipe as an error instead of panicking.
pub fn out(text: impl AsRef<str>) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{}", text.as_ref())?;
    stdout.flush()
}

/// Pretty JSON on stdout.
pub fn out_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    out(serde_json::to_string_pretty(value)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_durations_use_the_largest_unit() {
        assert_eq!(short_duration(0), "0s");
        assert_eq!(short_duration(5_400), "5s");
        assert_eq!(short_duration(59_999), "59s");
        assert_eq!(short_duration(60_000), "1m");
        assert_eq!(short_duration(3 * 60_000 + 59_000), "3m");
        assert_eq!(short_duration(2 * 3_600_000 + 1), "2h");
        assert_eq!(short_duration(4 * 86_400_000), "4d");
    }

    #[test]
    fn precise_durations_show_two_units() {
        assert_eq!(precise_duration(45_000), "45s");
        assert_eq!(precise_duration(192_000), "3m12s");
        assert_eq!(precise_duration(180_000), "3m");
        assert_eq!(precise_duration(2 * 3_600_000 + 5 * 60_000 + 7_000), "2h5m");
        assert_eq!(precise_duration(3 * 86_400_000 + 4 * 3_600_000), "3d4h");
    }

    #[test]
    fn relative_times() {
        let now = Timestamp::from_secs(10_000);
        assert_eq!(ago(Timestamp::from_secs(10_000), now), "just now");
        assert_eq!(ago(Timestamp::from_secs(9_995), now), "5s ago");
        assert_eq!(ago(Timestamp::from_secs(10_000 - 180), now), "3m ago");
        assert_eq!(ago(Timestamp::from_secs(10_000 - 7_200), now), "2h ago");
        assert_eq!(ago(Timestamp::from_secs(10_005), now), "in 5s");
    }

    #[test]
    fn sizes_and_resources() {
        assert_eq!(size(512), "512B");
        assert_eq!(size(3 << 20), "3MiB");
        assert_eq!(cpus(500), "0.5");
        assert_eq!(
            resources(&Resources::new(16_000, 64 << 30, 4)),
            "16 cpu, 64GiB, 4 gpu"
        );
    }
}
