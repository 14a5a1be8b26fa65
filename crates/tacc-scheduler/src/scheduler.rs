use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use tacc_core::{NodeId, Priority, Resources, TaskId, Timestamp};

use crate::cluster::Cluster;
use crate::config::{Limits, SchedulerConfig};
use crate::policy::{Backfill, Policy, QuotaView, RankContext, TaskView, Usage};
mod repeats;
mod standing;

pub use standing::{FairShareStanding, GroupStanding, UserStanding};

use crate::{
    Explanation, LimitKind, NodeSpec, PendingReason, Placement, SchedulerError, TaskRequest,
};

/// Something that happened, fed to [`Scheduler::handle`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    NodeUp(NodeSpec),
    /// The node is gone (lost or removed); tasks placed on it are no longer counted
    /// against it. The driver reports those tasks' end separately.
    NodeDown(NodeId),
    /// The node finishes what runs on it but takes no new tasks.
    NodeDrained(NodeId),
    /// A drained node takes new tasks again.
    NodeResumed(NodeId),
    TaskSubmitted {
        task: TaskId,
        request: TaskRequest,
    },
    /// A task already placed before the driver restarted: its resources are taken again.
    TaskRestored {
        task: TaskId,
        request: TaskRequest,
        placements: Vec<Placement>,
    },
    /// Cancelled while queued or running.
    TaskCancelled(TaskId),
    /// Finished in any way (success, failure, lost); its resources are free again.
    TaskEnded(TaskId),
    /// Failed; same effect as [`Event::TaskEnded`], kept apart for the record.
    TaskFailed(TaskId),
    /// A task told to stop by [`Action::Preempt`] has stopped: its resources are free and
    /// it goes back to the queue as a new attempt (keeping its submission time).
    TaskPreempted(TaskId),
    /// Nothing happened but time passed.
    Tick,
    /// Several things happened at this instant: apply them all (in order), then decide
    /// once. The simulator batches each instant (completions first, then arrivals); a
    /// restarted server can restore and resubmit everything in one event.
    Batch(Vec<Event>),
}

/// A decision of the scheduler, for the driver to carry out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    Start {
        task: TaskId,
        placements: Vec<Placement>,
    },
    /// The task stays queued, for this reason (only emitted when the reason changes).
    Pending { task: TaskId, reason: PendingReason },
    /// The task can never run on this cluster and leaves the queue.
    Reject { task: TaskId, reason: PendingReason },
    /// Send the task its checkpoint signal now and kill it after `grace_secs`; report
    /// [`Event::TaskPreempted`] once it has stopped (or `TaskEnded` if it finished).
    Preempt { task: TaskId, grace_secs: u64 },
}

/// The actions decided in answer to one event, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub at: Timestamp,
    pub actions: Vec<Action>,
}

#[derive(Debug, Clone)]
enum Phase {
    Queued {
        reason: Option<PendingReason>,
    },
    Running {
        placements: Vec<Placement>,
        started_at: Timestamp,
    },
    Preempting {
        placements: Vec<Placement>,
        started_at: Timestamp,
        since: Timestamp,
    },
}

#[derive(Debug, Clone)]
struct TaskEntry {
    request: TaskRequest,
    user: usize,
    group: usize,
    priority: Priority,
    attempt: u32,
    /// GPU-milliseconds of finished attempts.
    attained_gpu_ms: u64,
    rank: i64,
    /// Key in `Scheduler::ends` while holding resources.
    end_key: u64,
    phase: Phase,
}

/// Decaying usage of one group, integrated exactly between rate changes.
#[derive(Debug, Clone, Default)]
struct Ledger {
    value: f64,
    /// Billing units per second currently running.
    rate: f64,
    last_ms: u64,
}

impl Ledger {
    fn advance(&mut self, now_ms: u64, half_life_secs: u64) {
        let dt = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.last_ms = self.last_ms.max(now_ms);
        if dt <= 0.0 {
            return;
        }
        if half_life_secs == 0 {
            self.value += self.rate * dt;
            return;
        }
        let lambda = std::f64::consts::LN_2 / half_life_secs as f64;
        let keep = (-lambda * dt).exp();
        self.value = self.value * keep + self.rate * (1.0 - keep) / lambda;
    }
}

#[derive(Debug, Clone, Default)]
struct Account {
    name: String,
    usage: Usage,
    limits: Limits,
}

#[derive(Debug, Clone, Default)]
struct GroupAccount {
    account: Account,
    guaranteed_gpus: u64,
    share: f64,
    ledger: Ledger,
    fairshare: f64,
    allocated: Resources,
}

/// The first blocked task's reservation in the current decision.
#[derive(Debug, Clone)]
struct Reservation {
    task: TaskId,
    shadow: Option<Timestamp>,
    need: Resources,
    free_after: BTreeMap<NodeId, Resources>,
}

/// Capacity that preemption frees, held for the task that claimed it. It lasts across
/// decisions until the claimant starts, leaves the queue, can no longer be admitted, or
/// loses a claimed node; meanwhile no other task may start on the claimed share or take
/// the quota the claimant needs, and the claimant is considered before everyone else.
#[derive(Debug, Clone)]
struct Claim {
    /// Creation order: a claimant respects the holds of older claims only.
    seq: u64,
    task: TaskId,
    /// The claimant's per-node share, held on each of `nodes`.
    need: Resources,
    nodes: Vec<NodeId>,
    /// Tasks stopping on those nodes whose release the claim counts on.
    incoming: Vec<TaskId>,
}

/// What a claim holds on one node during a decision.
#[derive(Debug, Clone, Copy)]
struct Hold {
    seq: u64,
    claimant: TaskId,
    need: Resources,
    /// What the claim's stopping tasks still hold there.
    incoming: Resources,
}

/// Whether a task with seniority `before` (claims with a smaller `seq` bind it) may take
/// `per_node` on `node` without eating into what a claim holds there.
fn hold_allows(
    cluster: &Cluster,
    holds: &BTreeMap<NodeId, Hold>,
    node: NodeId,
    per_node: &Resources,
    before: u64,
) -> bool {
    match holds.get(&node) {
        Some(hold) if hold.seq < before => cluster.nodes[&node]
            .free
            .add(&hold.incoming)
            .covers(&hold.need.add(per_node)),
        _ => true,
    }
}

/// What one decision carries from task to task.
#[derive(Debug, Default)]
struct PassState {
    blocked_head: Option<TaskId>,
    reservation: Option<Reservation>,
    claimants: usize,
    /// Nodes held by claims (claims never share a node).
    holds: BTreeMap<NodeId, Hold>,
    /// Claimants still waiting after the claims were settled; the walk only keeps their
    /// place in line.
    waiting_claimants: BTreeSet<TaskId>,
    /// The first blocked task that stays within its group's guarantee.
    blocked_owner: Option<TaskId>,
    borrowing_sweep: bool,
}

/// Queue order: higher rank first, then earlier submission, then lower id.
type QueueKey = (Reverse<i64>, Timestamp, TaskId);

/// The scheduler's whole state: a pure function of the events fed to it.
#[derive(Debug, Clone)]
pub struct Scheduler {
    policy: Policy,
    config: SchedulerConfig,
    cluster: Cluster,
    tasks: BTreeMap<TaskId, TaskEntry>,
    queue: BTreeSet<QueueKey>,
    running: BTreeSet<TaskId>,
    preemptible_running: usize,
    /// (expected end in ms, task) of every task holding resources; `u64::MAX` = unknown.
    ends: BTreeSet<(u64, TaskId)>,
    users: Vec<Account>,
    user_index: BTreeMap<String, usize>,
    groups: Vec<GroupAccount>,
    group_index: BTreeMap<String, usize>,
    ranked_at: Option<Timestamp>,
    now: Timestamp,
    reservation: Option<(TaskId, Option<Timestamp>)>,
    preemptions: u64,
    /// Open claims, oldest first.
    claims: Vec<Claim>,
    next_claim: u64,
}

impl Default for Scheduler {
    fn default() -> Self {
        Self::new()
    }
}

impl Scheduler {
    /// The production default: `fairshare` with an open configuration.
    pub fn new() -> Self {
        Self::with_policy(Policy::production_default(), SchedulerConfig::default())
    }

    /// The production default policy with the operator's configuration.
    pub fn with_config(config: SchedulerConfig) -> Self {
        Self::with_policy(Policy::production_default(), config)
    }

    pub fn with_policy(policy: Policy, config: SchedulerConfig) -> Self {
        let mut scheduler = Scheduler {
            policy,
            config,
            cluster: Cluster::default(),
            tasks: BTreeMap::new(),
            queue: BTreeSet::new(),
            running: BTreeSet::new(),
            preemptible_running: 0,
            ends: BTreeSet::new(),
            users: Vec::new(),
            user_index: BTreeMap::new(),
            groups: Vec::new(),
            group_index: BTreeMap::new(),
            ranked_at: None,
            now: Timestamp(0),
            reservation: None,
            preemptions: 0,
            claims: Vec::new(),
            next_claim: 0,
        };
        // Configured groups exist from the start, so their shares count in fair share.
        let names: Vec<String> = scheduler.config.groups.keys().cloned().collect();
        for name in names {
            scheduler.group_id(&name);
        }
        scheduler
    }

