//! `tcloud usage`: what users and groups were allocated over a window (CPU-, GPU- and
//! memory-GiB-hours, tasks and attempts, like Slurm's `sreport`), optionally drawn as
//! stacked bars per hour, day or week (`--plot FILE.svg|FILE.png`); and with
//! `--fairshare`, the scheduler's fair-share standing, limits and what is held now (like
//! `sshare`). The server computes both and shows each caller only what is theirs to see.
//!
//! User and group names come from other people: they go through
//! [`crate::sanitize::field`] before they reach the terminal.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tacc_core::Timestamp;
use tacc_proto::{FairShareReport, QuotaLimits, UsageBy, UsageQuery, UsageReport, UsageRow};

use super::Ctx;
use crate::format::{self, cpus, out, print_table, table};
use crate::sanitize::field;

/// What `--plot` stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Metric {
    #[value(name = "gpu-hours")]
    Gpu,
    #[value(name = "cpu-hours")]
    Cpu,
    #[value(name = "memory-gib-hours")]
    Memory,
}

impl Metric {
    fn of(self, point: &tacc_proto::UsagePoint) -> f64 {
        match self {
            Metric::Gpu => point.gpu_hours,
            Metric::Cpu => point.cpu_hours,
            Metric::Memory => point.memory_gib_hours,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Metric::Gpu => "GPU-hours",
            Metric::Cpu => "CPU-hours",
            Metric::Memory => "memory GiB-hours",
        }
    }
}

/// The options of `tcloud usage` (without `--fairshare`).
#[derive(Debug, Clone)]
pub struct UsageOptions {
    pub query: UsageQuery,
    pub json: bool,
    pub plot: Option<PathBuf>,
    pub metric: Metric,
}

