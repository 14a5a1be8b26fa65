//! The normalised task: what a task file means once defaults are filled in.
//!
//! The same types travel as JSON from client to server, so every semantic rule lives in
//! [`TaskSpec::validate`], which needs no source text; the YAML reader reports the same
//! problems at their line and column through the span table.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tacc_core::{ByteSize, GpuCount, HumanDuration, Priority, Resources, RuntimeKind};

use crate::SchemaError;
use crate::array::{ArraySpec, NotifySpec, webhook_error};
use crate::processes::Processes;

pub const MAX_NODES: u32 = 4096;
pub const MAX_GPUS_PER_NODE: u32 = 1024;
pub const MAX_CPUS_PER_NODE: f64 = 4096.0;
pub const MAX_MEMORY_PER_NODE: ByteSize = ByteSize::from_bytes(64 << 40);
/// The largest `resources.disk` a task may ask for (per node).
pub const MAX_DISK_PER_NODE: ByteSize = ByteSize::from_bytes(1 << 50);
pub const MAX_TIME_LIMIT: HumanDuration = HumanDuration::from_secs(365 * 86_400);
pub const MAX_ATTEMPTS: u32 = 100;
pub const MAX_NAME_LEN: usize = 63;
/// Signals a task may ask to receive before it is stopped, so it can write a checkpoint.
pub const CHECKPOINT_SIGNALS: &[&str] = &[
    "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGCONT",
];

/// A task: what to run, on how much of the cluster, with what software and data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "TACC task file")]
pub struct TaskSpec {
    /// 1–63 characters of `a-z A-Z 0-9 . _ -`, starting with a letter or digit. When the file
    /// leaves it out, the name of the directory holding the task file is used.
    #[serde(default)]
    pub name: String,
    /// What each node of the task gets.
    #[serde(default)]
    pub resources: ResourceSpec,
    #[serde(default)]
    #[schemars(with = "PriorityName")]
    pub priority: Priority,
    /// May the scheduler stop this task to make room for more urgent work?
    #[serde(default)]
    pub preemptible: bool,
    #[serde(default)]
    pub code: CodeSpec,
    #[serde(default)]
    pub environment: EnvironmentSpec,
    #[serde(default)]
    pub datasets: Vec<DatasetSpec>,
    /// Shell commands run once per node before `run`; at most 64 KiB.
    #[serde(default)]
    pub setup: Option<String>,
    /// The shell command(s) run on every node; at most 64 KiB (put more in a script).
    pub run: String,
    /// Paths (relative to the working directory) kept for download after the task ends.
    #[serde(default)]
    pub outputs: Vec<String>,
    #[serde(default)]
    pub retry: RetrySpec,
    #[serde(default)]
    pub checkpoint: Option<CheckpointSpec>,
    // `None` is `auto` (the cluster decides), written `auto` in JSON as before.
    #[serde(default, with = "runtime_preference")]
    #[schemars(with = "RuntimeName")]
    pub runtime: Option<RuntimeKind>,
    /// Which nodes may run the task, beyond what `resources` and `runtime` ask for.
    #[serde(default, skip_serializing_if = "PlacementSpec::is_empty")]
    pub placement: PlacementSpec,
    /// The range the CPU and memory per node may move in while it runs (adaptive
    /// allocation), e.g. `{cpus: 2..8, memory: 8GiB..32GiB}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<crate::AdaptiveSpec>,
    /// Run the task as an array: one element per index, each with `TACC_ARRAY_INDEX`.
    /// `0-999`, `0-999:2` (every second) or `1,3,7`; at most 100000 elements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", example = "0-999")]
    pub array: Option<ArraySpec>,
    /// Where to report the end of the task (or, for an array, of all its elements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<NotifySpec>,
    /// Run the task as a sweep: one trial per parameter point, the best chosen by a
    /// reported metric (`grid`, `random` or `asha`, which stops bad trials early).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<crate::SweepSpec>,
    /// What becomes of a hung attempt: every rank still running silent — no output, no
    /// CPU or GPU use — for `after` (one rank may have exited early). Multi-node tasks get
    /// the cluster's default; `on_hang: off` never ends one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_hang: Option<HangSpec>,
    /// `batch` (default): a job. `interactive`: a dev session that holds its allocation
    /// for `tcloud shell`/`exec`/`port-forward` and ends when idle (`run` may be left out).
    #[serde(default, skip_serializing_if = "crate::TaskKind::is_batch")]
    pub kind: crate::TaskKind,
    /// A dev session ends after this long with no session in use and no CPU or GPU used
    /// by its processes (default 2h; the cluster may cap it). `kind: interactive` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", example = "2h")]
    pub idle_timeout: Option<HumanDuration>,
}