    /// A registered policy by name (see [`crate::policy_names`]).
    pub fn by_name(name: &str, config: SchedulerConfig) -> Result<Self, SchedulerError> {
        Ok(Self::with_policy(Policy::by_name(name)?, config))
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Number of tasks waiting.
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// Number of tasks holding resources (running or being preempted).
    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    /// Preemptions decided so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// The reservation of the last decision, as computed before anything was backfilled:
    /// the first blocked task and when it is expected to start (`None`: unknown).
    pub fn reservation(&self) -> Option<(TaskId, Option<Timestamp>)> {
        self.reservation
    }

    /// Current usage of a group (GPUs, CPUs, running and queued tasks).
    pub fn group_usage(&self, group: &str) -> Usage {
        self.group_index
            .get(group)
            .map_or_else(Usage::default, |g| self.groups[*g].account.usage)
    }

    /// Apply one event and decide what to do now.
    pub fn handle(&mut self, now: Timestamp, event: Event) -> Result<Plan, SchedulerError> {
        self.now = now;
        let mut actions = Vec::new();
        self.apply(now, event, &mut actions)?;
        self.schedule(now, &mut actions);
        Ok(Plan { at: now, actions })
    }

    fn apply(
        &mut self,
        now: Timestamp,
        event: Event,
        actions: &mut Vec<Action>,
    ) -> Result<(), SchedulerError> {
        match event {
            Event::NodeUp(spec) => self.cluster.add(spec)?,
            Event::NodeDown(node) => self.cluster.remove(node),
            Event::NodeDrained(node) => self.cluster.drain(node),
            Event::NodeResumed(node) => self.cluster.resume(node),
            Event::TaskSubmitted { task, request } => {
                if self.tasks.contains_key(&task) {
                    return Err(SchedulerError::DuplicateTask(task));
                }
                self.submit(now, task, request, actions);
            }
            Event::TaskRestored {
                task,
                request,
                placements,
            } => {
                if self.tasks.contains_key(&task) {
                    return Err(SchedulerError::DuplicateTask(task));
                }
                if let Some(missing) = placements.iter().find(|p| !self.cluster.contains(p.node)) {
                    return Err(SchedulerError::UnknownNode {
                        task,
                        node: missing.node,
                    });
                }
                self.insert_queued(now, task, request);
                self.start(now, task, placements, None);
            }
            Event::TaskCancelled(task) | Event::TaskEnded(task) | Event::TaskFailed(task) => {
                self.forget(now, task);
            }
            Event::TaskPreempted(task) => self.requeue(now, task),
            Event::Tick => {}
            Event::Batch(events) => {
                for event in events {
                    self.apply(now, event, actions)?;
                }
            }
        }
        Ok(())
    }

    fn user_id(&mut self, name: &str) -> usize {
        if let Some(id) = self.user_index.get(name) {
            return *id;
        }
        self.users.push(Account {
            name: name.to_string(),
            usage: Usage::default(),
            limits: self.config.user_limits(name),
        });
        self.user_index
            .insert(name.to_string(), self.users.len() - 1);
        self.users.len() - 1
    }

    fn group_id(&mut self, name: &str) -> usize {
        if let Some(id) = self.group_index.get(name) {
            return *id;
        }
        self.groups.push(GroupAccount {
            account: Account {
                name: name.to_string(),
                usage: Usage::default(),
                limits: self.config.group_limits(name),
            },
            guaranteed_gpus: self.config.guaranteed_gpus(name),
            share: self.config.share_weight(name),
            ledger: Ledger {
                last_ms: self.now.as_millis(),
                ..Ledger::default()
            },
            fairshare: 1.0,
            allocated: Resources::ZERO,
        });
        self.group_index
            .insert(name.to_string(), self.groups.len() - 1);
        // A new group changes everyone's normalised share.
        self.ranked_at = None;
        self.groups.len() - 1
    }

    fn submit(
        &mut self,
        now: Timestamp,
        task: TaskId,
        request: TaskRequest,
        actions: &mut Vec<Action>,
    ) {
        // A request no node's labels match yet waits for such a node (see `consider`);
        // one that the matching nodes could never hold is rejected.
        if self.cluster.selector_unmet(&request).is_none()
            && let Some(detail) = self.cluster.never_fits(&request)
        {
            actions.push(Action::Reject {
                task,
                reason: PendingReason::CannotFit { detail },
            });
            return;
        }
        let user = self.user_id(request.user.as_str());
        let group_name = self
            .config
            .group_of(request.user.as_str(), request.group.as_deref());
        let group = self.group_id(&group_name);
        if let Some(reason) = self.over_limits_forever(user, group, &request) {
            actions.push(Action::Reject { task, reason });
            return;
        }
        self.insert_queued(now, task, request);
    }

    /// Limits that reject at submit: a full queue, or a task bigger than a limit allows.
    fn over_limits_forever(
        &self,
        user: usize,
        group: usize,
        request: &TaskRequest,
    ) -> Option<PendingReason> {
        let total = request.total();
        let check = |limits: &Limits, usage: &Usage| -> Option<(LimitKind, u64)> {
            if let Some(max) = limits.max_queued_tasks.filter(|max| usage.queued >= *max) {
                return Some((LimitKind::QueuedTasks, max));
            }
            if let Some(max) = limits.max_gpus.filter(|max| total.gpus as u64 > *max) {
                return Some((LimitKind::Gpus, max));
            }
            if let Some(max) = limits.max_cpus.filter(|max| total.cpu_millis > max * 1000) {
                return Some((LimitKind::Cpus, max));
            }
            if let Some(max) = limits.max_running_tasks.filter(|max| *max == 0) {
                return Some((LimitKind::RunningTasks, max));
            }
            None
        };
        let user_account = &self.users[user];
        if let Some((limit, max)) = check(&user_account.limits, &user_account.usage) {
            return Some(PendingReason::OverUserQuota { limit, max });
        }
        let group_account = &self.groups[group].account;
        check(&group_account.limits, &group_account.usage).map(|(limit, max)| {
            PendingReason::OverGroupQuota {
                group: group_account.name.clone(),
                limit,
                max,
            }
        })
    }

    fn insert_queued(&mut self, now: Timestamp, task: TaskId, request: TaskRequest) {
        let user = self.user_id(request.user.as_str());
        let group_name = self
            .config
            .group_of(request.user.as_str(), request.group.as_deref());
        let group = self.group_id(&group_name);
        let priority = request
            .priority
            .min(self.config.priority_cap(request.user.as_str()));
        let entry = TaskEntry {
            request,
            user,
            group,
            priority,
            attempt: 1,
            attained_gpu_ms: 0,
            rank: 0,
            end_key: u64::MAX,
            phase: Phase::Queued { reason: None },
        };
        self.tasks.insert(task, entry);
        self.users[user].usage.queued += 1;
        self.groups[group].account.usage.queued += 1;
        self.enqueue(now, task);
    }

    /// (Re)compute the task's rank and put it in the queue.
    fn enqueue(&mut self, now: Timestamp, task: TaskId) {
        let rank = {
            let entry = &self.tasks[&task];
            self.policy
                .ordering
                .rank(&self.rank_context(now), &self.view(now, task, entry))
        };
        let entry = self.tasks.get_mut(&task).expect("known task");
        entry.rank = rank;
        self.queue
            .insert((Reverse(rank), entry.request.submitted_at, task));
    }

    fn rank_context(&self, now: Timestamp) -> RankContext<'_> {
        RankContext {
            now,
            config: &self.config,
            cluster_total: self.cluster.schedulable_total(),
        }
    }

    fn view<'a>(&'a self, now: Timestamp, id: TaskId, entry: &'a TaskEntry) -> TaskView<'a> {
        let group = &self.groups[entry.group];
        let current_run_ms = match &entry.phase {
            Phase::Running { started_at, .. } | Phase::Preempting { started_at, .. } => {
                now.millis_since(*started_at) * entry.request.total().gpus as u64
            }
            Phase::Queued { .. } => 0,
        };
        TaskView {
            id,
            request: &entry.request,
            group: &group.account.name,
            priority: entry.priority,
            attempt: entry.attempt,
            attained_gpu_secs: (entry.attained_gpu_ms + current_run_ms) as f64 / 1000.0,
            group_fairshare: group.fairshare,
            group_allocated: group.allocated,
        }
    }

    fn billing_rate(&self, request: &TaskRequest) -> f64 {
        let total = request.total();
        let weights = &self.config.fairshare;
        total.gpus as f64 * weights.gpu_weight
            + total.cpu_millis as f64 / 1000.0 * weights.cpu_weight
    }

    fn end_key(&self, started_at: Timestamp, request: &TaskRequest) -> u64 {
        request
            .time_limit_secs
            .or(self.config.default_time_limit_secs)
            .map_or(u64::MAX, |limit| started_at.plus_secs(limit).as_millis())
    }

