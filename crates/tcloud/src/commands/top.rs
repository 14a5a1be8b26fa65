//! `tcloud top`: what running tasks use, per task and per rank, refreshed like `top`:
//! CPU cores used against the cores allocated, memory against the limit, each GPU's
//! utilisation and memory, the node, when the rank last wrote output, and the flags the
//! server raises (the first failed rank, silent ranks). Also the peak-usage part of
//! `tcloud show`.
//!
//! Node names, task names and flag messages come from other people and from tasks: they
//! go through [`crate::sanitize::field`] before they reach the terminal.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Result;
use tacc_client::{Client, TaskQuery};
use tacc_core::{TaskId, TaskState};
use tacc_proto::{GpuSample, RankUsage, TaskUsage, UsageFlag, UsagePeakView};

use super::Ctx;
use crate::format::{self, ago, now, out, print_table, table};
use crate::sanitize::field;

pub async fn top(
    ctx: &Ctx,
    ids: Vec<TaskId>,
    as_json: bool,
    once: bool,
    interval: Duration,
) -> Result<()> {
    let client = ctx.client()?;
    let live = !once && std::io::stdout().is_terminal();
    loop {
        let usages = gather(&client, &ids).await?;
        if as_json {
            if once {
                format::out_json(&usages)?;
            } else {
                // One document a line, so a reader can follow the stream.
                out(serde_json::to_string(&usages)?)?;
            }
        } else {
            if live {
                // Home and clear, as `top` redraws.
                print!("\x1b[H\x1b[2J");
            }
            render(&usages, ids.is_empty(), (!once).then_some(interval))?;
        }
        if once {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        if !live && !as_json {
            out("")?;
        }
    }
}

/// The usage of the named tasks, or of every starting or running task the caller may see.
async fn gather(client: &Client, ids: &[TaskId]) -> Result<Vec<TaskUsage>> {
    if !ids.is_empty() {
        let mut usages = Vec::with_capacity(ids.len());
        for id in ids {
            usages.push(client.task_usage(*id).await?);
        }
        return Ok(usages);
    }
    let tasks = client
        .list_tasks(&TaskQuery {
            states: vec![TaskState::Starting, TaskState::Running],
            ..Default::default()
        })
        .await?;
    let mut usages = Vec::with_capacity(tasks.len());
    for task in tasks.iter().rev() {
        // A task that ended (or was removed) since the list was taken is left out.
        if let Ok(usage) = client.task_usage(task.id).await {
            usages.push(usage);
        }
    }
    Ok(usages)
}

fn render(usages: &[TaskUsage], listed: bool, refresh: Option<Duration>) -> Result<()> {
    let mut heading = format!(
        "{} task{}",
        usages.len(),
        if usages.len() == 1 { "" } else { "s" }
    );
    if listed {
        heading.push_str(" starting or running");
    }
    if let Some(every) = refresh {
        heading.push_str(&format!(
            ", every {}s (Ctrl-C to stop)",
            every.as_secs_f64()
        ));
    }
    out(heading)?;
    if usages.is_empty() {
        return Ok(());
    }
    let now = now();
    let mut t = table([
        "TASK", "NAME", "STATE", "RANK", "NODE", "CPU", "MEMORY", "GPU", "OUTPUT",
    ]);
    for usage in usages {
        if usage.ranks.is_empty() {
            t.add_row([
                usage.task_id.to_string(),
                field(&usage.name),
                usage.state.to_string(),
                "-".into(),
                "-".into(),
                format!("-/{}", format::cpus(usage.allocated.cpu_millis)),
                format!("-/{}", limit(usage.allocated.memory_bytes)),
                "-".into(),
                "(no sample yet)".into(),
            ]);
            continue;
        }
        for rank in &usage.ranks {
            t.add_row(rank_row(usage, rank, now));
        }
    }
    print_table(&t)?;
    for usage in usages {
        if let Some(adaptive) = &usage.adaptive {
            if let Some(verdict) = &adaptive.verdict {
                out(format!(
                    "task {}: {} — {}",
                    usage.task_id,
                    field(&verdict.bottleneck),
                    field(&verdict.evidence.join("; "))
                ))?;
            }
            if adaptive.allocation != adaptive.requested {
                out(format!(
                    "task {}: {}",
                    usage.task_id,
                    super::adaptive::allocation_line(adaptive)
                ))?;
            }
            // One task asked for by id: its recorded history too.
            if usages.len() == 1 && !listed && !adaptive.series.is_empty() {
                for line in super::adaptive::history_lines(adaptive, 10) {
                    out(line)?;
                }
            }
        }
        if !usage.finished_ranks.is_empty() {
            let ranks: Vec<String> = usage.finished_ranks.iter().map(u32::to_string).collect();
            out(format!(
                "task {}: rank {} finished its part; the attempt ends when every rank has",
                usage.task_id,
                ranks.join(", ")
            ))?;
        }
        for flag in &usage.flags {
            out(format!(
                "! task {}: {}",
                usage.task_id,
                field(&flag.message)
            ))?;
        }
    }
    Ok(())
}

fn rank_row(usage: &TaskUsage, rank: &RankUsage, now: tacc_core::Timestamp) -> [String; 9] {
    let cpu = rank
        .cpu_millis_used
        .map_or_else(|| "-".to_string(), format::cpus);
    let memory = rank
        .memory_bytes
        .map_or_else(|| "-".to_string(), format::size);
    [
        usage.task_id.to_string(),
        field(&usage.name),
        usage.state.to_string(),
        rank.node_rank.to_string(),
        field(&rank.node),
        format!("{cpu}/{}", format::cpus(usage.allocated.cpu_millis)),
        format!("{memory}/{}", limit(usage.allocated.memory_bytes)),
        gpus_text(&rank.gpus),
        rank.last_output_at
            .map_or_else(|| "none yet".to_string(), |at| ago(at, now)),
    ]
}

/// A memory limit; 0 is none.
fn limit(bytes: u64) -> String {
    if bytes == 0 {
        "-".into()
    } else {
        format::size(bytes)
    }
}

/// `0:90% 10GiB 1:40% 2GiB`, or `-` without GPUs.
fn gpus_text(gpus: &[GpuSample]) -> String {
    if gpus.is_empty() {
        return "-".into();
    }
    gpus.iter()
        .map(|g| {
            format!(
                "{}:{}% {}",
                g.index,
                g.utilization_percent,
                format::size(g.memory_used_bytes)
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The "Peak usage" part of `tcloud show`, and the flags.
pub fn print_peaks(peaks: &[UsagePeakView], flags: &[UsageFlag]) -> Result<()> {
    out("")?;
    out("Peak usage:")?;
    if peaks.is_empty() {
        out("  (none measured)")?;
    } else {
        let mut t = table([
            "ATTEMPT",
            "RANK",
            "NODE",
            "CPU",
            "MEMORY",
            "GPU",
            "GPU MEMORY",
        ]);
        for peak in peaks {
            t.add_row([
                peak.attempt.to_string(),
                peak.node_rank.to_string(),
                field(&peak.node),
                format::cpus(peak.cpu_millis),
                format::size(peak.memory_bytes),
                format!("{}%", peak.gpu_utilization_percent),
                format::size(peak.gpu_memory_bytes),
            ]);
        }
        print_table(&t)?;
    }
    for flag in flags {
        out(format!("! {}", field(&flag.message)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, Resources, Timestamp};

    #[test]
    fn a_rank_row_shows_use_against_allocation_and_makes_task_text_safe() {
        let usage = TaskUsage {
            task_id: TaskId(7),
            name: "evil\x1b]0;pwned\x07".into(),
            state: TaskState::Running,
            attempt: AttemptNo(1),
            allocated: Resources::new(2000, 4 << 30, 1),
            ranks: Vec::new(),
            peaks: Vec::new(),
            flags: Vec::new(),
            silent_after_secs: 300,
            adaptive: None,
            finished_ranks: Vec::new(),
        };
        let rank = RankUsage {
            node_rank: 1,
            node: "n\r2".into(),
            at: Timestamp(10_000),
            cpu_millis_used: Some(1500),
            cpu_throttled_ms: None,
            memory_bytes: Some(512 << 20),
            memory_peak_bytes: Some(600 << 20),
            gpus: vec![GpuSample {
                index: 3,
                utilization_percent: 90,
                memory_used_bytes: 10 << 30,
                memory_total_bytes: 80 << 30,
            }],
            last_output_at: Some(Timestamp(5_000)),
            quiet_secs: 5,
        };
        let row = rank_row(&usage, &rank, Timestamp(10_000));
        assert!(
            !row.iter()
                .any(|cell| cell.contains('\x1b') || cell.contains('\r'))
        );
        assert_eq!(row[4], "n^M2");
        assert_eq!(row[5], "1.5/2");
        assert_eq!(row[6], "512MiB/4GiB");
        assert_eq!(row[7], "3:90% 10GiB");
        assert_eq!(row[8], "5s ago");
        assert_eq!(gpus_text(&[]), "-");
        assert_eq!(limit(0), "-");
    }
}
