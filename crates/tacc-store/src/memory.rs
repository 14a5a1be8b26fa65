use std::collections::BTreeMap;
use std::sync::Mutex;

use tacc_core::{AttemptNo, GroupId, NodeId, SnapshotId, TaskId, TaskState, Timestamp};

use crate::idempotency::key_taken;
use crate::{
    AuditEntry, Created, DeliveryOutcome, DeliveryRecord, Enrolment, GroupFilter, GroupRecord,
    HistoryFilter, IdempotencyKey, JoinScope, KeptReply, Keyed, NewAuditEntry, NewDelivery,
    NewGroup, NewNode, NewTask, NewToken, NodeRecord, OutputRecord, Result, SecretRecord,
    SnapshotOwner, Store, StoreError, TaskChange, TaskEvent, TaskFilter, TaskHistory, TaskRecord,
    TokenKind, TokenRecord, Transition, UsagePeak, UserRecord,
};

/// An in-memory [`Store`] for tests of the layers above. It follows the same contract as
/// the SQLite store (including atomic `apply`) but keeps nothing across restarts.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    /// Fault injection: this many of the next `apply` calls fail (see
    /// [`MemoryStore::fail_next_applies`]).
    failing_applies: std::sync::atomic::AtomicU32,
}

#[derive(Debug, Default, Clone)]
struct Inner {
    tasks: BTreeMap<TaskId, TaskRecord>,
    events: BTreeMap<TaskId, Vec<TaskEvent>>,
    nodes: BTreeMap<NodeId, NodeRecord>,
    last_node_id: u64,
    snapshots: BTreeMap<SnapshotId, serde_json::Value>,
    /// By task, attempt, rank and path: the order `list_outputs` promises.
    outputs: BTreeMap<(TaskId, AttemptNo, u32, String), OutputRecord>,
    users: BTreeMap<String, UserRecord>,
    tokens: BTreeMap<u64, TokenRecord>,
    /// Per join token, the names it enrolled and when.
    enrolments: BTreeMap<u64, Vec<(Timestamp, String)>>,
    audit: Vec<AuditEntry>,
    secrets: BTreeMap<(String, String), SecretRecord>,
    snapshot_owners: std::collections::BTreeSet<(SnapshotId, String)>,
    chunk_owners: std::collections::BTreeSet<(String, String)>,
    usage_peaks: BTreeMap<(TaskId, AttemptNo, u32), UsagePeak>,
    resizes: BTreeMap<TaskId, Vec<crate::ResizeRecord>>,
    signal_points: BTreeMap<(TaskId, AttemptNo, Timestamp), crate::SignalRecord>,
    metrics: BTreeMap<(TaskId, AttemptNo, u32), crate::MetricPoint>,
    groups: BTreeMap<GroupId, GroupRecord>,
    deliveries: BTreeMap<u64, DeliveryRecord>,
    /// By pipeline and position.
    stages: BTreeMap<(GroupId, u32), crate::StageRecord>,
    /// Idempotency keys by user and key.
    kept: BTreeMap<(String, String), KeptReply>,
    /// The task uid of each user.
    task_uids: BTreeMap<String, u32>,
    rank_ends: BTreeMap<(TaskId, AttemptNo, u32), crate::RankEnd>,
    fairshare: BTreeMap<String, crate::FairShareLedger>,
    dashboard_sessions: BTreeMap<String, crate::DashboardSession>,
    /// The leadership lease (one process: nothing to fence).
    lease: Option<crate::LeaderLease>,
}

impl Inner {
    fn insert_pipeline(
        &mut self,
        group: NewGroup,
        stages: Vec<crate::NewStage>,
    ) -> (GroupRecord, Vec<crate::StageRecord>, Vec<TaskRecord>) {
        use crate::{NewStageRun, StageRecord, StageSource};
        let inner = self;
        let new_group_id =
            |inner: &Inner| GroupId(inner.groups.keys().next_back().map_or(1, |last| last.0 + 1));
        let id = new_group_id(inner);
        let record = GroupRecord {
            id,
            kind: group.kind,
            name: group.name.clone(),
            user: group.user.clone(),
            spec: group.spec,
            size: stages.len() as u32,
            created_at: group.created_at,
        };
        inner.groups.insert(id, record.clone());
        // Single-task stages first, as SQLite inserts them with the pipeline group.
        let mut singles = BTreeMap::new();
        for (position, stage) in stages.iter().enumerate() {
            if let NewStageRun::Task(task) = &stage.run {
                let mut task = inner.insert_queued(task.clone());
                // No index: a single stage is no array element.
                task.group = Some(id);
                inner.tasks.insert(task.id, task.clone());
                singles.insert(position, task);
            }
        }
        let mut records = Vec::new();
        let mut tasks = Vec::new();
        for (position, stage) in stages.into_iter().enumerate() {
            let (source, cached) = match stage.run {
                NewStageRun::Task(_) => {
                    let task = singles.remove(&position).expect("inserted above");
                    let source = StageSource::Task(task.id);
                    tasks.push(task);
                    (source, false)
                }
                NewStageRun::Array {
                    group: array,
                    elements,
                } => {
                    let array_id = new_group_id(inner);
                    inner.groups.insert(
                        array_id,
                        GroupRecord {
                            id: array_id,
                            kind: array.kind,
                            name: array.name,
                            user: array.user,
                            spec: array.spec,
                            size: elements.len() as u32,
                            created_at: array.created_at,
                        },
                    );
                    for (index, task) in elements {
                        let mut task = inner.insert_queued(task);
                        task.group = Some(array_id);
                        task.group_index = Some(index);
                        inner.tasks.insert(task.id, task.clone());
                        tasks.push(task);
                    }
                    (StageSource::Group(array_id), false)
                }
                NewStageRun::Cached(source) => (source, true),
            };
            let stage = StageRecord {
                pipeline: id,
                position: position as u32,
                name: stage.name,
                needs: stage.needs,
                cache_key: stage.cache_key,
                source,
                cached,
                user: group.user.clone(),
                pipeline_name: group.name.clone(),
            };
            inner.stages.insert((id, position as u32), stage.clone());
            records.push(stage);
        }
        (record, records, tasks)
    }

