//! Task routes: submit, list, show, events, cancel, explain, instruction, rerun.

use tacc_store::Created;

use super::idempotency::{RequestKey, stored};
use super::prelude::*;

pub(super) async fn task_view(app: &AppState, record: TaskRecord) -> TaskView {
    let names = app.control.node_names().await;
    let spec: Option<TaskSpec> = serde_json::from_value(record.spec.clone()).ok();
    let submission = crate::control::Submission::of(&record);
    TaskView {
        id: record.id,
        name: record.name,
        user: record.user,
        state: record.state,
        reason: record.reason,
        exit_code: record.exit_code,
        attempt: record.attempt,
        max_attempts: spec.as_ref().map_or(1, |s| s.retry.max_attempts),
        nodes: record
            .placements
            .iter()
            .map(|p| {
                names
                    .get(&p.node)
                    .cloned()
                    .unwrap_or_else(|| format!("node-{}", p.node))
            })
            .collect(),
        gpus: record
            .placements
            .iter()
            .map(|p| p.gpu_indices.clone())
            .collect(),
        snapshot: record.snapshot,
        per_node: spec
            .as_ref()
            .map(|s| s.resources.per_node())
            .unwrap_or_default(),
        num_nodes: spec.as_ref().map_or(1, |s| s.resources.nodes),
        time_limit_secs: spec
            .as_ref()
            .and_then(|s| s.resources.time_limit.map(|t| t.as_secs())),
        submitted_at: record.submitted_at,
        started_at: record.started_at,
        finished_at: record.finished_at,
        cancel_requested: record.cancel_requested,
        source: record.source,
        estimated_start: if record.state == TaskState::Queued {
            app.estimates.estimated_start(record.id).await
        } else {
            None
        },
        spec: record.spec,
        group: record.group,
        group_index: record.group_index,
        overrides: submission.overrides,
        wait_for_capacity: submission.wait_for_capacity,
    }
}

pub(super) async fn load(control: &Control, id: TaskId) -> ApiResult<TaskRecord> {
    control
        .query()
        .task(id)
        .await?
        .ok_or(ServerError::TaskNotFound(id))
}

pub(super) async fn submit(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Json(body): Json<SubmitTask>,
) -> ApiResult<Response> {
    let user = user_of(&caller)?;
    let request = serde_json::to_vec(&body).map_err(|e| ServerError::Internal(e.to_string()))?;
    let key = RequestKey::from_request(&headers, &user.name, "POST /v1/tasks", &request)?;
    if let Some(key) = &key
        && let Some(reply) = key.replay(&app.control).await?
    {
        return Ok(reply);
    }
    super::cluster_stop::refuse_while_stopping(&app)?;
    match (submit_new(&app, user, body, key.as_ref()).await, &key) {
        (Err(error), Some(key)) => key.after_failure(&app.control, error).await,
        (done, _) => done,
    }
}

/// The reply to a submission as kept under its idempotency key: what [`submit`] answers.
fn submitted_reply() -> tacc_store::RenderReply {
    Box::new(|created| match created {
        Created::Task(task) => stored(
            StatusCode::CREATED,
            &SubmitReply {
                task_id: task.id,
                state: task.state,
                group: None,
                overrides: crate::control::Submission::of(task).overrides,
            },
        ),
        Created::Group(group, tasks) | Created::Pipeline(group, _, tasks) => {
            stored(StatusCode::CREATED, &super::groups::submitted(group, tasks))
        }
    })
}

/// Client-declared translations are the client's word, kept and shown back to the same
/// user: bounded so that a submission cannot store an unbounded list.
fn check_translated(translated: &[tacc_proto::Override]) -> Result<(), ServerError> {
    if translated.len() > tacc_proto::MAX_TRANSLATED {
        return Err(ServerError::InvalidTask(format!(
            "the submission declares {} translated options; at most {} are accepted",
            translated.len(),
            tacc_proto::MAX_TRANSLATED
        )));
    }
    let too_long = translated.iter().any(|o| {
        [
            Some(&o.field),
            o.asked.as_ref(),
            Some(&o.applied),
            Some(&o.why),
        ]
        .into_iter()
        .flatten()
        .any(|text| text.len() > tacc_proto::MAX_TRANSLATED_BYTES)
    });
    if too_long {
        return Err(ServerError::InvalidTask(format!(
            "a translated option of the submission is longer than {} bytes",
            tacc_proto::MAX_TRANSLATED_BYTES
        )));
    }
    Ok(())
}

