//! Webhook notifications of ended tasks and groups (`notify:` in the task file).
//!
//! A notification is queued in the store in the same transaction as the state change it
//! reports (an outbox row, keyed so it is queued once), so a restart loses none; a
//! background worker posts each due one as JSON, signed with an HMAC-SHA256 of the body
//! keyed by the user's named secret (`X-TACC-Signature: sha256=<hex>`), with a timeout,
//! and retries a failed delivery with exponential backoff until it gives up. An array
//! notifies once, when its last element ends; its elements notify nothing themselves. A
//! pipeline notifies once, when its last stage ends (its stages notify nothing).
//!
//! Each try goes only where [`crate::webhook_destination`] allows (internal addresses
//! only when the operator says so, checked on the resolved address it connects to),
//! follows no redirect, goes through no proxy and is bounded by [`DELIVERY_TIMEOUT`] in
//! all. A refused destination is given up at once — retrying cannot change the rule —
//! with a warning in the server's log and an audit entry (`notify.refused`) saying why.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tacc_core::{GroupId, TaskId, TaskState, Timestamp};
use tacc_schema::NotifySpec;
use tacc_store::{DeliveryOutcome, DeliveryRecord, NewDelivery, Store, TaskChange, TaskFilter};
use tokio_util::sync::CancellationToken;

use crate::auth::AuditTrail;
use crate::control::GroupShape;
use crate::secrets::SecretBox;
use crate::webhook_destination::WebhookPolicy;
use crate::{Control, ServerError};

/// The header carrying the body's signature.
pub const SIGNATURE_HEADER: &str = "X-TACC-Signature";
/// How long one delivery may take, connection included.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Tries before a delivery is given up (about 17 minutes of backoff in all).
const MAX_TRIES: u32 = 10;
/// The first retry's wait; each further one doubles it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// How often the worker looks for due deliveries.
const POLL_EVERY: Duration = Duration::from_millis(250);
/// Deliveries taken per look.
const BATCH: u32 = 32;

/// `sha256=<hex>` of the body keyed by `secret`: what a receiver recomputes.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// The wait before try `tries + 1`, after `tries` failed ones.
fn backoff(tries: u32) -> Duration {
    let factor = 1u32 << tries.saturating_sub(1).min(16);
    (FIRST_BACKOFF * factor).min(MAX_BACKOFF)
}

fn notify_of(spec: &serde_json::Value) -> Option<NotifySpec> {
    serde_json::from_value(spec.get("notify")?.clone()).ok()
}

/// What the end of a group's elements can call for. It follows from what the group was
/// made with (its [`GroupShape`], read once per group), so an element's end reads no
/// group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupNotice {
    /// No `notify:`, and no pipeline to tell.
    Silent,
    /// The group is a pipeline (itself) or one of its stages: the pipeline may have ended.
    InPipeline(GroupId),
    /// The group notifies when its last element ends.
    Notifies,
}

impl GroupNotice {
    fn of(group: GroupId, shape: &GroupShape) -> GroupNotice {
        // A pipeline ends with its last stage, wherever that stage's tasks are.
        if shape.kind == tacc_store::GroupKind::Pipeline {
            return GroupNotice::InPipeline(group);
        }
        if let Some(stage) = &shape.stage {
            return GroupNotice::InPipeline(stage.pipeline);
        }
        if shape.notifies {
            GroupNotice::Notifies
        } else {
            GroupNotice::Silent
        }
    }
}

/// Whether a task or group spec asks for a notification the platform can send.
pub(crate) fn asks_to_notify(spec: &serde_json::Value) -> bool {
    notify_of(spec).is_some()
}

/// What a commit's ends call for: the notifications to commit with it, and the groups
/// some of whose elements it ends (their followers look again once it is applied).
#[derive(Debug, Default)]
pub(crate) struct Ends {
    pub notifications: Vec<TaskChange>,
    pub groups: Vec<GroupId>,
}

