//! What a task's environment says about its GPUs beyond their indices: the devices by
//! UUID where the probe offers MIG slices (CUDA needs `MIG-…` UUIDs to pick one), and,
//! for a task on a share of one GPU (`gpus: 0.5`), the share as
//! `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` where an MPS control daemon runs. Without MPS the
//! variable is left out: shares of one GPU are then packed by the scheduler only (and only
//! among one tenant's tasks), not limited on the GPU.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::gpus::GpuProbe;

/// Where the MPS control daemon's pipes are when `CUDA_MPS_PIPE_DIRECTORY` is not set.
const DEFAULT_MPS_PIPE_DIRECTORY: &str = "/tmp/nvidia-mps";

/// The MPS pipe directory when an MPS control daemon runs, judged cheaply: its `control`
/// pipe exists in `CUDA_MPS_PIPE_DIRECTORY` (given as `pipe_dir`) or the default place.
pub(crate) fn mps_pipe_directory(pipe_dir: Option<&str>) -> Option<PathBuf> {
    let dir = Path::new(pipe_dir.unwrap_or(DEFAULT_MPS_PIPE_DIRECTORY));
    dir.join("control").exists().then(|| dir.to_path_buf())
}

/// Adds to `env` what the task's GPUs need beyond [`tacc_compiler::Instruction::environment`]:
/// `CUDA_VISIBLE_DEVICES` by UUID where the probe says so, and the MPS share and pipe
/// directory (tasks have a private `/tmp`, so they are told where the pipes are) for a
/// share of one GPU while MPS runs (`mps`).
pub(crate) fn apply(
    env: &mut BTreeMap<String, String>,
    probe: &dyn GpuProbe,
    gpu_indices: &[u32],
    share_percent: Option<u32>,
    mps: Option<&Path>,
) {
    if let Some(visible) = probe.visible_devices(gpu_indices) {
        env.insert("CUDA_VISIBLE_DEVICES".into(), visible);
    }
    if let (Some(percent), Some(dir)) = (share_percent, mps) {
        env.insert(
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
            percent.to_string(),
        );
        env.insert("CUDA_MPS_PIPE_DIRECTORY".into(), dir.display().to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpus::FakeGpus;

    #[test]
    fn mps_runs_where_its_control_pipe_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        assert_eq!(mps_pipe_directory(Some(path)), None);
        std::fs::write(dir.path().join("control"), "").unwrap();
        assert_eq!(
            mps_pipe_directory(Some(path)),
            Some(dir.path().to_path_buf())
        );
    }

    #[test]
    fn a_share_gets_its_percentage_only_where_mps_runs() {
        let probe = FakeGpus::new(1, None);
        let mut env = BTreeMap::from([("CUDA_VISIBLE_DEVICES".to_string(), "0".to_string())]);
        apply(&mut env, &probe, &[0], Some(50), None);
        assert!(!env.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "0");
        apply(
            &mut env,
            &probe,
            &[0],
            Some(50),
            Some(Path::new("/var/run/mps")),
        );
        assert_eq!(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "50");
        assert_eq!(env["CUDA_MPS_PIPE_DIRECTORY"], "/var/run/mps");
        // A whole-GPU task is not limited even where MPS runs.
        let mut whole = BTreeMap::new();
        apply(
            &mut whole,
            &probe,
            &[0],
            None,
            Some(Path::new("/var/run/mps")),
        );
        assert!(whole.is_empty());
    }
}
