//! Task groups on the command line: `tcloud ps` folds each array into one line with its
//! elements counted by state (`ps g12` or `ps --expand` lists the elements), `cancel g12`,
//! `rerun g12 --failed`, following an array to its end, and `tcloud history`.
//!
//! Names and reasons may come from other users or tasks: they go through
//! [`crate::sanitize`] before reaching the terminal.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;
use tacc_client::{Client, HistoryQuery};
use tacc_core::{GroupId, TaskId, TaskState, Timestamp};
use tacc_proto::{GroupDetail, GroupView};

use super::Ctx;
use crate::errors::{CliError, TASK_FAILED};
use crate::format::{now, out, out_json, precise_duration, print_table, short_duration, table};
use crate::sanitize::{field, opt_field};

pub(crate) const POLL: Duration = Duration::from_millis(250);
/// Following a group: the wait between polls per element still unfinished, and its cap.
/// Each poll makes the server count the group's elements by state (a scan of the group's
/// index range), so a poll costs in proportion to the group's size: a big group is
/// polled less often while many elements remain (100,000 unfinished: every 2 s) and as
/// often as a small one (every 250 ms) once 12,500 or fewer remain, so its end is seen
/// as soon.
const FOLLOW_POLL_PER_UNFINISHED: Duration = Duration::from_micros(20);
const FOLLOW_POLL_MAX: Duration = Duration::from_secs(2);
/// How long one read of a followed array waits for its last element to end.
const FOLLOW_WAIT: Duration = Duration::from_secs(25);
/// How long `cancel g12` waits for the elements to stop.
const CANCEL_DEADLINE: Duration = Duration::from_secs(30);

/// A task or a task group, as `cancel` and `rerun` take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Task(TaskId),
    Group(GroupId),
}

/// `12` is a task, `g12` a group.
pub fn parse_target(text: &str) -> Result<Target, String> {
    let trimmed = text.trim();
    if trimmed.starts_with(['g', 'G']) {
        return trimmed
            .parse::<GroupId>()
            .map(Target::Group)
            .map_err(|e| e.to_string());
    }
    trimmed
        .parse::<TaskId>()
        .map(Target::Task)
        .map_err(|e| format!("{e}; a task group is written `g12`"))
}