pub async fn usage(ctx: &Ctx, options: UsageOptions) -> Result<()> {
    let client = ctx.client()?;
    let report = client.usage_report(&options.query).await?;
    if options.json {
        format::out_json(&report)?;
    } else {
        render(&report)?;
    }
    if let Some(path) = &options.plot {
        plot(&report, options.metric, path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

pub async fn fairshare(ctx: &Ctx, json: bool) -> Result<()> {
    let client = ctx.client()?;
    let report = client.fairshare_report().await?;
    if json {
        format::out_json(&report)
    } else {
        render_fairshare(&report)
    }
}

/// RFC 3339 in UTC, to the second.
pub(super) fn utc(at: Timestamp) -> String {
    let format = time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::from_unix_timestamp((at.as_millis() / 1000) as i64)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .unwrap_or_else(|| format!("{}ms", at.as_millis()))
}

/// An amount to read: two decimals, or two significant digits for the small amounts of
/// short tasks.
fn hours(value: f64) -> String {
    if value == 0.0 {
        "0".into()
    } else if value < 0.01 {
        let decimals = ((-value.log10()).ceil() as usize + 1).min(9);
        format!("{value:.decimals$}")
    } else {
        format!("{value:.2}")
    }
}

fn render(report: &UsageReport) -> Result<()> {
    out(format!(
        "Allocated from {} to {} (running attempts counted up to now)",
        utc(report.since),
        utc(report.until)
    ))?;
    if report.rows.is_empty() {
        out("No task of yours (or that you may see) held resources in this window.")?;
        return Ok(());
    }
    let by_user = report.by == UsageBy::User;
    let mut header = vec![if by_user { "USER" } else { "GROUP" }];
    if by_user {
        header.push("GROUP");
    }
    header.extend([
        "TASKS",
        "ATTEMPTS",
        "RUNNING",
        "CPU-H",
        "GPU-H",
        "IDLE-GPU-H",
        "MEM-GiB-H",
    ]);
    let mut t = table(header);
    let line = |row: &UsageRow, total: bool| {
        let mut cells = vec![field(&row.name)];
        if by_user {
            cells.push(if total {
                String::new()
            } else {
                row.group.as_deref().map_or("-".into(), field)
            });
        }
        cells.extend([
            row.tasks.to_string(),
            row.attempts.to_string(),
            row.running.to_string(),
            hours(row.cpu_hours),
            hours(row.gpu_hours),
            hours(row.gpu_idle_hours),
            hours(row.memory_gib_hours),
        ]);
        cells
    };
    for row in &report.rows {
        t.add_row(line(row, false));
    }
    if report.rows.len() > 1 {
        t.add_row(line(&report.total, true));
    }
    print_table(&t)?;
    Ok(())
}

/// A bucket's label under its bar: the hour, the day, or the week's first day.
fn bucket_label(start: Timestamp, bucket_secs: u64, span_years: bool) -> String {
    let text = utc(start);
    // `2025-05-01T13:00:00Z`
    match (bucket_secs < 86_400, span_years) {
        (true, _) => format!("{} {}h", &text[5..10], &text[11..13]),
        (false, false) => text[5..10].to_string(),
        (false, true) => text[..10].to_string(),
    }
}

/// Stacked bars of `metric` per bucket, one stack per row of the report.
fn chart(report: &UsageReport, metric: Metric) -> tacc_plot::StackedBars {
    let span_years = report.until.millis_since(report.since) > 300 * 86_400_000;
    let categories = report
        .series
        .first()
        .map(|s| {
            s.points
                .iter()
                .map(|p| bucket_label(p.start, report.bucket_secs, span_years))
                .collect()
        })
        .unwrap_or_default();
    let stacks = report
        .series
        .iter()
        .map(|s| {
            (
                field(&s.name),
                s.points.iter().map(|p| metric.of(p)).collect(),
            )
        })
        .collect();
    let per = match report.bucket_secs {
        3600 => "hour",
        86_400 => "day",
        _ => "week",
    };
    tacc_plot::StackedBars {
        title: format!(
            "{} per {per} by {}, {} to {}",
            metric.label(),
            report.by.as_str(),
            &utc(report.since)[..10],
            &utc(report.until)[..10]
        ),
        y_label: metric.label().to_string(),
        categories,
        stacks,
        width: 960,
        height: 480,
    }
}

fn plot(report: &UsageReport, metric: Metric, path: &Path) -> Result<()> {
    if report.series.is_empty() {
        anyhow::bail!(
            "nothing to plot: no usage in this window (widen it with --since, e.g. --since 30d)"
        );
    }
    chart(report, metric)
        .write(path)
        .with_context(|| format!("cannot plot to {}", path.display()))
}

fn quota(limits: &QuotaLimits) -> String {
    let parts: Vec<String> = [
        limits.max_gpus.map(|v| format!("gpus<={v}")),
        limits.max_cpus.map(|v| format!("cpus<={v}")),
        limits.max_running_tasks.map(|v| format!("running<={v}")),
        limits.max_queued_tasks.map(|v| format!("queued<={v}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" ")
    }
}

fn render_fairshare(report: &FairShareReport) -> Result<()> {
    out(format!(
        "Fair share as of {} (policy {}, usage half-life {})",
        utc(report.at),
        field(&report.policy),
        format::precise_duration(report.half_life_secs * 1000)
    ))?;
    if report.groups.is_empty() && report.users.is_empty() {
        out("No task has been scheduled since the server started: nothing to show yet.")?;
        return Ok(());
    }
    let mut groups = table([
        "GROUP",
        "SHARE",
        "NORM-SHARE",
        "DECAYED-USAGE",
        "EFFECTIVE",
        "FAIRSHARE",
        "GPUS",
        "CPUS",
        "RUNNING",
        "QUEUED",
        "QUOTA",
    ]);
    for g in &report.groups {
        groups.add_row(vec![
            field(&g.group),
            format!("{}", g.share),
            format!("{:.3}", g.normalized_share),
            hours(g.decayed_usage),
            format!("{:.3}", g.effective_usage),
            format!("{:.3}", g.fairshare),
            g.allocated.gpus.to_string(),
            cpus(g.allocated.cpu_millis),
            g.allocated.running.to_string(),
            g.allocated.queued.to_string(),
            quota(&g.limits),
        ]);
    }
    print_table(&groups)?;
    out("")?;
    let mut users = table([
        "USER",
        "GROUP",
        "FAIRSHARE",
        "GPUS",
        "CPUS",
        "RUNNING",
        "QUEUED",
        "QUOTA",
    ]);
    for u in &report.users {
        users.add_row(vec![
            field(&u.user),
            u.group.as_deref().map_or("-".into(), field),
            u.fairshare.map_or("-".into(), |f| format!("{f:.3}")),
            u.allocated.gpus.to_string(),
            cpus(u.allocated.cpu_millis),
            u.allocated.running.to_string(),
            u.allocated.queued.to_string(),
            quota(&u.limits),
        ]);
    }
    print_table(&users)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_proto::{UsagePoint, UsageSeries};

    #[test]
    fn small_amounts_keep_their_digits() {
        assert_eq!(hours(0.0), "0");
        assert_eq!(hours(0.000_56), "0.00056");
        assert_eq!(hours(0.000_035), "0.000035");
        assert_eq!(hours(12.345), "12.35");
    }

    #[test]
    fn buckets_are_labelled_by_hour_day_or_date() {
        let at = Timestamp(1_746_104_400_000); // 2025-05-01T13:00:00Z
        assert_eq!(bucket_label(at, 3600, false), "05-01 13h");
        assert_eq!(bucket_label(at, 86_400, false), "05-01");
        assert_eq!(bucket_label(at, 7 * 86_400, true), "2025-05-01");
    }

    #[test]
    fn the_chart_stacks_each_row_s_series() {
        let point = |day: u64, gpu: f64| UsagePoint {
            start: Timestamp(1_746_057_600_000 + day * 86_400_000),
            gpu_hours: gpu,
            cpu_hours: 2.0 * gpu,
            memory_gib_hours: 0.0,
        };
        let report = UsageReport {
            since: Timestamp(1_746_057_600_000),
            until: Timestamp(1_746_057_600_000 + 2 * 86_400_000),
            bucket_secs: 86_400,
            series: vec![
                UsageSeries {
                    name: "alice".into(),
                    points: vec![point(0, 1.0), point(1, 0.0)],
                },
                UsageSeries {
                    name: "bob".into(),
                    points: vec![point(0, 0.5), point(1, 3.0)],
                },
            ],
            ..UsageReport::default()
        };
        let chart = chart(&report, Metric::Cpu);
        assert_eq!(chart.categories, vec!["05-01", "05-02"]);
        assert_eq!(
            chart.stacks,
            vec![
                ("alice".to_string(), vec![2.0, 0.0]),
                ("bob".to_string(), vec![1.0, 6.0])
            ]
        );
        assert_eq!(
            chart.title,
            "CPU-hours per day by user, 2025-05-01 to 2025-05-03"
        );
    }
}