/// `on_hang: {after: 10m, then: fail|retry}`; `on_hang: off` is `after: null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HangSpec {
    /// How long every rank still running must have been silent; `null` (written `off`)
    /// never.
    #[schemars(with = "Option<String>", example = "10m")]
    pub after: Option<HumanDuration>,
    #[serde(default)]
    pub then: HangAction,
}

/// What a hung attempt becomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HangAction {
    /// The task fails (retried only as `retry:` says for failures).
    #[default]
    Fail,
    /// The attempt is stopped and the task runs again as a new attempt (up to
    /// `retry.max_attempts`).
    Retry,
}

// Mirrors `Priority` for the JSON Schema only, since tacc-core stays free of schemars.
/// Priority class; an administrator may cap it per user.
#[derive(JsonSchema)]
#[schemars(rename = "Priority")]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum PriorityName {
    Low,
    Normal,
    High,
}

/// Resources per node. `nodes > 1` makes a gang: all nodes start together or not at all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceSpec {
    #[serde(default = "default_nodes")]
    pub nodes: u32,
    /// Whole GPUs per node (`2`), or a share of one GPU (`0.5`, in hundredths) that the
    /// task may share with other tasks of its own user (or group, where the operator
    /// allows it); never with another tenant's.
    #[serde(default)]
    #[schemars(with = "crate::gpus::GpusSchema")]
    pub gpus: GpuCount,
    /// E.g. `A100`; any GPU when left out.
    #[serde(default)]
    pub gpu_type: Option<String>,
    /// Whole or fractional CPUs, e.g. `16` or `0.5`.
    #[serde(default = "default_cpus")]
    pub cpus: f64,
    /// E.g. `64GiB`, `512MiB`.
    #[serde(default = "default_memory")]
    #[schemars(with = "String", example = "64GiB")]
    pub memory: ByteSize,
    /// Enforced wall-clock limit, e.g. `4h`, `1h30m`, `2d`.
    #[serde(default)]
    #[schemars(with = "Option<String>", example = "4h")]
    pub time_limit: Option<HumanDuration>,
    /// The most the task's working directory may hold on each node, e.g. `10GiB`; a task
    /// that writes more is stopped with the reason `disk_limit`. No limit when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", example = "10GiB")]
    pub disk: Option<ByteSize>,
    /// Copies of `run` each node starts: `per_node` (default), `per_gpu` (one per GPU, as
    /// torchrun does) or a number. Sets `WORLD_SIZE`, `RANK` and `LOCAL_RANK`.
    #[serde(default, skip_serializing_if = "is_per_node")]
    #[schemars(with = "crate::processes::ProcessesSchema")]
    pub processes: Processes,
}

fn is_per_node(processes: &Processes) -> bool {
    *processes == Processes::PerNode
}

fn default_nodes() -> u32 {
    1
}
fn default_cpus() -> f64 {
    1.0
}
fn default_memory() -> ByteSize {
    ByteSize::gib(1)
}

impl Default for ResourceSpec {
    fn default() -> Self {
        ResourceSpec {
            nodes: default_nodes(),
            gpus: GpuCount::ZERO,
            gpu_type: None,
            cpus: default_cpus(),
            memory: default_memory(),
            time_limit: None,
            disk: None,
            processes: Processes::PerNode,
        }
    }
}

impl ResourceSpec {
    /// Processes each node starts (see [`Processes`]).
    pub fn processes_per_node(&self) -> u32 {
        self.processes.per_node(self.gpus.whole_gpus())
    }

    /// What one node of the task holds, as the scheduler counts it.
    pub fn per_node(&self) -> Resources {
        Resources::new(
            (self.cpus * 1000.0).round() as u64,
            self.memory.as_bytes(),
            // A share of one GPU holds no whole GPU: the scheduler packs shares apart.
            self.gpus.whole_gpus(),
        )
    }