/// `RUNNING 2 · QUEUED 990 · SUCCEEDED 8`, in the order of a task's life; for a
/// pipeline, each stage's state in file order: `gen cached · train running · eval queued`.
pub fn counts_text(group: &GroupView) -> String {
    if !group.stages.is_empty() {
        return group
            .stages
            .iter()
            .map(|stage| format!("{} {}", field(&stage.name), stage.state))
            .collect::<Vec<_>>()
            .join(" · ");
    }
    TaskState::ALL
        .iter()
        .filter_map(|state| {
            let n = group.counts.get(state)?;
            Some(format!("{} {n}", state.as_str().to_uppercase()))
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

/// The one-line form of a group, e.g. `g12  sweep-lr  array 1000  RUNNING 2 · QUEUED 998`.
fn group_row(group: &GroupView, now: Timestamp) -> [String; 6] {
    let mut kind = format!("{} {}", group.kind, group.size);
    if let Some(of) = group.rerun_of {
        kind.push_str(&format!(" (rerun of {of})"));
    }
    [
        group.id.to_string(),
        field(&group.name),
        field(&group.user),
        kind,
        short_duration(now.millis_since(group.created_at)),
        counts_text(group),
    ]
}

/// The groups part of `tcloud ps`: one line per group, then (with `expand`) its elements.
pub async fn print_groups(client: &Client, groups: &[GroupView], expand: bool) -> Result<()> {
    let now = now();
    let mut t = table(["GROUP", "NAME", "USER", "KIND", "AGE", "ELEMENTS"]);
    for group in groups {
        t.add_row(group_row(group, now));
    }
    print_table(&t)?;
    if expand {
        for group in groups {
            let detail = client.get_group(group.id).await?;
            out("")?;
            print_elements(&detail)?;
        }
    }
    Ok(())
}

/// A pipeline's stages: what each ran as (or reused), where it stands, why.
fn print_stages(detail: &GroupDetail) -> Result<()> {
    out(format!(
        "{} {} (pipeline, {} stages)",
        detail.group.id,
        field(&detail.group.name),
        detail.group.stages.len()
    ))?;
    let mut t = table(["STAGE", "STATE", "RUN", "NEEDS", "REASON"]);
    for stage in &detail.group.stages {
        let run = match (stage.task, stage.group) {
            (Some(task), _) => format!("task {task}"),
            (None, Some(group)) => {
                let counts = TaskState::ALL
                    .iter()
                    .filter_map(|state| {
                        let n = stage.counts.get(state)?;
                        Some(format!("{} {n}", state.as_str().to_uppercase()))
                    })
                    .collect::<Vec<_>>()
                    .join(" · ");
                let kind = if stage.sweep { "sweep" } else { "array" };
                format!("{kind} {group} {counts}")
            }
            (None, None) => "-".into(),
        };
        let needs = if stage.needs.is_empty() {
            "-".to_string()
        } else {
            stage
                .needs
                .iter()
                .map(|n| field(n))
                .collect::<Vec<_>>()
                .join(",")
        };
        t.add_row([
            field(&stage.name),
            stage.state.clone(),
            run,
            needs,
            opt_field(stage.reason.as_deref()),
        ]);
    }
    print_table(&t)?;
    Ok(())
}

fn print_elements(detail: &GroupDetail) -> Result<()> {
    if !detail.group.stages.is_empty() {
        return print_stages(detail);
    }
    let now = now();
    out(format!(
        "{} {} ({}): {}",
        detail.group.id,
        field(&detail.group.name),
        detail.group.kind,
        counts_text(&detail.group)
    ))?;
    let mut t = table(["INDEX", "TASK", "STATE", "TRY", "TIME", "EXIT", "REASON"]);
    for element in &detail.elements {
        let time = match (element.started_at, element.finished_at) {
            (Some(started), Some(finished)) => precise_duration(finished.millis_since(started)),
            (Some(started), None) => precise_duration(now.millis_since(started)),
            _ => "-".into(),
        };
        t.add_row([
            element.index.to_string(),
            element.task_id.to_string(),
            element.state.to_string(),
            element.attempt.to_string(),
            time,
            element
                .exit_code
                .map_or_else(|| "-".into(), |c| c.to_string()),
            opt_field(element.reason.as_deref()),
        ]);
    }
    print_table(&t)?;
    Ok(())
}

/// `tcloud ps g12`: one group and its elements.
pub async fn ps_group(ctx: &Ctx, id: GroupId, as_json: bool) -> Result<()> {
    let detail = ctx.client()?.get_group(id).await?;
    if as_json {
        return out_json(&detail);
    }
    print_elements(&detail)
}

/// `tcloud cancel g12 …`: every unfinished element of each group; waits for them to stop
/// unless `wait` is false.
pub async fn cancel_groups(ctx: &Ctx, ids: &[GroupId], wait: bool, as_json: bool) -> Result<()> {
    let client = ctx.client()?;
    let mut rows = Vec::new();
    for &id in ids {
        let reply = client.cancel_group(id).await?;
        rows.push((id, reply.cancelled));
    }
    let deadline = Instant::now() + CANCEL_DEADLINE;
    let mut views = Vec::new();
    for &(id, _) in &rows {
        let mut summary = client.group_summary(id).await?;
        while wait && !summary.is_finished() && Instant::now() < deadline {
            tokio::time::sleep(POLL).await;
            summary = client.group_summary(id).await?;
        }
        views.push(summary);
    }
    if as_json {
        let json: Vec<_> = rows
            .iter()
            .zip(&views)
            .map(|((id, cancelled), view)| {
                json!({"group": id, "cancelled": cancelled, "counts": view.counts})
            })
            .collect();
        return out_json(&json);
    }
    for ((id, cancelled), view) in rows.iter().zip(&views) {
        out(format!(
            "{id}: cancelled {cancelled} unfinished element(s) — {}",
            counts_text(view)
        ))?;
    }
    if wait && views.iter().any(|v| !v.is_finished()) {
        return Err(CliError::silent(crate::errors::FAILURE).into());
    }
    Ok(())
}

/// `tcloud rerun g12 --failed`: a new group of the elements that failed, were cancelled or
/// were lost, with their indices.
pub async fn rerun_failed(ctx: &Ctx, id: GroupId, follow: bool, as_json: bool) -> Result<()> {
    let client = ctx.client()?;
    let reply = client.rerun_group_failed(id).await?;
    let Some(group) = reply.group else {
        return Err(anyhow::anyhow!(
            "the server answered a group rerun without a group; is it older than this tcloud?"
        ));
    };
    if as_json {
        out_json(&json!({
            "group": group.group,
            "rerun_of": id,
            "elements": group.elements,
            "first_task": group.first_task,
        }))?;
    } else {
        out(format!(
            "Submitted {}: {} element(s) of {id} that did not succeed, with their indices",
            group.group, group.elements
        ))?;
    }
    if follow {
        follow_group(&client, group.group).await?;
    }
    Ok(())
}

/// Wait for every element of a group to end; print one summary line and exit with 0 only
/// when all succeeded (a pipeline: when every stage succeeded or was cached).
pub async fn follow_group(client: &Client, id: GroupId) -> Result<()> {
    let started = Instant::now();
    let mut summary = client.group_summary(id).await?;
    if summary.kind == "sweep" {
        return super::sweeps::follow_sweep(client, id, started).await;
    }
    while !group_ended(&summary) {
        if summary.kind == "array" {
            // An array's elements all exist from the start: the server answers the
            // moment the last one ends. (Never faster than a poll: a server that does not
            // wait answers at once.)
            let asked = Instant::now();
            summary = client.group_summary_when_ended(id, FOLLOW_WAIT).await?;
            if !group_ended(&summary) {
                tokio::time::sleep(POLL.saturating_sub(asked.elapsed())).await;
            }
            continue;
        }
        tokio::time::sleep(follow_interval(&summary)).await;
        summary = client.group_summary(id).await?;
    }
    let detail = client.get_group(id).await?;
    let outcome = group_outcome(&detail);
    eprintln!(
        "{} {id} {} after {}: {}{}",
        detail.group.kind,
        if outcome.succeeded {
            "succeeded"
        } else {
            "ended"
        },
        precise_duration(started.elapsed().as_millis() as u64),
        counts_text(&detail.group),
        outcome.tally,
    );
    if outcome.succeeded {
        Ok(())
    } else {
        Err(CliError::silent(TASK_FAILED).into())
    }
}

/// How long a follower waits before polling `group` again (see
/// [`FOLLOW_POLL_PER_UNFINISHED`]).
fn follow_interval(group: &GroupView) -> Duration {
    let unfinished: u64 = group
        .counts
        .iter()
        .filter(|(state, _)| !state.is_terminal())
        .map(|(_, n)| *n)
        .sum();
    FOLLOW_POLL_PER_UNFINISHED
        .saturating_mul(u32::try_from(unfinished).unwrap_or(u32::MAX))
        .clamp(POLL, FOLLOW_POLL_MAX)
}

/// A pipeline stage's state that will not change: an ended task state, or `cached`.
/// (`empty`: a stage with no task, which nothing will start, counts as ended.)
fn stage_ended(state: &str) -> bool {
    matches!(state, "cached" | "empty") || state.parse::<TaskState>().is_ok_and(|s| s.is_terminal())
}

/// Every element has ended; a pipeline's every stage too (a sweep stage queues its later
/// trials only as earlier ones end, so its counts alone can look finished too early).
fn group_ended(group: &GroupView) -> bool {
    group.is_finished() && group.stages.iter().all(|s| stage_ended(&s.state))
}

/// How a followed group ended, judged from that group alone.
#[derive(Debug, PartialEq)]
struct GroupOutcome {
    succeeded: bool,
    /// What follows the counts: attempts and elements, or a pipeline's tasks.
    tally: String,
}

fn group_outcome(detail: &GroupDetail) -> GroupOutcome {
    let group = &detail.group;
    if group.kind == "pipeline" {
        // A pipeline is its stages: each succeeded or reused an earlier run's outputs
        // (cached). Its size counts stages, while its counts add up every task its stages
        // ran (a sweep's trials, an array's elements), so the two are never compared.
        let succeeded = !group.stages.is_empty()
            && group
                .stages
                .iter()
                .all(|s| s.state == "succeeded" || s.state == "cached");
        let tasks: u64 = group.counts.values().sum();
        let tally = if tasks == 0 {
            String::new()
        } else {
            format!(" ({tasks} task{} run)", if tasks == 1 { "" } else { "s" })
        };
        return GroupOutcome { succeeded, tally };
    }
    let attempts: u64 = detail.elements.iter().map(|e| u64::from(e.attempt.0)).sum();
    let succeeded = group
        .counts
        .get(&TaskState::Succeeded)
        .copied()
        .unwrap_or(0);
    GroupOutcome {
        succeeded: succeeded == u64::from(group.size),
        tally: format!(" ({attempts} attempts over {} elements)", group.size),
    }
}

/// `tcloud history`: ended tasks, newest end first, a page at a time.
#[allow(clippy::too_many_arguments)]
pub async fn history(
    ctx: &Ctx,
    name: Option<String>,
    states: Vec<TaskState>,
    since: Option<tacc_core::HumanDuration>,
    user: Option<String>,
    limit: Option<u32>,
    before: Option<String>,
    as_json: bool,
) -> Result<()> {
    let since = since.map(|ago| Timestamp(now().as_millis().saturating_sub(ago.as_secs() * 1000)));
    let page = ctx
        .client()?
        .history(&HistoryQuery {
            name,
            states,
            since,
            user,
            before,
            limit,
        })
        .await?;
    if as_json {
        return out_json(&page);
    }
    if page.tasks.is_empty() {
        out("no ended tasks match")?;
        return Ok(());
    }
    let now = now();
    let mut t = table([
        "ID", "NAME", "USER", "STATE", "ENDED", "TIME", "EXIT", "GROUP", "REASON",
    ]);
    for task in &page.tasks {
        let time = match (task.started_at, task.finished_at) {
            (Some(started), Some(finished)) => precise_duration(finished.millis_since(started)),
            _ => "-".into(),
        };
        let group = match (task.group, task.group_index) {
            (Some(group), Some(index)) => format!("{group}[{index}]"),
            _ => "-".into(),
        };
        t.add_row([
            task.id.to_string(),
            field(&task.name),
            field(&task.user),
            task.state.to_string(),
            task.finished_at.map_or_else(
                || "-".into(),
                |at| format!("{} ago", short_duration(now.millis_since(at))),
            ),
            time,
            task.exit_code.map_or_else(|| "-".into(), |c| c.to_string()),
            group,
            opt_field(task.reason.as_deref()),
        ]);
    }
    print_table(&t)?;
    if let Some(next) = &page.next {
        out(format!(
            "more: `tcloud history --before {next}` (with the same filters)"
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_tasks_or_groups() {
        assert_eq!(parse_target("12"), Ok(Target::Task(TaskId(12))));
        assert_eq!(parse_target("g12"), Ok(Target::Group(GroupId(12))));
        assert!(parse_target("gx").unwrap_err().contains("g12"));
        assert!(parse_target("x").unwrap_err().contains("g12"));
    }

    #[test]
    fn counts_follow_a_task_s_life() {
        let group = GroupView {
            id: GroupId(3),
            kind: "array".into(),
            name: "sweep".into(),
            user: "alice".into(),
            size: 10,
            counts: [(TaskState::Succeeded, 8), (TaskState::Running, 2)]
                .into_iter()
                .collect(),
            created_at: Timestamp(0),
            rerun_of: None,
            stages: Vec::new(),
        };
        assert_eq!(counts_text(&group), "RUNNING 2 · SUCCEEDED 8");
        assert!(!group.is_finished());
    }

    /// A big group is polled less often while much of it is unfinished, a small one (or
    /// the end of a big one) every 250 ms: the follower's load on the server, which
    /// counts the whole group per poll, stays bounded however big the array.
    #[test]
    fn a_big_group_is_followed_less_often_until_its_end_nears() {
        let with = |queued: u64, done: u64| GroupView {
            id: GroupId(3),
            kind: "array".into(),
            name: "a".into(),
            user: "alice".into(),
            size: (queued + done) as u32,
            counts: [(TaskState::Queued, queued), (TaskState::Succeeded, done)]
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
            created_at: Timestamp(0),
            rerun_of: None,
            stages: Vec::new(),
        };
        assert_eq!(follow_interval(&with(2_000, 0)), POLL);
        assert_eq!(follow_interval(&with(12_500, 87_500)), POLL);
        assert_eq!(
            follow_interval(&with(50_000, 50_000)),
            Duration::from_secs(1)
        );
        assert_eq!(follow_interval(&with(100_000, 0)), FOLLOW_POLL_MAX);
        assert_eq!(follow_interval(&with(10_000_000, 0)), FOLLOW_POLL_MAX);
        assert_eq!(follow_interval(&with(0, 100_000)), POLL);
    }

    fn stage(name: &str, state: &str) -> tacc_proto::StageView {
        tacc_proto::StageView {
            name: name.into(),
            needs: Vec::new(),
            state: state.into(),
            task: None,
            group: None,
            sweep: false,
            counts: Default::default(),
            reason: None,
        }
    }

    /// The demo pipeline: generate, a six-trial sweep with early stopping, evaluate. Its
    /// size counts 3 stages, its counts every task the stages ran.
    fn pipeline(stages: &[(&str, &str)], counts: &[(TaskState, u64)]) -> GroupDetail {
        GroupDetail {
            group: GroupView {
                id: GroupId(4),
                kind: "pipeline".into(),
                name: "demo-pipeline".into(),
                user: "alice".into(),
                size: 3,
                counts: counts.iter().copied().collect(),
                created_at: Timestamp(0),
                rerun_of: None,
                stages: stages.iter().map(|(n, s)| stage(n, s)).collect(),
            },
            elements: Vec::new(),
        }
    }

    #[test]
    fn a_pipeline_with_cached_stages_succeeded() {
        let detail = pipeline(
            &[
                ("generate", "cached"),
                ("train", "cached"),
                ("evaluate", "succeeded"),
            ],
            &[(TaskState::Succeeded, 1)],
        );
        assert!(group_ended(&detail.group));
        let outcome = group_outcome(&detail);
        assert!(outcome.succeeded, "{outcome:?}");
        assert_eq!(outcome.tally, " (1 task run)");
        assert_eq!(
            counts_text(&detail.group),
            "generate cached · train cached · evaluate succeeded"
        );
    }

    #[test]
    fn a_pipeline_is_judged_by_its_stages_not_by_counting_tasks_against_stages() {
        // Eight tasks ran (generate, six trials of which four were stopped early, evaluate)
        // in a pipeline of three stages.
        let detail = pipeline(
            &[
                ("generate", "succeeded"),
                ("train", "succeeded"),
                ("evaluate", "succeeded"),
            ],
            &[(TaskState::Succeeded, 4), (TaskState::Cancelled, 4)],
        );
        let outcome = group_outcome(&detail);
        assert!(outcome.succeeded, "{outcome:?}");
        assert_eq!(outcome.tally, " (8 tasks run)");
    }

    #[test]
    fn a_pipeline_with_a_failed_stage_did_not_succeed_and_an_open_one_has_not_ended() {
        let failed = pipeline(
            &[
                ("generate", "succeeded"),
                ("train", "failed"),
                ("evaluate", "cancelled"),
            ],
            &[(TaskState::Succeeded, 1), (TaskState::Failed, 6)],
        );
        assert!(group_ended(&failed.group));
        assert!(!group_outcome(&failed).succeeded);
        // The sweep's later trials are not queued yet: every task so far has ended, but
        // the stage has not.
        let open = pipeline(
            &[
                ("generate", "succeeded"),
                ("train", "queued"),
                ("evaluate", "queued"),
            ],
            &[(TaskState::Succeeded, 3)],
        );
        assert!(open.group.is_finished());
        assert!(!group_ended(&open.group));
    }
}