    fn start(
        &mut self,
        now: Timestamp,
        task: TaskId,
        placements: Vec<Placement>,
        actions: Option<&mut Vec<Action>>,
    ) {
        let half_life = self.config.fairshare.half_life_secs;
        let (request, rank, user, group) = {
            let entry = &self.tasks[&task];
            (entry.request.clone(), entry.rank, entry.user, entry.group)
        };
        self.queue
            .remove(&(Reverse(rank), request.submitted_at, task));
        self.cluster.take(&request.per_node, &placements);
        let total = request.total();
        for usage in [
            &mut self.users[user].usage,
            &mut self.groups[group].account.usage,
        ] {
            usage.gpus += total.gpus as u64;
            usage.cpu_millis += total.cpu_millis;
            usage.running += 1;
            usage.queued -= 1;
        }
        let rate = self.billing_rate(&request);
        let account = &mut self.groups[group];
        account.allocated = account.allocated.add(&total);
        account.ledger.advance(now.as_millis(), half_life);
        account.ledger.rate += rate;
        if !self.claims.is_empty() {
            self.claims.retain(|c| c.task != task);
        }
        let end_key = self.end_key(now, &request);
        self.ends.insert((end_key, task));
        self.running.insert(task);
        if request.preemptible {
            self.preemptible_running += 1;
        }
        let entry = self.tasks.get_mut(&task).expect("known task");
        entry.end_key = end_key;
        entry.phase = Phase::Running {
            placements: placements.clone(),
            started_at: now,
        };
        if let Some(actions) = actions {
            actions.push(Action::Start { task, placements });
        }
    }

    /// Free what the task holds; it stays known (as queued) for the caller to drop or requeue.
    fn release(&mut self, now: Timestamp, task: TaskId) {
        let half_life = self.config.fairshare.half_life_secs;
        let Some(entry) = self.tasks.get(&task) else {
            return;
        };
        let (placements, started_at) = match &entry.phase {
            Phase::Queued { .. } => return,
            Phase::Running {
                placements,
                started_at,
            }
            | Phase::Preempting {
                placements,
                started_at,
                ..
            } => (placements.clone(), *started_at),
        };
        let request = entry.request.clone();
        let (user, group, end_key) = (entry.user, entry.group, entry.end_key);
        self.cluster.give_back(&request.per_node, &placements);
        let total = request.total();
        for usage in [
            &mut self.users[user].usage,
            &mut self.groups[group].account.usage,
        ] {
            usage.gpus -= total.gpus as u64;
            usage.cpu_millis -= total.cpu_millis;
            usage.running -= 1;
            usage.queued += 1;
        }
        let rate = self.billing_rate(&request);
        let account = &mut self.groups[group];
        account.allocated = account.allocated.saturating_sub(&total);
        account.ledger.advance(now.as_millis(), half_life);
        account.ledger.rate = (account.ledger.rate - rate).max(0.0);
        self.ends.remove(&(end_key, task));
        self.running.remove(&task);
        let entry = self.tasks.get_mut(&task).expect("known task");
        // Tasks being preempted were already taken off the preemptible count.
        if request.preemptible && matches!(entry.phase, Phase::Running { .. }) {
            self.preemptible_running -= 1;
        }
        entry.attained_gpu_ms += now.millis_since(started_at) * total.gpus as u64;
        entry.end_key = u64::MAX;
        entry.phase = Phase::Queued { reason: None };
    }

    /// The task leaves the scheduler (ended, failed or cancelled).
    fn forget(&mut self, now: Timestamp, task: TaskId) {
        self.release(now, task);
        if let Some(entry) = self.tasks.remove(&task) {
            self.queue
                .remove(&(Reverse(entry.rank), entry.request.submitted_at, task));
            self.users[entry.user].usage.queued -= 1;
            self.groups[entry.group].account.usage.queued -= 1;
        }
    }

    fn requeue(&mut self, now: Timestamp, task: TaskId) {
        let holds = self
            .tasks
            .get(&task)
            .is_some_and(|e| !matches!(e.phase, Phase::Queued { .. }));
        if !holds {
            return;
        }
        self.release(now, task);
        self.tasks.get_mut(&task).expect("known task").attempt += 1;
        self.enqueue(now, task);
    }

    /// Recompute fair-share factors and every queued task's rank, at most once per
    /// recalculation period (always when something made the ranks stale).
    fn refresh_ranks(&mut self, now: Timestamp) {
        let period_ms = self.config.fairshare.recalc_period_secs * 1000;
        if let Some(at) = self.ranked_at
            && now.millis_since(at) < period_ms
        {
            return;
        }
        self.ranked_at = Some(now);
        let half_life = self.config.fairshare.half_life_secs;
        for group in &mut self.groups {
            group.ledger.advance(now.as_millis(), half_life);
        }
        let inputs: Vec<(f64, f64)> = self
            .groups
            .iter()
            .map(|g| (g.ledger.value, g.share))
            .collect();
        for (group, shares) in self.groups.iter_mut().zip(standing::fair_shares(&inputs)) {
            group.fairshare = shares.factor;
        }
        let ctx = self.rank_context(now);
        let ranks: Vec<(TaskId, i64)> = self
            .queue
            .iter()
            .map(|(_, _, id)| {
                (
                    *id,
                    self.policy
                        .ordering
                        .rank(&ctx, &self.view(now, *id, &self.tasks[id])),
                )
            })
            .collect();
        self.queue.clear();
        for (id, rank) in ranks {
            let entry = self.tasks.get_mut(&id).expect("queued task");
            entry.rank = rank;
            self.queue
                .insert((Reverse(rank), entry.request.submitted_at, id));
        }
    }