    /// The share of one GPU asked for, in percent (`gpus: 0.5` is 50); `None` for whole GPUs.
    pub fn gpu_share_percent(&self) -> Option<u32> {
        self.gpus.share_percent()
    }
}

/// Which local files are shipped to the nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeSpec {
    /// Directory to ship, relative to the task file.
    #[serde(default = "default_code_dir")]
    pub dir: String,
    /// Gitignore-style patterns left out (on top of `.gitignore` and `.taccignore`).
    #[serde(default)]
    pub exclude: Vec<String>,
}

fn default_code_dir() -> String {
    ".".to_string()
}

impl Default for CodeSpec {
    fn default() -> Self {
        CodeSpec {
            dir: default_code_dir(),
            exclude: Vec::new(),
        }
    }
}

/// The software the task runs with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentSpec {
    /// Python version, e.g. `"3.11"`.
    #[serde(default)]
    pub python: Option<String>,
    /// Pip requirement specifiers; not together with `requirements`.
    #[serde(default)]
    pub pip: Vec<String>,
    /// A requirements file, relative to the code directory; not together with `pip`.
    #[serde(default)]
    pub requirements: Option<String>,
    #[serde(default)]
    pub conda: Option<CondaSpec>,
    /// A container image; selects the container runtime. Not together with `conda`.
    #[serde(default)]
    pub image: Option<String>,
    /// Environment variables set for `setup` and `run`. They are part of the task's
    /// spec, visible to whoever may read the task: never put a secret here. Each value
    /// at most 64 KiB, all of them (`NAME=value`) at most 512 KiB: the kernel refuses to
    /// start a program with more.
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    /// Names of the submitter's secrets (`tcloud secret set NAME`) to put into the
    /// task's environment under the same names; their values never appear in the spec,
    /// the API or the logs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

/// Variables the platform sets for every task; a task's `vars` or `secrets` cannot
/// replace them.
pub const PLATFORM_VARIABLES: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "NODE_RANK",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "CUDA_VISIBLE_DEVICES",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
];

/// Whether the platform owns the variable `name` (every `TACC_*` and
/// [`PLATFORM_VARIABLES`]).
pub fn is_platform_variable(name: &str) -> bool {
    name.starts_with("TACC_") || PLATFORM_VARIABLES.contains(&name)
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CondaSpec {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub channels: Vec<String>,
    #[serde(default)]
    pub dependencies: Vec<String>,
}

/// Data made visible to the task at `mount` inside its working directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DatasetSpec {
    pub name: String,
    /// A path on the cluster's shared storage, or a URL.
    pub source: String,
    /// Relative path inside the working directory; defaults to `name`.
    pub mount: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Total attempts, the first included; 1 means never retry.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Which endings are retried. Defaults to the platform's faults: `node_failure`, `lost`.
    #[serde(default = "default_retry_on")]
    pub on: Vec<RetryOn>,
}

fn default_max_attempts() -> u32 {
    1
}
fn default_retry_on() -> Vec<RetryOn> {
    vec![RetryOn::NodeFailure, RetryOn::Lost]
}

impl Default for RetrySpec {
    fn default() -> Self {
        RetrySpec {
            max_attempts: default_max_attempts(),
            on: default_retry_on(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RetryOn {
    /// A node of the task failed or became unreachable.
    NodeFailure,
    /// The scheduler preempted the task.
    Preempted,
    /// The user's command exited non-zero.
    Failed,
    /// The platform lost track of the task.
    Lost,
}

impl RetryOn {
    pub const ALL: [RetryOn; 4] = [
        RetryOn::NodeFailure,
        RetryOn::Preempted,
        RetryOn::Failed,
        RetryOn::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RetryOn::NodeFailure => "node_failure",
            RetryOn::Preempted => "preempted",
            RetryOn::Failed => "failed",
            RetryOn::Lost => "lost",
        }
    }
}

/// Before stopping the task (time limit, preemption), send `signal` and wait `grace`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// One of SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGALRM, SIGCONT.
    #[serde(default = "default_signal")]
    pub signal: String,
    #[serde(default = "default_grace")]
    #[schemars(with = "String", example = "60s")]
    pub grace: HumanDuration,
}

fn default_signal() -> String {
    "SIGUSR1".to_string()
}
fn default_grace() -> HumanDuration {
    HumanDuration::from_secs(60)
}

impl Default for CheckpointSpec {
    fn default() -> Self {
        CheckpointSpec {
            signal: default_signal(),
            grace: default_grace(),
        }
    }
}

// Mirrors `runtime:` for the JSON Schema only: `auto` and each `RuntimeKind`.
/// How the task is started on a node. `auto` lets the cluster decide (a container when
/// `environment.image` is set).
#[derive(JsonSchema)]
#[schemars(rename = "Runtime")]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum RuntimeName {
    Auto,
    Process,
    Container,
    Slurm,
}

/// The task file's `runtime:` word for a preference: a runtime kind, or `auto` for none.
pub fn runtime_name(runtime: Option<RuntimeKind>) -> &'static str {
    runtime.map_or("auto", RuntimeKind::as_str)
}

