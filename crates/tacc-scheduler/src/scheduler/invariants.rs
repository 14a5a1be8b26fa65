//! Consistency checks of the bookkeeping against first principles, for tests and
//! property tests: every task listed as running holds one placement per node of its gang,
//! no GPU is given twice, no node holds more than its capacity, no shared GPU holds more
//! than one GPU in shares or shares of two tenants, and the schedulable capacity kept is
//! the nodes' sum.

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{NodeId, Resources};

use super::Scheduler;

impl Scheduler {
    /// Checks the bookkeeping against first principles; for tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut used: BTreeMap<NodeId, (Resources, BTreeSet<u32>)> = BTreeMap::new();
        // Shares of one GPU by (node, GPU): hundredths held and the tenants holding them.
        let mut shares: BTreeMap<(NodeId, u32), (u32, BTreeSet<String>)> = BTreeMap::new();
        for id in &self.running {
            let entry = &self.tasks[id];
            let Some((placements, _)) = entry.phase.holding() else {
                return Err(format!("task {id} listed as running but queued"));
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
                if let Some(share) = entry.request.gpu_share {
                    let [gpu] = p.gpu_indices[..] else {
                        return Err(format!("task {id} holds a share of {:?}", p.gpu_indices));
                    };
                    let tenant = entry.request.gpu_tenant.clone().unwrap_or_default();
                    let held = shares.entry((p.node, gpu)).or_insert((0, BTreeSet::new()));
                    held.0 += share;
                    held.1.insert(tenant);
                    continue;
                }
                for gpu in &p.gpu_indices {
                    if !slot.1.insert(*gpu) {
                        return Err(format!("GPU {gpu} of node {} given twice", p.node));
                    }
                }
            }
        }
        for ((node, gpu), (hundredths, tenants)) in &shares {
            if *hundredths > tacc_core::GPU_HUNDREDTHS {
                return Err(format!(
                    "GPU {gpu} of node {node} holds {hundredths} hundredths in shares"
                ));
            }
            if tenants.len() != 1 {
                return Err(format!("GPU {gpu} of node {node} shared by {tenants:?}"));
            }
            if used.get(node).is_some_and(|(_, whole)| whole.contains(gpu)) {
                return Err(format!("GPU {gpu} of node {node} both shared and whole"));
            }
            let kept = self
                .cluster
                .shared
                .iter()
                .find(|(slot, _)| **slot == (*node, *gpu));
            if kept.is_none_or(|(_, kept)| kept.used != *hundredths) {
                return Err(format!("GPU {gpu} of node {node}: shares kept wrong"));
            }
        }
        // Each shared GPU counts as one whole GPU of its node.
        for (node, gpu) in shares.keys() {
            used.entry(*node)
                .or_insert((Resources::ZERO, BTreeSet::new()))
                .0
                .gpus += 1;
            if self
                .cluster
                .nodes
                .get(node)
                .is_some_and(|n| n.free_gpus.contains(gpu))
            {
                return Err(format!("shared GPU {gpu} of node {node} listed as free"));
            }
        }
        if self.cluster.shared.iter().count() != shares.len() {
            return Err("a shared GPU is kept that no running task holds".to_string());
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
        let total = self
            .cluster
            .nodes
            .values()
            .filter(|n| n.schedulable)
            .fold(Resources::ZERO, |acc, n| acc.add(&n.spec.capacity));
        if total != self.cluster.schedulable_total() {
            return Err(format!(
                "schedulable capacity kept as {} but the nodes add up to {total}",
                self.cluster.schedulable_total()
            ));
        }
        self.check_runs()
    }
}
