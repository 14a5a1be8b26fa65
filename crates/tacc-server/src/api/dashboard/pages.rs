//! The dashboard's pages: the cluster, the queue, users and groups, and a task (with its
//! events, attempts, resources, plots, outputs, live log and cancel button). Each page is
//! read from the same control plane and filtered by the same rules as the API (the guard
//! already checked the route's rule and, for a task, that it is the caller's).

use std::collections::BTreeMap;

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::response::Redirect;
use serde::Serialize;
use tacc_core::Role;

use super::super::prelude::*;
use super::plot::{self, Curve, Unit};
use super::render::{self, bytes, clock, cpus, relative, resources, trusted, v};
use super::session::Session;
use super::{Chrome, UiError, UiResult};

/// Bytes of a task's log its page shows without JavaScript (its end).
pub(crate) const LOG_TAIL_BYTES: u64 = 256 * 1024;
/// Tasks a list shows at most.
const LIST_LIMIT: u32 = 200;

#[derive(Debug, Serialize)]
struct NodeRow {
    name: String,
    state: String,
    last_seen: String,
    last_seen_at: String,
    capacity: String,
    allocated: String,
    gpu_type: String,
    gpus_total: u32,
    gpus_allocated: u32,
    gpus: Vec<GpuCell>,
    running: usize,
    visible_tasks: Vec<u64>,
    labels: Vec<String>,
}

#[derive(Debug, Serialize)]
struct GpuCell {
    index: u32,
    model: String,
    health: String,
    utilization: Option<u32>,
}

/// `GET /ui/`: the nodes, their state, what they hold and how busy their GPUs are.
pub(crate) async fn cluster(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    session: Option<Extension<Session>>,
) -> UiResult {
    let user = user_of(&caller)?;
    let control = &app.control;
    let now = crate::now();
    let gpu_use = control
        .usage
        .gpu_use_by_node(crate::usage::GPU_SAMPLE_FRESH);
    let mut rows = Vec::new();
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    let (mut gpus_total, mut gpus_allocated, mut busy_sum, mut busy_count) =
        (0u32, 0u32, 0u64, 0u64);
    for node in control.node_views().await {
        *states.entry(node.state.clone()).or_default() += 1;
        let mut visible = Vec::new();
        for task in &node.running_tasks {
            if visible_to(control, user, *task).await? {
                visible.push(task.0);
            }
        }
        let used = gpu_use.get(&node.id);
        let gpus: Vec<GpuCell> = node
            .gpus
            .iter()
            .map(|g| GpuCell {
                index: g.index,
                model: g.model.clone(),
                health: g.health.clone(),
                utilization: used.and_then(|u| u.utilization.get(&g.index).copied()),
            })
            .collect();
        for cell in &gpus {
            if let Some(u) = cell.utilization {
                busy_sum += u64::from(u);
                busy_count += 1;
            }
        }
        gpus_total += node.capacity.gpus;
        gpus_allocated += node.allocated.gpus;
        rows.push(NodeRow {
            last_seen: if node.state == "down" {
                relative(node.last_seen, now)
            } else {
                "now".into()
            },
            last_seen_at: clock(node.last_seen),
            capacity: resources(&node.capacity),
            allocated: resources(&node.allocated),
            gpu_type: node.gpu_type.clone().unwrap_or_default(),
            gpus_total: node.capacity.gpus,
            gpus_allocated: node.allocated.gpus,
            gpus,
            running: node.running_tasks.len(),
            visible_tasks: visible,
            labels: node
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
            name: node.name,
            state: node.state,
        });
    }
    let context = minijinja::context! {
        chrome => v(Chrome::new(user, session.as_deref(), "cluster")),
        nodes => v(rows),
        states => v(states),
        gpus_total => gpus_total,
        gpus_allocated => gpus_allocated,
        gpu_utilization => (busy_count > 0).then(|| busy_sum / busy_count),
    };
    Ok(render::page(StatusCode::OK, "cluster.html", context)?)
}

async fn visible_to(control: &Control, user: &UserCaller, task: TaskId) -> ApiResult<bool> {
    if user.role == Role::Admin {
        return Ok(true);
    }
    let Some(record) = control.query().task(task).await? else {
        return Ok(false);
    };
    let group = control.auth.group_of(&record.user).await?;
    Ok(crate::auth::may_act_for(
        user,
        &record.user,
        group.as_deref(),
    ))
}

#[derive(Debug, Serialize)]
struct TaskRow {
    id: u64,
    name: String,
    user: String,
    state: &'static str,
    reason: String,
    resources: String,
    submitted: String,
    waited: String,
    estimated_start: String,
    nodes: String,
}

