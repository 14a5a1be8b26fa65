//! Commands about tasks that already exist: `ps`, `show`, `logs`, `cancel`, and `nodes`
//! (their files: [`super::files`]).
//!
//! Every text field here may have been written by a task or by another user (names,
//! reasons, node names, output paths, the log itself): it goes through [`crate::sanitize`]
//! before it reaches the terminal. `--json` output needs nothing: JSON escapes control
//! characters.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::StreamExt;
use serde_json::json;
use tacc_client::{Client, TaskQuery};
use tacc_core::{TaskId, TaskState, Timestamp};
use tacc_proto::TaskView;

use super::Ctx;
use crate::errors::{CliError, FAILURE, NOT_FOUND, TASK_FAILED};
use crate::format::{
    self, ago, now, out, out_json, precise_duration, print_table, short_duration, table,
};
use crate::sanitize::{LogSanitizer, field, opt_field};

/// How long `logs -f` keeps trying to reconnect after the stream broke.
const RECONNECT_DEADLINE: Duration = Duration::from_secs(30);
/// How long `cancel` waits for tasks to stop.
const CANCEL_DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(200);

// ---------------------------------------------------------------- ps

#[allow(clippy::too_many_arguments)]
pub async fn ps(
    ctx: &Ctx,
    all: bool,
    state: Vec<TaskState>,
    user: Option<String>,
    limit: Option<u32>,
    group: Option<tacc_core::GroupId>,
    expand: bool,
    as_json: bool,
) -> Result<()> {
    if let Some(group) = group {
        return super::groups::ps_group(ctx, group, as_json).await;
    }
    let states = if !state.is_empty() {
        state
    } else if all {
        Vec::new()
    } else {
        vec![TaskState::Queued, TaskState::Starting, TaskState::Running]
    };
    let limit = limit.or(if all { Some(50) } else { None });
    let client = ctx.client()?;
    // Array elements are shown folded into their group's line (`--expand` lists them).
    let tasks = client
        .list_tasks(&TaskQuery {
            states: states.clone(),
            user: user.clone(),
            limit,
            ungrouped: true,
        })
        .await?;
    let mut groups = client.list_groups(all, user.as_deref()).await?;
    if !states.is_empty() {
        groups.retain(|g| g.counts.keys().any(|s| states.contains(s)));
    }
    if as_json {
        if expand {
            let mut details = Vec::with_capacity(groups.len());
            for group in &groups {
                details.push(client.get_group(group.id).await?);
            }
            return out_json(&json!({"tasks": tasks, "groups": details}));
        }
        return out_json(&json!({"tasks": tasks, "groups": groups}));
    }
    if !groups.is_empty() {
        super::groups::print_groups(&client, &groups, expand).await?;
        if tasks.is_empty() {
            return Ok(());
        }
        out("")?;
    }
    if tasks.is_empty() {
        let hint = if all {
            ""
        } else {
            " (`tcloud ps --all` shows finished ones too)"
        };
        out(format!("no tasks{hint}"))?;
        return Ok(());
    }
    let now = now();
    let mut t = table([
        "ID", "NAME", "USER", "STATE", "AGE", "TIME", "NODES", "START", "REASON",
    ]);
    for task in &tasks {
        t.add_row([
            task.id.to_string(),
            field(&task.name),
            field(&task.user),
            task.state.to_string(),
            short_duration(now.millis_since(task.submitted_at)),
            runtime(task, now)
                .map(precise_duration)
                .unwrap_or_else(|| "-".into()),
            nodes_text(task),
            estimated_start_text(task.estimated_start, now),
            opt_field(task.reason.as_deref()),
        ]);
    }
    print_table(&t)?;
    Ok(())
}

/// "in 5m" for a queued task's estimated start, "-" when there is none.
fn estimated_start_text(start: Option<tacc_core::Timestamp>, now: tacc_core::Timestamp) -> String {
    match start {
        Some(at) if at > now => format!("in {}", short_duration(at.millis_since(now))),
        Some(_) => "now".to_string(),
        None => "-".to_string(),
    }
}