/// The notifications `changes` call for, to commit with them: one per task that ends
/// with a `notify:`, and one per group whose last unfinished elements end here. Read
/// from `control`'s store; `control` also says when a pipeline has ended.
pub(crate) async fn notifications_for(
    control: &Control,
    changes: &[TaskChange],
) -> Result<Ends, ServerError> {
    let store = &*control.store;
    // A task's last transition in the batch is where it stays (a failure followed by
    // its retry's requeue is no end).
    let mut last: BTreeMap<TaskId, TaskState> = BTreeMap::new();
    for change in changes {
        if let TaskChange::Transition(t) = change {
            last.insert(t.task, t.to);
        }
    }
    let ended: Vec<TaskId> = last
        .iter()
        .filter(|(_, state)| state.is_terminal())
        .map(|(task, _)| *task)
        .collect();
    if ended.is_empty() {
        return Ok(Ends::default());
    }
    let at = crate::control::now();
    let mut out = Vec::new();
    let mut groups: BTreeMap<GroupId, u64> = BTreeMap::new();
    for task in ended {
        // Placed tasks' records are in memory (an ended task is still placed until this
        // commit is applied): an end reads nothing from the store here.
        let Some(record) = control.facts.task_record(task).await? else {
            continue;
        };
        if let Some(group) = record.group {
            *groups.entry(group).or_insert(0) += 1;
            continue;
        }
        let Some(notify) = notify_of(&record.spec) else {
            continue;
        };
        let state = last[&task];
        let body = serde_json::json!({
            "event": "task.ended",
            "at": at,
            "task": {
                "id": record.id,
                "name": record.name,
                "user": record.user,
                "state": state,
                "attempt": record.attempt,
                "exit_code": changes.iter().rev().find_map(|c| match c {
                    TaskChange::Transition(t) if t.task == task => Some(t.exit_code),
                    _ => None,
                }).flatten(),
                "reason": changes.iter().rev().find_map(|c| match c {
                    TaskChange::Transition(t) if t.task == task => Some(t.reason.clone()),
                    _ => None,
                }).flatten(),
                "submitted_at": record.submitted_at,
                "started_at": record.started_at,
            }
        });
        out.push(delivery(
            format!("task:{task}"),
            &record.user,
            notify,
            body,
            at,
        ));
    }
    let mut pipelines: BTreeSet<GroupId> = BTreeSet::new();
    let ended_groups: Vec<GroupId> = groups.keys().copied().collect();
    for (group, ending) in groups {
        // Most groups notify nothing: known from what the group was made with, without
        // reading it at every element's end.
        let Some(shape) = control.facts.group_shape(group).await? else {
            continue;
        };
        match GroupNotice::of(group, &shape) {
            GroupNotice::Silent => continue,
            GroupNotice::InPipeline(pipeline) => {
                pipelines.insert(pipeline);
                continue;
            }
            GroupNotice::Notifies => {}
        }
        let Some(record) = store.get_group(group).await? else {
            continue;
        };
        let Some(notify) = notify_of(&record.spec) else {
            continue;
        };
        // A sweep has ended only once every trial has been launched.
        if record.kind == tacc_store::GroupKind::Sweep
            && !crate::control::sweep_launched_all(&record)
        {
            continue;
        }
        let unfinished = store
            .count_tasks(&TaskFilter {
                group: Some(group),
                states: vec![TaskState::Queued, TaskState::Starting, TaskState::Running],
                ..Default::default()
            })
            .await?;
        if unfinished > ending {
            continue;
        }
        let counts = store.group_counts(group).await?;
        let counts = settle_counts(counts, changes, group, &last, store).await?;
        let counts: BTreeMap<&str, u64> = counts.iter().map(|(s, n)| (s.as_str(), *n)).collect();
        let body = serde_json::json!({
            "event": "group.ended",
            "at": at,
            "group": {
                "id": record.id.to_string(),
                "kind": record.kind,
                "name": record.name,
                "user": record.user,
                "size": record.size,
                "counts": counts,
            }
        });
        out.push(delivery(
            format!("group:{}", group.0),
            &record.user,
            notify,
            body,
            at,
        ));
    }
    for pipeline in pipelines {
        let Some(record) = store.get_group(pipeline).await? else {
            continue;
        };
        let Some(notify) = notify_of(&record.spec) else {
            continue;
        };
        let Some(stages) = control.facts.pipeline_end(pipeline, changes).await? else {
            continue;
        };
        let state = if stages.values().all(|s| s == "succeeded" || s == "cached") {
            "succeeded"
        } else if stages.values().any(|s| s == "cancelled") {
            "cancelled"
        } else {
            "failed"
        };
        let body = serde_json::json!({
            "event": "pipeline.ended",
            "at": at,
            "pipeline": {
                "id": record.id.to_string(),
                "name": record.name,
                "user": record.user,
                "state": state,
                "stages": stages,
            }
        });
        out.push(delivery(
            format!("pipeline:{}", pipeline.0),
            &record.user,
            notify,
            body,
            at,
        ));
    }
    Ok(Ends {
        notifications: out,
        groups: ended_groups,
    })
}

/// Webhook deliveries: signed with the owner's secret, sent where the operator allows.
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    store: Arc<dyn Store>,
    audit: Arc<AuditTrail>,
    seal: SecretBox,
    webhooks: WebhookPolicy,
}

