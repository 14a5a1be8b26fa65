//! Shares of one GPU (`gpus: 0.5`): several tasks packed onto the same GPU index of a
//! node, their shares never adding up to more than the whole GPU, and — fail-closed
//! tenancy — a GPU shared only among tasks of one tenant: one user, or one group where
//! the operator allows it ([`ShareGpusWithin`]). A GPU that holds a share is taken out of
//! the node's whole free GPUs until its last share leaves, so whole-GPU tasks never land
//! on it and every other rule of the scheduler keeps counting whole GPUs.
//!
//! Pure bookkeeping: which task holds how much of which GPU, and which GPU a new share
//! may take. The cluster calls it as tasks start and stop.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use tacc_core::{GPU_HUNDREDTHS, NodeId, TaskId};

/// Whose tasks may share one GPU. Anything wider than a group is not offered: a GPU
/// shared across tenants would let one read or starve another's memory and kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareGpusWithin {
    /// Only tasks of the same user share a GPU (the default).
    #[default]
    User,
    /// Tasks of users of the same group share a GPU.
    Group,
}

impl ShareGpusWithin {
    /// The tenant a task of `user` charged to `group` shares GPUs within.
    pub fn tenant(self, user: &str, group: &str) -> String {
        match self {
            ShareGpusWithin::User => format!("user {user}"),
            ShareGpusWithin::Group => format!("group {group}"),
        }
    }
}

/// One GPU holding shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedGpu {
    /// Hundredths of the GPU held, at most [`GPU_HUNDREDTHS`].
    pub used: u32,
    /// Each holder's share and tenant. One tenant, except after a restart that found
    /// tasks of two running on one GPU (the operator narrowed `share_gpus_within`): they
    /// run already, and no new share joins such a GPU.
    pub holders: BTreeMap<TaskId, (u32, String)>,
}

impl SharedGpu {
    /// Whether every holder is `tenant`'s.
    fn only(&self, tenant: &str) -> bool {
        self.holders.values().all(|(_, t)| t == tenant)
    }
}

/// Every shared GPU of the cluster, by node and GPU index.
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedGpus {
    gpus: BTreeMap<(NodeId, u32), SharedGpu>,
}

impl SharedGpus {
    /// The GPU of `node` a share of `share` hundredths for `tenant` takes: the fullest of
    /// the tenant's shared GPUs it still fits on (packing leaves whole GPUs free), else
    /// the lowest of `free_gpus` (a whole free GPU opened for sharing). Never a GPU
    /// another tenant shares.
    pub fn slot(
        &self,
        node: NodeId,
        free_gpus: &BTreeSet<u32>,
        tenant: &str,
        share: u32,
    ) -> Option<u32> {
        let packed = self
            .gpus
            .range((node, 0)..=(node, u32::MAX))
            .filter(|(_, gpu)| gpu.only(tenant) && gpu.used + share <= GPU_HUNDREDTHS)
            .max_by_key(|((_, index), gpu)| (gpu.used, std::cmp::Reverse(*index)))
            .map(|((_, index), _)| *index);
        packed.or_else(|| free_gpus.first().copied())
    }

    /// `task` takes `share` of GPU `index` of `node`; true when that opened the GPU for
    /// sharing (the caller takes it out of the node's whole free GPUs).
    pub fn take(
        &mut self,
        node: NodeId,
        index: u32,
        task: TaskId,
        tenant: &str,
        share: u32,
    ) -> bool {
        let opened = !self.gpus.contains_key(&(node, index));
        let gpu = self.gpus.entry((node, index)).or_insert_with(|| SharedGpu {
            used: 0,
            holders: BTreeMap::new(),
        });
        gpu.used += share;
        gpu.holders.insert(task, (share, tenant.to_string()));
        opened
    }

    /// `task` leaves GPU `index` of `node`; true when that was the last share (the caller
    /// gives the whole GPU back to the node).
    pub fn give_back(&mut self, node: NodeId, index: u32, task: TaskId) -> bool {
        let Some(gpu) = self.gpus.get_mut(&(node, index)) else {
            return false;
        };
        if let Some((share, _)) = gpu.holders.remove(&task) {
            gpu.used -= share;
        }
        if gpu.holders.is_empty() {
            self.gpus.remove(&(node, index));
            return true;
        }
        false
    }

    /// The node left the cluster: its shared GPUs with it.
    pub fn forget_node(&mut self, node: NodeId) {
        self.gpus.retain(|(n, _), _| *n != node);
    }

    /// Every shared GPU, for invariant checks and views.
    pub fn iter(&self) -> impl Iterator<Item = (&(NodeId, u32), &SharedGpu)> {
        self.gpus.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(indices: &[u32]) -> BTreeSet<u32> {
        indices.iter().copied().collect()
    }

    #[test]
    fn shares_pack_onto_the_tenants_fullest_gpu_and_never_onto_another_tenants() {
        let mut shared = SharedGpus::default();
        let n = NodeId(1);
        assert_eq!(shared.slot(n, &free(&[0, 1]), "user a", 50), Some(0));
        assert!(shared.take(n, 0, TaskId(1), "user a", 50));
        // The same tenant packs onto GPU 0; another tenant opens a free GPU instead.
        assert_eq!(shared.slot(n, &free(&[1]), "user a", 50), Some(0));
        assert_eq!(shared.slot(n, &free(&[1]), "user b", 50), Some(1));
        assert!(!shared.take(n, 0, TaskId(2), "user a", 50));
        // GPU 0 is full: a third share of the tenant needs a free GPU, and without one
        // there is no room, not a place on another tenant's GPU.
        assert_eq!(shared.slot(n, &free(&[1]), "user a", 1), Some(1));
        assert!(shared.take(n, 1, TaskId(3), "user b", 30));
        assert_eq!(shared.slot(n, &free(&[]), "user a", 10), None);
        // Restored after a restart: two tenants' shares on GPU 1; neither adds one there.
        assert!(!shared.take(n, 1, TaskId(4), "user a", 10));
        assert_eq!(shared.slot(n, &free(&[]), "user a", 10), None);
        assert_eq!(shared.slot(n, &free(&[]), "user b", 10), None);
        assert!(!shared.give_back(n, 1, TaskId(4)));
        assert_eq!(shared.slot(n, &free(&[]), "user b", 10), Some(1));
        assert!(!shared.give_back(n, 0, TaskId(1)));
        assert!(
            shared.give_back(n, 0, TaskId(2)),
            "the last share frees the GPU"
        );
        assert_eq!(shared.iter().count(), 1);
        shared.forget_node(n);
        assert_eq!(shared.iter().count(), 0);
    }

    #[test]
    fn the_tenant_is_the_user_unless_the_operator_allows_the_group() {
        assert_eq!(
            ShareGpusWithin::default().tenant("ann", "vision"),
            "user ann"
        );
        assert_eq!(
            ShareGpusWithin::Group.tenant("ann", "vision"),
            "group vision"
        );
    }
}