    fn insert_group(
        &mut self,
        group: NewGroup,
        elements: Vec<(u32, NewTask)>,
    ) -> (GroupRecord, Vec<TaskRecord>) {
        let id = GroupId(self.groups.keys().next_back().map_or(1, |last| last.0 + 1));
        let record = GroupRecord {
            id,
            kind: group.kind,
            name: group.name,
            user: group.user,
            spec: group.spec,
            size: elements.len() as u32,
            created_at: group.created_at,
        };
        self.groups.insert(id, record.clone());
        let mut tasks = Vec::with_capacity(elements.len());
        for (index, task) in elements {
            let mut task = self.insert_queued(task);
            task.group = Some(id);
            task.group_index = Some(index);
            self.tasks.insert(task.id, task.clone());
            tasks.push(task);
        }
        (record, tasks)
    }

    /// Fail when the key is kept and live; otherwise nothing changes.
    fn check_key_free(&self, key: &IdempotencyKey) -> Result<()> {
        match self.kept.get(&(key.user.clone(), key.key.clone())) {
            Some(kept) if !kept.key.expired(key.created_at) => Err(key_taken(key)),
            _ => Ok(()),
        }
    }

    fn keep(&mut self, kept: KeptReply) {
        self.kept
            .insert((kept.key.user.clone(), kept.key.key.clone()), kept);
    }

    fn next_task_id(&self) -> TaskId {
        TaskId(self.tasks.keys().next_back().map_or(1, |last| last.0 + 1))
    }

    fn insert_queued(&mut self, task: NewTask) -> TaskRecord {
        let id = self.next_task_id();
        let submitted_at = task.submitted_at;
        let record = task.into_queued_record(id);
        self.tasks.insert(id, record.clone());
        self.events.insert(
            id,
            vec![TaskEvent {
                at: submitted_at,
                attempt: AttemptNo::FIRST,
                state: TaskState::Queued,
                reason: None,
            }],
        );
        record
    }

    fn queue_delivery(&mut self, delivery: &NewDelivery) {
        if self.deliveries.values().any(|d| d.key == delivery.key) {
            return;
        }
        let id = self
            .deliveries
            .keys()
            .next_back()
            .map_or(1, |last| last + 1);
        self.deliveries.insert(
            id,
            DeliveryRecord {
                id,
                key: delivery.key.clone(),
                user: delivery.user.clone(),
                url: delivery.url.clone(),
                secret: delivery.secret.clone(),
                body: delivery.body.clone(),
                attempts: 0,
                next_at: delivery.created_at,
                last_error: None,
                delivered_at: None,
                gave_up: false,
            },
        );
    }
}