    fn quota_view(&self, entry: &TaskEntry) -> QuotaView<'_> {
        let user = &self.users[entry.user];
        let group = &self.groups[entry.group].account;
        QuotaView {
            user_limits: &user.limits,
            user_usage: user.usage,
            group_limits: &group.limits,
            group_usage: group.usage,
        }
    }

    fn set_reason(&mut self, task: TaskId, reason: PendingReason, actions: &mut Vec<Action>) {
        if let Some(TaskEntry {
            phase: Phase::Queued { reason: last },
            ..
        }) = self.tasks.get_mut(&task)
            && last.as_ref() != Some(&reason)
        {
            *last = Some(reason.clone());
            actions.push(Action::Pending { task, reason });
        }
    }

    /// One scheduling decision over the whole queue. When groups have guarantees, tasks
    /// that stay within their group's guarantee go first and borrowing tasks second (as
    /// in Kueue), so reclaimed capacity goes to its owner, not back to a borrower.
    fn schedule(&mut self, now: Timestamp, actions: &mut Vec<Action>) {
        self.refresh_ranks(now);
        self.reservation = None;
        let mut pass = PassState::default();
        if !self.claims.is_empty() {
            self.settle_claims(now, &mut pass, actions);
        }
        let order: Vec<TaskId> = self.queue.iter().map(|(_, _, id)| *id).collect();
        let guarantees = self.groups.iter().any(|g| g.guaranteed_gpus > 0);
        let mut repeat = None;
        if !guarantees {
            for task in order {
                self.consider_or_repeat(now, task, &mut pass, &mut repeat, actions);
            }
            return;
        }
        let mut deferred = Vec::new();
        for task in order {
            if self.borrows(task) {
                deferred.push(task);
            } else {
                self.consider_or_repeat(now, task, &mut pass, &mut repeat, actions);
            }
        }
        pass.borrowing_sweep = true;
        repeat = None;
        for task in deferred {
            if matches!(
                self.tasks.get(&task).map(|e| &e.phase),
                Some(Phase::Queued { .. })
            ) {
                self.consider_or_repeat(now, task, &mut pass, &mut repeat, actions);
            }
        }
    }

    /// [`Scheduler::consider`], unless an equal task just got an answer this one would
    /// get too (see [`repeats`]).
    fn consider_or_repeat(
        &mut self,
        now: Timestamp,
        task: TaskId,
        pass: &mut PassState,
        repeat: &mut Option<repeats::Repeat>,
        actions: &mut Vec<Action>,
    ) {
        if self.repeat(task, pass, repeat, actions) {
            return;
        }
        let before = self.walk_state(pass);
        let waiting_claimant = pass.waiting_claimants.contains(&task);
        self.consider(now, task, pass, actions);
        *repeat = if waiting_claimant {
            None
        } else {
            self.remember(task, before, pass)
        };
    }

    /// Drop the claims that can no longer be honoured, then give each claimant, oldest
    /// claim first, the first chance to start.
    fn settle_claims(&mut self, now: Timestamp, pass: &mut PassState, actions: &mut Vec<Action>) {
        let mut claims = std::mem::take(&mut self.claims);
        claims.retain_mut(|claim| {
            let queued = matches!(
                self.tasks.get(&claim.task).map(|e| &e.phase),
                Some(Phase::Queued { .. })
            );
            let nodes_usable = claim.nodes.iter().all(|id| {
                self.cluster
                    .nodes
                    .get(id)
                    .is_some_and(|node| node.schedulable)
            });
            claim.incoming.retain(|id| {
                matches!(
                    self.tasks.get(id).map(|e| &e.phase),
                    Some(Phase::Preempting { .. })
                )
            });
            queued && nodes_usable
        });
        for claim in &claims {
            for node in &claim.nodes {
                let incoming = claim
                    .incoming
                    .iter()
                    .filter_map(|id| {
                        let entry = &self.tasks[id];
                        let Phase::Preempting { placements, .. } = &entry.phase else {
                            return None;
                        };
                        placements
                            .iter()
                            .any(|p| p.node == *node)
                            .then_some(entry.request.per_node)
                    })
                    .fold(Resources::ZERO, |acc, r| acc.add(&r));
                pass.holds.insert(
                    *node,
                    Hold {
                        seq: claim.seq,
                        claimant: claim.task,
                        need: claim.need,
                        incoming,
                    },
                );
            }
        }
        let order: Vec<(u64, TaskId, bool)> = claims
            .iter()
            .map(|c| (c.seq, c.task, c.incoming.is_empty()))
            .collect();
        self.claims = claims;
        for (seq, task, nothing_incoming) in order {
            let entry = &self.tasks[&task];
            let admitted = self
                .policy
                .admission
                .admit(&self.view(now, task, entry), &self.quota_view(entry));
            if let Err(reason) = admitted {
                self.drop_claim(seq, pass);
                self.set_reason(task, reason, actions);
                continue;
            }
            if let Some(holder) = self.quota_held(now, task, seq) {
                pass.waiting_claimants.insert(task);
                let reason = PendingReason::LowerPriority { blocked_by: holder };
                self.set_reason(task, reason, actions);
                continue;
            }
            let request = &entry.request;
            let (cluster, holds) = (&self.cluster, &pass.holds);
            let allow = |node: NodeId| hold_allows(cluster, holds, node, &request.per_node, seq);
            let placement = cluster.place(request, self.policy.placement.as_ref(), &allow);
            if let Some(placements) = placement {
                self.drop_claim(seq, pass);
                self.start(now, task, placements, Some(actions));
            } else if nothing_incoming {
                // Everything it counted on is back and it still does not fit (a placement
                // policy's choice, a restored task): the walk treats it as any other task.
                self.drop_claim(seq, pass);
            } else {
                pass.waiting_claimants.insert(task);
                self.set_reason(task, PendingReason::WaitingForResources, actions);
            }
        }
    }

    fn drop_claim(&mut self, seq: u64, pass: &mut PassState) {
        self.claims.retain(|c| c.seq != seq);
        pass.holds.retain(|_, hold| hold.seq != seq);
    }

    /// The quota view of `entry` as if the tasks counted in `extra` (by user and by group
    /// index) had started as well.
    fn quota_with(
        &self,
        entry: &TaskEntry,
        extra_users: &BTreeMap<usize, Usage>,
        extra_groups: &BTreeMap<usize, Usage>,
    ) -> QuotaView<'_> {
        let mut quota = self.quota_view(entry);
        let plus = |usage: &mut Usage, extra: Option<&Usage>| {
            if let Some(extra) = extra {
                usage.gpus += extra.gpus;
                usage.cpu_millis += extra.cpu_millis;
                usage.running += extra.running;
                usage.queued = usage.queued.saturating_sub(extra.running);
            }
        };
        plus(&mut quota.user_usage, extra_users.get(&entry.user));
        plus(&mut quota.group_usage, extra_groups.get(&entry.group));
        quota
    }

    /// A claim (older than `before`) whose claimant could no longer be admitted if `task`
    /// started now, counting every older claimant as started: claims hold quota too.
    fn quota_held(&self, now: Timestamp, task: TaskId, before: u64) -> Option<TaskId> {
        let entry = &self.tasks[&task];
        let mut users: BTreeMap<usize, Usage> = BTreeMap::new();
        let mut groups: BTreeMap<usize, Usage> = BTreeMap::new();
        add_usage(&mut users, &mut groups, entry);
        for claim in self.claims.iter().filter(|c| c.seq < before) {
            if claim.task == task {
                continue;
            }
            let claimant = &self.tasks[&claim.task];
            if (claimant.user == entry.user || claimant.group == entry.group)
                && self
                    .policy
                    .admission
                    .admit(
                        &self.view(now, claim.task, claimant),
                        &self.quota_with(claimant, &users, &groups),
                    )
                    .is_err()
            {
                return Some(claim.task);
            }
            add_usage(&mut users, &mut groups, claimant);
        }
        None
    }

    /// Whether `task` would still be admitted once every open claimant has started.
    fn admitted_after_claims(&self, now: Timestamp, task: TaskId) -> bool {
        let mut users: BTreeMap<usize, Usage> = BTreeMap::new();
        let mut groups: BTreeMap<usize, Usage> = BTreeMap::new();
        for claim in &self.claims {
            add_usage(&mut users, &mut groups, &self.tasks[&claim.task]);
        }
        let entry = &self.tasks[&task];
        self.policy
            .admission
            .admit(
                &self.view(now, task, entry),
                &self.quota_with(entry, &users, &groups),
            )
            .is_ok()
    }

    /// Starting the task would put its group above its guarantee.
    fn borrows(&self, task: TaskId) -> bool {
        let entry = &self.tasks[&task];
        let group = &self.groups[entry.group];
        group.account.usage.gpus + entry.request.total().gpus as u64 > group.guaranteed_gpus
    }

    fn consider(
        &mut self,
        now: Timestamp,
        task: TaskId,
        pass: &mut PassState,
        actions: &mut Vec<Action>,
    ) {
        let no_veto = |_: NodeId| true;
        if pass.waiting_claimants.contains(&task) {
            // Settled already; it only keeps its place in line.
            self.note_blocked(now, task, pass);
            return;
        }
        let entry = &self.tasks[&task];
        if let Some(dep) = entry
            .request
            .depends_on
            .iter()
            .find(|d| self.tasks.contains_key(d))
        {
            let reason = PendingReason::Dependency { on: *dep };
            self.set_reason(task, reason, actions);
            return;
        }
        if let (Backfill::None, Some(head)) = (self.policy.backfill, pass.blocked_head) {
            self.set_reason(
                task,
                PendingReason::BehindOlderTask { blocked_by: head },
                actions,
            );
            return;
        }
        let admitted = self
            .policy
            .admission
            .admit(&self.view(now, task, entry), &self.quota_view(entry));
        if let Err(reason) = admitted {
            self.set_reason(task, reason, actions);
            return;
        }
        if !self.claims.is_empty()
            && let Some(claimant) = self.quota_held(now, task, u64::MAX)
        {
            let reason = PendingReason::LowerPriority {
                blocked_by: claimant,
            };
            self.set_reason(task, reason, actions);
            return;
        }
        if pass.borrowing_sweep
            && self.policy.backfill == Backfill::Greedy
            && let Some(owner) = pass.blocked_owner
        {
            // Greedy policies have no reservation: hold borrowers while an owner waits.
            self.set_reason(
                task,
                PendingReason::LowerPriority { blocked_by: owner },
                actions,
            );
            return;
        }
        let request = &entry.request;
        let use_per_node = request.per_node;
        let (cluster, holds) = (&self.cluster, &pass.holds);
        let keeps_holds = |node: NodeId| hold_allows(cluster, holds, node, &use_per_node, u64::MAX);
        let placement = match &pass.reservation {
            Some(held) if !ends_before(now, request, &self.config, held.shadow) => {
                let need = held.need;
                let keeps_reservation = |node: NodeId| {
                    held.free_after
                        .get(&node)
                        .is_none_or(|free| free.covers(&use_per_node.add(&need)))
                        && keeps_holds(node)
                };
                self.cluster
                    .place(request, self.policy.placement.as_ref(), &keeps_reservation)
            }
            _ => self
                .cluster
                .place(request, self.policy.placement.as_ref(), &keeps_holds),
        };
        if let Some(placements) = placement {
            if let Some(held) = &mut pass.reservation
                && !ends_before(now, request, &self.config, held.shadow)
            {
                for p in &placements {
                    if let Some(free) = held.free_after.get_mut(&p.node) {
                        *free = free.saturating_sub(&request.per_node);
                    }
                }
            }
            self.start(now, task, placements, Some(actions));
            return;
        }
        // Too few nodes carry its labels: nothing running or reserved stands in its way,
        // so it neither holds up the queue nor claims anything.
        if let Some(detail) = self.cluster.selector_unmet(&self.tasks[&task].request) {
            self.set_reason(task, PendingReason::NoMatchingNode { detail }, actions);
            return;
        }
        if (pass.reservation.is_some() || !pass.holds.is_empty())
            && let Some(placements) =
                self.cluster
                    .place(request, self.policy.placement.as_ref(), &no_veto)
        {
            // It fits now, but only on resources held for a reservation or a claim.
            let claimant = placements
                .iter()
                .find_map(|p| pass.holds.get(&p.node).map(|hold| hold.claimant));
            let blocked_by = match (&pass.reservation, claimant) {
                (Some(held), _) => held.task,
                (None, Some(claimant)) => claimant,
                (None, None) => unreachable!("placement vetoed by nothing"),
            };
            if self.policy.backfill == Backfill::None {
                pass.blocked_head.get_or_insert(task);
            }
            let reason = PendingReason::LowerPriority { blocked_by };
            self.set_reason(task, reason, actions);
            return;
        }
        // Under EASY only the reserved head claims: a task behind it could not use what
        // its victims free, and the victims would restart at once. For the same reason a
        // borrowing task never claims: owners, considered first, would take the room.
        // A claimant must be admitted alongside the older claimants (claims hold quota),
        // and its victims' share is then held for it until it starts (see `Claim`).
        if pass.claimants < self.config.preemption.max_claimants_per_pass
            && pass.reservation.is_none()
            && !pass.borrowing_sweep
            && self.may_claim(task)
            && (self.claims.is_empty() || self.admitted_after_claims(now, task))
        {
            pass.claimants += 1;
            self.try_preempt(now, task, pass, actions);
        }
        self.note_blocked(now, task, pass);
        self.set_reason(task, PendingReason::WaitingForResources, actions);
    }

    /// Bookkeeping for a task that waits for resources in this decision.
    fn note_blocked(&mut self, now: Timestamp, task: TaskId, pass: &mut PassState) {
        if !pass.borrowing_sweep && pass.blocked_owner.is_none() {
            pass.blocked_owner = Some(task);
        }
        match self.policy.backfill {
            Backfill::None => {
                pass.blocked_head.get_or_insert(task);
            }
            Backfill::Greedy => {}
            Backfill::Easy => {
                if pass.reservation.is_none() {
                    pass.reservation = self.reserve(now, task);
                    self.reservation = pass.reservation.as_ref().map(|r| (r.task, r.shadow));
                }
            }
        }
    }

    /// Where and when the blocked `task` could start as running tasks end by their
    /// time limits (EASY's shadow time and the resources it needs then).
    fn reserve(&self, now: Timestamp, task: TaskId) -> Option<Reservation> {
        let request = &self.tasks[&task].request;
        let releases = self.ends.iter().flat_map(|(end, id)| {
            let entry = &self.tasks[id];
            let placements = match &entry.phase {
                Phase::Running { placements, .. } | Phase::Preempting { placements, .. } => {
                    &placements[..]
                }
                Phase::Queued { .. } => &[],
            };
            let at = if *end == u64::MAX {
                u64::MAX
            } else {
                (*end).max(now.as_millis())
            };
            placements
                .iter()
                .map(move |p| (at, *id, p.node, entry.request.per_node))
        });
        let fit = self.cluster.earliest_fit(request, releases, &|_| true)?;
        let shadow = if fit.releases_used == 0 {
            Some(now)
        } else if fit.at == u64::MAX {
            None
        } else {
            Some(Timestamp(fit.at))
        };
        Some(Reservation {
            task,
            shadow,
            need: request.per_node,
            free_after: fit.free_after,
        })
    }

    fn may_claim(&self, task: TaskId) -> bool {
        if self.preemptible_running == 0 {
            return false;
        }
        self.reclaims(task) || (self.policy.preemptive && self.config.preemption.by_priority)
    }

    /// The task's group is below its guarantee even after starting it.
    fn reclaims(&self, task: TaskId) -> bool {
        let entry = &self.tasks[&task];
        let group = &self.groups[entry.group];
        self.config.preemption.reclaim
            && group.guaranteed_gpus > 0
            && group.account.usage.gpus + entry.request.total().gpus as u64 <= group.guaranteed_gpus
    }

    /// Pick preemptible victims that lose the least work and free room for `task`.
    /// The claimant's fit may not use a node another claim holds; the nodes it chooses
    /// are then held for it (with what is still running or stopping there counted in)
    /// until it starts.
    fn try_preempt(
        &mut self,
        now: Timestamp,
        task: TaskId,
        pass: &mut PassState,
        actions: &mut Vec<Action>,
    ) {
        let reclaim = self.reclaims(task);
        let by_priority = self.policy.preemptive && self.config.preemption.by_priority;
        let ctx = self.rank_context(now);
        let claimant = &self.tasks[&task];
        let level = self
            .policy
            .ordering
            .preemption_level(&ctx, &self.view(now, task, claimant));
        let mut candidates: Vec<(u64, TaskId)> = Vec::new();
        for id in &self.running {
            let entry = &self.tasks[id];
            let Phase::Running { started_at, .. } = &entry.phase else {
                continue;
            };
            let exempt_ms = self.config.preemption.min_run_secs * 1000;
            if !entry.request.preemptible || now.millis_since(*started_at) < exempt_ms {
                continue;
            }
            let group = &self.groups[entry.group];
            let borrowing = group.account.usage.gpus > group.guaranteed_gpus;
            let reclaimable = reclaim && entry.group != claimant.group && borrowing;
            let outranked = by_priority
                && (entry.group == claimant.group || borrowing)
                && self
                    .policy
                    .ordering
                    .preemption_level(&ctx, &self.view(now, *id, entry))
                    < level;
            if reclaimable || outranked {
                let lost_work =
                    now.millis_since(*started_at) * entry.request.total().gpus.max(1) as u64;
                candidates.push((lost_work, *id));
            }
        }
        if candidates.is_empty() {
            return;
        }
        candidates.sort_unstable();
        let preempting = self
            .running
            .iter()
            .filter(|id| matches!(self.tasks[id].phase, Phase::Preempting { .. }));
        let releases = preempting
            .map(|id| (0, *id))
            .chain(
                candidates
                    .iter()
                    .enumerate()
                    .map(|(i, (_, id))| (i as u64 + 1, *id)),
            )
            .flat_map(|(key, id)| {
                let entry = &self.tasks[&id];
                let placements = match &entry.phase {
                    Phase::Running { placements, .. } | Phase::Preempting { placements, .. } => {
                        &placements[..]
                    }
                    Phase::Queued { .. } => &[],
                };
                placements
                    .iter()
                    .map(move |p| (key, id, p.node, entry.request.per_node))
            });
        let unclaimed = |node: NodeId| !pass.holds.contains_key(&node);
        let Some(fit) = self
            .cluster
            .earliest_fit(&claimant.request, releases, &unclaimed)
        else {
            return;
        };
        let victims: Vec<TaskId> = candidates
            .iter()
            .map(|(_, id)| *id)
            .filter(|id| fit.needed.contains(id))
            .collect();
        let need = claimant.request.per_node;
        // Releases are taken cheapest first, so an early one may turn out unneeded once a
        // later, bigger one is in: keep a victim only if its nodes need it.
        let share_on = |id: &TaskId, node: NodeId| {
            let entry = &self.tasks[id];
            match &entry.phase {
                Phase::Running { placements, .. } | Phase::Preempting { placements, .. }
                    if placements.iter().any(|p| p.node == node) =>
                {
                    entry.request.per_node
                }
                _ => Resources::ZERO,
            }
        };
        let mut needed = fit.needed.clone();
        for victim in victims.iter().rev() {
            let spare = fit.free_after.keys().all(|node| {
                let mut free = self.cluster.nodes[node].free;
                for id in needed.iter().filter(|id| *id != victim) {
                    free = free.add(&share_on(id, *node));
                }
                free.covers(&need)
            });
            if spare {
                needed.remove(victim);
            }
        }
        let victims: Vec<TaskId> = victims
            .into_iter()
            .filter(|id| needed.contains(id))
            .collect();
        if victims.is_empty() {
            return;
        }
        let seq = self.next_claim;
        self.next_claim += 1;
        for node in fit.free_after.keys() {
            let incoming = needed
                .iter()
                .filter_map(|id| {
                    let entry = &self.tasks[id];
                    let (Phase::Running { placements, .. } | Phase::Preempting { placements, .. }) =
                        &entry.phase
                    else {
                        return None;
                    };
                    placements
                        .iter()
                        .any(|p| p.node == *node)
                        .then_some(entry.request.per_node)
                })
                .fold(Resources::ZERO, |acc, r| acc.add(&r));
            pass.holds.insert(
                *node,
                Hold {
                    seq,
                    claimant: task,
                    need,
                    incoming,
                },
            );
        }
        self.claims.push(Claim {
            seq,
            task,
            need,
            nodes: fit.free_after.keys().copied().collect(),
            incoming: needed.iter().copied().collect(),
        });
        let grace_secs = self.config.preemption.grace_secs;
        for victim in victims {
            let entry = self.tasks.get_mut(&victim).expect("running task");
            let Phase::Running {
                placements,
                started_at,
            } = &entry.phase
            else {
                continue;
            };
            entry.phase = Phase::Preempting {
                placements: placements.clone(),
                started_at: *started_at,
                since: now,
            };
            let old_key = entry.end_key;
            let new_key = now.plus_secs(grace_secs).as_millis().min(old_key);
            entry.end_key = new_key;
            if entry.request.preemptible {
                self.preemptible_running -= 1;
            }
            self.ends.remove(&(old_key, victim));
            self.ends.insert((new_key, victim));
            self.preemptions += 1;
            actions.push(Action::Preempt {
                task: victim,
                grace_secs,
            });
        }
    }

    /// Where the task stands, why it waits, and when it may start.
    pub fn explain(&self, task: TaskId) -> Explanation {
        let Some(entry) = self.tasks.get(&task) else {
            return Explanation::Unknown;
        };
        match &entry.phase {
            Phase::Running {
                placements,
                started_at,
            } => Explanation::Running {
                placements: placements.clone(),
                started_at: *started_at,
                attempt: entry.attempt,
            },
            Phase::Preempting { since, .. } => Explanation::Preempting {
                since: *since,
                attempt: entry.attempt,
            },
            Phase::Queued { reason } => {
                let key = (Reverse(entry.rank), entry.request.submitted_at, task);
                // No estimate for a task no node can run yet: it depends on a node
                // registering, not on the timeline.
                let waits_for_node = matches!(reason, Some(PendingReason::NoMatchingNode { .. }));
                Explanation::Queued {
                    reason: reason.clone(),
                    position: self.queue.range(..key).count(),
                    estimated_start: if waits_for_node {
                        None
                    } else {
                        self.estimate_start(task)
                    },
                    attempt: entry.attempt,
                }
            }
        }
    }

    /// Most tasks ahead that an estimate walks through before giving up.
    const ESTIMATE_HORIZON: usize = 2_000;

    /// Estimated start from the reservation timeline: the node-level shadow time for the
    /// reserved task; for others, a GPU-count timeline where running tasks end by their
    /// time limits and each task ahead takes the earliest slot that fits (conservative
    /// backfill over the aggregate pool).
    fn estimate_start(&self, target: TaskId) -> Option<Timestamp> {
        if let Some((head, shadow)) = self.reservation
            && head == target
        {
            return shadow;
        }
        let now = self.now.as_millis();
        let mut deltas: BTreeMap<u64, i64> = BTreeMap::new();
        for (end, id) in &self.ends {
            if *end != u64::MAX {
                *deltas.entry((*end).max(now)).or_default() +=
                    self.tasks[id].request.total().gpus as i64;
            }
        }
        let mut free = self.cluster.free_gpus_total() as i64;
        let mut profile: Vec<(u64, i64)> = vec![(now, free)];
        for (at, delta) in deltas {
            free += delta;
            if at == now {
                profile[0].1 = free;
            } else {
                profile.push((at, free));
            }
        }
        for (_, _, id) in self.queue.iter().take(Self::ESTIMATE_HORIZON) {
            let request = &self.tasks[id].request;
            let need = request.total().gpus as i64;
            let length = request
                .time_limit_secs
                .or(self.config.default_time_limit_secs)
                .map_or(u64::MAX, |s| s.saturating_mul(1000));
            let start = (0..profile.len()).find(|&i| {
                let until = profile[i].0.saturating_add(length);
                profile[i..]
                    .iter()
                    .take_while(|(t, _)| *t < until)
                    .all(|(_, free)| *free >= need)
            });
            let Some(i) = start else {
                if *id == target {
                    return None;
                }
                continue;
            };
            let begin = profile[i].0;
            if *id == target {
                return Some(Timestamp(begin));
            }
            let until = begin.saturating_add(length);
            if until != u64::MAX
                && let Err(pos) = profile.binary_search_by_key(&until, |(t, _)| *t)
            {
                let before = profile[pos - 1].1;
                profile.insert(pos, (until, before));
            }
            for (t, free) in profile.iter_mut().skip(i) {
                if *t >= until {
                    break;
                }
                *free -= need;
            }
        }
        None
    }

    /// The reservation the blocked `task` would get from the current state; for tests
    /// ("backfill never delays the reservation").
    #[doc(hidden)]
    pub fn recompute_reservation(&self, task: TaskId) -> Option<Option<Timestamp>> {
        self.tasks.get(&task)?;
        self.reserve(self.now, task).map(|r| r.shadow)
    }

    /// Checks the bookkeeping against first principles; for tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut used: BTreeMap<NodeId, (Resources, BTreeSet<u32>)> = BTreeMap::new();
        for id in &self.running {
            let entry = &self.tasks[id];
            let placements = match &entry.phase {
                Phase::Running { placements, .. } | Phase::Preempting { placements, .. } => {
                    placements
                }
                Phase::Queued { .. } => {
                    return Err(format!("task {id} listed as running but queued"));
                }
            };
            if placements.len() != entry.request.nodes as usize {
                return Err(format!(
                    "task {id} holds {} nodes of {}",
                    placements.len(),
                    entry.request.nodes
                ));
            }
            for p in placements {
                let slot = used
                    .entry(p.node)
                    .or_insert((Resources::ZERO, BTreeSet::new()));
                slot.0 = slot.0.add(&entry.request.per_node);
                for gpu in &p.gpu_indices {
                    if !slot.1.insert(*gpu) {
                        return Err(format!("GPU {gpu} of node {} given twice", p.node));
                    }
                }
            }
        }
        for (id, (total, _)) in &used {
            if let Some(node) = self.cluster.nodes.get(id)
                && !node.spec.capacity.covers(total)
            {
                return Err(format!(
                    "node {id} over-allocated: {total} > {}",
                    node.spec.capacity
                ));
            }
        }
        Ok(())
    }
}

