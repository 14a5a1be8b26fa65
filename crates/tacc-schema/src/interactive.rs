//! Dev sessions: `kind: interactive` makes a task that holds its allocation for a person
//! working inside it (`tcloud dev`, `tcloud shell`) instead of running a job. Its `run`,
//! when the file leaves it out, is a holder process that waits and uses nothing; the
//! server ends the task once it has been idle — no session in use and no CPU or GPU used
//! by its processes — for its `idle_timeout`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tacc_core::HumanDuration;

use crate::spec::{Problem, TaskSpec, problem};

/// What a task is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// A job: it runs `run` and ends when `run` does.
    #[default]
    Batch,
    /// A dev session: it holds its allocation for `tcloud shell`/`exec`/`port-forward`
    /// and ends when idle for `idle_timeout` (or when cancelled, or its `run` ends).
    Interactive,
}

impl TaskKind {
    pub fn is_batch(&self) -> bool {
        *self == TaskKind::Batch
    }
}

/// A dev session's idle timeout when its task file names none.
pub const DEFAULT_IDLE_TIMEOUT: HumanDuration = HumanDuration::from_secs(2 * 3600);
/// The shortest idle timeout a task may ask for: the server samples use every few
/// seconds, so a shorter one could end a session that is in use.
pub const MIN_IDLE_TIMEOUT: HumanDuration = HumanDuration::from_secs(10);

/// A dev session's `run` when the file gives none: it says how to get in, then waits
/// without using anything (`sleep` is in every image, busybox's included; a huge
/// number of seconds rather than `infinity`, which busybox lacks).
pub const DEV_HOLDER: &str = "echo \"dev session ready: tcloud shell $TACC_TASK_ID\"\n\
                              exec sleep 2147483647\n";

impl TaskSpec {
    /// Whether the task is a dev session (`kind: interactive`).
    pub fn is_interactive(&self) -> bool {
        self.kind == TaskKind::Interactive
    }

    /// How long the dev session may stay idle before it ends (the task's `idle_timeout`,
    /// else [`DEFAULT_IDLE_TIMEOUT`]); `None` for a batch task.
    pub fn dev_idle_timeout(&self) -> Option<HumanDuration> {
        self.is_interactive()
            .then(|| self.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT))
    }
}

pub(crate) fn check_interactive(spec: &TaskSpec) -> Option<Problem> {
    match (spec.kind, spec.idle_timeout) {
        (TaskKind::Batch, Some(_)) => {
            return Some(problem(
                "idle_timeout",
                "`idle_timeout` applies to dev sessions only",
                "add `kind: interactive` (a dev session, ended when idle), or remove \
                 `idle_timeout` (a batch task ends when its `run` does; `resources.time_limit` \
                 bounds it)",
            ));
        }
        (TaskKind::Interactive, Some(timeout)) if timeout < MIN_IDLE_TIMEOUT => {
            return Some(problem(
                "idle_timeout",
                format!("`idle_timeout` must be at least {MIN_IDLE_TIMEOUT}"),
                "give how long the session may sit unused, e.g. `idle_timeout: 2h`",
            ));
        }
        _ => {}
    }
    if spec.is_interactive() && (spec.array.is_some() || spec.sweep.is_some()) {
        return Some(problem(
            "kind",
            "a dev session cannot be an array or a sweep",
            "remove `array:`/`sweep:`, or `kind: interactive` to run them as batch tasks",
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_task;

    fn parsed(yaml: &str) -> Result<TaskSpec, String> {
        parse_task("dir/task.yaml", yaml)
            .map(|(spec, _)| spec)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_dev_session_needs_no_run_and_defaults_its_idle_timeout() {
        let spec = parsed("kind: interactive\nresources: {gpus: 0}\n").unwrap();
        assert!(spec.is_interactive());
        assert_eq!(spec.run, DEV_HOLDER);
        assert_eq!(spec.dev_idle_timeout(), Some(DEFAULT_IDLE_TIMEOUT));
        let spec = parsed("kind: interactive\nidle_timeout: 20s\nrun: jupyter lab\n").unwrap();
        assert_eq!(spec.run, "jupyter lab");
        assert_eq!(spec.dev_idle_timeout(), Some(HumanDuration::from_secs(20)));
        let batch = parsed("run: python train.py\n").unwrap();
        assert_eq!(batch.kind, TaskKind::Batch);
        assert_eq!(batch.dev_idle_timeout(), None);
        // A batch task's JSON does not change.
        assert!(!serde_json::to_string(&batch).unwrap().contains("kind"));
    }

    #[test]
    fn idle_timeout_mistakes_are_reported_at_their_line() {
        let table = [
            (
                "run: x\nidle_timeout: 1h\n",
                "`idle_timeout` applies to dev sessions only",
            ),
            (
                "kind: interactive\nidle_timeout: 3s\n",
                "`idle_timeout` must be at least 10s",
            ),
            (
                "kind: interactive\narray: 0-3\n",
                "a dev session cannot be an array or a sweep",
            ),
            ("kind: notebook\nrun: x\n", "kind"),
            ("run: x\n", ""),
        ];
        for (yaml, want) in table {
            match parsed(yaml) {
                Ok(_) => assert!(want.is_empty(), "{yaml}: accepted"),
                Err(e) => assert!(!want.is_empty() && e.contains(want), "{yaml}: {e}"),
            }
        }
    }
}