async fn submit_new(
    app: &AppState,
    user: &UserCaller,
    body: SubmitTask,
    key: Option<&RequestKey>,
) -> ApiResult<Response> {
    let keyed = || key.map(|k| k.keyed(submitted_reply()));
    check_translated(&body.translated)?;
    let options = || crate::control::SubmitOptions {
        source: body.source.clone(),
        wait_for_capacity: body.wait_for_capacity,
        translated: body.translated.clone(),
    };
    let spec: TaskSpec = serde_json::from_value(body.spec)
        .map_err(|e| ServerError::InvalidTask(format!("the task spec is not valid: {e}")))?;
    let elements = spec.array.as_ref().map_or(1, |a| a.len() as u64);
    app.submissions.admit_tasks(user, elements).await?;
    // Knowing a snapshot's id is not a capability: only who uploaded it may run it.
    if user.role != tacc_core::Role::Admin
        && !app
            .control
            .query()
            .is_snapshot_owner(&body.snapshot, &user.name)
            .await?
    {
        return Err(ServerError::InvalidTask(format!(
            "snapshot {} is unknown to this server: upload the code first (tcloud submit does this)",
            body.snapshot
        )));
    }
    if spec.sweep.is_some() {
        let group = app
            .sweeps
            .submit(&user.name, spec, body.snapshot, options(), keyed())
            .await?;
        let records = app.control.facts.group_elements(group.id).await?;
        return Ok((
            StatusCode::CREATED,
            Json(super::groups::submitted(&group, &records)),
        )
            .into_response());
    }
    if spec.array.is_some() {
        let (group, records) = app
            .arrays
            .submit(&user.name, spec, body.snapshot, options(), None, keyed())
            .await?;
        return Ok((
            StatusCode::CREATED,
            Json(super::groups::submitted(&group, &records)),
        )
            .into_response());
    }
    let record = app
        .control
        .submit(&user.name, spec, body.snapshot, options(), keyed())
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(SubmitReply {
            task_id: record.id,
            state: record.state,
            group: None,
            overrides: crate::control::Submission::of(&record).overrides,
        }),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct ListQuery {
    /// Comma-separated states.
    state: Option<String>,
    user: Option<String>,
    limit: Option<u32>,
    /// Only tasks that are no group's element (groups are listed by `/v1/groups`).
    #[serde(default)]
    ungrouped: bool,
}

pub(super) async fn list_tasks(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Vec<TaskView>>> {
    let user = user_of(&caller)?;
    let states = match &query.state {
        None => Vec::new(),
        Some(text) => text
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<TaskState>()
                    .map_err(|e| ServerError::BadRequest(e.to_string()))
            })
            .collect::<Result<_, _>>()?,
    };
    let records = visible_tasks(
        &app.control,
        user,
        TaskFilter {
            states,
            ungrouped: query.ungrouped,
            ..Default::default()
        },
        query.user,
        query.limit,
    )
    .await?;
    let mut views = Vec::with_capacity(records.len());
    for record in records {
        views.push(task_view(&app, record).await);
    }
    Ok(Json(views))
}

/// The tasks in `states` (all when empty) that `user` may see, as the API lists them: a
/// plain user lists only their own tasks; a group admin their group's; an admin all.
/// `owner` narrows the list to one owner's (ignored for a plain user).
pub(super) async fn visible_tasks(
    control: &Control,
    user: &UserCaller,
    base: TaskFilter,
    owner: Option<String>,
    limit: Option<u32>,
) -> ApiResult<Vec<TaskRecord>> {
    let only_own = user.role == tacc_core::Role::User;
    let filter = TaskFilter {
        user: if only_own {
            Some(user.name.clone())
        } else {
            owner
        },
        limit: if user.role == tacc_core::Role::GroupAdmin {
            None
        } else {
            limit
        },
        ..base
    };
    let records = control.query().tasks(&filter).await?;
    if user.role != tacc_core::Role::GroupAdmin {
        return Ok(records);
    }
    let mut visible = Vec::with_capacity(records.len());
    for record in records {
        let group = control.auth.group_of(&record.user).await?;
        if !crate::auth::may_act_for(user, &record.user, group.as_deref()) {
            continue;
        }
        if limit.is_some_and(|limit| visible.len() >= limit as usize) {
            break;
        }
        visible.push(record);
    }
    Ok(visible)
}

