//! Consistency checks of the bookkeeping against first principles, for tests and
//! property tests: every task listed as running holds one placement per node of its gang,
//! no GPU is given twice, no node holds more than its capacity, and the schedulable
//! capacity kept is the nodes' sum.

use std::collections::{BTreeMap, BTreeSet};

use tacc_core::{NodeId, Resources};

use super::Scheduler;

impl Scheduler {
    /// Checks the bookkeeping against first principles; for tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut used: BTreeMap<NodeId, (Resources, BTreeSet<u32>)> = BTreeMap::new();
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
        Ok(())
    }
}
