//! Nodes, their free resources, and where a request fits — now, or after some running
//! tasks release their share ("what if" questions for reservations and preemption).

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{NodeId, Resources, TaskId};

use crate::gpu_sharing::SharedGpus;
use crate::policy::{NodeView, PlacementPolicy};
use crate::{NodeSpec, Placement, SchedulerError, TaskRequest};

#[derive(Debug, Clone)]
pub(crate) struct NodeState {
    pub spec: NodeSpec,
    pub free: Resources,
    pub free_gpus: BTreeSet<u32>,
    /// Drained nodes keep their running tasks but take no new ones.
    pub schedulable: bool,
}

/// The answer to "where would this request fit if these releases happened first?".
#[derive(Debug, Clone)]
pub(crate) struct WhatIf {
    /// How many releases were needed (0: it fits now).
    pub releases_used: usize,
    /// Sort key of the last release used (its end time, or its order for preemption).
    pub at: u64,
    /// Free resources of the chosen nodes after the releases used.
    pub free_after: BTreeMap<NodeId, Resources>,
    /// The releases used on a chosen node before it could hold its share: the ones that
    /// really matter (a release on a node that already qualified is not needed).
    pub needed: BTreeSet<TaskId>,
}

/// Nodes indexed by free GPUs, so best-fit placement is a range scan over an ordered set
/// rather than a pass over every node.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cluster {
    pub nodes: BTreeMap<NodeId, NodeState>,
    by_free_gpus: BTreeSet<(u32, NodeId)>,
    /// Capacity of the schedulable nodes, kept as nodes come, go, drain and resume: every
    /// rank computation reads it, so summing 10,000 nodes each time made each submission
    /// cost a pass over the cluster.
    schedulable_total: Resources,
    /// Nodes whose placement depends on a task's time limit (pilot allocations).
    time_bound: usize,
    /// GPUs holding shares of one GPU (`gpus: 0.5`), each out of its node's free GPUs.
    pub shared: SharedGpus,
}

/// Whether placement on `node` depends on a task's time limit (see `allocation_end`).
fn is_time_bound(node: &NodeSpec) -> bool {
    node.labels.contains_key(tacc_core::labels::PILOT_ENDS)
        || node
            .labels
            .contains_key(tacc_core::labels::PILOT_SHORT_SECS)
}

pub(crate) fn node_matches(node: &NodeSpec, request: &TaskRequest) -> bool {
    let type_ok = match &request.gpu_type {
        Some(wanted) => node.gpu_type.as_deref() == Some(wanted.as_str()),
        None => true,
    };
    type_ok
        && request
            .node_selector
            .iter()
            .all(|(key, value)| node.labels.get(key) == Some(value))
}

impl Cluster {
    pub fn add(&mut self, spec: NodeSpec) -> Result<(), SchedulerError> {
        if self.nodes.contains_key(&spec.id) {
            return Err(SchedulerError::DuplicateNode(spec.id));
        }
        self.by_free_gpus.insert((spec.capacity.gpus, spec.id));
        self.schedulable_total = self.schedulable_total.add(&spec.capacity);
        self.time_bound += usize::from(is_time_bound(&spec));
        self.nodes.insert(
            spec.id,
            NodeState {
                free: spec.capacity,
                free_gpus: (0..spec.capacity.gpus).collect(),
                schedulable: true,
                spec,
            },
        );
        Ok(())
    }

    pub fn remove(&mut self, id: NodeId) {
        if let Some(node) = self.nodes.remove(&id) {
            self.shared.forget_node(id);
            self.by_free_gpus.remove(&(node.free.gpus, id));
            if node.schedulable {
                self.schedulable_total = self.schedulable_total.saturating_sub(&node.spec.capacity);
            }
            self.time_bound -= usize::from(is_time_bound(&node.spec));
        }
    }

    pub fn drain(&mut self, id: NodeId) {
        if let Some(node) = self.nodes.get_mut(&id)
            && node.schedulable
        {
            node.schedulable = false;
            self.by_free_gpus.remove(&(node.free.gpus, id));
            self.schedulable_total = self.schedulable_total.saturating_sub(&node.spec.capacity);
        }
    }

    pub fn resume(&mut self, id: NodeId) {
        if let Some(node) = self.nodes.get_mut(&id)
            && !node.schedulable
        {
            node.schedulable = true;
            self.by_free_gpus.insert((node.free.gpus, id));
            self.schedulable_total = self.schedulable_total.add(&node.spec.capacity);
        }
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.nodes.contains_key(&id)
    }

    /// Capacity of the nodes that take new work.
    pub fn schedulable_total(&self) -> Resources {
        self.schedulable_total
    }