pub(super) async fn get_task(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Json<TaskView>> {
    let record = load(&app.control, TaskId(id)).await?;
    Ok(Json(task_view(&app, record).await))
}

pub(super) async fn task_events(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Json<Vec<TaskEventView>>> {
    load(&app.control, TaskId(id)).await?;
    let events = app.control.query().task_events(TaskId(id)).await?;
    let mut views: Vec<TaskEventView> = events
        .into_iter()
        .map(|e| TaskEventView {
            at: e.at,
            attempt: e.attempt,
            state: e.state,
            reason: e.reason,
        })
        .collect();
    // Allocation changes of a running attempt are part of its history (the task stays
    // running; the reason says what moved and why).
    for resize in app.control.query().resizes(TaskId(id)).await? {
        views.push(TaskEventView {
            at: resize.at,
            attempt: resize.attempt,
            state: tacc_core::TaskState::Running,
            reason: Some(format!(
                "resized to {:.2} CPUs, {} per node: {}",
                resize.cpu_millis as f64 / 1000.0,
                tacc_core::ByteSize::from_bytes(resize.memory_bytes),
                resize.reason
            )),
        });
    }
    views.sort_by_key(|e| e.at);
    Ok(Json(views))
}

pub(super) async fn cancel_task(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> ApiResult<Response> {
    let key = match caller.user() {
        Some(user) => RequestKey::from_request(
            &headers,
            &user.name,
            "POST /v1/tasks/{id}/cancel",
            id.to_string().as_bytes(),
        )?,
        None => None,
    };
    if let Some(key) = &key
        && let Some(reply) = key.replay(&app.control).await?
    {
        return Ok(reply);
    }
    let before = load(&app.control, TaskId(id)).await?;
    let after = app.control.cancel(TaskId(id)).await?;
    let reply = CancelReply {
        task_id: after.id,
        state: after.state,
        changed: !before.state.is_terminal(),
    };
    // A cancel is idempotent by itself (cancelling twice changes nothing more), so its
    // key is kept after it, only for the retry to get the same reply.
    if let Some(key) = &key {
        key.keep(&app.control, stored(StatusCode::OK, &reply))
            .await?;
    }
    Ok(Json(reply).into_response())
}

/// `POST /v1/estimate`: when a task like this would start here (nothing is stored).
pub(super) async fn estimate(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(body): Json<tacc_proto::EstimateQuery>,
) -> ApiResult<Json<tacc_proto::SubmitEstimate>> {
    let user = user_of(&caller)?;
    let spec: TaskSpec = serde_json::from_value(body.spec)
        .map_err(|e| ServerError::InvalidTask(format!("the task spec is not valid: {e}")))?;
    Ok(Json(
        app.estimates.estimate_submission(&user.name, spec).await?,
    ))
}

pub(super) async fn explain_task(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Json<tacc_proto::TaskExplanation>> {
    Ok(Json(app.control.explain(TaskId(id), &app.estimates).await?))
}

pub(super) async fn task_instruction(
    State(app): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<Json<serde_json::Value>> {
    let record = load(&app.control, TaskId(id)).await?;
    let spec: TaskSpec = serde_json::from_value(record.spec.clone())
        .map_err(|e| ServerError::Internal(e.to_string()))?;
    let mut instruction = tacc_compiler::compile(
        record.id,
        record.attempt,
        &record.user,
        &spec,
        record.snapshot.clone(),
    );
    // What applies, not only what was asked (a lowered priority).
    crate::control::Submission::of(&record).apply_to(&mut instruction);
    Ok(Json(
        serde_json::to_value(instruction).map_err(|e| ServerError::Internal(e.to_string()))?,
    ))
}

/// Submit a task again: same snapshot, spec, environment and datasets; a new task id.
pub(super) async fn rerun_task(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> ApiResult<Response> {
    let user = user_of(&caller)?;
    let key = RequestKey::from_request(
        &headers,
        &user.name,
        "POST /v1/tasks/{id}/rerun",
        id.to_string().as_bytes(),
    )?;
    if let Some(key) = &key
        && let Some(reply) = key.replay(&app.control).await?
    {
        return Ok(reply);
    }
    super::cluster_stop::refuse_while_stopping(&app)?;
    match (rerun_new(&app, user, TaskId(id), key.as_ref()).await, &key) {
        (Err(error), Some(key)) => key.after_failure(&app.control, error).await,
        (done, _) => done,
    }
}

async fn rerun_new(
    app: &AppState,
    user: &UserCaller,
    id: TaskId,
    key: Option<&RequestKey>,
) -> ApiResult<Response> {
    app.submissions.admit(user).await?;
    let keyed = key.map(|k| k.keyed(submitted_reply()));
    let record = crate::artifacts::rerun(&app.control, id, &user.name, keyed).await?;
    // The rerun's owner may read the code it runs.
    app.control
        .store
        .add_snapshot_owner(tacc_store::SnapshotOwner {
            snapshot: record.snapshot.clone(),
            user: user.name.clone(),
        })
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(SubmitReply {
            task_id: record.id,
            state: record.state,
            group: None,
            overrides: crate::control::Submission::of(&record).overrides,
        }),
    )
        .into_response())
}
