//! `tacc-schema`: layer 1 of TACC's four (schema → compiler → scheduling → execution). It
//! turns a task file (YAML) into a validated, normalised [`TaskSpec`]: every field known,
//! typed, range-checked and defaulted, and every mistake reported like a compiler error, at
//! `file:line:column` with the offending line, a caret and a help line. It also imports TACC's
//! legacy `tuxiv.conf`, and publishes the task file's JSON Schema for editors.
//!
//! It depends only on `tacc-core` among our crates, and does no I/O beyond reading the task
//! file (and checking that its code directory exists): no tokio, no network.

mod adaptive;
mod array;
mod error;
mod gpus;
mod interactive;
mod legacy;
mod pipeline;
mod processes;
mod reader;
mod schema;
mod sizes;
mod spans;
mod spec;
mod sweep;

use std::fs;
use std::path::{Component, Path, PathBuf};

pub use adaptive::{AdaptiveSpec, Range};
pub use array::{ArrayError, ArraySpec, MAX_ARRAY_ELEMENTS, NotifySpec};
pub use error::{Diagnostic, Diagnostics, MAX_SHOWN_DIAGNOSTICS, SchemaError, Severity};
pub use interactive::{DEFAULT_IDLE_TIMEOUT, DEV_HOLDER, MIN_IDLE_TIMEOUT, TaskKind};
pub use legacy::LegacyChange;
pub use pipeline::{
    LoadedPipeline, MAX_STAGES, PipelineSpec, StageSpec, is_pipeline, load_pipeline, parse_pipeline,
};
pub use processes::{MAX_PROCESSES_PER_NODE, Processes};
pub use schema::json_schema;
pub use sizes::{MAX_COMMAND_BYTES, MAX_VAR_VALUE_BYTES, MAX_VARS_TOTAL_BYTES};
pub use spans::{Location, Spans};
pub use spec::{
    CHECKPOINT_SIGNALS, CheckpointSpec, CodeSpec, CondaSpec, DatasetSpec, EnvironmentSpec,
    HangAction, HangSpec, MAX_ATTEMPTS, MAX_CPUS_PER_NODE, MAX_GPUS_PER_NODE, MAX_MEMORY_PER_NODE,
    MAX_NAME_LEN, MAX_NODES, MAX_TIME_LIMIT, PLATFORM_VARIABLES, PlacementSpec, ResourceSpec,
    RetryOn, RetrySpec, TaskSpec, is_platform_variable, runtime_name,
};
pub use sweep::{
    AshaSpec, Goal, MAX_SWEEP_TRIALS, PARAM_VARIABLE_PREFIX, ParameterSpec, SweepMethod, SweepSpec,
    TrialPoint, parameter_variable, placeholders, substitute,
};

/// Names a task file may have in a directory, in the order they are looked for.
pub const TASK_FILE_NAMES: [&str; 3] = ["task.yaml", "task.yml", "tacc.yaml"];
/// The legacy TACC CLI's task file, used when a directory has none of [`TASK_FILE_NAMES`].
pub const LEGACY_FILE_NAME: &str = "tuxiv.conf";

/// A task file read from disk, with what later layers need to report errors against it.
#[derive(Debug, Clone)]
pub struct LoadedTask {
    pub spec: TaskSpec,
    /// The file that was read.
    pub source: PathBuf,
    /// The absolute directory `code.dir` resolves to (relative to the task file's directory).
    pub code_root: PathBuf,
    /// Things that were accepted but deserve the user's attention (mostly from `tuxiv.conf`).
    pub warnings: Vec<String>,
    /// The options of a legacy `tuxiv.conf` not honoured as written (each also a warning):
    /// submitted with the task, which keeps them as overrides (`tcloud show`).
    pub legacy_changes: Vec<LegacyChange>,
    spans: Spans,
}

impl LoadedTask {
    /// An error located at the field `field_path` (dotted, e.g. `datasets`,
    /// `environment.image` or `datasets.0.source`) of the task file; when that field was not
    /// written, at its nearest written parent, else at the start of the file.
    pub fn error_at(
        &self,
        field_path: &str,
        message: impl Into<String>,
        help: Option<String>,
    ) -> SchemaError {
        self.spans.error_at(field_path, message, help)
    }

    /// The span table of the file, for callers that want locations without an error.
    pub fn spans(&self) -> &Spans {
        &self.spans
    }

    /// [`LoadedTask::warnings`] as a compiler prints them: each located one with its
    /// `file:line:col`, the line and a caret; the others as one line.
    pub fn rendered_warnings(&self) -> Vec<String> {
        self.warnings
            .iter()
            .map(|warning| self.spans.render_warning(warning))
            .collect()
    }
}

/// Parse and validate task file text. `source_name` is only used in error messages, and, when
/// the file has no `name`, its directory's name becomes the task's name.
pub fn parse_task(source_name: &str, text: &str) -> Result<(TaskSpec, Spans), SchemaError> {
    let directory_name = Path::new(source_name)
        .parent()
        .and_then(Path::file_name)
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    parse_task_with_fallback_name(source_name, text, &task_name_from(&directory_name))
}

fn parse_task_with_fallback_name(
    source_name: &str,
    text: &str,
    fallback_name: &str,
) -> Result<(TaskSpec, Spans), SchemaError> {
    let mut spans = Spans::new(source_name, text);
    let root = reader::load_yaml(text, &spans)?;
    let spec = reader::read_task(&root, &mut spans, fallback_name)?;
    Ok((spec, spans))
}