impl Notifier {
    /// The deliveries of `control`'s outbox, signed with its secrets, as configured.
    pub(crate) fn of(control: &Control) -> Notifier {
        Notifier {
            store: control.store.clone(),
            audit: control.audit.clone(),
            seal: control.secret_box.clone(),
            webhooks: control.config.webhooks.clone(),
        }
    }

    /// One try of one delivery: sign with the owner's secret, post, and record how it went.
    async fn deliver(&self, client: &reqwest::Client, delivery: DeliveryRecord) {
        let outcome = match self.post(client, &delivery).await {
            Ok(()) => DeliveryOutcome::Delivered {
                at: crate::control::now(),
            },
            Err(Failure::Refused(why)) => {
                let error = format!("not sent to {}: {why}", delivery.url);
                tracing::warn!(
                    "notification {} of {}: {error}",
                    delivery.key,
                    delivery.user
                );
                self.audit.record_as(
                    delivery.user.clone(),
                    "notify.refused",
                    format!("{} {}", delivery.key, delivery.url),
                    false,
                    error.clone(),
                );
                DeliveryOutcome::GaveUp { error }
            }
            Err(Failure::Failed(error)) if delivery.attempts + 1 >= MAX_TRIES => {
                tracing::warn!(
                    "gave up notifying {} of {} after {MAX_TRIES} tries: {error}",
                    delivery.url,
                    delivery.key
                );
                DeliveryOutcome::GaveUp { error }
            }
            Err(Failure::Failed(error)) => {
                let wait = backoff(delivery.attempts + 1);
                DeliveryOutcome::Retry {
                    next_at: Timestamp(crate::control::now().as_millis() + wait.as_millis() as u64),
                    error,
                }
            }
        };
        if let Err(e) = self.store.finish_delivery(delivery.id, outcome).await {
            tracing::error!("cannot record the delivery of {}: {e}", delivery.key);
        }
    }

    async fn post(
        &self,
        client: &reqwest::Client,
        delivery: &DeliveryRecord,
    ) -> Result<(), Failure> {
        // A literal address is never resolved, so the resolver cannot check it: here.
        if let Some(ip) = crate::webhook_destination::literal_host(&delivery.url) {
            self.webhooks
                .permits(ip)
                .map_err(|why| Failure::Refused(why.to_string()))?;
        }
        let secret = self
            .store
            .get_secret(&delivery.user, &delivery.secret)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "the secret `{}` of {} that signs this notification is gone; \
                     set it again with `tcloud secret set {}`",
                    delivery.secret, delivery.user, delivery.secret
                )
            })?;
        let key = self.seal.open_value(&secret).map_err(|e| e.to_string())?;
        let response = client
            .post(&delivery.url)
            .header("Content-Type", "application/json")
            .header(
                SIGNATURE_HEADER,
                signature(key.as_bytes(), delivery.body.as_bytes()),
            )
            .header("X-TACC-Event", &delivery.key)
            .body(delivery.body.clone())
            .send()
            .await
            .map_err(|e| match crate::webhook_destination::refusal_in(&e) {
                Some(why) => Failure::Refused(why.to_string()),
                None => Failure::Failed(format!("cannot reach {}: {}", delivery.url, causes(&e))),
            })?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(Failure::Failed(format!(
                "{} answered HTTP {status}",
                delivery.url
            )))
        }
    }
}

/// Why a try did not deliver.
#[derive(Debug)]
enum Failure {
    /// The destination is one the operator does not allow: never retried.
    Refused(String),
    /// Anything else (unreachable, an error status, a missing secret): retried.
    Failed(String),
}

impl From<String> for Failure {
    fn from(error: String) -> Self {
        Failure::Failed(error)
    }
}

/// An error and its causes on one line (reqwest's own message names none of them).
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(current) = cause {
        text.push_str(&format!(": {current}"));
        cause = current.source();
    }
    text
}

/// A group's counts as they are once `changes` are committed: the elements ending in
/// this batch move from their current state to their end state.
async fn settle_counts(
    mut counts: BTreeMap<TaskState, u64>,
    changes: &[TaskChange],
    group: GroupId,
    last: &BTreeMap<TaskId, TaskState>,
    store: &dyn Store,
) -> Result<BTreeMap<TaskState, u64>, ServerError> {
    let touched: BTreeSet<TaskId> = changes
        .iter()
        .filter_map(|c| match c {
            TaskChange::Transition(t) => Some(t.task),
            _ => None,
        })
        .collect();
    for task in touched {
        let Some(record) = store.get_task(task).await? else {
            continue;
        };
        if record.group != Some(group) {
            continue;
        }
        if let Some(n) = counts.get_mut(&record.state) {
            *n = n.saturating_sub(1);
        }
        *counts.entry(last[&task]).or_insert(0) += 1;
    }
    counts.retain(|_, n| *n > 0);
    Ok(counts)
}