/// `runtime:` as JSON: the kind's name, or `auto` for none, as when it was a plain enum.
mod runtime_preference {
    use serde::{Deserialize, Deserializer, Serializer};
    use tacc_core::RuntimeKind;

    pub fn serialize<S: Serializer>(
        runtime: &Option<RuntimeKind>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(super::runtime_name(*runtime))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<RuntimeKind>, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text == "auto" {
            return Ok(None);
        }
        text.parse().map(Some).map_err(|_| {
            serde::de::Error::unknown_variant(&text, &["auto", "process", "container", "slurm"])
        })
    }
}

/// Which nodes may run the task. Every label must be carried by the node with exactly
/// this value; `partition` picks the nodes of a Slurm agent that submits to that Slurm
/// partition. A task no registered node matches stays queued, and `tcloud why` says
/// which labels it waits for, until such a node registers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlacementSpec {
    /// Node labels, as operators give them to agents (`taccd agent --label KEY=VALUE`),
    /// e.g. `{gpu-gen: hopper}`. Keys under `tacc.io/` are the platform's: use `runtime`
    /// and `partition` instead.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// A Slurm partition, e.g. `debug`: the task runs as a Slurm job there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
}

impl PlacementSpec {
    /// True when it restricts nothing (the task file left `placement` out).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.partition.is_none()
    }
}

/// A semantic mistake, named by field path; the caller decides how to locate it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub field: String,
    pub message: String,
    pub help: Option<String>,
}

pub(crate) fn problem(
    field: impl Into<String>,
    message: impl Into<String>,
    help: impl Into<String>,
) -> Problem {
    Problem {
        field: field.into(),
        message: message.into(),
        help: Some(help.into()),
    }
}

impl TaskSpec {
    /// Checks every rule that does not need the source text: ranges, names, paths and fields
    /// that exclude each other. The server calls this on specs it receives as JSON.
    pub fn validate(&self) -> Result<(), SchemaError> {
        match self.first_problem() {
            None => Ok(()),
            Some(Problem {
                field,
                message,
                help,
            }) => Err(SchemaError::Invalid {
                field,
                message,
                help,
            }),
        }
    }

    /// The first of [`TaskSpec::problems`].
    pub(crate) fn first_problem(&self) -> Option<Problem> {
        self.problems().into_iter().next()
    }

    /// Every semantic mistake, at most one per check (a check stops at its first finding,
    /// whose fix often changes what else it would say), so a file's mistakes are reported
    /// in one run. A new check is one more `extend` here.
    pub(crate) fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        problems.extend(check_name(&self.name));
        problems.extend(check_resources(&self.resources));
        problems.extend(check_code(&self.code));
        problems.extend(check_environment(&self.environment, self.runtime));
        problems.extend(check_placement(
            &self.placement,
            self.runtime,
            &self.environment,
        ));
        problems.extend(check_datasets(&self.datasets));
        problems.extend(check_commands(self));
        problems.extend(crate::interactive::check_interactive(self));
        problems.extend(crate::sizes::check_sizes(self));
        problems.extend(check_outputs(&self.outputs));
        problems.extend(check_retry(&self.retry));
        problems.extend(
            self.adaptive
                .as_ref()
                .and_then(|adaptive| crate::adaptive::check_adaptive(adaptive, &self.resources)),
        );
        problems.extend(
            self.checkpoint
                .as_ref()
                .and_then(|checkpoint| check_checkpoint(checkpoint, &self.resources)),
        );
        problems.extend(self.notify.as_ref().and_then(check_notify));
        problems.extend(
            self.sweep.as_ref().and_then(|sweep| {
                crate::sweep::check_sweep(sweep, &self.run, self.setup.as_deref())
            }),
        );
        problems
    }
}