    /// Whether some node's placement depends on a task's time limit.
    pub fn has_time_bound_nodes(&self) -> bool {
        self.time_bound > 0
    }

    fn reindex(&mut self, id: NodeId, before: u32) {
        if let Some(node) = self.nodes.get(&id)
            && node.schedulable
        {
            self.by_free_gpus.remove(&(before, id));
            self.by_free_gpus.insert((node.free.gpus, id));
        }
    }

    pub fn take(&mut self, task: TaskId, request: &TaskRequest, placements: &[Placement]) {
        let per_node = &request.per_node;
        for placement in placements {
            if let Some(node) = self.nodes.get_mut(&placement.node) {
                let before = node.free.gpus;
                node.free = node.free.saturating_sub(per_node);
                match (request.gpu_share, placement.gpu_indices.first()) {
                    (Some(share), Some(&gpu)) => {
                        let tenant = request.gpu_tenant.as_deref().unwrap_or_default();
                        if self.shared.take(placement.node, gpu, task, tenant, share) {
                            node.free_gpus.remove(&gpu);
                            node.free.gpus = node.free.gpus.saturating_sub(1);
                        }
                    }
                    _ => {
                        for gpu in &placement.gpu_indices {
                            node.free_gpus.remove(gpu);
                        }
                    }
                }
                self.reindex(placement.node, before);
            }
        }
    }

    pub fn give_back(&mut self, task: TaskId, request: &TaskRequest, placements: &[Placement]) {
        let per_node = &request.per_node;
        for placement in placements {
            if let Some(node) = self.nodes.get_mut(&placement.node) {
                let before = node.free.gpus;
                node.free = node.free.add(per_node);
                match (request.gpu_share, placement.gpu_indices.first()) {
                    (Some(_), Some(&gpu)) => {
                        if self.shared.give_back(placement.node, gpu, task) {
                            node.free_gpus.insert(gpu);
                            node.free.gpus += 1;
                        }
                    }
                    _ => node.free_gpus.extend(placement.gpu_indices.iter().copied()),
                }
                self.reindex(placement.node, before);
            }
        }
    }

    /// The GPU of `node` a share request would take now, if any (see [`SharedGpus::slot`]).
    fn share_slot(&self, node: &NodeState, request: &TaskRequest) -> Option<u32> {
        let share = request.gpu_share?;
        let tenant = request.gpu_tenant.as_deref().unwrap_or_default();
        self.shared
            .slot(node.spec.id, &node.free_gpus, tenant, share)
    }

    /// Whether each of `placements`' nodes can trade `old` for `new` per node (CPU and
    /// memory only: a task keeps its GPUs).
    pub fn can_resize(&self, old: &Resources, new: &Resources, placements: &[Placement]) -> bool {
        placements.iter().all(|p| {
            self.nodes
                .get(&p.node)
                .is_some_and(|node| node.free.add(old).covers(new))
        })
    }

    /// Trades `old` for `new` per node on `placements` (checked by [`Cluster::can_resize`]).
    pub fn resize(&mut self, old: &Resources, new: &Resources, placements: &[Placement]) {
        for placement in placements {
            if let Some(node) = self.nodes.get_mut(&placement.node) {
                node.free = node.free.add(old).saturating_sub(new);
            }
        }
    }

    /// The least free CPU and memory over `nodes`.
    pub fn least_free(&self, nodes: impl Iterator<Item = NodeId>) -> Resources {
        nodes
            .filter_map(|id| self.nodes.get(&id).map(|node| node.free))
            .reduce(|a, b| Resources {
                cpu_millis: a.cpu_millis.min(b.cpu_millis),
                memory_bytes: a.memory_bytes.min(b.memory_bytes),
                gpus: a.gpus.min(b.gpus),
            })
            .unwrap_or(Resources::ZERO)
    }

    /// Schedulable nodes that fit one node's share of `request` now, best fit first.
    fn fitting_now<'a>(&'a self, request: &'a TaskRequest) -> impl Iterator<Item = &'a NodeState> {
        let need = request.per_node;
        self.by_free_gpus
            .range((need.gpus, NodeId(0))..)
            .map(|(_, id)| &self.nodes[id])
            .filter(move |node| {
                node.free.covers(&need)
                    && (request.gpu_share.is_none() || self.share_slot(node, request).is_some())
                    && node_matches(&node.spec, request)
                    && crate::scheduler::allocation_end::fits(&node.spec, request)
            })
    }