/// The webhook call warning the owner of `record` of what the platform is about to do to
/// its attempt (`kind`: `idle_gpu`), when the task has a `notify:`; committed with the
/// warning's own change. The key makes one call per warning.
pub(crate) fn warning(
    record: &tacc_store::TaskRecord,
    kind: &str,
    message: &str,
    at: Timestamp,
) -> Option<TaskChange> {
    let notify = notify_of(&record.spec)?;
    let body = serde_json::json!({
        "event": "task.warning",
        "at": at,
        "kind": kind,
        "message": message,
        "task": {
            "id": record.id,
            "name": record.name,
            "user": record.user,
            "attempt": record.attempt,
        }
    });
    Some(delivery(
        format!("task:{}/{}:{kind}:{}", record.id, record.attempt, at.0),
        &record.user,
        notify,
        body,
        at,
    ))
}

fn delivery(
    key: String,
    user: &str,
    notify: NotifySpec,
    body: serde_json::Value,
    at: Timestamp,
) -> TaskChange {
    TaskChange::Notify(NewDelivery {
        key,
        user: user.to_string(),
        url: notify.webhook,
        secret: notify.secret,
        body: body.to_string(),
        created_at: at,
    })
}

/// Deliver due notifications until `shutdown`.
pub(crate) async fn run_deliveries(notifier: Notifier, shutdown: CancellationToken) {
    let resolver = crate::webhook_destination::CheckedResolver {
        policy: Arc::new(notifier.webhooks.clone()),
    };
    let client = match reqwest::Client::builder()
        .timeout(DELIVERY_TIMEOUT)
        .connect_timeout(DELIVERY_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        // A proxy would connect to the destination itself, past the resolver's check.
        .no_proxy()
        .dns_resolver(Arc::new(resolver))
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            tracing::error!("cannot build the webhook client, no notification is sent: {e}");
            return;
        }
    };
    let mut tick = tokio::time::interval(POLL_EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        // A notification says a task ended: it leaves only once that end is durable.
        let due = match notifier
            .store
            .due_deliveries(crate::control::now(), BATCH)
            .await
        {
            Ok(due) if due.is_empty() => continue,
            Ok(due) => match notifier.store.sync().await {
                Ok(()) => due,
                Err(e) => {
                    tracing::error!("cannot make the notification outbox durable: {e}");
                    continue;
                }
            },
            Err(e) => {
                tracing::error!("cannot read the notification outbox: {e}");
                continue;
            }
        };
        let tries = due.into_iter().map(|d| notifier.deliver(&client, d));
        futures::future::join_all(tries).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_hex() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_groups_notice_follows_from_its_kind_its_stage_and_its_notify() {
        use tacc_store::{GroupKind, StageRecord, StageSource};
        let stage = StageRecord {
            pipeline: GroupId(3),
            position: 1,
            name: "train".into(),
            needs: Vec::new(),
            cache_key: "k".into(),
            source: StageSource::Group(GroupId(7)),
            cached: false,
            user: "ada".into(),
            pipeline_name: "p".into(),
        };
        let shape = |kind, notifies, stage: Option<&StageRecord>| GroupShape {
            kind,
            notifies,
            stage: stage.cloned(),
        };
        let cases = [
            (shape(GroupKind::Array, false, None), GroupNotice::Silent),
            (shape(GroupKind::Sweep, false, None), GroupNotice::Silent),
            (shape(GroupKind::Array, true, None), GroupNotice::Notifies),
            (shape(GroupKind::Sweep, true, None), GroupNotice::Notifies),
            // A stage tells its pipeline, whatever its own `notify:`.
            (
                shape(GroupKind::Array, true, Some(&stage)),
                GroupNotice::InPipeline(GroupId(3)),
            ),
            (
                shape(GroupKind::Sweep, false, Some(&stage)),
                GroupNotice::InPipeline(GroupId(3)),
            ),
            // A pipeline is its own.
            (
                shape(GroupKind::Pipeline, true, None),
                GroupNotice::InPipeline(GroupId(7)),
            ),
        ];
        for (shape, expected) in cases {
            assert_eq!(GroupNotice::of(GroupId(7), &shape), expected, "{shape:?}");
        }
    }

    #[test]
    fn only_a_usable_notify_asks_for_a_notification() {
        let notify = serde_json::json!({"notify": {"webhook": "https://example.com/hook", "secret": "hook"}});
        assert!(asks_to_notify(&notify));
        assert!(!asks_to_notify(&serde_json::json!({"run": "true"})));
        assert!(!asks_to_notify(
            &serde_json::json!({"notify": {"webhook": 3}})
        ));
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(4), Duration::from_secs(8));
        assert_eq!(backoff(30), MAX_BACKOFF);
    }
}
