//! Live re-allocation of a running execution: its CPU quota and memory limit change
//! while it runs (adaptive allocation). Each runtime that can do it hands out a
//! [`Resizer`] with the execution's handle: the process runtime writes the execution's
//! cgroup ([`Cgroup::set_limits`]), the container runtime calls Docker's update API.

use std::fmt::Debug;
use std::sync::Arc;

use bollard::Docker;
use bollard::models::ContainerUpdateBody;

use crate::ExecError;
use crate::cgroups::Cgroup;

/// Changes one running execution's limits (0: no limit).
#[async_trait::async_trait]
pub trait Resizer: Send + Sync + Debug {
    async fn resize(&self, cpu_millis: u64, memory_bytes: u64) -> Result<(), ExecError>;
}

/// The process runtime's: the execution's own cgroup.
#[derive(Debug)]
pub(crate) struct CgroupResizer(pub(crate) Arc<dyn Cgroup>);

#[async_trait::async_trait]
impl Resizer for CgroupResizer {
    async fn resize(&self, cpu_millis: u64, memory_bytes: u64) -> Result<(), ExecError> {
        let cgroup = self.0.clone();
        // A few small file writes; off the async workers all the same.
        tokio::task::spawn_blocking(move || cgroup.set_limits(cpu_millis, memory_bytes))
            .await
            .map_err(|e| ExecError::Cgroup {
                action: "resize",
                path: self.0.path().display().to_string(),
                detail: e.to_string(),
            })?
    }
}

/// The container runtime's: `POST /containers/{id}/update`.
#[derive(Debug)]
pub(crate) struct DockerResizer {
    pub(crate) docker: Docker,
    pub(crate) container: String,
}

/// The update body for these limits. Swap stays at Docker's default for a memory limit
/// (as much again), which must also move or a grow above it is refused.
pub(crate) fn update_body(cpu_millis: u64, memory_bytes: u64) -> ContainerUpdateBody {
    let memory = memory_bytes as i64;
    ContainerUpdateBody {
        nano_cpus: Some(cpu_millis as i64 * 1_000_000),
        memory: Some(memory),
        memory_swap: Some(if memory_bytes == 0 { -1 } else { 2 * memory }),
        ..Default::default()
    }
}

#[async_trait::async_trait]
impl Resizer for DockerResizer {
    async fn resize(&self, cpu_millis: u64, memory_bytes: u64) -> Result<(), ExecError> {
        self.docker
            .update_container(&self.container, update_body(cpu_millis, memory_bytes))
            .await
            .map_err(|e| {
                ExecError::Container(format!(
                    "cannot update the limits of container {}: {e}",
                    self.container
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_docker_update_moves_swap_with_memory() {
        let body = update_body(2500, 1 << 30);
        assert_eq!(body.nano_cpus, Some(2_500_000_000));
        assert_eq!(body.memory, Some(1 << 30));
        assert_eq!(body.memory_swap, Some(2 << 30));
        assert_eq!(update_body(0, 0).memory_swap, Some(-1));
    }
}