fn task_row(view: &TaskView, now: tacc_core::Timestamp) -> TaskRow {
    TaskRow {
        id: view.id.0,
        name: view.name.clone(),
        user: view.user.clone(),
        state: view.state.as_str(),
        reason: view.reason.clone().unwrap_or_default(),
        resources: if view.num_nodes > 1 {
            format!("{} × {}", view.num_nodes, resources(&view.per_node))
        } else {
            resources(&view.per_node)
        },
        submitted: clock(view.submitted_at),
        waited: relative(view.submitted_at, now),
        estimated_start: match view.estimated_start {
            Some(at) if at <= now => "now".into(),
            Some(at) => format!("{} ({})", relative(at, now), clock(at)),
            None => "unknown".into(),
        },
        nodes: view.nodes.join(", "),
    }
}

/// `GET /ui/queue`: queued tasks with why they wait and when they should start, what
/// runs, and what ended last — the caller's tasks only (their group's as its admin, all
/// as an admin).
pub(crate) async fn queue(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    session: Option<Extension<Session>>,
) -> UiResult {
    let user = user_of(&caller)?;
    let control = &app.control;
    let now = crate::now();
    let list = |states: Vec<TaskState>| {
        super::super::tasks::visible_tasks(
            control,
            user,
            tacc_store::TaskFilter {
                states,
                ..Default::default()
            },
            None,
            Some(LIST_LIMIT),
        )
    };
    let mut queued = Vec::new();
    for record in list(vec![TaskState::Queued]).await? {
        queued.push(task_row(
            &super::super::tasks::task_view(&app, record).await,
            now,
        ));
    }
    let mut active = Vec::new();
    for record in list(vec![TaskState::Starting, TaskState::Running]).await? {
        active.push(task_row(
            &super::super::tasks::task_view(&app, record).await,
            now,
        ));
    }
    let mut ended = Vec::new();
    let terminal = vec![
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Cancelled,
        TaskState::Lost,
    ];
    let recent = super::super::tasks::visible_tasks(
        control,
        user,
        tacc_store::TaskFilter {
            states: terminal,
            ..Default::default()
        },
        None,
        Some(20),
    )
    .await?;
    for record in recent {
        ended.push(task_row(
            &super::super::tasks::task_view(&app, record).await,
            now,
        ));
    }
    let context = minijinja::context! {
        chrome => v(Chrome::new(user, session.as_deref(), "queue")),
        queued => v(queued),
        active => v(active),
        ended => v(ended),
        policy => control.config.policy.clone(),
    };
    Ok(render::page(StatusCode::OK, "queue.html", context)?)
}

/// `GET /ui/accounts`: users and groups, their quotas and shares, what they hold now.
pub(crate) async fn accounts(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    session: Option<Extension<Session>>,
) -> UiResult {
    let user = user_of(&caller)?;
    let page = super::accounts::build(&app.control, &app.accounting, user).await?;
    let context = minijinja::context! {
        chrome => v(Chrome::new(user, session.as_deref(), "accounts")),
        page => v(page),
    };
    Ok(render::page(StatusCode::OK, "accounts.html", context)?)
}

#[derive(Debug, Serialize)]
struct EventRow {
    at: String,
    attempt: u32,
    state: &'static str,
    reason: String,
}

#[derive(Debug, Serialize)]
struct AttemptRow {
    attempt: u32,
    started: String,
    ended: String,
    state: &'static str,
    reason: String,
}

#[derive(Debug, Serialize)]
struct RankRow {
    attempt: u32,
    rank: u32,
    node: String,
    cpu: String,
    memory: String,
    gpu: String,
    gpu_memory: String,
    at: String,
}

#[derive(Debug, Serialize)]
struct OutputRow {
    name: String,
    size: String,
    attempt: u32,
    rank: u32,
    href: String,
}

