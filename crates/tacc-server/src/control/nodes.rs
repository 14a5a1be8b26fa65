//! The node lifecycle of the control plane: agents register (claiming what they still
//! run), poll for their desired work (the poll is the heartbeat), go down when silent,
//! come back (stale attempts stopped before new work; flapping nodes held back until
//! stable), are drained, resumed and removed; and the node listing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tacc_core::{NodeId, Resources, TaskState, Timestamp};
use tacc_proto::{AttemptRef, DesiredWork, RegisterAgent};
use tacc_store::{NewNode, NodeEnrolment, NodeRecord, TaskFilter};
use tokio::sync::watch;

use super::effects::Effects;
use super::handlers::{self, poll::PollRefused};
use super::{Control, Core};
use crate::ServerError;

/// How often the server checks node liveness ([`Control::check_liveness`]).
pub const LIVENESS_CHECK_EVERY: Duration = Duration::from_secs(1);

/// How often within [`FLAP_WINDOW`] a node must have been lost to count as flapping.
pub(crate) const FLAP_LOSSES: usize = 2;
/// The window in which losses of a node count towards flapping.
pub(crate) const FLAP_WINDOW: Duration = Duration::from_secs(600);

impl Control {
    /// An agent (re)registers. Attempts the server placed on this node that the agent does
    /// not report are lost: their processes are gone with the agent's previous life.
    /// `enrolment` is set when the node enrols with a join token (see `enrolment`).
    pub async fn register_agent(
        &self,
        registration: RegisterAgent,
        enrolment: Option<NodeEnrolment>,
    ) -> Result<NodeRecord, ServerError> {
        self.turn(async |inner: &mut Core| {
            let record = self
                .store
                .register_node(NewNode {
                    name: registration.name.clone(),
                    capacity: registration.capacity,
                    gpu_type: registration.gpu_type.clone(),
                    labels: registration.labels.clone(),
                    address: registration.address.clone(),
                    registered_at: self.clock.now(),
                    enrolment,
                })
                .await?;
            // Read before the node comes up: a queued task the scheduler places on it at once
            // is new work for the agent, not an attempt its previous life left unclaimed.
            let active = self
                .store
                .list_tasks(&TaskFilter {
                    states: vec![TaskState::Starting, TaskState::Running],
                    ..Default::default()
                })
                .await?;
            let claimed: BTreeSet<AttemptRef> = registration.running.iter().copied().collect();
            self.node_attempts
                .forget_node(record.id, &registration.running);
            self.log_offsets.registered(record.id, registration.life);
            let mut fx = Effects::default();
            let lost = handlers::register::on_register(
                inner,
                &mut fx,
                handlers::register::Registration {
                    record: record.clone(),
                    claimed: claimed.clone(),
                    active,
                    seen: self.clock.instant(),
                    config: &self.config,
                },
            );
            self.carry(inner, fx).await?;
            for (attempt, outcome) in lost {
                self.lose_attempt(inner, attempt, outcome).await?;
            }
            self.release_held(inner).await?;
            let mut fx = Effects::default();
            handlers::register::on_claims_settled(inner, &mut fx, record.id, claimed);
            self.carry(inner, fx).await?;
            Ok(record)
        })
        .await
    }

    /// The work a node should be doing; also counts as the node's heartbeat. `running` is
    /// what the agent runs now: a cancelled attempt it does not run (it never received
    /// it, or already stopped it) is cancelled here, since no report about it will come.
    async fn desired_work(
        &self,
        node: NodeId,
        running: &[AttemptRef],
    ) -> Result<(DesiredWork, watch::Receiver<u64>), ServerError> {
        let refused = |refusal| match refusal {
            PollRefused::UnknownNode => ServerError::NodeNotFound(node),
            PollRefused::NotRegistered => ServerError::NodeNotRegistered(node),
        };
        let assignments = self
            .turn(async |core: &mut Core| {
                let settled = handlers::poll::on_poll(core, node, running, self.clock.instant())
                    .map_err(refused)?;
                let mut fx = Effects::default();
                for attempt in settled {
                    if let Some(record) = self.facts.task_record(attempt.task).await? {
                        handlers::poll::on_cancel_settled(
                            core,
                            &mut fx,
                            &self.config,
                            record,
                            attempt,
                            self.clock.now(),
                        );
                    }
                }
                let assignments =
                    handlers::poll::on_work(core, &mut fx, node, running).map_err(refused)?;
                self.carry(core, fx).await?;
                Ok(assignments)
            })
            .await?;
        let receiver = self.comm.work_version(node);
        let version = *receiver.borrow();
        Ok((
            DesiredWork {
                version,
                assignments,
                requests: Vec::new(),
            },
            receiver,
        ))
    }

