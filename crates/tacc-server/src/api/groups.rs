//! Task group routes (arrays: list with counts, show by element, cancel, rerun the failed
//! elements) and the history of ended tasks.

use tacc_core::{GroupId, Timestamp};
use tacc_proto::{
    ElementView, GroupCancelReply, GroupDetail, GroupRerun, GroupSubmitted, GroupView, HistoryPage,
};
use tacc_store::{GroupFilter, GroupRecord, HistoryFilter};

use super::prelude::*;
use super::tasks::task_view;

/// Groups `tcloud ps` shows besides those with unfinished elements: the latest few.
const RECENT_GROUPS: u32 = 20;
/// Most history rows one page holds.
const MAX_HISTORY_PAGE: u32 = 500;

async fn group_view(control: &Control, record: GroupRecord) -> ApiResult<GroupView> {
    let mut counts = control.query().group_counts(record.id).await?;
    let stages = if record.kind == tacc_store::GroupKind::Pipeline {
        let stages = control.facts.stage_views(record.id).await?;
        // A pipeline counts every stage's tasks, its array stages' elements included.
        for stage in stages.iter().filter(|s| s.state != "cached") {
            for (state, n) in &stage.counts {
                *counts.entry(*state).or_insert(0) += n;
            }
        }
        stages
    } else {
        Vec::new()
    };
    Ok(GroupView {
        stages,
        id: record.id,
        kind: record.kind.as_str().to_string(),
        rerun_of: record
            .spec
            .get("rerun_of")
            .and_then(serde_json::Value::as_u64)
            .map(GroupId),
        name: record.name,
        user: record.user,
        size: record.size,
        counts,
        created_at: record.created_at,
    })
}

fn group_id(text: &str) -> ApiResult<GroupId> {
    text.parse()
        .map_err(|e: tacc_core::CoreError| ServerError::BadRequest(e.to_string()))
}

async fn load_group(control: &Control, id: GroupId) -> ApiResult<GroupRecord> {
    control
        .query()
        .group(id)
        .await?
        .ok_or(ServerError::GroupNotFound(id))
}

#[derive(Debug, Deserialize)]
pub(super) struct GroupsQuery {
    /// Every group, not only the unfinished and the latest ones.
    #[serde(default)]
    all: bool,
    user: Option<String>,
    limit: Option<u32>,
}

/// The caller's groups (a group admin's group's, an admin's all): those with unfinished
/// elements and the latest few, or all of them with `all`.
pub(super) async fn list_groups(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<GroupsQuery>,
) -> ApiResult<Json<Vec<GroupView>>> {
    let user = user_of(&caller)?;
    let owner = if user.role == tacc_core::Role::User {
        Some(user.name.clone())
    } else {
        query.user.clone()
    };
    let control = &app.control;
    let mut records = if query.all {
        control
            .store
            .list_groups(&GroupFilter {
                user: owner,
                limit: query.limit,
                ..Default::default()
            })
            .await?
    } else {
        let mut active = control
            .store
            .list_groups(&GroupFilter {
                user: owner.clone(),
                with_states: vec![TaskState::Queued, TaskState::Starting, TaskState::Running],
                ..Default::default()
            })
            .await?;
        let recent = control
            .store
            .list_groups(&GroupFilter {
                user: owner,
                limit: Some(query.limit.unwrap_or(RECENT_GROUPS)),
                ..Default::default()
            })
            .await?;
        for group in recent {
            if !active.iter().any(|g| g.id == group.id) {
                active.push(group);
            }
        }
        active.sort_by_key(|g| std::cmp::Reverse(g.id));
        active
    };
    if user.role == tacc_core::Role::GroupAdmin {
        let mut visible = Vec::with_capacity(records.len());
        for record in records {
            let group = control.auth.group_of(&record.user).await?;
            if crate::auth::may_act_for(user, &record.user, group.as_deref()) {
                visible.push(record);
            }
        }
        records = visible;
    }
    let mut views = Vec::with_capacity(records.len());
    for record in records {
        // An array or sweep stage is shown on its pipeline's line.
        if matches!(
            record.kind,
            tacc_store::GroupKind::Array | tacc_store::GroupKind::Sweep
        ) && control
            .store
            .stage_of(tacc_store::StageSource::Group(record.id))
            .await?
            .is_some()
        {
            continue;
        }
        views.push(group_view(control, record).await?);
    }
    Ok(Json(views))
}