/// A path made safe for a URL, segment by segment (`/` kept).
pub(crate) fn url_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for byte in path.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(byte as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// The attempts of a task, from its events: when each began and how it ended.
fn attempts_of(events: &[tacc_store::TaskEvent]) -> Vec<AttemptRow> {
    let mut rows: BTreeMap<u32, AttemptRow> = BTreeMap::new();
    for event in events.iter().filter(|e| e.attempt.0 > 0) {
        let row = rows.entry(event.attempt.0).or_insert_with(|| AttemptRow {
            attempt: event.attempt.0,
            started: clock(event.at),
            ended: String::new(),
            state: event.state.as_str(),
            reason: String::new(),
        });
        // Back in the queue after it ran (lost, preempted): that attempt ended there.
        let requeued = event.state == TaskState::Queued && row.state != "queued";
        row.state = event.state.as_str();
        row.reason = event.reason.clone().unwrap_or_default();
        if event.state.is_terminal() || requeued {
            row.ended = clock(event.at);
        }
    }
    rows.into_values().collect()
}

#[derive(Debug, Deserialize)]
pub(crate) struct TaskQuery {
    /// The attempt whose curves to plot (the current one when absent).
    attempt: Option<u32>,
}

/// `GET /ui/tasks/{id}`: everything about one task.
pub(crate) async fn task(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    session: Option<Extension<Session>>,
    Path(id): Path<u64>,
    Query(query): Query<TaskQuery>,
) -> UiResult {
    let user = user_of(&caller)?;
    let control = &app.control;
    let now = crate::now();
    let task = TaskId(id);
    let record = super::super::tasks::load(control, task).await?;
    let view = super::super::tasks::task_view(&app, record).await;
    let explanation = if view.state == TaskState::Queued {
        Some(control.explain(task, &app.estimates).await?)
    } else {
        None
    };
    let events = control.query().task_events(task).await?;
    let attempts = attempts_of(&events);
    let events: Vec<EventRow> = events
        .iter()
        .map(|e| EventRow {
            at: clock(e.at),
            attempt: e.attempt.0,
            state: e.state.as_str(),
            reason: e.reason.clone().unwrap_or_default(),
        })
        .collect();
    let usage = app.usage.task_usage(control, task).await?;
    let mut ranks: Vec<RankRow> = usage
        .ranks
        .iter()
        .map(|r| RankRow {
            attempt: usage.attempt.0,
            rank: r.node_rank,
            node: r.node.clone(),
            cpu: r.cpu_millis_used.map_or("—".into(), cpus),
            memory: r.memory_bytes.map_or("—".into(), bytes),
            gpu: if r.gpus.is_empty() {
                "—".into()
            } else {
                r.gpus
                    .iter()
                    .map(|g| format!("#{} {}%", g.index, g.utilization_percent))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            gpu_memory: if r.gpus.is_empty() {
                "—".into()
            } else {
                bytes(r.gpus.iter().map(|g| g.memory_used_bytes).sum())
            },
            at: relative(r.at, now),
        })
        .collect();
    ranks.sort_by_key(|r| r.rank);
    let peaks: Vec<RankRow> = usage
        .peaks
        .iter()
        .map(|p| RankRow {
            attempt: p.attempt.0,
            rank: p.node_rank,
            node: p.node.clone(),
            cpu: cpus(p.cpu_millis),
            memory: bytes(p.memory_bytes),
            gpu: format!("{}%", p.gpu_utilization_percent),
            gpu_memory: bytes(p.gpu_memory_bytes),
            at: clock(p.at),
        })
        .collect();
    let flags: Vec<String> = usage.flags.iter().map(|f| f.message.clone()).collect();
    let plotted = AttemptNo(query.attempt.unwrap_or(view.attempt.0));
    let charts = charts(control, task, plotted);
    let outputs = control.query().outputs(task).await?;
    let names = super::super::outputs::listed_names(&outputs);
    let outputs: Vec<OutputRow> = outputs
        .into_iter()
        .zip(names)
        .map(|(o, name)| OutputRow {
            href: format!(
                "/v1/tasks/{id}/outputs/{}/{}?rank={}",
                o.attempt.0,
                url_path(&o.path),
                o.rank
            ),
            name,
            size: bytes(o.size),
            attempt: o.attempt.0,
            rank: o.rank,
        })
        .collect();
    let log = log_tail(control, task)?;
    let context = minijinja::context! {
        chrome => v(Chrome::new(user, session.as_deref(), "queue")),
        task => minijinja::context! {
            id => id,
            name => view.name,
            user => view.user,
            state => view.state.as_str(),
            active => !view.state.is_terminal(),
            running => view.state == TaskState::Running,
            ranks => view.num_nodes,
            reason => view.reason.unwrap_or_default(),
            exit_code => view.exit_code,
            attempt => view.attempt.0,
            max_attempts => view.max_attempts,
            nodes => view.nodes.join(", "),
            resources => if view.num_nodes > 1 {
                format!("{} × {}", view.num_nodes, resources(&view.per_node))
            } else {
                resources(&view.per_node)
            },
            submitted => clock(view.submitted_at),
            started => view.started_at.map(clock),
            finished => view.finished_at.map(clock),
            estimated_start => view.estimated_start.map(|at| format!("{} ({})", relative(at, now), clock(at))),
            cancel_requested => view.cancel_requested,
            source => view.source,
        },
        explanation => explanation.map(|e| {
            let estimate = super::estimate::lines(&e, now);
            minijinja::context! {
                position => e.queue_position,
                policy => e.policy,
                details => e.details,
                estimate => estimate,
            }
        }),
        events => v(events),
        attempts => v(attempts),
        plotted_attempt => plotted.0,
        ranks => v(ranks),
        peaks => v(peaks),
        flags => flags,
        charts => charts,
        outputs => v(outputs),
        log => log,
    };
    Ok(render::page(StatusCode::OK, "task.html", context)?)
}

/// The CPU, memory and GPU charts of one attempt, one curve per rank.
fn charts(control: &Control, task: TaskId, attempt: AttemptNo) -> Vec<minijinja::Value> {
    let series = control.usage.series(task, attempt);
    let curves = |value: &dyn Fn(&crate::usage::SeriesPoint) -> Option<f64>| -> Vec<Curve> {
        series
            .iter()
            .map(|s| Curve {
                label: format!("rank {} ({})", s.node_rank, s.node),
                points: s
                    .points
                    .iter()
                    .filter_map(|p| value(p).map(|v| (p.at, v)))
                    .collect(),
            })
            .filter(|c| !c.points.is_empty())
            .collect()
    };
    let mut charts = vec![
        plot::line_chart("CPU (cores)", Unit::Cores, &curves(&|p| p.cpus)),
        plot::line_chart(
            "Memory",
            Unit::Bytes,
            &curves(&|p| p.memory_bytes.map(|b| b as f64)),
        ),
    ];
    let gpu = curves(&|p| p.gpu_percent);
    if !gpu.is_empty() {
        charts.push(plot::line_chart("GPU utilisation", Unit::Percent, &gpu));
        charts.push(plot::line_chart(
            "GPU memory",
            Unit::Bytes,
            &curves(&|p| p.gpu_memory_bytes.map(|b| b as f64)),
        ));
    }
    charts.into_iter().map(trusted).collect()
}

/// The end of a task's log (what the page shows without JavaScript), whether earlier
/// output was left out, and the offset the live stream resumes from.
fn log_tail(control: &Control, task: TaskId) -> ApiResult<minijinja::Value> {
    let length = control
        .logs
        .len(task)
        .map_err(|e| ServerError::Internal(format!("cannot read the log of task {task}: {e}")))?;
    let start = length.saturating_sub(LOG_TAIL_BYTES);
    let data = control
        .logs
        .read(task, start, (length - start) as usize)
        .map_err(|e| ServerError::Internal(format!("cannot read the log of task {task}: {e}")))?;
    let mut text = String::from_utf8_lossy(&data).into_owned();
    let mut skipped = start;
    if start > 0 {
        // Start at a line, not in the middle of one.
        if let Some(newline) = text.find('\n') {
            skipped += newline as u64 + 1;
            text.drain(..=newline);
        }
    }
    Ok(minijinja::context! {
        text => text,
        skipped => skipped,
        offset => start + data.len() as u64,
    })
}

#[derive(Debug, Deserialize)]
pub(crate) struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

/// The session a form came from, if its CSRF token is that session's: a form posted by
/// another site, or with no session, is refused.
fn checked_session(
    session: Option<Extension<Session>>,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Result<Session, UiError> {
    let stale = || {
        UiError(ServerError::BadRequest(
            "this form is stale or did not come from this dashboard (its CSRF token does \
             not match your session); reload the page and try again"
                .into(),
        ))
    };
    let Some(Extension(session)) = session else {
        return Err(stale());
    };
    let Ok(Form(form)) = form else {
        return Err(stale());
    };
    if session.csrf_matches(&form.csrf) {
        Ok(session)
    } else {
        Err(stale())
    }
}

/// `POST /ui/tasks/{id}/cancel`: the cancel button.
pub(crate) async fn cancel(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    session: Option<Extension<Session>>,
    Path(id): Path<u64>,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> UiResult {
    checked_session(session, form)?;
    let task = TaskId(id);
    let before = super::super::tasks::load(&app.control, task).await?;
    app.control
        .audit
        .audited(
            &caller,
            "task.cancel",
            format!("task {id}"),
            format!("from the dashboard, while {}", before.state.as_str()),
            app.control.cancel(task),
        )
        .await?;
    Ok(Redirect::to(&format!("/ui/tasks/{id}")).into_response())
}
