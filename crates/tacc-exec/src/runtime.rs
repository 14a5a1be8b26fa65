//! Choosing the runtime of a task (the TACC paper's Table 1), in one pure function:
//! the user's preference, the static characteristics the compiler sees (an image needs a
//! container; a gang larger than the local cluster needs Slurm), the runtime
//! characteristics the scheduler knows (a short task takes the fast local path), and
//! fail-safe switching (a runtime that is unavailable or failed to launch for an
//! infrastructure reason is skipped, and the switch is said in words for the task's
//! event log).

use std::collections::BTreeSet;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuntimeKind {
    Process,
    Container,
    Slurm,
}

impl RuntimeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Process => "process",
            RuntimeKind::Container => "container",
            RuntimeKind::Slurm => "slurm",
        }
    }
}

/// Tasks expected to end within this run on the local path rather than queue in Slurm.
pub const SHORT_TASK: Duration = Duration::from_secs(300);

/// Everything the decision looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeQuestion {
    /// `runtime:` in the task file; `None` is `auto`.
    pub preference: Option<RuntimeKind>,
    /// `environment.image` is set.
    pub has_image: bool,
    pub num_nodes: u32,
    /// Machines the local (process/container) cluster has.
    pub local_machines: u32,
    /// What the scheduler expects the task to take (its time limit, or a prediction).
    pub expected_duration: Option<Duration>,
    /// Runtimes this cluster offers right now.
    pub available: BTreeSet<RuntimeKind>,
    /// Runtimes that already failed to launch this task for an infrastructure reason.
    pub failed: BTreeSet<RuntimeKind>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeChoice {
    pub runtime: RuntimeKind,
    /// Why, for `tcloud show`/`why`; says so when this is a switch.
    pub why: String,
}

/// The runtimes that may run the task, best first (before availability and failures).
pub fn eligible_runtimes(question: &RuntimeQuestion) -> Vec<RuntimeKind> {
    use RuntimeKind::*;
    if let Some(preferred) = question.preference {
        return vec![preferred];
    }
    if question.has_image {
        return vec![Container];
    }
    let fits_locally = question.num_nodes <= question.local_machines.max(1);
    let short = question.expected_duration.is_some_and(|d| d <= SHORT_TASK);
    match (fits_locally, short) {
        (false, _) => vec![Slurm],
        (true, true) => vec![Process, Slurm],
        (true, false) => vec![Slurm, Process],
    }
}

/// The runtime for the task, or why none can run it.
pub fn choose_runtime(question: &RuntimeQuestion) -> Result<RuntimeChoice, String> {
    let eligible = eligible_runtimes(question);
    let first = eligible[0];
    let mut skipped = Vec::new();
    for runtime in &eligible {
        if question.failed.contains(runtime) {
            skipped.push(format!("{} failed to launch it", runtime.as_str()));
        } else if !question.available.contains(runtime) {
            skipped.push(format!("{} is not available", runtime.as_str()));
        } else {
            let reason = reason_for(question, *runtime);
            let why = if *runtime == first {
                reason
            } else {
                format!(
                    "switched to {}: {} ({reason})",
                    runtime.as_str(),
                    skipped.join(", ")
                )
            };
            return Ok(RuntimeChoice {
                runtime: *runtime,
                why,
            });
        }
    }
    Err(format!(
        "no runtime can run this task: {}{}",
        skipped.join(", "),
        if question.preference.is_some() {
            "; remove `runtime:` to let TACC pick another"
        } else {
            ""
        }
    ))
}

fn reason_for(question: &RuntimeQuestion, runtime: RuntimeKind) -> String {
    if question.preference.is_some() {
        return format!("runtime: {} asked for in the task file", runtime.as_str());
    }
    match runtime {
        RuntimeKind::Container => "the task names a container image".into(),
        RuntimeKind::Slurm if question.num_nodes > question.local_machines.max(1) => format!(
            "{} nodes do not fit the local cluster of {} machine(s)",
            question.num_nodes, question.local_machines
        ),
        RuntimeKind::Slurm => "a long task goes to the Slurm cluster".into(),
        RuntimeKind::Process => "a short task takes the fast local path".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::RuntimeKind::*;
    use super::*;

    fn question() -> RuntimeQuestion {
        RuntimeQuestion {
            preference: None,
            has_image: false,
            num_nodes: 1,
            local_machines: 1,
            expected_duration: None,
            available: BTreeSet::from([Process, Container, Slurm]),
            failed: BTreeSet::new(),
        }
    }

    #[test]
    fn preference_wins_and_is_never_switched_away_from() {
        let mut q = question();
        q.preference = Some(Process);
        q.num_nodes = 4;
        assert_eq!(choose_runtime(&q).unwrap().runtime, Process);
        q.failed.insert(Process);
        let err = choose_runtime(&q).unwrap_err();
        assert!(err.contains("remove `runtime:`"), "{err}");
    }

    #[test]
    fn an_image_means_a_container() {
        let mut q = question();
        q.has_image = true;
        assert_eq!(choose_runtime(&q).unwrap().runtime, Container);
        q.available.remove(&Container);
        assert!(choose_runtime(&q).is_err());
    }

    #[test]
    fn a_gang_larger_than_the_local_cluster_goes_to_slurm() {
        let mut q = question();
        q.num_nodes = 2;
        let choice = choose_runtime(&q).unwrap();
        assert_eq!(choice.runtime, Slurm);
        assert!(choice.why.contains("do not fit"), "{}", choice.why);
        q.available.remove(&Slurm);
        assert!(choose_runtime(&q).is_err());
    }

    #[test]
    fn short_tasks_take_the_local_path_long_ones_slurm() {
        let mut q = question();
        q.expected_duration = Some(Duration::from_secs(30));
        assert_eq!(choose_runtime(&q).unwrap().runtime, Process);
        q.expected_duration = Some(Duration::from_secs(3600));
        assert_eq!(choose_runtime(&q).unwrap().runtime, Slurm);
        q.available.remove(&Slurm);
        let choice = choose_runtime(&q).unwrap();
        assert_eq!(choice.runtime, Process);
        assert!(
            choice
                .why
                .starts_with("switched to process: slurm is not available"),
            "{}",
            choice.why
        );
    }

    #[test]
    fn a_failed_launch_moves_to_the_next_eligible_runtime() {
        let mut q = question();
        q.expected_duration = Some(Duration::from_secs(3600));
        q.failed.insert(Slurm);
        let choice = choose_runtime(&q).unwrap();
        assert_eq!(choice.runtime, Process);
        assert!(
            choice.why.contains("slurm failed to launch it"),
            "{}",
            choice.why
        );
        q.failed.insert(Process);
        assert!(choose_runtime(&q).is_err());
    }
}