/// `tcloud why ID`: the scheduler's explanation of a task.
pub async fn why(ctx: &Ctx, id: TaskId, as_json: bool) -> Result<()> {
    let client = ctx.client()?;
    let explanation = client.explain(id).await?;
    if as_json {
        return out_json(&explanation);
    }
    let now = now();
    let mut lines = vec![format!("task {id} is {}", explanation.state)];
    if let Some(reason) = &explanation.reason {
        let label = if explanation.state == TaskState::Queued {
            "waiting because"
        } else {
            "reason"
        };
        lines.push(format!("{label}: {}", field(reason)));
    }
    if let Some(position) = explanation.queue_position {
        lines.push(format!(
            "queue position: {} (0 is considered first)",
            position
        ));
    }
    if explanation.start_estimate.is_some() {
        lines.extend(super::estimate::lines(&explanation, now));
    } else if explanation.state == TaskState::Queued {
        lines.push(match explanation.estimated_start {
            Some(_) => format!(
                "estimated start: {}",
                estimated_start_text(explanation.estimated_start, now)
            ),
            None => "estimated start: unknown".to_string(),
        });
    }
    lines.push(format!("policy: {}", field(&explanation.policy)));
    for detail in &explanation.details {
        lines.push(format!("- {}", field(detail)));
    }
    if let Some(adaptive) = &explanation.adaptive {
        if explanation.state.is_active() && explanation.state != TaskState::Queued {
            lines.extend(super::adaptive::verdict_lines(adaptive));
        }
    }
    if explanation.state == TaskState::Queued {
        let spec = client.get_task(id).await?.spec;
        lines.extend(other_clusters(ctx, &spec, now).await);
    }
    out(lines.join("\n"))?;
    Ok(())
}

/// How long `tcloud why` waits for another cluster's answer.
const OTHER_CLUSTER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The what-if on the user's other cluster profiles (each with a token): when the same
/// task would start there if submitted now. A cluster that does not answer in a few
/// seconds, or refuses the question, is said so in a word.
async fn other_clusters(ctx: &Ctx, spec: &serde_json::Value, now: Timestamp) -> Vec<String> {
    let Ok(config) = crate::config::Config::load() else {
        return Vec::new();
    };
    let Ok(current) = ctx.target() else {
        return Vec::new();
    };
    // Asked all at once: a cluster that does not answer costs its wait once.
    let asked = config.file.clusters.iter().filter_map(|(name, cluster)| {
        let token = cluster.token()?;
        if super::same_url(&cluster.url, &current.url) {
            return None;
        }
        let client = super::pinned_client(&cluster.url, cluster.fingerprint.as_deref()).ok()?;
        let client = client.with_token(token.to_string());
        Some(async move {
            let said = match tokio::time::timeout(OTHER_CLUSTER_WAIT, client.estimate(spec)).await {
                Ok(Ok(answer)) => what_if_text(&answer, now),
                Ok(Err(e)) => format!("could not tell ({})", field(&e.to_string())),
                Err(_) => "did not answer in 3s".to_string(),
            };
            format!(
                "- on cluster {} ({}): {said}",
                field(name),
                field(&cluster.url)
            )
        })
    });
    let mut lines: Vec<String> = futures::future::join_all(asked).await;
    if !lines.is_empty() {
        lines.insert(0, "if submitted now to your other clusters:".to_string());
    }
    lines
}

/// What another cluster says of the task, in a few words.
fn what_if_text(answer: &tacc_proto::SubmitEstimate, now: Timestamp) -> String {
    if let Some(refused) = &answer.refused {
        return format!("refused ({})", field(refused));
    }
    if answer.starts_now {
        return "would start now".to_string();
    }
    match answer.estimate.as_ref().map(|e| &e.latest) {
        Some(tacc_proto::LatestStartView::At { at }) => format!(
            "would start {} at the latest",
            estimated_start_text(Some(*at), now)
        ),
        _ => "would wait, with no estimate".to_string(),
    }
}

/// Milliseconds the task has run (so far), if it started.
fn runtime(task: &TaskView, now: tacc_core::Timestamp) -> Option<u64> {
    let started = task.started_at?;
    Some(task.finished_at.unwrap_or(now).millis_since(started))
}

fn nodes_text(task: &TaskView) -> String {
    if task.nodes.is_empty() {
        format!("({})", task.num_nodes)
    } else {
        field(&task.nodes.join(","))
    }
}

// ---------------------------------------------------------------- show