    /// A node's poll for its work, answered now: its desired work (see
    /// [`Control::desired_work`]), which attempts it was handed (so their reports and
    /// outputs are accepted), and the questions waiting for it.
    pub async fn poll_work(
        &self,
        node: NodeId,
        running: &[AttemptRef],
    ) -> Result<(DesiredWork, watch::Receiver<u64>), ServerError> {
        let (mut work, changes) = self.desired_work(node, running).await?;
        self.node_attempts.sync(node, running, &work.assignments);
        work.requests = self.node_requests.take(node);
        Ok((work, changes))
    }

    pub async fn touch(&self, node: NodeId) {
        if let Some(live) = self.inner.lock().await.nodes.get_mut(&node) {
            live.last_seen = self.clock.instant();
        }
    }

    /// Give the scheduler the tasks held while it knew no node, once it knows one (see
    /// `handlers::submit`).
    async fn release_held(&self, inner: &mut Core) -> Result<(), ServerError> {
        if !handlers::submit::held_are_due(inner) {
            return Ok(());
        }
        let mut records = Vec::with_capacity(inner.held.len());
        for task in inner.held.clone() {
            match self.facts.task_record(task).await? {
                Some(record) => records.push(record),
                // Gone from the store: nothing to schedule.
                None => {
                    inner.held.remove(&task);
                }
            }
        }
        let mut fx = Effects::default();
        handlers::submit::on_release_held(inner, &mut fx, &self.config, &records);
        self.carry(inner, fx).await
    }

    /// Mark silent nodes offline and their attempts lost, and hand flapping nodes that
    /// stayed up long enough back to the scheduler. Called periodically.
    pub async fn check_liveness(&self) -> Result<(), ServerError> {
        self.turn(async |inner: &mut Core| {
            let mut fx = Effects::default();
            let tick = handlers::liveness::on_liveness_tick(
                inner,
                &mut fx,
                self.clock.instant(),
                self.config.heartbeat_timeout,
            );
            handlers::liveness::on_restart_facts_due(
                inner,
                &mut fx,
                self.clock.now(),
                self.clock.instant(),
            );
            self.carry(inner, fx).await?;
            for node in tick.lost_nodes {
                self.node_attempts.forget_node(node, &[]);
            }
            for (attempt, outcome) in tick.lost_attempts {
                self.lose_attempt(inner, attempt, outcome).await?;
            }
            self.release_held(inner).await?;
            self.end_hung_attempts(inner).await?;
            self.apply_idle_gpu_policy(inner).await?;
            let mut fx = Effects::default();
            handlers::liveness::on_retries_due(inner, &mut fx, self.clock.now());
            self.carry(inner, fx).await?;
            Ok(())
        })
        .await
    }

    pub async fn node_views(&self) -> Vec<tacc_proto::NodeView> {
        let inner = self.inner.lock().await;
        inner
            .nodes
            .values()
            .map(|live| {
                let mut allocated = live
                    .assignments
                    .values()
                    .filter_map(|a| {
                        inner
                            .specs
                            .get(&a.attempt.task)
                            .map(|s| s.resources.per_node())
                    })
                    .fold(Resources::ZERO, |acc, r| acc.add(&r));
                // A GPU holding shares (`gpus: 0.5`) is taken whole, however many share it.
                let shared: std::collections::BTreeSet<u32> = live
                    .assignments
                    .values()
                    .filter(|a| {
                        inner
                            .specs
                            .get(&a.attempt.task)
                            .is_some_and(|s| s.resources.gpu_share_percent().is_some())
                    })
                    .flat_map(|a| a.gpu_indices.iter().copied())
                    .collect();
                allocated.gpus += shared.len() as u32;
                tacc_proto::NodeView {
                    id: live.record.id,
                    name: live.record.name.clone(),
                    capacity: live.record.capacity,
                    allocated,
                    gpu_type: live.record.gpu_type.clone(),
                    labels: live.record.labels.clone(),
                    state: match (live.online, live.record.drained) {
                        // Slurm's word for a node not heard from since the controller
                        // restarted.
                        (false, _) if live.expected => "unknown".into(),
                        (false, _) => "down".into(),
                        (true, _) if live.record.pending => "pending".into(),
                        (true, _) if live.held_back_until.is_some() => "flapping".into(),
                        (true, false) => "up".into(),
                        (true, true) if live.assignments.is_empty() => "drained".into(),
                        (true, true) => "draining".into(),
                    },
                    // Not heard from in this server's life: when it last was, as kept.
                    last_seen: match live.record.last_seen {
                        Some(kept) if !live.online => kept,
                        _ => {
                            Timestamp(
                                self.clock.now().0.saturating_sub(
                                    self.clock.since(live.last_seen).as_millis() as u64,
                                ),
                            )
                        }
                    },
                    running_tasks: live.assignments.keys().map(|a| a.task).collect(),
                    gpus: self.usage.node_gpus(live.record.id),
                }
            })
            .collect()
    }

