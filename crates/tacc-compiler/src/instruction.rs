//! The compiler's output: one self-contained [`Instruction`] from which an execution
//! backend can run a task attempt with nothing else.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tacc_core::{AttemptNo, Priority, Resources, RuntimeKind, SnapshotId, TaskId};
use tacc_schema::TaskSpec;

use crate::CompilerError;
use crate::environment::{DatasetMount, EnvPlan, InstructionEnvironment, resolve_datasets};

/// Bumped whenever a field's meaning changes, so an old agent refuses a new instruction.
/// Version 2 added `environment` and `datasets`, which an older agent would silently skip.
/// Version 3 added `image` and `runtime`; an instruction without them stays version 2, so
/// agents of version 2 still run every task that does not need a container. Version 4
/// added `processes_per_node`; only an instruction with more than one process per node
/// needs it (an older agent would start one process where the task asked for several).
/// Version 5 added `array`; only an array element's instruction needs it (an older agent
/// would run every element without its index). Version 6 added `disk_limit_bytes`;
/// only an instruction with a limit needs it (an older agent would not enforce it).
/// Version 7 added `gpu_share_percent`; only a task on a share of one GPU needs it (an
/// older agent would give it no MPS share and tell it `TACC_GPUS=0`).
pub const INSTRUCTION_FORMAT: u32 = 7;

/// The format of an instruction that uses nothing newer than version 6.
const FORMAT_WITH_DISK: u32 = 6;

/// The format of an instruction that uses nothing newer than version 5.
const FORMAT_WITH_ARRAY: u32 = 5;

/// The format of an instruction that uses nothing newer than version 4.
const FORMAT_WITH_PROCESSES: u32 = 4;

/// The format of an instruction that uses nothing newer than version 2.
const FORMAT_WITHOUT_RUNTIME: u32 = 2;
/// The format of an instruction that uses nothing newer than version 3.
const FORMAT_WITH_RUNTIME: u32 = 3;

/// How long a task gets between SIGTERM and SIGKILL when no checkpoint grace is set.
const DEFAULT_KILL_GRACE_SECS: u64 = 10;

/// Everything a node needs to run its part of one attempt of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instruction {
    pub format_version: u32,
    pub task: TaskId,
    pub attempt: AttemptNo,
    pub name: String,
    pub user: String,
    /// The exact code the task runs.
    pub snapshot: SnapshotId,
    pub num_nodes: u32,
    /// Copies of `run` each node starts (`resources.processes`); each has its own
    /// `LOCAL_RANK` and `RANK`, and `WORLD_SIZE` counts them all.
    #[serde(default = "one_process")]
    pub processes_per_node: u32,
    pub per_node: Resources,
    /// `gpus: 0.5`: the share of its one GPU the task runs on, in percent (its
    /// `per_node.gpus` is 0; the GPU is shared with tasks of the same tenant). The agent
    /// sets `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` to it where MPS runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_share_percent: Option<u32>,
    pub time_limit_secs: Option<u64>,
    /// `resources.disk`: the most the working directory may hold on each node; the
    /// agent stops a task that writes more (reason `disk_limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_limit_bytes: Option<u64>,
    /// Runs once per node before `run`; its failure fails the attempt as `setup_failed`.
    pub setup: Option<String>,
    pub run: String,
    /// The user's environment variables (platform variables are added per node).
    pub vars: BTreeMap<String, String>,
    /// Paths, relative to the working directory, kept after the attempt.
    pub outputs: Vec<String>,
    pub kill_grace_secs: u64,
    /// `checkpoint.signal` (e.g. `SIGUSR1`): sent instead of SIGTERM before the grace on
    /// a cancel, preemption or time limit; `None` is SIGTERM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
    /// The managed environment the task runs in, `None` for the node's own tools.
    #[serde(default)]
    pub environment: Option<InstructionEnvironment>,
    /// Data fetched once per node and linked into the working directory. Sources are as
    /// the task file wrote them until [`Instruction::resolve_datasets`] is applied.
    #[serde(default)]
    pub datasets: Vec<DatasetMount>,
    /// Backends may map it (e.g. to a Slurm QoS); `low`, `normal` or `high` on the wire.
    #[serde(default)]
    pub priority: Priority,
    /// `environment.image`: the task runs in a container of this image, never without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `runtime:` of the task file (`process`, `container` or `slurm` on the wire); `None`
    /// is `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeKind>,
    /// The Unix account the operator mapped the task's user to (`[users.NAME] unix_user`
    /// in the server's configuration); `None` runs the task as the agent's unprivileged
    /// task account for that user. Never root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_user: Option<String>,
    /// The array element this attempt runs: `TACC_ARRAY_GROUP` and `TACC_ARRAY_INDEX`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayElement>,
}