pub async fn show(ctx: &Ctx, id: TaskId, as_json: bool, instruction: bool) -> Result<()> {
    let client = ctx.client()?;
    if instruction {
        let instruction = client.task_instruction(id).await?;
        return out_json(&instruction);
    }
    let task = client.get_task(id).await?;
    let events = client.task_events(id).await?;
    let outputs = client.list_outputs(id).await?;
    // A server without usage (older than `tcloud top`) shows none.
    let usage = client.task_usage(id).await.ok();
    let adaptive = usage.as_ref().and_then(|u| u.adaptive.clone());
    let (peaks, flags) = usage.map(|u| (u.peaks, u.flags)).unwrap_or_default();
    if as_json {
        let mut value = serde_json::to_value(&task)?;
        if let Some(object) = value.as_object_mut() {
            object.insert("events".into(), serde_json::to_value(&events)?);
            object.insert("outputs".into(), serde_json::to_value(&outputs)?);
            object.insert("peaks".into(), serde_json::to_value(&peaks)?);
            object.insert("flags".into(), serde_json::to_value(&flags)?);
            object.insert("adaptive".into(), serde_json::to_value(&adaptive)?);
        }
        return out_json(&value);
    }
    let now = now();
    let mut rows: Vec<(&str, String)> = vec![
        ("id", task.id.to_string()),
        ("name", field(&task.name)),
        ("user", field(&task.user)),
        ("state", {
            let mut state = task.state.to_string();
            if task.cancel_requested && !task.state.is_terminal() {
                state.push_str(" (cancel requested)");
            }
            state
        }),
    ];
    if let Some(reason) = &task.reason {
        rows.push(("reason", field(reason)));
    }
    if let Some(code) = task.exit_code {
        rows.push(("exit code", code.to_string()));
    }
    rows.push(("attempt", format!("{}/{}", task.attempt, task.max_attempts)));
    rows.push(("nodes", {
        if task.nodes.is_empty() {
            format!("{} (not placed yet)", task.num_nodes)
        } else {
            format!("{} ({})", task.num_nodes, field(&task.nodes.join(", ")))
        }
    }));
    if task.gpus.iter().any(|g| !g.is_empty()) {
        let gpus: Vec<String> = task
            .gpus
            .iter()
            .map(|g| g.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
            .collect();
        rows.push(("gpus", gpus.join(" | ")));
    }
    rows.push((
        "resources",
        format!(
            "{} per node",
            format::resources_with_share(
                &task.per_node,
                serde_json::from_value::<tacc_schema::TaskSpec>(task.spec.clone())
                    .ok()
                    .and_then(|spec| spec.resources.gpu_share_percent())
            )
        ),
    ));
    rows.push((
        "time limit",
        task.time_limit_secs
            .map(|s| precise_duration(s * 1000))
            .unwrap_or_else(|| "none".into()),
    ));
    rows.push(("snapshot", task.snapshot.short().to_string()));
    if let Some(source) = &task.source {
        rows.push(("source", field(source)));
    }
    rows.push(("submitted", ago(task.submitted_at, now)));
    if let Some(started) = task.started_at {
        rows.push((
            "started",
            format!(
                "{} (waited {})",
                ago(started, now),
                precise_duration(started.millis_since(task.submitted_at))
            ),
        ));
    }
    if let Some(finished) = task.finished_at {
        let ran = runtime(&task, now)
            .map(|ms| format!(" (ran {})", precise_duration(ms)))
            .unwrap_or_default();
        rows.push(("finished", format!("{}{ran}", ago(finished, now))));
    } else if let Some(ms) = runtime(&task, now) {
        rows.push(("running for", precise_duration(ms)));
    }
    if task.wait_for_capacity {
        rows.push((
            "capacity",
            "accepted to wait for a node that can hold it (--wait-for-capacity)".into(),
        ));
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in &rows {
        out(format!(
            "{:<width$}  {value}",
            format!("{key}:"),
            width = width + 1
        ))?;
    }
    // The spec says what was asked; these are what applies instead.
    if !task.overrides.is_empty() {
        out("")?;
        out("Changed by the platform (asked → applies):")?;
        for applied in &task.overrides {
            out(format!(
                "  {}: {} → {} ({})",
                field(&applied.field),
                field(applied.asked.as_deref().unwrap_or("not set")),
                field(&applied.applied),
                field(&applied.why)
            ))?;
        }
    }

    if let Some(adaptive) = &adaptive {
        if adaptive.allocation != adaptive.requested || !adaptive.series.is_empty() {
            out("")?;
            out("Adaptive allocation:")?;
            out(format!("  {}", super::adaptive::allocation_line(adaptive)))?;
            if !adaptive.series.is_empty() {
                for line in super::adaptive::history_lines(adaptive, 12) {
                    out(format!("  {line}"))?;
                }
            }
        }
    }

    out("")?;
    out("Events:")?;
    if events.is_empty() {
        out("  (none)")?;
    } else {
        let mut t = table(["TIME", "ATTEMPT", "STATE", "REASON"]);
        for event in &events {
            t.add_row([
                ago(event.at, now),
                event.attempt.to_string(),
                event.state.to_string(),
                opt_field(event.reason.as_deref()),
            ]);
        }
        print_table(&t)?;
    }

    out("")?;
    out("Outputs:")?;
    if outputs.is_empty() {
        out("  (none)")?;
    } else {
        // A path several ranks wrote is listed once per rank, as `rank-R/PATH`.
        let mut t = table(["PATH", "SIZE", "ATTEMPT", "RANK"]);
        for file in &outputs {
            let name = if file.name.is_empty() {
                &file.path
            } else {
                &file.name
            };
            t.add_row([
                field(name),
                format::size(file.size),
                file.attempt.to_string(),
                file.rank.to_string(),
            ]);
        }
        print_table(&t)?;
        out(format!("Download them with `tcloud download {id}`"))?;
    }
    super::top::print_peaks(&peaks, &flags)?;
    Ok(())
}

// ---------------------------------------------------------------- logs

/// How log bytes reach the terminal: made safe, or as they are (`--raw`).
#[derive(Debug)]
pub struct LogWriter {
    to_stderr: bool,
    /// `None` with `--raw`.
    sanitizer: Option<LogSanitizer>,
}

impl LogWriter {
    pub fn new(to_stderr: bool, raw: bool) -> Self {
        LogWriter {
            to_stderr,
            sanitizer: (!raw).then(LogSanitizer::new),
        }
    }

    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match &mut self.sanitizer {
            Some(sanitizer) => write_log(sanitizer.push(bytes).as_bytes(), self.to_stderr),
            None => write_log(bytes, self.to_stderr),
        }
    }

    /// The end of the log: a UTF-8 sequence cut off at the end is shown byte by byte.
    pub fn finish(&mut self) -> std::io::Result<()> {
        match &mut self.sanitizer {
            Some(sanitizer) => write_log(sanitizer.finish().as_bytes(), self.to_stderr),
            None => Ok(()),
        }
    }
}

fn write_log(bytes: &[u8], to_stderr: bool) -> std::io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    if to_stderr {
        let mut err = std::io::stderr().lock();
        err.write_all(bytes)?;
        err.flush()
    } else {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(bytes)?;
        stdout.flush()
    }
}