pub(crate) fn check_notify(notify: &NotifySpec) -> Option<Problem> {
    if let Some(message) = webhook_error(&notify.webhook) {
        return Some(problem(
            "notify.webhook",
            message,
            "write the receiver's URL, e.g. `webhook: https://hooks.example.com/tacc`",
        ));
    }
    if notify.secret.trim().is_empty() {
        return Some(problem(
            "notify.secret",
            "`notify.secret` is empty",
            "name one of your secrets, which signs every notification: \
             `tcloud secret set HOOK_KEY`, then `secret: HOOK_KEY`",
        ));
    }
    None
}

/// Why `name` is not a valid task name, if it is not.
pub(crate) fn name_error(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the task name is empty".to_string());
    }
    if name.chars().count() > MAX_NAME_LEN {
        return Some(format!(
            "the task name is {} characters long; at most {MAX_NAME_LEN} are allowed",
            name.chars().count()
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Some(format!(
            "the task name `{name}` must start with a letter or digit"
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "the task name `{name}` contains `{bad}`; only letters, digits, `.`, `_` and `-` are allowed"
        ));
    }
    None
}

fn check_name(name: &str) -> Option<Problem> {
    name_error(name).map(|message| {
        problem(
            "name",
            message,
            "use 1–63 characters of a-z, A-Z, 0-9, `.`, `_` or `-`, starting with a letter or digit, e.g. `name: mnist-ddp`",
        )
    })
}

/// Every mistake of `resources`, one per field at most (each field is checked on its own,
/// so `cpus: -2` and a zero `memory` are both reported).
fn check_resources(resources: &ResourceSpec) -> Vec<Problem> {
    let mut problems = Vec::new();
    if resources.nodes == 0 || resources.nodes > MAX_NODES {
        problems.push(problem(
            "resources.nodes",
            format!(
                "`nodes` must be between 1 and {MAX_NODES}, found {}",
                resources.nodes
            ),
            "ask for the number of machines the task spans, e.g. `nodes: 2`",
        ));
    }
    if resources.gpus > GpuCount::whole(MAX_GPUS_PER_NODE) {
        problems.push(problem(
            "resources.gpus",
            format!(
                "`gpus` must be at most {MAX_GPUS_PER_NODE} per node, found {}",
                resources.gpus
            ),
            "`gpus` counts GPUs on each node; use `nodes` to span machines",
        ));
    }
    if let Some(gpu_type) = &resources.gpu_type {
        if gpu_type.trim().is_empty() {
            problems.push(problem(
                "resources.gpu_type",
                "`gpu_type` is empty",
                "name a GPU model such as `gpu_type: A100`, or remove the line",
            ));
        } else if resources.gpus.is_zero() {
            problems.push(problem(
                "resources.gpu_type",
                format!("`gpu_type: {gpu_type}` is set but `gpus` is 0"),
                "add `gpus: 1` (or more) to `resources`, or remove `gpu_type`",
            ));
        }
    }
    let cpus = resources.cpus;
    if !cpus.is_finite() || cpus <= 0.0 || cpus > MAX_CPUS_PER_NODE {
        problems.push(problem(
            "resources.cpus",
            format!("`cpus` must be more than 0 and at most {MAX_CPUS_PER_NODE}, found {cpus}"),
            "write whole or fractional CPUs per node, e.g. `cpus: 16` or `cpus: 0.5`",
        ));
    } else if (cpus * 1000.0).round() < 1.0 {
        problems.push(problem(
            "resources.cpus",
            format!("`cpus: {cpus}` is below the smallest share, 0.001 CPU"),
            "ask for at least `cpus: 0.001`",
        ));
    }
    let memory = resources.memory;
    if memory.as_bytes() == 0 || memory > MAX_MEMORY_PER_NODE {
        problems.push(problem(
            "resources.memory",
            format!(
                "`memory` must be more than 0 and at most {MAX_MEMORY_PER_NODE}, found {memory}"
            ),
            "write memory per node with a unit, e.g. `memory: 64GiB`",
        ));
    } else if memory < ByteSize::mib(1) {
        // A bare number is bytes; anything under a MiB is almost surely a forgotten unit.
        problems.push(problem(
            "resources.memory",
            format!("`memory` is only {memory}; did you forget the unit?"),
            "write memory per node with a unit, e.g. `memory: 64GiB` or `memory: 512MiB`",
        ));
    }
    if let Some(disk) = resources.disk {
        if disk.as_bytes() == 0 || disk > MAX_DISK_PER_NODE {
            problems.push(problem(
                "resources.disk",
                format!("`disk` must be more than 0 and at most {MAX_DISK_PER_NODE}, found {disk}"),
                "write the most the working directory may hold with a unit, e.g. `disk: 10GiB`",
            ));
        } else if disk < ByteSize::mib(1) {
            // A bare number is bytes; anything under a MiB is almost surely a forgotten unit.
            problems.push(problem(
                "resources.disk",
                format!("`disk` is only {disk}; did you forget the unit?"),
                "write the most the working directory may hold with a unit, e.g. `disk: 10GiB`",
            ));
        }
    }
    if resources.processes == Processes::PerGpu && resources.gpus.whole_gpus() == 0 {
        problems.push(problem(
            "resources.processes",
            format!(
                "`processes: per_gpu` starts one process per whole GPU, but `gpus` is {}",
                resources.gpus
            ),
            "add `gpus: N` (whole GPUs) to `resources`, or write a number such as `processes: 1`",
        ));
    }
    if let Some(limit) = resources.time_limit
        && (limit.as_secs() == 0 || limit > MAX_TIME_LIMIT)
    {
        problems.push(problem(
            "resources.time_limit",
            format!("`time_limit` must be more than 0s and at most 365d, found {limit}"),
            "write a duration such as `time_limit: 4h` or `time_limit: 2d`",
        ));
    }
    problems
}

/// Why `path` may not be used as a path inside the task's working directory, if it may not.
pub(crate) fn relative_path_error(path: &str) -> Option<String> {
    if path.trim().is_empty() {
        return Some("the path is empty".to_string());
    }
    if path.starts_with('/') || path.starts_with('\\') || Path::new(path).is_absolute() {
        return Some(format!("`{path}` is an absolute path"));
    }
    if path.starts_with('~') {
        return Some(format!("`{path}` starts with `~`, which is not expanded"));
    }
    if Path::new(path)
        .components()
        .any(|component| matches!(component, Component::ParentDir))
    {
        return Some(format!("`{path}` climbs out of its directory with `..`"));
    }
    None
}

fn check_relative_path(field: String, path: &str, what: &str) -> Option<Problem> {
    relative_path_error(path).map(|why| {
        problem(
            field,
            format!("{what} must be a relative path inside the task directory: {why}"),
            "write a path relative to the task's directory without `..`, e.g. `results/`",
        )
    })
}

fn check_code(code: &CodeSpec) -> Option<Problem> {
    check_relative_path("code.dir".to_string(), &code.dir, "`code.dir`").or_else(|| {
        code.exclude
            .iter()
            .position(|pattern| pattern.trim().is_empty())
            .map(|index| {
                problem(
                    format!("code.exclude.{index}"),
                    "an `exclude` pattern is empty",
                    "remove the empty entry, or write a pattern such as `data/` or `*.ckpt`",
                )
            })
    })
}

/// True for names a POSIX shell accepts as a variable: `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn is_shell_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn check_environment(
    environment: &EnvironmentSpec,
    runtime: Option<RuntimeKind>,
) -> Option<Problem> {
    if let Some(python) = &environment.python {
        let well_formed = !python.is_empty()
            && python
                .split('.')
                .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_digit()));
        if !well_formed {
            return Some(problem(
                "environment.python",
                format!("`python: {python}` is not a version number"),
                "write the version in quotes, e.g. `python: \"3.11\"`",
            ));
        }
    }
    if !environment.pip.is_empty() && environment.requirements.is_some() {
        return Some(problem(
            "environment.requirements",
            "`pip` and `requirements` cannot both be given",
            "list packages under `pip`, or put them in the requirements file, not both",
        ));
    }
    if let Some(index) = environment
        .pip
        .iter()
        .position(|spec| spec.trim().is_empty())
    {
        return Some(problem(
            format!("environment.pip.{index}"),
            "a `pip` entry is empty",
            "remove the empty entry, or write a requirement such as `numpy==2.1.*`",
        ));
    }
    if let Some(requirements) = &environment.requirements
        && let Some(why) = relative_path_error(requirements)
    {
        return Some(problem(
            "environment.requirements",
            format!("`requirements` must be a file inside the code directory: {why}"),
            "write the file's path relative to the code directory, e.g. `requirements: requirements.txt`",
        ));
    }
    if let Some(image) = &environment.image {
        if image.trim().is_empty() || image.chars().any(char::is_whitespace) {
            return Some(problem(
                "environment.image",
                format!("`{image}` is not a container image reference"),
                "write an image such as `image: pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime`",
            ));
        }
        if environment.conda.is_some() {
            return Some(problem(
                "environment.image",
                "`image` and `conda` cannot both be given",
                "install the conda packages in the image, or drop `image` and let TACC build the conda environment",
            ));
        }
        if let Some(kind @ (RuntimeKind::Process | RuntimeKind::Slurm)) = runtime {
            return Some(problem(
                "environment.image",
                format!("`runtime: {kind}` cannot run a container image"),
                format!(
                    "remove `runtime: {kind}` (or use `runtime: container`), or remove `image`"
                ),
            ));
        }
    } else if runtime == Some(RuntimeKind::Container) {
        return Some(problem(
            "runtime",
            "`runtime: container` needs `environment.image`",
            "add `image: <container image>` under `environment`, or use `runtime: auto`",
        ));
    }
    if let Some(conda) = &environment.conda
        && let Some(index) = conda.dependencies.iter().position(|d| d.trim().is_empty())
    {
        return Some(problem(
            format!("environment.conda.dependencies.{index}"),
            "a conda dependency is empty",
            "remove the empty entry, or write a package such as `pytorch=2.4`",
        ));
    }
    for name in environment.vars.keys() {
        if !is_shell_identifier(name) {
            return Some(problem(
                format!("environment.vars.{name}"),
                format!("`{name}` is not a valid environment variable name"),
                "use letters, digits and `_`, not starting with a digit, e.g. `OMP_NUM_THREADS`",
            ));
        }
    }
    for (index, name) in environment.secrets.iter().enumerate() {
        if !is_shell_identifier(name) {
            return Some(problem(
                format!("environment.secrets.{index}"),
                format!("`{name}` is not a valid secret name"),
                "name a secret set with `tcloud secret set NAME`, e.g. `WANDB_API_KEY`",
            ));
        }
        if is_platform_variable(name) {
            return Some(problem(
                format!("environment.secrets.{index}"),
                format!("`{name}` is set by the platform and cannot be a secret"),
                "store the secret under another name",
            ));
        }
        if environment.vars.contains_key(name) {
            return Some(problem(
                format!("environment.secrets.{index}"),
                format!("`{name}` is both in `vars` and in `secrets`"),
                "remove it from `vars`: a secret must not be written in the task file",
            ));
        }
    }
    None
}