/// The file in the working directory a task appends metrics to (`$TACC_METRICS`).
pub const METRICS_FILE: &str = ".tacc_metrics.jsonl";
/// The task's checkpoint directory in its working directory (`$TACC_CHECKPOINT_DIR`):
/// kept like outputs whenever an attempt ends, and restored into the next attempt's,
/// which then finds it in `$TACC_RESUME_FROM`.
pub const CHECKPOINT_DIR: &str = ".tacc-checkpoint";

/// Which element of which array an instruction runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayElement {
    /// The group's number (`g12` is 12).
    pub group: u64,
    pub index: u32,
}

fn one_process() -> u32 {
    1
}

/// What differs between the nodes of one attempt, and between the processes of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeContext {
    pub node_rank: u32,
    /// Which of the node's processes (0 when it starts one).
    pub local_rank: u32,
    pub gpu_indices: Vec<u32>,
    pub master_addr: String,
    pub master_port: u16,
    pub workdir: PathBuf,
    pub userdir: PathBuf,
}

/// Turn a validated task spec into the instruction for one attempt.
pub fn compile(
    task: TaskId,
    attempt: AttemptNo,
    user: &str,
    spec: &TaskSpec,
    snapshot: SnapshotId,
) -> Instruction {
    let image = spec.environment.image.clone();
    let runtime = spec.runtime;
    let processes_per_node = spec.resources.processes_per_node();
    Instruction {
        format_version: if spec.resources.gpu_share_percent().is_some() {
            INSTRUCTION_FORMAT
        } else if spec.resources.disk.is_some() {
            FORMAT_WITH_DISK
        } else if processes_per_node > 1 {
            FORMAT_WITH_PROCESSES
        } else if image.is_some() || runtime.is_some() {
            FORMAT_WITH_RUNTIME
        } else {
            FORMAT_WITHOUT_RUNTIME
        },
        task,
        attempt,
        name: spec.name.clone(),
        user: user.to_string(),
        snapshot,
        num_nodes: spec.resources.nodes,
        processes_per_node,
        per_node: spec.resources.per_node(),
        gpu_share_percent: spec.resources.gpu_share_percent(),
        time_limit_secs: spec.resources.time_limit.map(|t| t.as_secs()),
        disk_limit_bytes: spec.resources.disk.map(|d| d.as_bytes()),
        setup: spec.setup.clone().filter(|s| !s.trim().is_empty()),
        run: spec.run.clone(),
        vars: spec.environment.vars.clone(),
        outputs: spec.outputs.clone(),
        kill_grace_secs: spec
            .checkpoint
            .as_ref()
            .map_or(DEFAULT_KILL_GRACE_SECS, |c| c.grace.as_secs()),
        stop_signal: spec.checkpoint.as_ref().map(|c| c.signal.clone()),
        environment: EnvPlan::from_spec(&spec.environment).map(|plan| InstructionEnvironment {
            spec_key: plan.spec_key(),
            plan,
        }),
        datasets: spec
            .datasets
            .iter()
            .map(|d| DatasetMount {
                name: d.name.clone(),
                source: d.source.clone(),
                mount: d.mount.clone(),
            })
            .collect(),
        priority: spec.priority,
        image,
        runtime,
        unix_user: None,
        array: None,
    }
}

impl Instruction {
    /// Make this the instruction of one array element (which needs format 5).
    pub fn set_array_element(&mut self, element: ArrayElement) {
        self.array = Some(element);
        self.format_version = self.format_version.max(FORMAT_WITH_ARRAY);
    }

    /// Replace dataset sources that name a registered dataset (`registry`: name → path or
    /// URL) by what they name; a source that is neither is an error the user must fix.
    pub fn resolve_datasets(
        &mut self,
        registry: &BTreeMap<String, String>,
    ) -> Result<(), CompilerError> {
        let specs: Vec<tacc_schema::DatasetSpec> = self
            .datasets
            .iter()
            .map(|d| tacc_schema::DatasetSpec {
                name: d.name.clone(),
                source: d.source.clone(),
                mount: d.mount.clone(),
            })
            .collect();
        self.datasets = resolve_datasets(&specs, registry)?;
        Ok(())
    }