/// Streams the log from the start until the task has ended, reconnecting from the offset
/// reached when the stream breaks (a server restart), for up to 30 s at a time.
pub async fn stream_logs(client: &Client, id: TaskId, writer: &mut LogWriter) -> Result<TaskView> {
    let mut offset = 0u64;
    let mut broken_since: Option<Instant> = None;
    loop {
        let mut clean_end = false;
        match client.follow_logs(id, offset).await {
            Ok(stream) => {
                if broken_since.take().is_some() {
                    eprintln!("(reconnected; resuming the log at byte {offset})");
                }
                futures::pin_mut!(stream);
                clean_end = true;
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(bytes) => {
                            writer.write(&bytes)?;
                            offset += bytes.len() as u64;
                        }
                        Err(_) => {
                            clean_end = false;
                            break;
                        }
                    }
                }
            }
            Err(e) if e.is_unreachable() => {}
            Err(e) => return Err(e.into()),
        }
        match client.get_task(id).await {
            Ok(task) if task.state.is_terminal() => {
                // Output may have landed after the stream ended.
                if let Ok((tail, _)) = client.logs(id, offset).await {
                    writer.write(&tail)?;
                }
                writer.finish()?;
                return Ok(task);
            }
            Ok(_) if clean_end => {
                // The server closed the stream while the task runs (it is shutting down?).
                broken_since.get_or_insert_with(Instant::now);
            }
            Ok(_) => {
                broken_since.get_or_insert_with(Instant::now);
            }
            Err(e) if e.is_unreachable() => {
                let since = *broken_since.get_or_insert_with(|| {
                    eprintln!(
                        "(lost the connection to {}; reconnecting for up to {} s)",
                        client.base_url(),
                        RECONNECT_DEADLINE.as_secs()
                    );
                    Instant::now()
                });
                while client.health().await.is_err() {
                    if since.elapsed() >= RECONNECT_DEADLINE {
                        return Err(e.into());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(e) => return Err(e.into()),
        }
        if broken_since.is_some_and(|since| since.elapsed() >= RECONNECT_DEADLINE) {
            anyhow::bail!(
                "the log stream of task {id} keeps breaking; see the rest with `tcloud logs {id}`"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The line printed to stderr when a followed task ends. `starting_at`: when its last
/// attempt began preparing (environment, datasets, inputs) — the time before `started_at`
/// that the task's own run does not show, and that a user waited all the same.
pub fn outcome_line(task: &TaskView, starting_at: Option<Timestamp>) -> String {
    let mut line = format!("task {} {}", task.id, task.state);
    if task.max_attempts > 1 || task.attempt.0 > 1 {
        line.push_str(&format!(
            " on attempt {} of {}",
            task.attempt, task.max_attempts
        ));
    }
    if let Some(code) = task.exit_code {
        if task.state != TaskState::Succeeded {
            line.push_str(&format!(" (exit code {code})"));
        }
    }
    line.push_str(&took(starting_at, task.started_at, task.finished_at));
    if let Some(reason) = &task.reason {
        let repeats_code = task.exit_code.is_some() && reason.starts_with("exit code");
        if task.state != TaskState::Succeeded && !repeats_code {
            line.push_str(&format!(": {}", field(reason)));
        }
    }
    line
}

/// ` after 5.8s (5.2s preparing, 0.6s running)`: the whole wait from the start of
/// preparation, and its two parts; ` after 2.0s preparing` for an attempt that ended before
/// it ran; ` after 0.6s` when the preparation is not known.
fn took(
    starting_at: Option<Timestamp>,
    started_at: Option<Timestamp>,
    finished_at: Option<Timestamp>,
) -> String {
    let Some(finished) = finished_at else {
        return String::new();
    };
    match (starting_at, started_at) {
        (Some(starting), Some(started)) if started > starting => format!(
            " after {} ({} preparing, {} running)",
            format::tenths(finished.millis_since(starting)),
            format::tenths(started.millis_since(starting)),
            format::tenths(finished.millis_since(started)),
        ),
        (_, Some(started)) => format!(" after {}", format::tenths(finished.millis_since(started))),
        (Some(starting), None) => format!(
            " after {} preparing",
            format::tenths(finished.millis_since(starting))
        ),
        (None, None) => String::new(),
    }
}

/// When the task's current attempt began preparing: its last `starting` event.
async fn preparing_since(client: &Client, task: &TaskView) -> Option<Timestamp> {
    let events = client.task_events(task.id).await.ok()?;
    events
        .iter()
        .rev()
        .find(|e| e.attempt == task.attempt && e.state == TaskState::Starting)
        .map(|e| e.at)
}

/// Exit code for a task that has ended.
pub fn outcome_code(state: TaskState) -> u8 {
    if state == TaskState::Succeeded {
        0
    } else {
        TASK_FAILED
    }
}

/// Follows the log (made safe for the terminal) to the end, prints the outcome, and fails
/// with exit 5 unless it succeeded.
pub async fn follow_to_end(client: &Client, id: TaskId, log_to_stderr: bool) -> Result<()> {
    follow_to_end_with(client, id, &mut LogWriter::new(log_to_stderr, false)).await
}

async fn follow_to_end_with(client: &Client, id: TaskId, writer: &mut LogWriter) -> Result<()> {
    let task = stream_logs(client, id, writer).await?;
    let starting_at = preparing_since(client, &task).await;
    eprintln!("{}", outcome_line(&task, starting_at));
    match outcome_code(task.state) {
        0 => Ok(()),
        code => Err(CliError::silent(code).into()),
    }
}

pub async fn logs(ctx: &Ctx, id: TaskId, follow: bool, raw: bool) -> Result<()> {
    let client = ctx.client()?;
    let mut writer = LogWriter::new(false, raw);
    if follow {
        return follow_to_end_with(&client, id, &mut writer).await;
    }
    let (bytes, _) = client.logs(id, 0).await?;
    writer.write(&bytes)?;
    writer.finish()?;
    Ok(())
}

// ---------------------------------------------------------------- cancel

pub async fn cancel(ctx: &Ctx, ids: &[TaskId], wait: bool, as_json: bool) -> Result<()> {
    let client = ctx.client()?;
    let mut worst = 0u8;
    // id -> (state, changed, error)
    let mut results: BTreeMap<TaskId, (Option<TaskState>, bool, Option<String>)> = BTreeMap::new();
    for &id in ids {
        match client.cancel(id).await {
            Ok(reply) => {
                results.insert(id, (Some(reply.state), reply.changed, None));
            }
            Err(e) if e.is_unreachable() => return Err(e.into()),
            Err(e) => {
                let code = if e.code() == Some("not_found") {
                    NOT_FOUND
                } else {
                    FAILURE
                };
                worst = worst.max(code);
                results.insert(id, (None, false, Some(field(&e.to_string()))));
            }
        }
    }
    if wait {
        let deadline = Instant::now() + CANCEL_DEADLINE;
        loop {
            let pending: Vec<TaskId> = results
                .iter()
                .filter(|(_, (state, _, _))| state.is_some_and(|s| !s.is_terminal()))
                .map(|(id, _)| *id)
                .collect();
            if pending.is_empty() || Instant::now() >= deadline {
                break;
            }
            for id in pending {
                if let Ok(task) = client.get_task(id).await {
                    if let Some(entry) = results.get_mut(&id) {
                        entry.0 = Some(task.state);
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }
    let mut json_rows = Vec::new();
    for (id, (state, changed, error)) in &results {
        if as_json {
            json_rows
                .push(json!({"task_id": id, "state": state, "changed": changed, "error": error}));
            continue;
        }
        match (state, error) {
            (_, Some(error)) if error.contains(&format!("task {id}")) => {
                eprintln!("error: {error}")
            }
            (_, Some(error)) => eprintln!("error: task {id}: {error}"),
            (Some(state), None) if !changed => out(format!("task {id}: already {state}"))?,
            (Some(state), None) if state.is_terminal() => out(format!("task {id}: {state}"))?,
            (Some(state), None) if wait => {
                worst = worst.max(FAILURE);
                eprintln!(
                    "error: task {id}: cancel requested, but still {state} after {} s",
                    CANCEL_DEADLINE.as_secs()
                );
            }
            (Some(state), None) => out(format!("task {id}: cancel requested (now {state})"))?,
            (None, None) => {}
        }
    }
    if as_json {
        out_json(&json_rows)?;
    }
    if worst != 0 {
        return Err(CliError::silent(worst).into());
    }
    Ok(())
}

// ---------------------------------------------------------------- nodes

pub async fn nodes(ctx: &Ctx, as_json: bool) -> Result<()> {
    let client = ctx.client()?;
    let nodes = client.list_nodes().await?;
    if as_json {
        return out_json(&nodes);
    }
    if nodes.is_empty() {
        out(
            "no nodes have registered (a node appears when its agent starts: `taccd agent`, or `tcloud up` for this machine)",
        )?;
        return Ok(());
    }
    let now = now();
    let mut t = table(["NAME", "STATE", "CPUS", "MEMORY", "GPUS", "TASKS", "SEEN"]);
    for node in &nodes {
        let mut gpus = format!("{}/{}", node.allocated.gpus, node.capacity.gpus);
        if let Some(kind) = &node.gpu_type {
            gpus.push_str(&format!(" {}", field(kind)));
        }
        let tasks = if node.running_tasks.is_empty() {
            "-".to_string()
        } else {
            node.running_tasks
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        t.add_row([
            field(&node.name),
            field(&node.state),
            format!(
                "{}/{}",
                format::cpus(node.allocated.cpu_millis),
                format::cpus(node.capacity.cpu_millis)
            ),
            format!(
                "{}/{}",
                format::size(node.allocated.memory_bytes),
                format::size(node.capacity.memory_bytes)
            ),
            gpus,
            tasks,
            ago(node.last_seen, now),
        ]);
    }
    print_table(&t)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_codes() {
        assert_eq!(outcome_code(TaskState::Succeeded), 0);
        for state in [TaskState::Failed, TaskState::Cancelled, TaskState::Lost] {
            assert_eq!(outcome_code(state), TASK_FAILED);
        }
    }

    /// A task that waited 5.8 s for its environment and then ran for a moment: the line
    /// says both, never just `succeeded after 0s`.
    #[test]
    fn the_outcome_counts_the_preparation() {
        let at = |ms| Some(Timestamp::from_millis(ms));
        assert_eq!(
            took(at(1_000), at(6_800), at(6_900)),
            " after 5.9s (5.8s preparing, 0.1s running)"
        );
        assert_eq!(took(at(1_000), None, at(3_000)), " after 2.0s preparing");
        assert_eq!(took(None, at(1_000), at(1_600)), " after 0.6s");
        assert_eq!(took(at(1_000), at(1_000), at(1_600)), " after 0.6s");
        assert_eq!(took(at(1_000), at(2_000), None), "");
    }
}