    /// Choose nodes and GPU indices for the whole gang, or `None`. `allow` may veto
    /// nodes (backfill uses it to keep reserved resources free).
    pub fn place(
        &self,
        request: &TaskRequest,
        policy: &dyn PlacementPolicy,
        allow: &dyn Fn(NodeId) -> bool,
    ) -> Option<Vec<Placement>> {
        // Fast rejection keeps a long queue over a full cluster cheap.
        let most_free = self.by_free_gpus.last().map_or(0, |(g, _)| *g);
        if request.nodes == 0 || request.per_node.gpus > most_free {
            return None;
        }
        let mut candidates = self
            .fitting_now(request)
            .filter(|node| allow(node.spec.id))
            .map(|node| NodeView {
                id: node.spec.id,
                free: node.free,
                capacity: node.spec.capacity,
            });
        let chosen = policy.choose(request, &mut candidates)?;
        let distinct: BTreeSet<NodeId> = chosen.iter().copied().collect();
        if distinct.len() != request.nodes as usize {
            return None;
        }
        Some(
            chosen
                .into_iter()
                .map(|id| Placement {
                    node: id,
                    gpu_indices: match request.gpu_share {
                        Some(_) => self
                            .share_slot(&self.nodes[&id], request)
                            .into_iter()
                            .collect(),
                        None => self.nodes[&id]
                            .free_gpus
                            .iter()
                            .take(request.per_node.gpus as usize)
                            .copied()
                            .collect(),
                    },
                })
                .collect(),
        )
    }

    /// The first point in `releases` (each: sort key, task, node, amount) after which the
    /// request fits, with the nodes it would take (best fit by free GPUs then); `allow`
    /// may veto nodes.
    pub fn earliest_fit(
        &self,
        request: &TaskRequest,
        releases: impl Iterator<Item = (u64, TaskId, NodeId, Resources)>,
        allow: &dyn Fn(NodeId) -> bool,
    ) -> Option<WhatIf> {
        // A share that does not fit now is projected to wait for a whole free GPU: the
        // releases say what whole GPUs come back, not which shares.
        let need = request.footprint();
        let count = request.nodes as usize;
        if count == 0 {
            return None;
        }
        let mut qualifying: BTreeSet<NodeId> = BTreeSet::new();
        for node in self.fitting_now(request).filter(|n| allow(n.spec.id)) {
            qualifying.insert(node.spec.id);
            if qualifying.len() >= count {
                break;
            }
        }
        let mut extra: BTreeMap<NodeId, Resources> = BTreeMap::new();
        let mut used: Vec<(TaskId, NodeId)> = Vec::new();
        let mut at = 0;
        let mut releases_used = 0;
        let mut releases = releases;
        while qualifying.len() < count {
            let (key, task, node_id, amount) = releases.next()?;
            releases_used += 1;
            at = key;
            let Some(node) = self.nodes.get(&node_id) else {
                continue;
            };
            if !node.schedulable
                || !node_matches(&node.spec, request)
                || !crate::scheduler::allocation_end::fits(&node.spec, request)
                || !allow(node_id)
            {
                continue;
            }
            if !qualifying.contains(&node_id) {
                used.push((task, node_id));
            }
            let added = extra.entry(node_id).or_insert(Resources::ZERO);
            *added = added.add(&amount);
            if node.free.add(added).covers(&need) {
                qualifying.insert(node_id);
            }
        }
        let effective = |id: &NodeId| {
            let free = self.nodes[id].free;
            extra.get(id).map_or(free, |e| free.add(e))
        };
        let mut ranked: Vec<(u32, NodeId)> = qualifying
            .iter()
            .map(|id| (effective(id).gpus, *id))
            .collect();
        ranked.sort_unstable();
        let nodes: Vec<NodeId> = ranked.into_iter().take(count).map(|(_, id)| id).collect();
        let free_after = nodes.iter().map(|id| (*id, effective(id))).collect();
        let needed = used
            .into_iter()
            .filter(|(_, node)| nodes.contains(node))
            .map(|(task, _)| task)
            .collect();
        Some(WhatIf {
            releases_used,
            at,
            free_after,
            needed,
        })
    }

    /// Why too few nodes carry the labels the request selects, if they do not (resources
    /// and GPU model aside: that is [`Cluster::never_fits`]'s question). Nodes come and
    /// go, so such a request waits rather than being rejected.
    pub fn selector_unmet(&self, request: &TaskRequest) -> Option<String> {
        if request.node_selector.is_empty() {
            return None;
        }
        let needed = request.nodes.max(1) as usize;
        let matching = self
            .nodes
            .values()
            .filter(|node| {
                request
                    .node_selector
                    .iter()
                    .all(|(key, value)| node.spec.labels.get(key) == Some(value))
            })
            .take(needed)
            .count();
        if matching >= needed {
            return None;
        }
        let wanted: Vec<String> = request
            .node_selector
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        Some(format!(
            "it needs {needed} node(s) labelled {}, and {} of the {} node(s) up {}; it waits until one registers",
            wanted.join(", "),
            if matching == 0 {
                "none".to_string()
            } else {
                format!("only {matching}")
            },
            self.nodes.len(),
            if matching == 1 { "is" } else { "are" },
        ))
    }