    /// The complete environment of the task's processes on one node: the node's base
    /// variables (PATH, HOME, …), then the user's, then the platform's, which win.
    pub fn environment(
        &self,
        node: &NodeContext,
        base: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let mut env = base.clone();
        env.extend(self.vars.clone());
        let gpus = node
            .gpu_indices
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let local_world_size = self.processes_per_node.max(1);
        let world_size = (self.num_nodes * local_world_size).to_string();
        let rank = (node.node_rank * local_world_size + node.local_rank).to_string();
        let local_world_size = local_world_size.to_string();
        let platform = [
            ("TACC_TASK_ID", self.task.to_string()),
            ("TACC_TASK_NAME", self.name.clone()),
            ("TACC_ATTEMPT", self.attempt.to_string()),
            ("TACC_USER", self.user.clone()),
            ("TACC_WORKDIR", node.workdir.display().to_string()),
            ("TACC_USERDIR", node.userdir.display().to_string()),
            // Where the task appends metric lines (JSON) for the platform to keep.
            (
                "TACC_METRICS",
                node.workdir.join(METRICS_FILE).display().to_string(),
            ),
            (
                "TACC_CHECKPOINT_DIR",
                node.workdir.join(CHECKPOINT_DIR).display().to_string(),
            ),
            ("TACC_NUM_NODES", self.num_nodes.to_string()),
            ("TACC_NODE_RANK", node.node_rank.to_string()),
            ("TACC_MASTER_ADDR", node.master_addr.clone()),
            ("TACC_MASTER_PORT", node.master_port.to_string()),
            ("TACC_WORLD_SIZE", world_size.clone()),
            ("TACC_RANK", rank.clone()),
            ("TACC_LOCAL_RANK", node.local_rank.to_string()),
            ("TACC_LOCAL_WORLD_SIZE", local_world_size.clone()),
            // The names torch.distributed (and torchrun's children) read.
            ("MASTER_ADDR", node.master_addr.clone()),
            ("MASTER_PORT", node.master_port.to_string()),
            ("WORLD_SIZE", world_size),
            ("RANK", rank),
            ("LOCAL_RANK", node.local_rank.to_string()),
            ("LOCAL_WORLD_SIZE", local_world_size),
            ("NODE_RANK", node.node_rank.to_string()),
            ("GROUP_RANK", node.node_rank.to_string()),
            // What each node was given, for the task and for backends that request it
            // from another scheduler (Slurm).
            (
                "TACC_CPUS",
                self.per_node.cpu_millis.div_ceil(1000).to_string(),
            ),
            (
                "TACC_MEMORY_MB",
                (self.per_node.memory_bytes / (1024 * 1024)).to_string(),
            ),
            // `0.5` for a share of one GPU, as the task file wrote it.
            (
                "TACC_GPUS",
                match self.gpu_share_percent.and_then(tacc_core::GpuCount::share) {
                    Some(share) => share.to_string(),
                    None => self.per_node.gpus.to_string(),
                },
            ),
            ("TACC_PRIORITY", self.priority.as_str().to_string()),
            // An empty list hides every GPU from a task that asked for none.
            ("CUDA_VISIBLE_DEVICES", gpus),
            // Python buffers stdout when it is a pipe; live logs need it unbuffered.
            ("PYTHONUNBUFFERED", "1".to_string()),
        ];
        env.extend(platform.into_iter().map(|(k, v)| (k.to_string(), v)));
        if let Some(element) = self.array {
            env.insert("TACC_ARRAY_GROUP".into(), format!("g{}", element.group));
            env.insert("TACC_ARRAY_INDEX".into(), element.index.to_string());
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TaskSpec {
        let (spec, _) = tacc_schema::parse_task(
            "task.yaml",
            "name: t\nresources: {nodes: 2, gpus: 2, time_limit: 1h}\nenvironment: {vars: {A: b, TACC_TASK_ID: spoof}}\nsetup: pip list\nrun: python train.py\n",
        )
        .unwrap();
        spec
    }

    #[test]
    fn compile_carries_resources_and_commands() {
        let snapshot: SnapshotId = "0".repeat(64).parse().unwrap();
        let instruction = compile(TaskId(7), AttemptNo(2), "alice", &spec(), snapshot);
        assert_eq!(instruction.num_nodes, 2);
        assert_eq!(instruction.per_node.gpus, 2);
        assert_eq!(instruction.time_limit_secs, Some(3600));
        assert_eq!(instruction.setup.as_deref(), Some("pip list"));
        let json = serde_json::to_value(&instruction).unwrap();
        assert_eq!(
            serde_json::from_value::<Instruction>(json).unwrap(),
            instruction
        );
    }

    #[test]
    fn environment_has_platform_names_and_they_win() {
        let snapshot: SnapshotId = "0".repeat(64).parse().unwrap();
        let instruction = compile(TaskId(7), AttemptNo(2), "alice", &spec(), snapshot);
        let node = NodeContext {
            node_rank: 1,
            local_rank: 0,
            gpu_indices: vec![2, 3],
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            workdir: "/w".into(),
            userdir: "/u".into(),
        };
        let base = BTreeMap::from([("PATH".to_string(), "/bin".to_string())]);
        let env = instruction.environment(&node, &base);
        assert_eq!(env["TACC_TASK_ID"], "7");
        assert_eq!(env["TACC_ATTEMPT"], "2");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "2,3");
        assert_eq!(env["WORLD_SIZE"], "2");
        assert_eq!(env["NODE_RANK"], "1");
        assert_eq!(env["MASTER_PORT"], "29500");
        assert_eq!(env["RANK"], "1");
        assert_eq!(env["LOCAL_RANK"], "0");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "1");
        assert_eq!(env["A"], "b");
        assert_eq!(env["PATH"], "/bin");
        assert!(!env.contains_key("TACC_ARRAY_INDEX"));
    }

