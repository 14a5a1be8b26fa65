//! Nodes as the control plane knows them: the pace of their lifecycle (liveness checks,
//! flapping) and what `tcloud nodes` shows of each, read from the core. The lifecycle
//! itself is the handlers' (`handlers::register`, `poll`, `liveness`, `node_admin`);
//! the entry points that run them are `Control::register_agent`, `poll_work`,
//! `check_liveness` and the node administration in `mod.rs`.

use std::time::{Duration, Instant};

use tacc_core::{NodeId, Resources, Timestamp};

use super::Core;
/// How often the server checks node liveness ([`Control::check_liveness`]).
pub const LIVENESS_CHECK_EVERY: Duration = Duration::from_secs(1);

/// How often within [`FLAP_WINDOW`] a node must have been lost to count as flapping.
pub(crate) const FLAP_LOSSES: usize = 2;
/// The window in which losses of a node count towards flapping.
pub(crate) const FLAP_WINDOW: Duration = Duration::from_secs(600);

/// What `tcloud nodes` shows of every node the core knows, at `now` (`instant` on the
/// core's clock); `gpus` is what the usage book last heard of a node's devices.
pub(crate) fn node_views(
    inner: &Core,
    now: Timestamp,
    instant: Instant,
    gpus: impl Fn(NodeId) -> Vec<tacc_proto::GpuDevice>,
) -> Vec<tacc_proto::NodeView> {
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
                    _ => Timestamp(
                        now.0.saturating_sub(
                            instant
                                .saturating_duration_since(live.last_seen)
                                .as_millis() as u64,
                        ),
                    ),
                },
                running_tasks: live.assignments.keys().map(|a| a.task).collect(),
                gpus: gpus(live.record.id),
            }
        })
        .collect()
}
