//! The agent protocol: registration, the work long poll, reports.

use super::prelude::*;
use crate::enrolment::Admission;

/// Longest a work poll is held open before answering "no change".
const MAX_POLL_WAIT: Duration = Duration::from_secs(30);

/// Register with a join token (a new node: the answer carries the node's credential) or
/// with the node's own credential (an agent restart).
pub(super) async fn register_agent(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(body): Json<RegisterAgent>,
) -> ApiResult<Json<AgentRegistered>> {
    let admission = app.enrolments.admit_registration(&caller, &body).await?;
    let gpus = body.gpus.clone();
    let enrolment = match admission {
        Admission::Enrol(enrolment) => Some(enrolment),
        Admission::Restart => None,
    };
    let record = app.control.register_agent(body, enrolment).await?;
    app.control
        .usage
        .register_node(record.id, record.name.clone(), gpus);
    let node_token = match admission {
        Admission::Enrol(_) => Some(
            app.enrolments
                .issue_node_credential(&caller, &record)
                .await?,
        ),
        Admission::Restart => None,
    };
    Ok(Json(AgentRegistered {
        node_id: record.id,
        heartbeat_timeout_ms: app.control.config.heartbeat_timeout.as_millis() as u64,
        node_token,
        replicated: app.control.config.replicated,
    }))
}

/// Long poll: answers at once when the node's work changed since `after` or a question
/// about its files waits, otherwise when either happens or the wait is over. A change
/// already handed to the node with a report batch's answer keeps the poll waiting.
pub(super) async fn agent_work(
    State(app): State<AppState>,
    Path(node): Path<u64>,
    Json(poll): Json<WorkPoll>,
) -> ApiResult<Json<tacc_proto::DesiredWork>> {
    let node = NodeId(node);
    let control = &app.control;
    let mut asked = control.node_requests.subscribe(node);
    let (work, mut changes) = control.poll_work(node, poll.after, &poll.running).await?;
    if poll.after != Some(work.version) || !work.requests.is_empty() {
        return Ok(Json(work));
    }
    let wait = tokio::time::sleep(Duration::from_millis(poll.wait_ms).min(MAX_POLL_WAIT));
    tokio::pin!(wait);
    loop {
        tokio::select! {
            changed = changes.changed() => {
                let version = *changes.borrow_and_update();
                if changed.is_ok() && control.already_handed(node, version).await {
                    continue;
                }
            }
            _ = asked.changed() => {}
            _ = &mut wait => {}
            _ = app.shutdown.cancelled() => {}
        }
        break;
    }
    let (work, _) = control.poll_work(node, poll.after, &poll.running).await?;
    Ok(Json(work))
}

pub(super) async fn agent_reports(
    State(app): State<AppState>,
    Path(node): Path<u64>,
    Json(body): Json<AgentReports>,
) -> ApiResult<Json<tacc_proto::ReportsAck>> {
    Ok(Json(
        app.control
            .agent_reports(NodeId(node), body.reports, body.work)
            .await?,
    ))
}