    #[test]
    fn a_disk_limit_travels_and_needs_an_agent_that_enforces_it() {
        let snapshot: SnapshotId = "0".repeat(64).parse().unwrap();
        let plain = compile(TaskId(7), AttemptNo(1), "alice", &spec(), snapshot.clone());
        assert_eq!(plain.disk_limit_bytes, None);
        assert!(plain.format_version < INSTRUCTION_FORMAT);
        let (limited, _) =
            tacc_schema::parse_task("task.yaml", "run: x\nresources: {disk: 1GiB}\n").unwrap();
        let mut instruction = compile(TaskId(7), AttemptNo(1), "alice", &limited, snapshot);
        assert_eq!(instruction.disk_limit_bytes, Some(1 << 30));
        assert_eq!(instruction.format_version, FORMAT_WITH_DISK);
        // An array element's instruction keeps the newer format it needs.
        instruction.set_array_element(ArrayElement { group: 1, index: 0 });
        assert_eq!(instruction.format_version, FORMAT_WITH_DISK);
    }

    #[test]
    fn a_share_of_one_gpu_travels_and_needs_an_agent_that_knows_shares() {
        let snapshot: SnapshotId = "0".repeat(64).parse().unwrap();
        let (half, _) =
            tacc_schema::parse_task("task.yaml", "run: x\nresources: {gpus: 0.5}\n").unwrap();
        let instruction = compile(TaskId(7), AttemptNo(1), "alice", &half, snapshot.clone());
        assert_eq!(instruction.gpu_share_percent, Some(50));
        assert_eq!(instruction.per_node.gpus, 0);
        assert_eq!(instruction.format_version, INSTRUCTION_FORMAT);
        let node = NodeContext {
            node_rank: 0,
            local_rank: 0,
            gpu_indices: vec![0],
            master_addr: "n1".into(),
            master_port: 29500,
            workdir: "/w".into(),
            userdir: "/u".into(),
        };
        let env = instruction.environment(&node, &BTreeMap::new());
        assert_eq!(env["TACC_GPUS"], "0.5");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "0");
        let whole = compile(TaskId(7), AttemptNo(1), "alice", &spec(), snapshot);
        assert_eq!(whole.gpu_share_percent, None);
        assert!(whole.format_version < INSTRUCTION_FORMAT);
    }

    #[test]
    fn an_array_element_sees_its_group_and_index() {
        let snapshot: SnapshotId = "0".repeat(64).parse().unwrap();
        let mut instruction = compile(TaskId(7), AttemptNo(1), "alice", &spec(), snapshot);
        instruction.set_array_element(ArrayElement {
            group: 12,
            index: 41,
        });
        assert_eq!(instruction.format_version, FORMAT_WITH_ARRAY);
        let node = NodeContext {
            node_rank: 0,
            local_rank: 0,
            gpu_indices: vec![],
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            workdir: "/w".into(),
            userdir: "/u".into(),
        };
        let env = instruction.environment(&node, &BTreeMap::new());
        assert_eq!(env["TACC_ARRAY_INDEX"], "41");
        assert_eq!(env["TACC_ARRAY_GROUP"], "g12");
        let json = serde_json::to_value(&instruction).unwrap();
        assert_eq!(
            serde_json::from_value::<Instruction>(json).unwrap(),
            instruction
        );
    }

    #[test]
    fn one_process_per_gpu_counts_processes_in_world_size_and_rank() {
        let (spec, _) = tacc_schema::parse_task(
            "task.yaml",
            "name: t\nresources: {nodes: 3, gpus: 4, processes: per_gpu}\nrun: python train.py\n",
        )
        .unwrap();
        let snapshot: SnapshotId = "0".repeat(64).parse().unwrap();
        let instruction = compile(TaskId(7), AttemptNo(1), "alice", &spec, snapshot);
        assert_eq!(instruction.processes_per_node, 4);
        assert_eq!(instruction.format_version, FORMAT_WITH_PROCESSES);
        let node = NodeContext {
            node_rank: 2,
            local_rank: 3,
            gpu_indices: vec![0, 1, 2, 3],
            master_addr: "10.0.0.1".into(),
            master_port: 29517,
            workdir: "/w".into(),
            userdir: "/u".into(),
        };
        let env = instruction.environment(&node, &BTreeMap::new());
        assert_eq!(env["WORLD_SIZE"], "12");
        assert_eq!(env["TACC_WORLD_SIZE"], "12");
        assert_eq!(env["RANK"], "11");
        assert_eq!(env["LOCAL_RANK"], "3");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "4");
        assert_eq!(env["NODE_RANK"], "2");
        assert_eq!(env["TACC_NUM_NODES"], "3");
        assert_eq!(env["MASTER_PORT"], "29517");
        // torchrun leaves every GPU of the node visible and lets LOCAL_RANK pick one.
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "0,1,2,3");
    }

    #[test]
    fn priority_and_runtime_travel_as_the_strings_they_always_were() {
        let (spec, _) = tacc_schema::parse_task(
            "task.yaml",
            "name: t\npriority: high\nruntime: slurm\nrun: echo\n",
        )
        .unwrap();
        let snapshot: SnapshotId = "0".repeat(64).parse().unwrap();
        let instruction = compile(TaskId(1), AttemptNo(1), "alice", &spec, snapshot);
        let json = serde_json::to_value(&instruction).unwrap();
        assert_eq!(json["priority"], "high");
        assert_eq!(json["runtime"], "slurm");
        // An instruction from before these were typed: no priority means `normal`.
        let mut old = json.clone();
        old.as_object_mut().unwrap().remove("priority");
        let old: Instruction = serde_json::from_value(old).unwrap();
        assert_eq!(old.priority, Priority::Normal);
        assert_eq!(old.runtime, Some(RuntimeKind::Slurm));
        let (auto, _) = tacc_schema::parse_task("task.yaml", "name: t\nrun: echo\n").unwrap();
        let json =
            serde_json::to_value(compile(TaskId(1), AttemptNo(1), "a", &auto, snapshot_id()))
                .unwrap();
        assert!(json.get("runtime").is_none(), "{json}");
    }

    fn snapshot_id() -> SnapshotId {
        "0".repeat(64).parse().unwrap()
    }

    #[test]
    fn an_instruction_needs_format_four_only_with_several_processes() {
        let (spec, _) = tacc_schema::parse_task("task.yaml", "name: t\nrun: echo\n").unwrap();
        let snapshot: SnapshotId = "0".repeat(64).parse().unwrap();
        let instruction = compile(TaskId(1), AttemptNo(1), "alice", &spec, snapshot);
        assert_eq!(instruction.processes_per_node, 1);
        assert_eq!(instruction.format_version, 2);
        let mut json = serde_json::to_value(&instruction).unwrap();
        json.as_object_mut().unwrap().remove("processes_per_node");
        let old: Instruction = serde_json::from_value(json).unwrap();
        assert_eq!(old.processes_per_node, 1);
    }
}