/// Why the label `key: value` of `placement.labels` is refused, if it is: the message and
/// whether it is about the key (else the value).
pub(crate) fn placement_label_error(key: &str, value: &str) -> Option<(String, bool)> {
    use tacc_core::labels;
    if let Some(why) = labels::key_error(key) {
        return Some((why, true));
    }
    if labels::is_reserved(key) {
        return Some((
            format!(
                "`{key}` is a label the platform sets itself (keys under `{}`)",
                labels::RESERVED_PREFIX
            ),
            true,
        ));
    }
    labels::value_error(value).map(|why| (why, false))
}

pub(crate) const LABEL_HELP: &str = "write a label the way the operator gave it to the agent (`taccd agent --label KEY=VALUE`), e.g. `labels: {gpu-gen: hopper}`; choose the runtime with `runtime:` and a Slurm partition with `partition:`";

fn check_placement(
    placement: &PlacementSpec,
    runtime: Option<RuntimeKind>,
    environment: &EnvironmentSpec,
) -> Option<Problem> {
    for (key, value) in &placement.labels {
        if let Some((message, _)) = placement_label_error(key, value) {
            return Some(problem(
                format!("placement.labels.{key}"),
                message,
                LABEL_HELP,
            ));
        }
    }
    let partition = placement.partition.as_deref()?;
    if let Some(why) = tacc_core::labels::value_error(partition) {
        return Some(problem(
            "placement.partition",
            why.replace("label value", "partition"),
            "name a Slurm partition, e.g. `partition: debug` (`sinfo` lists them)",
        ));
    }
    if let Some(kind @ (RuntimeKind::Process | RuntimeKind::Container)) = runtime {
        return Some(problem(
            "placement.partition",
            format!(
                "`partition: {partition}` runs the task as a Slurm job, but the task asks for `runtime: {kind}`"
            ),
            "remove `partition`, or use `runtime: slurm` (or `runtime: auto`)",
        ));
    }
    if environment.image.is_some() {
        return Some(problem(
            "placement.partition",
            format!(
                "`partition: {partition}` runs the task as a Slurm job, which cannot run `environment.image`"
            ),
            "remove `partition`, or remove `image` and install the software on the Slurm nodes",
        ));
    }
    None
}