    fn node_named(inner: &Core, name: &str) -> Result<NodeId, ServerError> {
        handlers::node_admin::node_named(inner, name).ok_or_else(|| {
            ServerError::NotFound(format!(
                "no node is named `{name}` (list them with `tcloud nodes`)"
            ))
        })
    }

    /// Drain a node: what runs on it finishes, nothing new is placed there. The mark is
    /// durable, so a restarted server keeps the node drained until it is resumed.
    pub async fn drain_node(&self, name: &str) -> Result<tacc_proto::NodeView, ServerError> {
        self.set_drained(name, true).await
    }

    /// Let a drained node take new tasks again.
    pub async fn resume_node(&self, name: &str) -> Result<tacc_proto::NodeView, ServerError> {
        self.set_drained(name, false).await
    }

    async fn set_drained(
        &self,
        name: &str,
        drained: bool,
    ) -> Result<tacc_proto::NodeView, ServerError> {
        self.turn(async |core: &mut Core| {
            let id = Self::node_named(core, name)?;
            self.store.set_node_drained(id, drained).await?;
            let mut fx = Effects::default();
            handlers::node_admin::on_drain(core, &mut fx, id, drained);
            self.carry(core, fx).await
        })
        .await?;
        self.node_view(name).await
    }

    /// Approve a node that enrolled while approval is required: it gets work from now on
    /// (unless drained). Approving a node that waits for nothing changes nothing.
    pub async fn approve_node(&self, name: &str) -> Result<tacc_proto::NodeView, ServerError> {
        self.turn(async |core: &mut Core| {
            let id = Self::node_named(core, name)?;
            self.store.approve_node(id).await?;
            let mut fx = Effects::default();
            let released = handlers::node_admin::on_approve(core, &mut fx, id);
            self.carry(core, fx).await?;
            if released {
                self.release_held(core).await?;
            }
            Ok(())
        })
        .await?;
        self.node_view(name).await
    }

    async fn node_view(&self, name: &str) -> Result<tacc_proto::NodeView, ServerError> {
        self.node_views()
            .await
            .into_iter()
            .find(|n| n.name == name)
            .ok_or_else(|| ServerError::NotFound(format!("node `{name}` vanished")))
    }

    /// Forget a node and revoke its credential: it must join again with a join token.
    /// A node that is up and still runs tasks is refused (drain it first); the attempts
    /// of a down node are lost.
    pub async fn remove_node(&self, name: &str) -> Result<(), ServerError> {
        let id = self
            .turn(async |core: &mut Core| {
                let id = Self::node_named(core, name)?;
                let mut fx = Effects::default();
                let lost = handlers::node_admin::on_remove(core, &mut fx, id).map_err(|still| {
                    ServerError::Conflict(format!(
                        "node `{name}` still runs {} task(s); drain it (`tcloud admin node drain \
                         {name}`) and wait until they end, or remove it once it is down",
                        still.tasks
                    ))
                })?;
                self.carry(core, fx).await?;
                for (attempt, outcome) in lost {
                    self.lose_attempt(core, attempt, outcome).await?;
                }
                self.node_attempts.forget_node(id, &[]);
                handlers::node_admin::on_forget(core, id);
                Ok(id)
            })
            .await?;
        // Answers a waiting poll, so the agent hears at once that its node is gone.
        self.comm.node_removed(id);
        self.store.remove_node(id).await?;
        let at = self.clock.now();
        for token in self.store.list_tokens(None).await? {
            if token.kind == tacc_store::TokenKind::Node
                && token.node == Some(id)
                && token.revoked_at.is_none()
            {
                self.store.revoke_token(token.id, at).await?;
            }
        }
        self.auth.forget();
        Ok(())
    }

    /// Why a task is where it is, in the scheduler's words and the store's.
    pub async fn node_names(&self) -> BTreeMap<NodeId, String> {
        self.inner
            .lock()
            .await
            .nodes
            .iter()
            .map(|(id, n)| (*id, n.record.name.clone()))
            .collect()
    }
}