    /// Why the request could not fit even on an empty cluster, if it could not.
    pub fn never_fits(&self, request: &TaskRequest) -> Option<String> {
        self.misfit(request).map(|misfit| misfit.detail)
    }

    /// [`Cluster::never_fits`] with the part of the request at fault, so a refusal can
    /// point at the field that asked for it. The one place "can never fit" is decided.
    pub fn misfit(&self, request: &TaskRequest) -> Option<Misfit> {
        if request.nodes == 0 {
            return Some(Misfit {
                part: MisfitPart::Nodes,
                detail: "it asks for 0 nodes".to_string(),
            });
        }
        let fitting = self
            .nodes
            .values()
            .filter(|node| {
                node_matches(&node.spec, request) && node.spec.capacity.covers(&request.footprint())
            })
            .take(request.nodes as usize)
            .count();
        if fitting >= request.nodes as usize {
            return None;
        }
        let largest = self
            .nodes
            .values()
            .map(|node| node.spec.capacity)
            .max_by_key(|cap| (cap.gpus, cap.cpu_millis, cap.memory_bytes));
        let mut wanted = Vec::new();
        if let Some(gpu_type) = &request.gpu_type {
            wanted.push(format!("gpu_type {gpu_type}"));
        }
        if !request.node_selector.is_empty() {
            let labels: Vec<String> = request
                .node_selector
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            wanted.push(format!("labels {}", labels.join(", ")));
        }
        let constraint = if wanted.is_empty() {
            String::new()
        } else {
            format!(" matching {}", wanted.join(" and "))
        };
        let detail = match largest {
            None => "the cluster has no nodes".to_string(),
            Some(largest) => format!(
                "it asks for {} node(s) with {} each{constraint}, but only {fitting} node(s) can hold that (largest node: {largest}; {})",
                request.nodes,
                request.per_node,
                self.inventory()
            ),
        };
        Some(Misfit {
            part: self.misfit_part(request),
            detail,
        })
    }

    /// Which part of a request that never fits is at fault: a GPU model no node has, else
    /// the first resource no matching node has enough of, else the number of nodes.
    fn misfit_part(&self, request: &TaskRequest) -> MisfitPart {
        if let Some(wanted) = &request.gpu_type
            && !self
                .nodes
                .values()
                .any(|node| node.spec.gpu_type.as_deref() == Some(wanted.as_str()))
        {
            return MisfitPart::GpuType;
        }
        let matching: Vec<Resources> = self
            .nodes
            .values()
            .filter(|node| node_matches(&node.spec, request))
            .map(|node| node.spec.capacity)
            .collect();
        let most = |part: fn(&Resources) -> u64| matching.iter().map(part).max().unwrap_or(0);
        let asked = &request.footprint();
        if u64::from(asked.gpus) > most(|r| u64::from(r.gpus)) {
            MisfitPart::Gpus
        } else if asked.cpu_millis > most(|r| r.cpu_millis) {
            MisfitPart::Cpus
        } else if asked.memory_bytes > most(|r| r.memory_bytes) {
            MisfitPart::Memory
        } else {
            MisfitPart::Nodes
        }
    }

    /// What the cluster has, for a refusal to say: its GPU models, partitions and labels.
    fn inventory(&self) -> String {
        let mut gpu_types = BTreeSet::new();
        let mut partitions = BTreeSet::new();
        let mut labels = BTreeSet::new();
        for node in self.nodes.values() {
            gpu_types.extend(node.spec.gpu_type.clone());
            for (key, value) in &node.spec.labels {
                if key == tacc_core::labels::SLURM_PARTITION {
                    partitions.insert(value.clone());
                } else if !key.starts_with(tacc_core::labels::RESERVED_PREFIX) {
                    labels.insert(format!("{key}={value}"));
                }
            }
        }
        let list = |set: BTreeSet<String>| {
            if set.is_empty() {
                "none".to_string()
            } else {
                set.into_iter().collect::<Vec<_>>().join(", ")
            }
        };
        format!(
            "GPU types: {}; partitions: {}; labels: {}",
            list(gpu_types),
            list(partitions),
            list(labels)
        )
    }
}

/// The part of a request no node of the cluster could ever hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MisfitPart {
    Nodes,
    GpuType,
    Gpus,
    Cpus,
    Memory,
}

/// Why a request can never fit the cluster, and which part of it is at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misfit {
    pub part: MisfitPart,
    pub detail: String,
}