fn check_datasets(datasets: &[DatasetSpec]) -> Option<Problem> {
    for (index, dataset) in datasets.iter().enumerate() {
        let field = |name: &str| format!("datasets.{index}.{name}");
        if let Some(why) = name_error(&dataset.name) {
            return Some(problem(
                field("name"),
                why.replace("task name", "dataset name"),
                "use letters, digits, `.`, `_` or `-`, e.g. `name: mnist`",
            ));
        }
        if dataset.source.trim().is_empty() {
            return Some(problem(
                field("source"),
                format!("dataset `{}` has an empty `source`", dataset.name),
                "write a path on the cluster's shared storage or a URL, e.g. `source: /shared/datasets/mnist`",
            ));
        }
        if let Some(found) = check_relative_path(field("mount"), &dataset.mount, "`mount`") {
            return Some(found);
        }
        let earlier = &datasets[..index];
        if earlier.iter().any(|other| other.name == dataset.name) {
            return Some(problem(
                field("name"),
                format!("dataset name `{}` is used twice", dataset.name),
                "give each dataset its own name",
            ));
        }
        if earlier.iter().any(|other| other.mount == dataset.mount) {
            return Some(problem(
                field("mount"),
                format!("two datasets are mounted at `{}`", dataset.mount),
                "give each dataset its own `mount` path",
            ));
        }
    }
    None
}