/// Load a task from a task file, or from a directory holding one (`task.yaml`, `task.yml`,
/// `tacc.yaml`, in that order, else a legacy `tuxiv.conf`, which is translated).
pub fn load_task(path: &Path) -> Result<LoadedTask, SchemaError> {
    let read_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SchemaError::Read { path, source }
    };
    let metadata = fs::metadata(path).map_err(read_error(path))?;
    let mut warnings = Vec::new();
    let mut legacy_changes = Vec::new();
    let file = if metadata.is_dir() {
        find_task_file(path, &mut warnings)?
    } else {
        path.to_path_buf()
    };
    let text = fs::read_to_string(&file).map_err(read_error(&file))?;

    let parent = match file.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let task_dir = fs::canonicalize(parent).map_err(read_error(parent))?;
    let fallback_name = task_name_from(
        &task_dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let source_name = file.display().to_string();
    let is_legacy = file
        .file_name()
        .is_some_and(|name| name == LEGACY_FILE_NAME);
    let (spec, spans) = if is_legacy {
        let translated = legacy::translate(&source_name, &text, &fallback_name)?;
        warnings.extend(translated.warnings);
        legacy_changes = translated.changes;
        (translated.spec, translated.spans)
    } else {
        parse_task_with_fallback_name(&source_name, &text, &fallback_name)?
    };

    // `code.dir` was validated to be relative and free of `..`, so joining cannot escape.
    let code_root: PathBuf = task_dir
        .join(&spec.code.dir)
        .components()
        .filter(|component| !matches!(component, Component::CurDir))
        .collect();
    if !code_root.is_dir() {
        return Err(spans.error_at(
            "code.dir",
            format!(
                "the code directory `{}` does not exist",
                code_root.display()
            ),
            Some("set `code.dir` to a directory relative to the task file, e.g. `dir: .`".into()),
        ));
    }
    if let Some(checkpoint) = &spec.checkpoint
        && checkpoint.signal == "SIGCONT"
    {
        // Every runtime (process, container, Slurm) delivers the checkpoint signal
        // (docs/RELIABILITY.md section 9), so a signal is only worth a word when what it
        // does by default is misleading: SIGCONT alone does not ask anything to stop.
        let at = spans
            .location("checkpoint.signal")
            .or_else(|| spans.location("checkpoint"))
            .map(|l| format!("{source_name}:{}:{}: ", l.line, l.column))
            .unwrap_or_default();
        warnings.push(format!(
            "{at}`checkpoint.signal: SIGCONT` does nothing to a task that does not trap it: a stopped task (cancel, preemption, time limit) then runs on until SIGKILL after `checkpoint.grace` ({}); trap SIGCONT in the task, or pick a signal that stops it (SIGUSR1 with a trap, or SIGTERM)",
            checkpoint.grace
        ));
    }
    Ok(LoadedTask {
        spec,
        source: file,
        code_root,
        warnings,
        legacy_changes,
        spans,
    })
}

fn find_task_file(dir: &Path, warnings: &mut Vec<String>) -> Result<PathBuf, SchemaError> {
    let mut present = TASK_FILE_NAMES
        .iter()
        .chain([&LEGACY_FILE_NAME])
        .map(|name| dir.join(name))
        .filter(|candidate| candidate.is_file());
    let Some(chosen) = present.next() else {
        return Err(SchemaError::TaskFileNotFound {
            dir: dir.to_path_buf(),
            looked_for: TASK_FILE_NAMES
                .iter()
                .chain([&LEGACY_FILE_NAME])
                .map(|name| format!("`{name}`"))
                .collect(),
        });
    };
    for ignored in present {
        warnings.push(format!(
            "{} was ignored because {} is used",
            ignored.display(),
            chosen.display()
        ));
    }
    Ok(chosen)
}

/// A valid task name made from a directory name: other characters become `-`.
pub(crate) fn task_name_from(raw: &str) -> String {
    let replaced: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed: String = replaced
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .chars()
        .take(MAX_NAME_LEN)
        .collect();
    if trimmed.is_empty() {
        "task".to_string()
    } else {
        trimmed
    }
}

#[cfg(test)]
mod checkpoint_warning_tests {
    fn warnings_of(checkpoint: &str) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("task.yaml"),
            format!("name: ckpt\nrun: python train.py\ncheckpoint:\n{checkpoint}"),
        )
        .unwrap();
        super::load_task(dir.path()).unwrap().warnings
    }

    /// Every runtime delivers the checkpoint signal, so a task file asking for one gets no
    /// warning that it is "not sent" (issue 26: SIGUSR1 was warned about although sent).
    #[test]
    fn a_delivered_checkpoint_signal_gets_no_warning() {
        for signal in [
            "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGALRM",
        ] {
            let warnings = warnings_of(&format!("  signal: {signal}\n  grace: 30s\n"));
            assert!(warnings.is_empty(), "{signal}: {warnings:?}");
        }
    }

    #[test]
    fn sigcont_is_accepted_with_a_located_warning_that_it_stops_nothing() {
        let warnings = warnings_of("  signal: SIGCONT\n  grace: 30s\n");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let warning = &warnings[0];
        assert!(warning.contains("task.yaml:4:"), "{warning}");
        assert!(
            warning.contains("SIGCONT") && warning.contains("SIGKILL") && warning.contains("30s"),
            "{warning}"
        );
        assert!(!warning.contains("not sent"), "{warning}");
    }
}