/// Whether an ended task belongs in a history page.
pub(crate) fn in_history(filter: &HistoryFilter, task: &TaskRecord) -> bool {
    let Some(finished) = task.finished_at else {
        return false;
    };
    task.state.is_terminal()
        && (filter.states.is_empty() || filter.states.contains(&task.state))
        && filter.user.as_ref().is_none_or(|u| *u == task.user)
        && filter.name.as_ref().is_none_or(|n| *n == task.name)
        && filter.since.is_none_or(|since| finished >= since)
        && filter
            .before
            .is_none_or(|before| (finished, task.id) < before)
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Fault injection for the control plane's lifecycle tests: the next `count` calls
    /// of [`Store::apply`] fail as a database that cannot be reached does, applying
    /// nothing.
    pub fn fail_next_applies(&self, count: u32) {
        self.failing_applies
            .store(count, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The state-transition rules shared by every store implementation (and by the control
/// plane's in-memory copy of placed tasks, so that copy never drifts from the store).
pub fn apply_transition(record: &mut TaskRecord, change: &TaskChange) -> Result<Option<TaskEvent>> {
    match change {
        TaskChange::Transition(Transition {
            task,
            from,
            to,
            attempt,
            at,
            reason,
            exit_code,
            placements,
        }) => {
            if record.state != *from {
                return Err(StoreError::Conflict {
                    task: *task,
                    expected: from.to_string(),
                    actual: record.state.to_string(),
                });
            }
            record.state = *to;
            record.attempt = *attempt;
            record.reason = reason.clone();
            match to {
                TaskState::Queued => {
                    record.placements.clear();
                    record.exit_code = None;
                    record.started_at = None;
                    record.cancel_requested = false;
                }
                TaskState::Starting => record.placements = placements.clone(),
                TaskState::Running => record.started_at = Some(*at),
                _ => {}
            }
            if to.is_terminal() {
                record.finished_at = Some(*at);
                record.exit_code = *exit_code;
            }
            Ok(Some(TaskEvent {
                at: *at,
                attempt: *attempt,
                state: *to,
                reason: reason.clone(),
            }))
        }
        TaskChange::Reason { reason, .. } => {
            record.reason = reason.clone();
            Ok(None)
        }
        TaskChange::CancelRequested { .. } => {
            record.cancel_requested = true;
            Ok(None)
        }
        TaskChange::Resized(resize) => {
            let active = matches!(record.state, TaskState::Starting | TaskState::Running);
            if !active || record.attempt != resize.attempt {
                return Err(StoreError::Conflict {
                    task: resize.task,
                    expected: format!("running attempt {}", resize.attempt),
                    actual: format!("{} attempt {}", record.state, record.attempt),
                });
            }
            Ok(None)
        }
        TaskChange::Notify(_) | TaskChange::RankEnded(_) => Ok(None),
    }
}

/// The task a change is about; `None` for a notification, which changes no task.
pub(crate) fn change_task(change: &TaskChange) -> Option<TaskId> {
    change.task()
}

pub(crate) fn matches(filter: &TaskFilter, task: &TaskRecord) -> bool {
    (filter.states.is_empty() || filter.states.contains(&task.state))
        && filter.user.as_ref().is_none_or(|u| *u == task.user)
        && filter.group.is_none_or(|g| task.group == Some(g))
        && !(filter.ungrouped && task.group.is_some())
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    /// Nothing is kept past the process: there is nothing to sync.
    async fn sync(&self) -> Result<()> {
        Ok(())
    }

    async fn try_acquire_lease(
        &self,
        claim: &crate::LeaseClaim,
    ) -> Result<Option<crate::LeaderLease>> {
        let mut inner = self.inner.lock().expect("store lock poisoned");
        let epoch = match &inner.lease {
            Some(held) if !held.expired(claim.now) => return Ok(None),
            Some(held) => held.epoch + 1,
            None => 1,
        };
        let lease = crate::LeaderLease {
            holder: claim.holder.clone(),
            leader_url: claim.leader_url.clone(),
            epoch,
            expires_at: claim.expires_at(),
        };
        inner.lease = Some(lease.clone());
        Ok(Some(lease))
    }

    async fn renew_lease(
        &self,
        claim: &crate::LeaseClaim,
        epoch: u64,
    ) -> Result<Option<crate::LeaderLease>> {
        let mut inner = self.inner.lock().expect("store lock poisoned");
        match &mut inner.lease {
            Some(held) if held.holder == claim.holder && held.epoch == epoch => {
                held.expires_at = claim.expires_at();
                Ok(Some(held.clone()))
            }
            _ => Ok(None),
        }
    }

    async fn current_lease(&self) -> Result<Option<crate::LeaderLease>> {
        Ok(self
            .inner
            .lock()
            .expect("store lock poisoned")
            .lease
            .clone())
    }

    async fn create_task(&self, task: NewTask) -> Result<TaskRecord> {
        Ok(self.inner.lock().unwrap().insert_queued(task))
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<TaskRecord>> {
        Ok(self.inner.lock().unwrap().tasks.get(&id).cloned())
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>> {
        let inner = self.inner.lock().unwrap();
        let limit = filter.limit.map_or(usize::MAX, |l| l as usize);
        Ok(inner
            .tasks
            .values()
            .rev()
            .filter(|t| matches(filter, t))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn count_tasks(&self, filter: &TaskFilter) -> Result<u64> {
        let inner = self.inner.lock().unwrap();
        Ok(inner.tasks.values().filter(|t| matches(filter, t)).count() as u64)
    }

    async fn task_events(&self, id: TaskId) -> Result<Vec<TaskEvent>> {
        Ok(self
            .inner
            .lock()
            .unwrap()
            .events
            .get(&id)
            .cloned()
            .unwrap_or_default())
    }

    async fn apply(&self, changes: &[TaskChange]) -> Result<()> {
        let failing = self.failing_applies.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |left| left.checked_sub(1),
        );
        if failing.is_ok() {
            return Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut));
        }
        let mut inner = self.inner.lock().unwrap();
        // Work on a copy so a failing change leaves nothing applied.
        let mut draft = inner.clone();
        for change in changes {
            let Some(id) = change_task(change) else {
                if let TaskChange::Notify(delivery) = change {
                    draft.queue_delivery(delivery);
                }
                continue;
            };
            let record = draft
                .tasks
                .get_mut(&id)
                .ok_or(StoreError::TaskNotFound(id))?;
            if let Some(event) = apply_transition(record, change)? {
                draft.events.entry(id).or_default().push(event);
            }
            if let TaskChange::Resized(resize) = change {
                draft.resizes.entry(id).or_default().push(resize.clone());
            }
            if let TaskChange::RankEnded(end) = change {
                draft
                    .rank_ends
                    .insert((end.task, end.attempt, end.rank), end.clone());
            }
        }
        *inner = draft;
        Ok(())
    }

    async fn register_node(&self, node: NewNode) -> Result<NodeRecord> {
        let mut inner = self.inner.lock().unwrap();
        let existing = inner
            .nodes
            .values()
            .find(|n| n.name == node.name)
            .map(|n| (n.id, n.drained, n.enrolled_capacity, n.pending, n.last_seen));
        let (id, drained, enrolled_capacity, pending, last_seen) = existing.unwrap_or_else(|| {
            // Ids are never reused, not even a removed node's (as AUTOINCREMENT in SQLite).
            inner.last_node_id += 1;
            (
                NodeId(inner.last_node_id),
                false,
                node.capacity,
                false,
                None,
            )
        });
        // An enrolment sets the enrolled capacity and approval state; a restart keeps them.
        let (enrolled_capacity, pending) = match node.enrolment {
            Some(enrolment) => (node.capacity, enrolment.pending),
            None => (enrolled_capacity, pending),
        };
        let record = NodeRecord {
            id,
            name: node.name,
            capacity: node.capacity,
            gpu_type: node.gpu_type,
            labels: node.labels,
            address: node.address,
            registered_at: node.registered_at,
            drained,
            enrolled_capacity,
            pending,
            last_seen,
        };
        inner.nodes.insert(id, record.clone());
        Ok(record)
    }

    async fn list_nodes(&self) -> Result<Vec<NodeRecord>> {
        Ok(self.inner.lock().unwrap().nodes.values().cloned().collect())
    }

    async fn set_node_drained(&self, node: NodeId, drained: bool) -> Result<bool> {
        let mut inner = self.inner.lock().unwrap();
        Ok(inner
            .nodes
            .get_mut(&node)
            .map(|n| n.drained = drained)
            .is_some())
    }

    async fn approve_node(&self, node: NodeId) -> Result<bool> {
        let mut inner = self.inner.lock().unwrap();
        Ok(inner
            .nodes
            .get_mut(&node)
            .map(|n| n.pending = false)
            .is_some())
    }

    async fn remove_node(&self, node: NodeId) -> Result<bool> {
        Ok(self.inner.lock().unwrap().nodes.remove(&node).is_some())
    }

    async fn put_snapshot(
        &self,
        id: &SnapshotId,
        manifest: &serde_json::Value,
        _total_bytes: u64,
        _at: Timestamp,
    ) -> Result<()> {
        self.inner
            .lock()
            .unwrap()
            .snapshots
            .entry(id.clone())
            .or_insert_with(|| manifest.clone());
        Ok(())
    }

    async fn get_snapshot(&self, id: &SnapshotId) -> Result<Option<serde_json::Value>> {
        Ok(self.inner.lock().unwrap().snapshots.get(id).cloned())
    }

    async fn list_snapshots(&self) -> Result<Vec<SnapshotId>> {
        Ok(self
            .inner
            .lock()
            .unwrap()
            .snapshots
            .keys()
            .cloned()
            .collect())
    }

    async fn add_output(&self, output: OutputRecord) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        if !inner.tasks.contains_key(&output.task) {
            return Err(StoreError::TaskNotFound(output.task));
        }
        let key = (
            output.task,
            output.attempt,
            output.rank,
            output.path.clone(),
        );
        inner.outputs.insert(key, output);
        Ok(())
    }

    async fn list_outputs(&self, task: TaskId) -> Result<Vec<OutputRecord>> {
        Ok(self
            .inner
            .lock()
            .unwrap()
            .outputs
            .values()
            .filter(|o| o.task == task)
            .cloned()
            .collect())
    }

    async fn list_resizes(&self, task: TaskId) -> Result<Vec<crate::ResizeRecord>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner.resizes.get(&task).cloned().unwrap_or_default())
    }

    async fn record_signal_point(&self, point: crate::SignalRecord, keep: u32) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        if !inner.tasks.contains_key(&point.task) {
            return Err(StoreError::TaskNotFound(point.task));
        }
        let (task, attempt) = (point.task, point.attempt);
        inner.signal_points.insert((task, attempt, point.at), point);
        let range = (task, attempt, Timestamp(0))..=(task, attempt, Timestamp(u64::MAX));
        let kept = inner.signal_points.range(range.clone()).count();
        let excess: Vec<_> = inner
            .signal_points
            .range(range)
            .take(kept.saturating_sub(keep as usize))
            .map(|(key, _)| *key)
            .collect();
        for key in excess {
            inner.signal_points.remove(&key);
        }
        Ok(())
    }

    async fn list_signal_points(&self, task: TaskId) -> Result<Vec<crate::SignalRecord>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .signal_points
            .range(
                (task, AttemptNo(0), Timestamp(0))
                    ..=(task, AttemptNo(u32::MAX), Timestamp(u64::MAX)),
            )
            .map(|(_, point)| point.clone())
            .collect())
    }

    async fn record_usage_peak(&self, peak: UsagePeak) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        if !inner.tasks.contains_key(&peak.task) {
            return Err(StoreError::TaskNotFound(peak.task));
        }
        let key = (peak.task, peak.attempt, peak.node_rank);
        let merged = match inner.usage_peaks.get(&key) {
            Some(kept) => kept.merge(&peak),
            None => peak,
        };
        inner.usage_peaks.insert(key, merged);
        Ok(())
    }

    async fn list_usage_peaks(&self, task: TaskId) -> Result<Vec<UsagePeak>> {
        Ok(self
            .inner
            .lock()
            .unwrap()
            .usage_peaks
            .range((task, AttemptNo(0), 0)..=(task, AttemptNo(u32::MAX), u32::MAX))
            .map(|(_, peak)| peak.clone())
            .collect())
    }

    async fn tasks_active_between(
        &self,
        since: Timestamp,
        until: Timestamp,
        user: Option<&str>,
    ) -> Result<Vec<TaskHistory>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .tasks
            .values()
            .filter(|task| user.is_none_or(|u| u == task.user))
            .filter_map(|task| {
                let events = inner.events.get(&task.id)?;
                let started_before = events
                    .iter()
                    .any(|e| e.state == TaskState::Starting && e.at < until);
                let seen_since = task.state.is_active() || events.iter().any(|e| e.at >= since);
                (started_before && seen_since).then(|| TaskHistory {
                    task: task.clone(),
                    events: events.clone(),
                })
            })
            .collect())
    }

    async fn create_group(
        &self,
        group: NewGroup,
        elements: Vec<(u32, NewTask)>,
    ) -> Result<(GroupRecord, Vec<TaskRecord>)> {
        Ok(self.inner.lock().unwrap().insert_group(group, elements))
    }

    async fn add_group_elements(
        &self,
        group: GroupId,
        elements: Vec<(u32, NewTask)>,
    ) -> Result<Vec<TaskRecord>> {
        let mut inner = self.inner.lock().unwrap();
        let Some(record) = inner.groups.get_mut(&group) else {
            return Err(StoreError::GroupNotFound(group));
        };
        record.size += elements.len() as u32;
        let mut tasks = Vec::with_capacity(elements.len());
        for (index, task) in elements {
            let mut task = inner.insert_queued(task);
            task.group = Some(group);
            task.group_index = Some(index);
            inner.tasks.insert(task.id, task.clone());
            tasks.push(task);
        }
        Ok(tasks)
    }

    async fn append_metrics(&self, points: Vec<crate::MetricPoint>) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        if let Some(missing) = points.iter().find(|p| !inner.tasks.contains_key(&p.task)) {
            return Err(StoreError::TaskNotFound(missing.task));
        }
        for mut point in points {
            let (task, attempt) = (point.task, point.attempt);
            let next = inner
                .metrics
                .range((task, attempt, 0)..=(task, attempt, u32::MAX))
                .next_back()
                .map_or(0, |(key, _)| key.2 + 1);
            if next >= crate::MAX_METRIC_POINTS_PER_ATTEMPT {
                continue;
            }
            point.seq = next;
            inner.metrics.insert((task, attempt, next), point);
        }
        Ok(())
    }

    async fn list_metrics(&self, task: TaskId) -> Result<Vec<crate::MetricPoint>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .metrics
            .range((task, AttemptNo(0), 0)..=(task, AttemptNo(u32::MAX), u32::MAX))
            .map(|(_, point)| point.clone())
            .collect())
    }

    async fn create_pipeline(
        &self,
        group: NewGroup,
        stages: Vec<crate::NewStage>,
    ) -> Result<(GroupRecord, Vec<crate::StageRecord>, Vec<TaskRecord>)> {
        Ok(self.inner.lock().unwrap().insert_pipeline(group, stages))
    }

    async fn create_pipeline_keyed(
        &self,
        group: NewGroup,
        stages: Vec<crate::NewStage>,
        keyed: Keyed,
    ) -> Result<(GroupRecord, Vec<crate::StageRecord>, Vec<TaskRecord>)> {
        let mut inner = self.inner.lock().unwrap();
        inner.check_key_free(&keyed.key)?;
        let made = inner.insert_pipeline(group, stages);
        let reply = (keyed.render)(Created::Pipeline(&made.0, &made.1, &made.2));
        inner.keep(KeptReply {
            key: keyed.key,
            reply,
        });
        Ok(made)
    }

    async fn pipeline_stages(&self, pipeline: GroupId) -> Result<Vec<crate::StageRecord>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .stages
            .range((pipeline, 0)..=(pipeline, u32::MAX))
            .map(|(_, stage)| stage.clone())
            .collect())
    }

    async fn stage_of(&self, source: crate::StageSource) -> Result<Option<crate::StageRecord>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .stages
            .values()
            .find(|stage| stage.source == source && !stage.cached)
            .cloned())
    }

    async fn stages_with_key(
        &self,
        user: &str,
        pipeline: &str,
        stage: &str,
        cache_key: &str,
    ) -> Result<Vec<crate::StageRecord>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .stages
            .values()
            .rev()
            .filter(|s| {
                s.user == user
                    && s.pipeline_name == pipeline
                    && s.name == stage
                    && s.cache_key == cache_key
            })
            .take(20)
            .cloned()
            .collect())
    }

    async fn get_group(&self, id: GroupId) -> Result<Option<GroupRecord>> {
        Ok(self.inner.lock().unwrap().groups.get(&id).cloned())
    }

    async fn list_groups(&self, filter: &GroupFilter) -> Result<Vec<GroupRecord>> {
        let inner = self.inner.lock().unwrap();
        let limit = filter.limit.map_or(usize::MAX, |l| l as usize);
        Ok(inner
            .groups
            .values()
            .rev()
            .filter(|g| filter.user.as_ref().is_none_or(|u| *u == g.user))
            .filter(|g| filter.since.is_none_or(|since| g.created_at >= since))
            .filter(|g| {
                filter.with_states.is_empty()
                    || inner
                        .tasks
                        .values()
                        .any(|t| t.group == Some(g.id) && filter.with_states.contains(&t.state))
            })
            .take(limit)
            .cloned()
            .collect())
    }

    async fn group_counts(&self, id: GroupId) -> Result<BTreeMap<TaskState, u64>> {
        let inner = self.inner.lock().unwrap();
        let mut counts = BTreeMap::new();
        for task in inner.tasks.values().filter(|t| t.group == Some(id)) {
            *counts.entry(task.state).or_insert(0) += 1;
        }
        Ok(counts)
    }

    async fn group_has_open(&self, id: GroupId) -> Result<bool> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .tasks
            .values()
            .any(|t| t.group == Some(id) && !t.state.is_terminal()))
    }

    async fn task_history(&self, filter: &HistoryFilter) -> Result<Vec<TaskRecord>> {
        let inner = self.inner.lock().unwrap();
        let mut ended: Vec<&TaskRecord> = inner
            .tasks
            .values()
            .filter(|t| in_history(filter, t))
            .collect();
        ended.sort_by_key(|t| std::cmp::Reverse((t.finished_at, t.id)));
        Ok(ended
            .into_iter()
            .take(filter.limit as usize)
            .cloned()
            .collect())
    }

    async fn due_deliveries(&self, now: Timestamp, limit: u32) -> Result<Vec<DeliveryRecord>> {
        let inner = self.inner.lock().unwrap();
        let mut due: Vec<&DeliveryRecord> = inner
            .deliveries
            .values()
            .filter(|d| d.delivered_at.is_none() && !d.gave_up && d.next_at <= now)
            .collect();
        due.sort_by_key(|d| (d.next_at, d.id));
        Ok(due.into_iter().take(limit as usize).cloned().collect())
    }

    async fn finish_delivery(&self, id: u64, outcome: DeliveryOutcome) -> Result<bool> {
        let mut inner = self.inner.lock().unwrap();
        let Some(delivery) = inner.deliveries.get_mut(&id) else {
            return Ok(false);
        };
        delivery.attempts += 1;
        match outcome {
            DeliveryOutcome::Delivered { at } => delivery.delivered_at = Some(at),
            DeliveryOutcome::Retry { next_at, error } => {
                delivery.next_at = next_at;
                delivery.last_error = Some(error);
            }
            DeliveryOutcome::GaveUp { error } => {
                delivery.gave_up = true;
                delivery.last_error = Some(error);
            }
        }
        Ok(true)
    }

    async fn get_delivery(&self, key: &str) -> Result<Option<DeliveryRecord>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner.deliveries.values().find(|d| d.key == key).cloned())
    }

    async fn kept_reply(&self, user: &str, key: &str, now: Timestamp) -> Result<Option<KeptReply>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .kept
            .get(&(user.to_string(), key.to_string()))
            .filter(|kept| !kept.key.expired(now))
            .cloned())
    }

    async fn keep_reply(&self, kept: KeptReply) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        inner.check_key_free(&kept.key)?;
        inner.keep(kept);
        Ok(())
    }

    async fn create_task_keyed(&self, task: NewTask, keyed: Keyed) -> Result<TaskRecord> {
        let mut inner = self.inner.lock().unwrap();
        inner.check_key_free(&keyed.key)?;
        let record = inner.insert_queued(task);
        let reply = (keyed.render)(Created::Task(&record));
        inner.keep(KeptReply {
            key: keyed.key,
            reply,
        });
        Ok(record)
    }

    async fn create_group_keyed(
        &self,
        group: NewGroup,
        elements: Vec<(u32, NewTask)>,
        keyed: Keyed,
    ) -> Result<(GroupRecord, Vec<TaskRecord>)> {
        let mut inner = self.inner.lock().unwrap();
        inner.check_key_free(&keyed.key)?;
        let (record, tasks) = inner.insert_group(group, elements);
        let reply = (keyed.render)(Created::Group(&record, &tasks));
        inner.keep(KeptReply {
            key: keyed.key,
            reply,
        });
        Ok((record, tasks))
    }

    async fn create_user(&self, user: UserRecord) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        if inner.users.contains_key(&user.name) {
            return Err(StoreError::AlreadyExists {
                what: "user",
                name: user.name,
            });
        }
        inner.users.insert(user.name.clone(), user);
        Ok(())
    }

    async fn get_user(&self, name: &str) -> Result<Option<UserRecord>> {
        Ok(self.inner.lock().unwrap().users.get(name).cloned())
    }

    async fn list_users(&self) -> Result<Vec<UserRecord>> {
        Ok(self.inner.lock().unwrap().users.values().cloned().collect())
    }

    async fn create_token(&self, token: NewToken) -> Result<TokenRecord> {
        let mut inner = self.inner.lock().unwrap();
        if inner.tokens.values().any(|t| t.hash == token.hash) {
            return Err(StoreError::AlreadyExists {
                what: "token",
                name: token.hash,
            });
        }
        let id = inner.tokens.keys().next_back().map_or(1, |last| last + 1);
        let record = TokenRecord {
            id,
            kind: token.kind,
            hash: token.hash,
            user: token.user,
            node: token.node,
            created_at: token.created_at,
            expires_at: token.expires_at,
            revoked_at: None,
            label: token.label,
            // A join token without a scope is single-use, as the SQL stores read it.
            join: match token.kind {
                TokenKind::AgentJoin => Some(token.join.unwrap_or_else(JoinScope::single_use)),
                _ => token.join,
            },
            enrolled: 0,
        };
        inner.tokens.insert(id, record.clone());
        Ok(record)
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner.tokens.values().find(|t| t.hash == hash).cloned())
    }

    async fn get_token(&self, id: u64) -> Result<Option<TokenRecord>> {
        Ok(self.inner.lock().unwrap().tokens.get(&id).cloned())
    }

    async fn list_tokens(&self, user: Option<&str>) -> Result<Vec<TokenRecord>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .tokens
            .values()
            .filter(|t| user.is_none() || t.user.as_deref() == user)
            .cloned()
            .collect())
    }

    async fn revoke_token(&self, id: u64, at: Timestamp) -> Result<bool> {
        let mut inner = self.inner.lock().unwrap();
        match inner.tokens.get_mut(&id) {
            Some(token) if token.revoked_at.is_none() => {
                token.revoked_at = Some(at);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn enrol_node(&self, token: u64, node_name: &str, at: Timestamp) -> Result<Enrolment> {
        let mut inner = self.inner.lock().unwrap();
        let Some((scope, count)) = inner
            .tokens
            .get(&token)
            .filter(|t| t.kind == TokenKind::AgentJoin)
            .map(|t| {
                (
                    t.join.clone().unwrap_or_else(JoinScope::single_use),
                    t.enrolled,
                )
            })
        else {
            return Ok(Enrolment::NotJoinToken);
        };
        if let Some(bound) = scope.bound_node
            && bound != node_name
        {
            return Ok(Enrolment::BoundToOther { bound });
        }
        let used = inner.enrolments.entry(token).or_default();
        if count >= scope.max_nodes || used.iter().any(|(_, n)| n == node_name) {
            let mut enrolled = used.clone();
            enrolled.sort();
            return Ok(Enrolment::UsedUp {
                max_nodes: scope.max_nodes,
                enrolled: enrolled.into_iter().map(|(_, name)| name).collect(),
            });
        }
        used.push((at, node_name.to_string()));
        inner.tokens.get_mut(&token).expect("read above").enrolled += 1;
        Ok(Enrolment::Admitted)
    }

    async fn append_audit(&self, entry: NewAuditEntry) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        // After the last, not the count: pruning leaves gaps.
        let id = inner.audit.last().map_or(0, |e| e.id) + 1;
        inner.audit.push(AuditEntry {
            id,
            at: entry.at,
            actor: entry.actor,
            action: entry.action,
            target: entry.target,
            outcome: entry.outcome,
            detail: entry.detail,
        });
        Ok(())
    }

    async fn prune_audit(&self, before: Timestamp) -> Result<u64> {
        let mut inner = self.inner.lock().unwrap();
        let was = inner.audit.len();
        inner.audit.retain(|e| e.at >= before);
        Ok((was - inner.audit.len()) as u64)
    }

    async fn list_audit(&self, since: Option<Timestamp>, limit: u32) -> Result<Vec<AuditEntry>> {
        let inner = self.inner.lock().unwrap();
        let matching: Vec<AuditEntry> = inner
            .audit
            .iter()
            .filter(|e| since.is_none_or(|s| e.at >= s))
            .cloned()
            .collect();
        let skip = matching.len().saturating_sub(limit as usize);
        Ok(matching.into_iter().skip(skip).collect())
    }

    async fn rank_ends(&self, task: TaskId, attempt: AttemptNo) -> Result<Vec<crate::RankEnd>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .rank_ends
            .range((task, attempt, 0)..=(task, attempt, u32::MAX))
            .map(|(_, end)| end.clone())
            .collect())
    }

    async fn save_fairshare(&self, ledgers: &[crate::FairShareLedger]) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        for ledger in ledgers {
            inner.fairshare.insert(ledger.group.clone(), ledger.clone());
        }
        Ok(())
    }

    async fn load_fairshare(&self) -> Result<Vec<crate::FairShareLedger>> {
        Ok(self
            .inner
            .lock()
            .unwrap()
            .fairshare
            .values()
            .cloned()
            .collect())
    }

    async fn save_nodes_seen(&self, seen: &[(NodeId, Timestamp)]) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        for (node, at) in seen {
            if let Some(record) = inner.nodes.get_mut(node) {
                record.last_seen = Some(*at);
            }
        }
        Ok(())
    }

    async fn recent_run_times(&self, user: &str, name: &str, limit: u32) -> Result<Vec<u64>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .tasks
            .values()
            .rev()
            .filter(|t| t.user == user && t.name == name && t.state == TaskState::Succeeded)
            .filter_map(|t| Some(t.finished_at?.millis_since(t.started_at?)))
            .take(limit as usize)
            .collect())
    }

    async fn put_dashboard_session(&self, session: crate::DashboardSession) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        inner
            .dashboard_sessions
            .insert(session.key.clone(), session);
        Ok(())
    }

    async fn dashboard_session(&self, key: &str) -> Result<Option<crate::DashboardSession>> {
        Ok(self
            .inner
            .lock()
            .unwrap()
            .dashboard_sessions
            .get(key)
            .cloned())
    }

    async fn delete_dashboard_session(&self, key: &str) -> Result<bool> {
        Ok(self
            .inner
            .lock()
            .unwrap()
            .dashboard_sessions
            .remove(key)
            .is_some())
    }

    async fn prune_dashboard_sessions(&self, before: Timestamp) -> Result<u64> {
        let mut inner = self.inner.lock().unwrap();
        let count = inner.dashboard_sessions.len();
        inner
            .dashboard_sessions
            .retain(|_, session| session.opened_at >= before);
        Ok((count - inner.dashboard_sessions.len()) as u64)
    }

    async fn task_uid(&self, user: &str, base: u32) -> Result<u32> {
        let mut inner = self.inner.lock().unwrap();
        if let Some(uid) = inner.task_uids.get(user) {
            return Ok(*uid);
        }
        let next = inner
            .task_uids
            .values()
            .max()
            .map_or(0, |highest| highest.saturating_add(1))
            .max(base)
            .max(1);
        if next == 0 || next > crate::sql::task_uids::MAX_TASK_UID {
            return Err(StoreError::Corrupt(format!(
                "task uid {next} of user `{user}` is out of range"
            )));
        }
        inner.task_uids.insert(user.to_string(), next);
        Ok(next)
    }

    async fn list_task_uids(&self) -> Result<Vec<(String, u32)>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .task_uids
            .iter()
            .map(|(user, uid)| (user.clone(), *uid))
            .collect())
    }

    async fn put_secret(&self, secret: SecretRecord) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        inner
            .secrets
            .insert((secret.user.clone(), secret.name.clone()), secret);
        Ok(())
    }

    async fn get_secret(&self, user: &str, name: &str) -> Result<Option<SecretRecord>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .secrets
            .get(&(user.to_string(), name.to_string()))
            .cloned())
    }

    async fn list_secrets(&self, user: &str) -> Result<Vec<SecretRecord>> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .secrets
            .values()
            .filter(|s| s.user == user)
            .cloned()
            .collect())
    }

    async fn delete_secret(&self, user: &str, name: &str) -> Result<bool> {
        let mut inner = self.inner.lock().unwrap();
        Ok(inner
            .secrets
            .remove(&(user.to_string(), name.to_string()))
            .is_some())
    }

    async fn add_snapshot_owner(&self, owner: SnapshotOwner) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        inner.snapshot_owners.insert((owner.snapshot, owner.user));
        Ok(())
    }

    async fn is_snapshot_owner(&self, snapshot: &SnapshotId, user: &str) -> Result<bool> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .snapshot_owners
            .contains(&(snapshot.clone(), user.to_string())))
    }

    async fn add_chunk_owners(&self, user: &str, hashes: &[String]) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        for hash in hashes {
            inner.chunk_owners.insert((user.to_string(), hash.clone()));
        }
        Ok(())
    }

    async fn owned_chunks(
        &self,
        user: &str,
        hashes: &[String],
    ) -> Result<std::collections::BTreeSet<String>> {
        let inner = self.inner.lock().unwrap();
        Ok(hashes
            .iter()
            .filter(|h| {
                inner
                    .chunk_owners
                    .contains(&(user.to_string(), (*h).clone()))
            })
            .cloned()
            .collect())
    }
}