fn check_commands(spec: &TaskSpec) -> Option<Problem> {
    if spec.run.trim().is_empty() {
        return Some(problem(
            "run",
            "`run` is empty",
            "write the command each node runs, e.g. `run: python train.py`",
        ));
    }
    if spec
        .setup
        .as_ref()
        .is_some_and(|setup| setup.trim().is_empty())
    {
        return Some(problem(
            "setup",
            "`setup` is empty",
            "write the commands to run once per node before `run`, or remove `setup`",
        ));
    }
    None
}

fn check_outputs(outputs: &[String]) -> Option<Problem> {
    outputs.iter().enumerate().find_map(|(index, output)| {
        check_relative_path(format!("outputs.{index}"), output, "an output")
    })
}

fn check_retry(retry: &RetrySpec) -> Option<Problem> {
    if retry.max_attempts == 0 || retry.max_attempts > MAX_ATTEMPTS {
        return Some(problem(
            "retry.max_attempts",
            format!(
                "`max_attempts` must be between 1 and {MAX_ATTEMPTS}, found {}",
                retry.max_attempts
            ),
            "count the first attempt too: `max_attempts: 3` runs at most three times",
        ));
    }
    None
}

fn check_checkpoint(checkpoint: &CheckpointSpec, resources: &ResourceSpec) -> Option<Problem> {
    if !CHECKPOINT_SIGNALS.contains(&checkpoint.signal.as_str()) {
        return Some(problem(
            "checkpoint.signal",
            format!("`{}` is not a signal a task can be sent", checkpoint.signal),
            format!("use one of {}", CHECKPOINT_SIGNALS.join(", ")),
        ));
    }
    if checkpoint.grace.as_secs() == 0 {
        return Some(problem(
            "checkpoint.grace",
            "`grace` is 0s, which leaves no time to write a checkpoint",
            "give the task time to save its state, e.g. `grace: 60s`",
        ));
    }
    if let Some(limit) = resources.time_limit
        && checkpoint.grace >= limit
    {
        return Some(problem(
            "checkpoint.grace",
            format!(
                "`grace: {}` is not shorter than `time_limit: {limit}`",
                checkpoint.grace
            ),
            "make the grace period a small part of the time limit, e.g. `grace: 60s`",
        ));
    }
    None
}