#[derive(Debug, Deserialize)]
pub(super) struct GroupQuery {
    /// `false` leaves the elements out: the counts only, for pollers of big groups.
    #[serde(default = "yes")]
    elements: bool,
    /// Answer once no element of the group is open (queued, starting, running), or after
    /// this many milliseconds (at most [`MAX_GROUP_WAIT`]), whichever comes first: a
    /// follower hears of the last end at once instead of at its next poll.
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// The longest a group read waits for the group's elements to end.
const MAX_GROUP_WAIT: Duration = Duration::from_secs(30);

fn yes() -> bool {
    true
}

pub(super) async fn get_group(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<GroupQuery>,
) -> ApiResult<Json<GroupDetail>> {
    let id = group_id(&id)?;
    let record = load_group(&app.control, id).await?;
    if let Some(wait) = query.wait_ms {
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(wait).min(MAX_GROUP_WAIT);
        // Followed before the first look: an end between the look and the wait is seen.
        let mut ends = app.control.group_ends.follow(id);
        while app.control.query().group_has_open(id).await? {
            tokio::select! {
                _ = ends.changed() => {}
                _ = tokio::time::sleep_until(deadline) => break,
                _ = app.shutdown.cancelled() => break,
            }
        }
    }
    if !query.elements {
        return Ok(Json(GroupDetail {
            group: group_view(&app.control, record).await?,
            elements: Vec::new(),
        }));
    }
    // Counts first, then the elements: an element ends after the counts were read, never
    // before, so elements are never behind what the counts say (terminal states stay).
    let group = group_view(&app.control, record).await?;
    let elements = app
        .control
        .facts
        .group_elements(id)
        .await?
        .into_iter()
        .map(|t| ElementView {
            index: t.group_index.unwrap_or_default(),
            task_id: t.id,
            state: t.state,
            reason: t.reason,
            exit_code: t.exit_code,
            attempt: t.attempt,
            started_at: t.started_at,
            finished_at: t.finished_at,
        })
        .collect();
    Ok(Json(GroupDetail { group, elements }))
}

/// A sweep's leaderboard, best trial first.
pub(super) async fn get_sweep(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<tacc_proto::SweepBoard>> {
    let id = group_id(&id)?;
    let record = load_group(&app.control, id).await?;
    if record.kind != tacc_store::GroupKind::Sweep {
        return Err(ServerError::BadRequest(format!(
            "group {id} is {} {}, not a sweep: see it with `tcloud ps {id}`",
            if record.kind == tacc_store::GroupKind::Array {
                "an"
            } else {
                "a"
            },
            record.kind
        )));
    }
    let view = group_view(&app.control, record.clone()).await?;
    Ok(Json(app.control.facts.sweep_board(&record, view).await?))
}

pub(super) async fn cancel_group(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<GroupCancelReply>> {
    let id = group_id(&id)?;
    load_group(&app.control, id).await?;
    let cancelled = app.arrays.cancel(id).await?;
    Ok(Json(GroupCancelReply {
        group: id,
        cancelled,
    }))
}

pub(super) async fn rerun_group(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Json(body): Json<GroupRerun>,
) -> ApiResult<(StatusCode, Json<SubmitReply>)> {
    let user = user_of(&caller)?;
    super::cluster_stop::refuse_while_stopping(&app)?;
    if !body.failed {
        return Err(ServerError::BadRequest(
            "a group is rerun by its failed elements only: send {\"failed\": true} \
             (`tcloud rerun GROUP --failed`); to run everything again, submit the task file again"
                .into(),
        ));
    }
    let id = group_id(&id)?;
    let record = load_group(&app.control, id).await?;
    if record.kind == tacc_store::GroupKind::Pipeline {
        return Err(ServerError::BadRequest(format!(
            "{id} is a pipeline: submit its file again (`tcloud submit pipeline.yaml`); the \
             stages that succeeded with the same code, spec and inputs are cached, the others run"
        )));
    }
    let failed = app
        .control
        .query()
        .tasks(&TaskFilter {
            group: Some(id),
            states: crate::control::RERUN_STATES.to_vec(),
            ..Default::default()
        })
        .await?
        .len() as u64;
    app.submissions.admit_tasks(user, failed).await?;
    let Some((group, records)) = app.arrays.rerun_failed(&record, &user.name).await? else {
        return Err(ServerError::Conflict(format!(
            "no element of {id} failed, was cancelled or was lost: there is nothing to rerun"
        )));
    };
    if let Some(first) = records.first() {
        // The rerun's owner may read the code it runs.
        app.control
            .store
            .add_snapshot_owner(tacc_store::SnapshotOwner {
                snapshot: first.snapshot.clone(),
                user: user.name.clone(),
            })
            .await?;
    }
    Ok((StatusCode::CREATED, Json(submitted(&group, &records))))
}

/// The reply to a submission that made a group.
pub(super) fn submitted(group: &GroupRecord, records: &[TaskRecord]) -> SubmitReply {
    let first = records.first();
    SubmitReply {
        task_id: first.map_or(TaskId(0), |t| t.id),
        state: first.map_or(TaskState::Queued, |t| t.state),
        group: Some(GroupSubmitted {
            group: group.id,
            elements: records.len() as u32,
            first_task: first.map_or(TaskId(0), |t| t.id),
        }),
        // Every element was submitted alike.
        overrides: first.map_or_else(Vec::new, |t| crate::control::Submission::of(t).overrides),
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct HistoryQuery {
    name: Option<String>,
    /// Comma-separated end states.
    state: Option<String>,
    /// Ended at or after this time (milliseconds since the epoch).
    since: Option<u64>,
    user: Option<String>,
    /// The `next` of the previous page.
    before: Option<String>,
    limit: Option<u32>,
}

/// A page cursor: `<end time in ms>-<task id>`.
fn parse_cursor(text: &str) -> ApiResult<(Timestamp, TaskId)> {
    let bad = || {
        ServerError::BadRequest(format!(
            "`{text}` is not a history cursor: pass the `next` of the previous page"
        ))
    };
    let (at, id) = text.split_once('-').ok_or_else(bad)?;
    Ok((
        Timestamp(at.parse().map_err(|_| bad())?),
        TaskId(id.parse().map_err(|_| bad())?),
    ))
}

pub(super) async fn history(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<HistoryQuery>,
) -> ApiResult<Json<HistoryPage>> {
    let user = user_of(&caller)?;
    let states = match &query.state {
        None => Vec::new(),
        Some(text) => text
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                let state: TaskState = s
                    .parse()
                    .map_err(|e: tacc_core::CoreError| ServerError::BadRequest(e.to_string()))?;
                if !state.is_terminal() {
                    return Err(ServerError::BadRequest(format!(
                        "`{s}` is not an end state; the history holds succeeded, failed, \
                         cancelled and lost tasks (see `tcloud ps` for the others)"
                    )));
                }
                Ok(state)
            })
            .collect::<Result<_, _>>()?,
    };
    let owner = if user.role == tacc_core::Role::User {
        if let Some(other) = query.user.as_ref().filter(|u| **u != user.name) {
            return Err(ServerError::Forbidden(format!(
                "user {} may not read the history of {other}; leave out --user",
                user.name
            )));
        }
        Some(user.name.clone())
    } else {
        query.user.clone()
    };
    let limit = query.limit.unwrap_or(50).clamp(1, MAX_HISTORY_PAGE);
    let filter = HistoryFilter {
        user: owner,
        name: query.name.clone(),
        states,
        since: query.since.map(Timestamp),
        before: query.before.as_deref().map(parse_cursor).transpose()?,
        limit,
    };
    let records = app.control.query().history(&filter).await?;
    let next = (records.len() as u32 == limit)
        .then(|| records.last())
        .flatten()
        .and_then(|t| {
            t.finished_at
                .map(|at| format!("{}-{}", at.as_millis(), t.id))
        });
    let mut tasks = Vec::with_capacity(records.len());
    for record in records {
        if user.role == tacc_core::Role::GroupAdmin {
            let group = app.control.auth.group_of(&record.user).await?;
            if !crate::auth::may_act_for(user, &record.user, group.as_deref()) {
                continue;
            }
        }
        tasks.push(task_view(&app, record).await);
    }
    Ok(Json(HistoryPage { tasks, next }))
}
