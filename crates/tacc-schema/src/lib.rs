//! TEMPORARY stand-in for `tacc-schema` (the real crate lands from branch wip-schema):
//! the agreed public API with a minimal parser, so the layers above can be built.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tacc_core::{ByteSize, HumanDuration, Priority, Resources};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub name: String,
    #[serde(default)]
    pub resources: ResourceSpec,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default)]
    pub preemptible: bool,
    #[serde(default)]
    pub code: CodeSpec,
    #[serde(default)]
    pub environment: EnvironmentSpec,
    #[serde(default)]
    pub datasets: Vec<DatasetSpec>,
    pub setup: Option<String>,
    pub run: String,
    #[serde(default)]
    pub outputs: Vec<String>,
    #[serde(default)]
    pub retry: RetrySpec,
    pub checkpoint: Option<CheckpointSpec>,
    #[serde(default)]
    pub runtime: Runtime,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResourceSpec {
    pub nodes: u32,
    pub gpus: u32,
    pub gpu_type: Option<String>,
    pub cpus: f64,
    pub memory: ByteSize,
    pub time_limit: Option<HumanDuration>,
}
impl Default for ResourceSpec {
    fn default() -> Self {
        ResourceSpec {
            nodes: 1,
            gpus: 0,
            gpu_type: None,
            cpus: 1.0,
            memory: ByteSize::gib(1),
            time_limit: None,
        }
    }
}
impl ResourceSpec {
    pub fn per_node(&self) -> Resources {
        Resources::new(
            (self.cpus * 1000.0).round() as u64,
            self.memory.as_bytes(),
            self.gpus,
        )
    }
}
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CodeSpec {
    pub dir: String,
    pub exclude: Vec<String>,
}
impl Default for CodeSpec {
    fn default() -> Self {
        CodeSpec {
            dir: ".".into(),
            exclude: vec![],
        }
    }
}
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvironmentSpec {
    pub python: Option<String>,
    pub pip: Vec<String>,
    pub requirements: Option<String>,
    pub conda: Option<CondaSpec>,
    pub image: Option<String>,
    pub vars: BTreeMap<String, String>,
}
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CondaSpec {
    pub name: Option<String>,
    pub channels: Vec<String>,
    pub dependencies: Vec<String>,
}
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetSpec {
    pub name: String,
    pub source: String,
    pub mount: String,
}
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySpec {
    pub max_attempts: u32,
    pub on: Vec<RetryOn>,
}
impl Default for RetrySpec {
    fn default() -> Self {
        RetrySpec {
            max_attempts: 1,
            on: vec![],
        }
    }
}
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryOn {
    NodeFailure,
    Preempted,
    Failed,
    Lost,
}
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointSpec {
    pub signal: String,
    pub grace: HumanDuration,
}
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    #[default]
    Auto,
    Process,
    Container,
    Slurm,
}

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("{0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Default)]
pub struct Spans;

#[derive(Debug, Clone)]
pub struct LoadedTask {
    pub spec: TaskSpec,
    pub source: PathBuf,
    pub code_root: PathBuf,
    pub warnings: Vec<String>,
}
impl LoadedTask {
    pub fn error_at(
        &self,
        field_path: &str,
        message: impl Into<String>,
        help: Option<String>,
    ) -> SchemaError {
        SchemaError::Invalid(format!(
            "{}: {field_path}: {} {}",
            self.source.display(),
            message.into(),
            help.unwrap_or_default()
        ))
    }
}
impl TaskSpec {
    pub fn validate(&self) -> Result<(), SchemaError> {
        if self.run.trim().is_empty() {
            return Err(SchemaError::Invalid("run is empty".into()));
        }
        Ok(())
    }
}
pub fn parse_task(source_name: &str, text: &str) -> Result<(TaskSpec, Spans), SchemaError> {
    let spec: TaskSpec = serde_yaml::from_str(text)
        .map_err(|e| SchemaError::Invalid(format!("{source_name}: {e}")))?;
    spec.validate()?;
    Ok((spec, Spans))
}
pub fn load_task(path: &Path) -> Result<LoadedTask, SchemaError> {
    let file = if path.is_dir() {
        path.join("task.yaml")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file)
        .map_err(|e| SchemaError::Invalid(format!("{}: {e}", file.display())))?;
    let (spec, _) = parse_task(&file.display().to_string(), &text)?;
    let base = file
        .parent()
        .unwrap_or(Path::new("."))
        .canonicalize()
        .map_err(|e| SchemaError::Invalid(e.to_string()))?;
    let code_root = base.join(&spec.code.dir);
    Ok(LoadedTask {
        spec,
        source: file,
        code_root,
        warnings: vec![],
    })
}