/// Count `entry` as running in the per-user and per-group extra usage.
fn add_usage(
    users: &mut BTreeMap<usize, Usage>,
    groups: &mut BTreeMap<usize, Usage>,
    entry: &TaskEntry,
) {
    let total = entry.request.total();
    for usage in [
        users.entry(entry.user).or_default(),
        groups.entry(entry.group).or_default(),
    ] {
        usage.gpus += total.gpus as u64;
        usage.cpu_millis += total.cpu_millis;
        usage.running += 1;
    }
}

/// Whether the task is sure to end (by its time limit) before the reservation starts.
fn ends_before(
    now: Timestamp,
    request: &TaskRequest,
    config: &SchedulerConfig,
    shadow: Option<Timestamp>,
) -> bool {
    match (
        shadow,
        request.time_limit_secs.or(config.default_time_limit_secs),
    ) {
        (Some(shadow), Some(limit)) => now.plus_secs(limit) <= shadow,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GroupConfig;
    use tacc_core::UserName;

    fn node(id: u64, cpus: u64, gpus: u32) -> Event {
        Event::NodeUp(NodeSpec {
            id: NodeId(id),
            capacity: Resources::new(cpus * 1000, 64 << 30, gpus),
            gpu_type: None,
            labels: Default::default(),
        })
    }

    fn request(cpus: u64, gpus: u32, nodes: u32, at: u64) -> TaskRequest {
        TaskRequest {
            user: UserName::new("alice"),
            per_node: Resources::new(cpus * 1000, 1 << 30, gpus),
            nodes,
            submitted_at: Timestamp(at),
            ..Default::default()
        }
    }

    fn fifo() -> Scheduler {
        Scheduler::by_name("fifo", SchedulerConfig::default()).unwrap()
    }

    fn submit(s: &mut Scheduler, id: u64, req: TaskRequest) -> Plan {
        s.handle(
            req.submitted_at,
            Event::TaskSubmitted {
                task: TaskId(id),
                request: req,
            },
        )
        .unwrap()
    }

    fn started(plan: &Plan) -> Vec<TaskId> {
        plan.actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { task, .. } => Some(*task),
                _ => None,
            })
            .collect()
    }

    /// An array's elements: the walk answers equal tasks alike (without searching the
    /// cluster for each), every policy, and starts them in order as room frees.
    #[test]
    fn identical_queued_tasks_wait_alike_and_start_in_order() {
        for policy in crate::policy_names() {
            if policy == "sjf" {
                continue;
            }
            let mut s = Scheduler::by_name(policy, SchedulerConfig::default()).unwrap();
            s.handle(Timestamp(0), node(1, 4, 0)).unwrap();
            let events = (1..=200)
                .map(|id| Event::TaskSubmitted {
                    task: TaskId(id),
                    request: TaskRequest {
                        time_limit_secs: Some(60),
                        ..request(1, 0, 1, 1)
                    },
                })
                .collect();
            let plan = s.handle(Timestamp(1), Event::Batch(events)).unwrap();
            assert_eq!(
                started(&plan),
                (1..=4).map(TaskId).collect::<Vec<_>>(),
                "{policy}"
            );
            let waiting = plan
                .actions
                .iter()
                .filter(|a| matches!(a, Action::Pending { .. }))
                .count();
            assert_eq!(
                waiting, 196,
                "{policy}: every other element is told why it waits"
            );
            for id in 5..=200 {
                assert!(
                    matches!(s.explain(TaskId(id)), Explanation::Queued { .. }),
                    "{policy}: task {id}"
                );
            }
            let plan = s.handle(Timestamp(2), Event::TaskEnded(TaskId(2))).unwrap();
            assert_eq!(started(&plan), [TaskId(5)], "{policy}");
            s.check_invariants().unwrap();
        }
    }

    #[test]
    fn a_drained_node_takes_nothing_new_until_resumed() {
        let mut s = fifo();
        s.handle(Timestamp(0), node(1, 4, 0)).unwrap();
        assert_eq!(
            started(&submit(&mut s, 1, request(1, 0, 1, 1))),
            vec![TaskId(1)]
        );
        s.handle(Timestamp(2), Event::NodeDrained(NodeId(1)))
            .unwrap();
        assert!(started(&submit(&mut s, 2, request(1, 0, 1, 3))).is_empty());
        let plan = s
            .handle(Timestamp(4), Event::NodeResumed(NodeId(1)))
            .unwrap();
        assert_eq!(started(&plan), vec![TaskId(2)]);
    }

    fn labelled(id: u64, cpus: u64, labels: &[(&str, &str)]) -> Event {
        Event::NodeUp(NodeSpec {
            id: NodeId(id),
            capacity: Resources::new(cpus * 1000, 64 << 30, 0),
            gpu_type: None,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
    }

    fn selecting(cpus: u64, at: u64, selector: &[(&str, &str)]) -> TaskRequest {
        TaskRequest {
            node_selector: selector
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..request(cpus, 0, 1, at)
        }
    }

    fn pending_reason(plan: &Plan, task: u64) -> Option<&PendingReason> {
        plan.actions.iter().find_map(|a| match a {
            Action::Pending { task: t, reason } if *t == TaskId(task) => Some(reason),
            _ => None,
        })
    }

    #[test]
    fn a_selector_no_node_matches_waits_without_holding_up_the_queue() {
        let mut s = fifo();
        s.handle(Timestamp(0), labelled(1, 4, &[("kind", "process")]))
            .unwrap();
        let plan = submit(&mut s, 1, selecting(1, 1, &[("kind", "slurm")]));
        let Some(PendingReason::NoMatchingNode { detail }) = pending_reason(&plan, 1) else {
            panic!("{plan:?}");
        };
        assert!(
            detail.contains("1 node(s) labelled kind=slurm, and none of the 1 node(s) up are"),
            "{detail}"
        );
        assert!(
            PendingReason::NoMatchingNode {
                detail: detail.clone()
            }
            .to_string()
            .starts_with("no node can run it yet: ")
        );
        assert!(
            matches!(
                s.explain(TaskId(1)),
                Explanation::Queued {
                    estimated_start: None,
                    ..
                }
            ),
            "no estimate while no node can run it"
        );
        // FIFO: a later task that can run is not kept behind it.
        assert_eq!(
            started(&submit(&mut s, 2, selecting(1, 2, &[("kind", "process")]))),
            vec![TaskId(2)]
        );
        assert_eq!(
            started(&submit(&mut s, 3, request(1, 0, 1, 3))),
            vec![TaskId(3)]
        );
        // The node it waits for registers: it starts there.
        let plan = s
            .handle(Timestamp(4), labelled(2, 4, &[("kind", "slurm")]))
            .unwrap();
        match &plan.actions[..] {
            [Action::Start { task, placements }] => {
                assert_eq!(*task, TaskId(1));
                assert_eq!(placements[0].node, NodeId(2));
            }
            other => panic!("{other:?}"),
        }
        s.check_invariants().unwrap();
    }

    #[test]
    fn a_selector_is_rejected_only_when_its_nodes_are_too_small() {
        let mut s = fifo();
        s.handle(Timestamp(0), labelled(1, 2, &[("kind", "slurm")]))
            .unwrap();
        s.handle(Timestamp(0), node(2, 64, 0)).unwrap();
        // Nodes carry the label, but none of them could ever hold 8 CPUs.
        let plan = submit(&mut s, 1, selecting(8, 1, &[("kind", "slurm")]));
        match &plan.actions[..] {
            [
                Action::Reject {
                    reason: PendingReason::CannotFit { detail },
                    ..
                },
            ] => assert!(detail.contains("labels"), "{detail}"),
            other => panic!("{other:?}"),
        }
        // A gang of two waits while only one node carries the label.
        let mut gang = selecting(1, 2, &[("kind", "slurm")]);
        gang.nodes = 2;
        let plan = submit(&mut s, 2, gang);
        let Some(PendingReason::NoMatchingNode { detail }) = pending_reason(&plan, 2) else {
            panic!("{plan:?}");
        };
        assert!(
            detail.contains("2 node(s) labelled kind=slurm, and only 1 of the 2 node(s) up is"),
            "{detail}"
        );
    }

    #[test]
    fn a_queued_task_whose_nodes_went_down_waits_for_them() {
        let mut s = fifo();
        s.handle(Timestamp(0), labelled(1, 1, &[("kind", "slurm")]))
            .unwrap();
        assert_eq!(
            started(&submit(&mut s, 1, selecting(1, 1, &[("kind", "slurm")]))),
            vec![TaskId(1)]
        );
        let plan = submit(&mut s, 2, selecting(1, 2, &[("kind", "slurm")]));
        assert_eq!(
            pending_reason(&plan, 2),
            Some(&PendingReason::WaitingForResources)
        );
        let plan = s.handle(Timestamp(3), Event::NodeDown(NodeId(1))).unwrap();
        assert!(
            matches!(
                pending_reason(&plan, 2),
                Some(PendingReason::NoMatchingNode { .. })
            ),
            "{plan:?}"
        );
    }

    #[test]
    fn new_is_the_fairshare_default() {
        assert_eq!(Scheduler::new().policy_name(), "fairshare");
    }

    #[test]
    fn fifo_starts_what_fits_and_blocks_behind_the_head() {
        let mut s = fifo();
        s.handle(Timestamp(0), node(1, 4, 2)).unwrap();
        assert_eq!(
            started(&submit(&mut s, 1, request(3, 1, 1, 1))),
            vec![TaskId(1)]
        );
        let plan = submit(&mut s, 2, request(2, 0, 1, 2));
        assert_eq!(
            plan.actions,
            vec![Action::Pending {
                task: TaskId(2),
                reason: PendingReason::WaitingForResources
            }]
        );
        // Task 3 would fit, but FIFO keeps it behind task 2.
        let plan = submit(&mut s, 3, request(1, 0, 1, 3));
        assert!(started(&plan).is_empty());
        let plan = s.handle(Timestamp(4), Event::TaskEnded(TaskId(1))).unwrap();
        assert_eq!(started(&plan), vec![TaskId(2), TaskId(3)]);
    }

    #[test]
    fn gangs_start_on_all_nodes_or_none() {
        let mut s = fifo();
        s.handle(Timestamp(0), node(1, 4, 4)).unwrap();
        s.handle(Timestamp(0), node(2, 4, 4)).unwrap();
        submit(&mut s, 1, request(1, 2, 1, 1));
        let plan = submit(&mut s, 2, request(1, 4, 2, 2));
        assert!(started(&plan).is_empty(), "only one node has 4 free GPUs");
        let plan = s.handle(Timestamp(3), Event::TaskEnded(TaskId(1))).unwrap();
        match &plan.actions[..] {
            [Action::Start { task, placements }] => {
                assert_eq!(*task, TaskId(2));
                assert_eq!(placements.len(), 2);
                assert!(placements.iter().all(|p| p.gpu_indices == vec![0, 1, 2, 3]));
            }
            other => panic!("unexpected plan {other:?}"),
        }
    }

    #[test]
    fn impossible_requests_are_rejected_at_submit() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 4, 0)).unwrap();
        let plan = submit(&mut s, 1, request(8, 0, 1, 1));
        match &plan.actions[..] {
            [Action::Reject { task, reason }] => {
                assert_eq!(*task, TaskId(1));
                assert!(
                    reason.to_string().contains("largest node: 4 cpu"),
                    "{reason}"
                );
            }
            other => panic!("unexpected plan {other:?}"),
        }
        assert_eq!(s.queue_len(), 0);
    }

    #[test]
    fn high_priority_goes_first_and_gpu_indices_are_distinct() {
        let mut s = fifo();
        s.handle(Timestamp(0), node(1, 8, 2)).unwrap();
        submit(&mut s, 1, request(8, 0, 1, 1));
        submit(&mut s, 2, request(1, 1, 1, 2));
        let mut high = request(1, 1, 1, 3);
        high.priority = Priority::High;
        submit(&mut s, 3, high);
        let plan = s.handle(Timestamp(4), Event::TaskEnded(TaskId(1))).unwrap();
        let starts: Vec<_> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { task, placements } => {
                    Some((*task, placements[0].gpu_indices.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(starts, vec![(TaskId(3), vec![0]), (TaskId(2), vec![1])]);
    }

    #[test]
    fn restored_tasks_hold_their_resources() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 2, 0)).unwrap();
        s.handle(
            Timestamp(0),
            Event::TaskRestored {
                task: TaskId(1),
                request: request(2, 0, 1, 0),
                placements: vec![Placement {
                    node: NodeId(1),
                    gpu_indices: vec![],
                }],
            },
        )
        .unwrap();
        assert!(started(&submit(&mut s, 2, request(1, 0, 1, 1))).is_empty());
        let plan = s
            .handle(Timestamp(2), Event::TaskCancelled(TaskId(1)))
            .unwrap();
        assert_eq!(started(&plan), vec![TaskId(2)]);
    }

    #[test]
    fn easy_backfill_respects_the_reservation() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 8, 4)).unwrap();
        let mut long = request(1, 2, 1, 0);
        long.time_limit_secs = Some(100);
        submit(&mut s, 1, long);
        let mut big = request(1, 4, 1, 1);
        big.time_limit_secs = Some(10);
        submit(&mut s, 2, big);
        assert_eq!(
            s.reservation(),
            Some((TaskId(2), Some(Timestamp::from_secs(100))))
        );
        // Ends before the reservation: may backfill.
        let mut short = request(1, 1, 1, 2);
        short.time_limit_secs = Some(50);
        assert_eq!(started(&submit(&mut s, 3, short)), vec![TaskId(3)]);
        // Would still run at 100 s: must wait, with the reason saying why.
        let mut late = request(1, 1, 1, 3);
        late.time_limit_secs = Some(500);
        let plan = submit(&mut s, 4, late);
        assert!(started(&plan).is_empty());
        assert!(plan.actions.contains(&Action::Pending {
            task: TaskId(4),
            reason: PendingReason::LowerPriority {
                blocked_by: TaskId(2)
            }
        }));
        match s.explain(TaskId(2)) {
            Explanation::Queued {
                estimated_start,
                position,
                ..
            } => {
                assert_eq!(estimated_start, Some(Timestamp::from_secs(100)));
                assert_eq!(position, 0);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn limits_hold_tasks_back_and_reject_what_can_never_pass() {
        let mut config = SchedulerConfig::default();
        config.default_user_limits.max_gpus = Some(2);
        config.default_user_limits.max_queued_tasks = Some(2);
        let mut s = Scheduler::with_config(config);
        s.handle(Timestamp(0), node(1, 8, 8)).unwrap();
        assert_eq!(
            started(&submit(&mut s, 1, request(1, 2, 1, 0))),
            vec![TaskId(1)]
        );
        let plan = submit(&mut s, 2, request(1, 1, 1, 1));
        assert_eq!(
            plan.actions,
            vec![Action::Pending {
                task: TaskId(2),
                reason: PendingReason::OverUserQuota {
                    limit: LimitKind::Gpus,
                    max: 2
                }
            }]
        );
        let plan = submit(&mut s, 3, request(1, 3, 1, 2));
        assert!(
            matches!(plan.actions[..], [Action::Reject { .. }]),
            "{plan:?}"
        );
    }

    #[test]
    fn owners_reclaim_borrowed_gpus_by_preemption() {
        let mut config = SchedulerConfig::default();
        for name in ["a", "b"] {
            config.groups.insert(
                name.into(),
                GroupConfig {
                    guaranteed_gpus: 2,
                    ..Default::default()
                },
            );
        }
        let mut s = Scheduler::with_config(config);
        s.handle(Timestamp(0), node(1, 8, 4)).unwrap();
        for id in 1..=4 {
            let mut borrower = request(1, 1, 1, id);
            borrower.group = Some("b".into());
            borrower.preemptible = true;
            submit(&mut s, id, borrower);
        }
        assert_eq!(s.group_usage("b").gpus, 4, "b borrows a's idle share");
        let mut owner = request(1, 2, 1, 10);
        owner.group = Some("a".into());
        let plan = s
            .handle(
                Timestamp(700_000),
                Event::TaskSubmitted {
                    task: TaskId(9),
                    request: owner,
                },
            )
            .unwrap();
        let victims: Vec<TaskId> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Preempt {
                    task,
                    grace_secs: 30,
                } => Some(*task),
                _ => None,
            })
            .collect();
        // The two that ran the shortest lose the least work.
        assert_eq!(victims, vec![TaskId(4), TaskId(3)]);
        assert_eq!(s.preemptions(), 2);
        s.handle(Timestamp(720_000), Event::TaskPreempted(TaskId(3)))
            .unwrap();
        let plan = s
            .handle(Timestamp(720_000), Event::TaskPreempted(TaskId(4)))
            .unwrap();
        assert_eq!(started(&plan), vec![TaskId(9)]);
        assert!(matches!(
            s.explain(TaskId(4)),
            Explanation::Queued { attempt: 2, .. }
        ));
    }

    #[test]
    fn what_victims_free_is_held_for_the_claimant() {
        // Once both its tasks are stopped, b is back within its guarantee and its older
        // task ranks first: without the claim it would take the GPUs straight back.
        let mut config = SchedulerConfig::default();
        for (name, guaranteed_gpus) in [("a", 4), ("b", 3)] {
            config.groups.insert(
                name.into(),
                GroupConfig {
                    guaranteed_gpus,
                    ..Default::default()
                },
            );
        }
        let mut s = Scheduler::with_config(config);
        s.handle(Timestamp(0), node(1, 8, 4)).unwrap();
        for (id, gpus) in [(1, 3), (2, 1)] {
            let mut borrower = request(1, gpus, 1, id);
            borrower.group = Some("b".into());
            borrower.preemptible = true;
            submit(&mut s, id, borrower);
        }
        let mut owner = request(1, 4, 1, 10);
        owner.group = Some("a".into());
        let plan = s
            .handle(
                Timestamp(700_000),
                Event::TaskSubmitted {
                    task: TaskId(9),
                    request: owner,
                },
            )
            .unwrap();
        assert_eq!(s.preemptions(), 2, "{plan:?}");
        // The first victim stops: it may not start again on what the claimant needs.
        let plan = s
            .handle(Timestamp(710_000), Event::TaskPreempted(TaskId(2)))
            .unwrap();
        assert!(started(&plan).is_empty(), "{plan:?}");
        assert!(matches!(
            s.explain(TaskId(2)),
            Explanation::Queued {
                reason: Some(PendingReason::LowerPriority {
                    blocked_by: TaskId(9)
                }),
                ..
            }
        ));
        let plan = s
            .handle(Timestamp(720_000), Event::TaskPreempted(TaskId(1)))
            .unwrap();
        assert_eq!(started(&plan), vec![TaskId(9)]);
    }

    #[test]
    fn only_the_victims_the_claimant_needs_are_preempted() {
        let mut config = SchedulerConfig::default();
        for name in ["a", "b"] {
            config.groups.insert(
                name.into(),
                GroupConfig {
                    guaranteed_gpus: 2,
                    ..Default::default()
                },
            );
        }
        let mut s = Scheduler::with_config(config);
        s.handle(Timestamp(0), node(1, 8, 4)).unwrap();
        for (id, gpus) in [(1, 3), (2, 1)] {
            let mut borrower = request(1, gpus, 1, id);
            borrower.group = Some("b".into());
            borrower.preemptible = true;
            submit(&mut s, id, borrower);
        }
        let mut owner = request(1, 2, 1, 10);
        owner.group = Some("a".into());
        let plan = s
            .handle(
                Timestamp(700_000),
                Event::TaskSubmitted {
                    task: TaskId(9),
                    request: owner,
                },
            )
            .unwrap();
        // Task 2 loses less work, but stopping it alone frees 1 GPU of the 2 needed, and
        // once task 1 is stopped task 2 is not needed at all.
        let preempted: Vec<&Action> = plan
            .actions
            .iter()
            .filter(|a| matches!(a, Action::Preempt { .. }))
            .collect();
        assert_eq!(
            preempted,
            vec![&Action::Preempt {
                task: TaskId(1),
                grace_secs: 30
            }]
        );
    }

    #[test]
    fn dependencies_wait_for_the_task_they_name() {
        let mut s = Scheduler::new();
        s.handle(Timestamp(0), node(1, 8, 0)).unwrap();
        submit(&mut s, 1, request(1, 0, 1, 0));
        let mut after = request(1, 0, 1, 1);
        after.depends_on = vec![TaskId(1)];
        let plan = submit(&mut s, 2, after);
        assert_eq!(
            plan.actions,
            vec![Action::Pending {
                task: TaskId(2),
                reason: PendingReason::Dependency { on: TaskId(1) }
            }]
        );
        let plan = s.handle(Timestamp(5), Event::TaskEnded(TaskId(1))).unwrap();
        assert_eq!(started(&plan), vec![TaskId(2)]);
    }

    #[test]
    fn priority_is_capped_per_user_and_gpu_type_is_honoured() {
        let config = SchedulerConfig {
            default_max_priority: Some(Priority::Normal),
            ..Default::default()
        };
        let mut s = Scheduler::by_name("fifo", config).unwrap();
        s.handle(
            Timestamp(0),
            Event::NodeUp(NodeSpec {
                id: NodeId(1),
                capacity: Resources::new(8000, 1 << 34, 2),
                gpu_type: Some("V100".into()),
                labels: Default::default(),
            }),
        )
        .unwrap();
        s.handle(Timestamp(0), node(2, 8, 2)).unwrap();
        let mut typed = request(1, 1, 1, 0);
        typed.gpu_type = Some("V100".into());
        typed.priority = Priority::High;
        let plan = submit(&mut s, 1, typed);
        match &plan.actions[..] {
            [Action::Start { placements, .. }] => assert_eq!(placements[0].node, NodeId(1)),
            other => panic!("{other:?}"),
        }
        let mut a100 = request(1, 1, 1, 0);
        a100.gpu_type = Some("A100".into());
        assert!(matches!(
            submit(&mut s, 2, a100).actions[..],
            [Action::Reject { .. }]
        ));
    }
}
