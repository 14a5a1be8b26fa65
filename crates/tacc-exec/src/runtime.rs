//! Choosing the runtime of a task (the TACC paper's Table 1), in one pure function:
//! the user's preference, the static characteristics the compiler sees (an image needs a
//! container; a gang larger than the local cluster needs Slurm), the runtime
//! characteristics the scheduler knows (a short task takes the fast local path), and
//! fail-safe switching (a runtime that is unavailable or failed to launch for an
//! infrastructure reason is skipped, and the switch is said in words for the task's
//! event log).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

pub use tacc_core::RuntimeKind;

/// Tasks expected to end within this run on the local path rather than queue in Slurm.
pub const SHORT_TASK: Duration = Duration::from_secs(300);

/// Everything the decision looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeQuestion {
    /// `runtime:` in the task file; `None` is `auto`.
    pub preference: Option<RuntimeKind>,
    /// `environment.image` is set.
    pub has_image: bool,
    /// The node runs tasks that name no image in its default image (isolation the
    /// operator asked for, best effort: such a task may fall back to a process).
    pub isolate_by_default: bool,
    pub num_nodes: u32,
    /// Machines the local (process/container) cluster has.
    pub local_machines: u32,
    /// What the scheduler expects the task to take (its time limit, or a prediction).
    pub expected_duration: Option<Duration>,
    /// Runtimes this node (or cluster) is set up with at all. One it lacks is never
    /// eligible, and leaving it out is no switch.
    pub offered: BTreeSet<RuntimeKind>,
    /// Offered runtimes that do not answer right now, with why.
    pub unavailable: BTreeMap<RuntimeKind, String>,
    /// Runtimes that already failed to launch this task for an infrastructure reason,
    /// with why.
    pub failed: BTreeMap<RuntimeKind, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeChoice {
    pub runtime: RuntimeKind,
    /// Why, for `tcloud show`/`why`; says so when this is a switch.
    pub why: String,
    /// Whether a better runtime was skipped (unavailable or failed): the user is told.
    pub switched: bool,
}

/// The runtimes that may run the task, best first (before what is offered, available
/// or failed). A preference is never switched away from; an image is never dropped.
pub fn eligible_runtimes(question: &RuntimeQuestion) -> Vec<RuntimeKind> {
    use RuntimeKind::*;
    if let Some(preferred) = question.preference {
        return vec![preferred];
    }
    if question.has_image {
        // Only a container honours the image: running the script on the node's own
        // tools instead would run other software than the task asked for.
        return vec![Container];
    }
    let mut local = Vec::new();
    if question.isolate_by_default {
        local.push(Container);
    }
    local.push(Process);
    let fits_locally = question.num_nodes <= question.local_machines.max(1);
    let short = question.expected_duration.is_some_and(|d| d <= SHORT_TASK);
    match (fits_locally, short) {
        (false, _) => vec![Slurm],
        (true, true) => local.into_iter().chain([Slurm]).collect(),
        (true, false) => [Slurm].into_iter().chain(local).collect(),
    }
}

/// The runtime for the task, or why none can run it.
pub fn choose_runtime(question: &RuntimeQuestion) -> Result<RuntimeChoice, String> {
    if let Some(preferred) = question.preference.filter(|p| *p != RuntimeKind::Container) {
        if question.has_image {
            return Err(format!(
                "`runtime: {}` cannot run `environment.image`; remove one of them",
                preferred.as_str()
            ));
        }
    }
    let eligible = eligible_runtimes(question);
    let candidates: Vec<RuntimeKind> = eligible
        .iter()
        .copied()
        .filter(|r| question.offered.contains(r))
        .collect();
    if candidates.is_empty() {
        let names: Vec<&str> = eligible.iter().map(|r| r.as_str()).collect();
        let offered: Vec<&str> = question.offered.iter().map(|r| r.as_str()).collect();
        return Err(format!(
            "no runtime here can run this task: it needs {}, this node offers {}",
            names.join(" or "),
            if offered.is_empty() {
                "none".to_string()
            } else {
                offered.join(", ")
            }
        ));
    }
    let mut skipped = Vec::new();
    for runtime in candidates {
        if let Some(why) = question.failed.get(&runtime) {
            skipped.push(format!("{} failed to launch it ({why})", runtime.as_str()));
        } else if let Some(why) = question.unavailable.get(&runtime) {
            skipped.push(format!("{} is unavailable ({why})", runtime.as_str()));
        } else {
            let reason = reason_for(question, runtime);
            let switched = !skipped.is_empty();
            let why = if switched {
                format!(
                    "switched to {}: {} ({reason})",
                    runtime.as_str(),
                    skipped.join(", ")
                )
            } else {
                reason
            };
            return Ok(RuntimeChoice {
                runtime,
                why,
                switched,
            });
        }
    }
    let hint = if question.preference.is_some() {
        "; remove `runtime:` to let TACC pick another"
    } else if question.has_image {
        "; a task with `environment.image` runs only in a container"
    } else {
        ""
    };
    Err(format!(
        "no runtime can run this task: {}{hint}",
        skipped.join(", ")
    ))
}

fn reason_for(question: &RuntimeQuestion, runtime: RuntimeKind) -> String {
    if question.preference.is_some() {
        return format!("runtime: {} asked for in the task file", runtime.as_str());
    }
    let short = question.expected_duration.is_some_and(|d| d <= SHORT_TASK);
    match runtime {
        RuntimeKind::Container if question.has_image => "the task names a container image".into(),
        RuntimeKind::Container => "this node runs tasks in its default container image".into(),
        RuntimeKind::Slurm if question.num_nodes > question.local_machines.max(1) => format!(
            "{} nodes do not fit the local cluster of {} machine(s)",
            question.num_nodes, question.local_machines
        ),
        RuntimeKind::Slurm if question.expected_duration.is_some() && !short => {
            "a long task goes to the Slurm cluster".into()
        }
        RuntimeKind::Slurm => "the task runs as a Slurm job".into(),
        RuntimeKind::Process if short => "a short task takes the fast local path".into(),
        RuntimeKind::Process => "the task runs as a process on the node".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::RuntimeKind::*;
    use super::*;

    const EVERYTHING: &[RuntimeKind] = &[Process, Container, Slurm];
    const PROCESS_AGENT: &[RuntimeKind] = &[Process, Container];

    /// One row of the decision table.
    struct Case {
        name: &'static str,
        preference: Option<RuntimeKind>,
        has_image: bool,
        isolate_by_default: bool,
        num_nodes: u32,
        duration_secs: Option<u64>,
        offered: &'static [RuntimeKind],
        unavailable: &'static [RuntimeKind],
        failed: &'static [RuntimeKind],
        /// The runtime, or `Err(fragment)` of the refusal.
        expect: Result<RuntimeKind, &'static str>,
        /// A fragment of `why`, and whether it is a switch.
        why: &'static str,
        switched: bool,
    }

    const BASE: Case = Case {
        name: "",
        preference: None,
        has_image: false,
        isolate_by_default: false,
        num_nodes: 1,
        duration_secs: None,
        offered: EVERYTHING,
        unavailable: &[],
        failed: &[],
        expect: Ok(Process),
        why: "",
        switched: false,
    };

    fn question(case: &Case) -> RuntimeQuestion {
        let reasons = |set: &[RuntimeKind], why: &str| {
            set.iter()
                .map(|r| (*r, format!("{why} {}", r.as_str())))
                .collect()
        };
        RuntimeQuestion {
            preference: case.preference,
            has_image: case.has_image,
            isolate_by_default: case.isolate_by_default,
            num_nodes: case.num_nodes,
            local_machines: 1,
            expected_duration: case.duration_secs.map(Duration::from_secs),
            offered: case.offered.iter().copied().collect(),
            unavailable: reasons(case.unavailable, "engine down:"),
            failed: reasons(case.failed, "launch broke:"),
        }
    }

    #[test]
    fn the_decision_table() {
        let cases = [
            Case {
                name: "a preference wins over the task's shape",
                preference: Some(Process),
                num_nodes: 4,
                expect: Ok(Process),
                why: "runtime: process asked for",
                ..BASE
            },
            Case {
                name: "a preference is never switched away from",
                preference: Some(Process),
                failed: &[Process],
                expect: Err("remove `runtime:`"),
                ..BASE
            },
            Case {
                name: "a preference for a runtime that cannot run an image is refused",
                preference: Some(Process),
                has_image: true,
                expect: Err("`runtime: process` cannot run `environment.image`"),
                ..BASE
            },
            Case {
                name: "a Slurm login node runs every task as a Slurm job",
                offered: &[Slurm],
                duration_secs: Some(30),
                expect: Ok(Slurm),
                why: "runs as a Slurm job",
                ..BASE
            },
            Case {
                name: "runtime: container without an image takes the node's default image",
                preference: Some(Container),
                offered: PROCESS_AGENT,
                expect: Ok(Container),
                why: "runtime: container asked for",
                ..BASE
            },
            Case {
                name: "an image means a container",
                has_image: true,
                expect: Ok(Container),
                why: "names a container image",
                ..BASE
            },
            Case {
                name: "an image is never dropped for a process when the engine is down",
                has_image: true,
                offered: PROCESS_AGENT,
                unavailable: &[Container],
                expect: Err("runs only in a container"),
                ..BASE
            },
            Case {
                name: "an image on a node without a container runtime",
                has_image: true,
                offered: &[Process],
                expect: Err("it needs container, this node offers process"),
                ..BASE
            },
            Case {
                name: "a gang larger than the local cluster goes to Slurm",
                num_nodes: 2,
                expect: Ok(Slurm),
                why: "do not fit",
                ..BASE
            },
            Case {
                name: "a gang larger than the local cluster without Slurm",
                num_nodes: 2,
                offered: PROCESS_AGENT,
                expect: Err("it needs slurm"),
                ..BASE
            },
            Case {
                name: "a short task takes the local path",
                duration_secs: Some(30),
                expect: Ok(Process),
                why: "fast local path",
                ..BASE
            },
            Case {
                name: "a long task goes to Slurm",
                duration_secs: Some(3600),
                expect: Ok(Slurm),
                why: "long task",
                ..BASE
            },
            Case {
                name: "a long task on a node without Slurm runs as a process, no switch",
                duration_secs: Some(3600),
                offered: PROCESS_AGENT,
                expect: Ok(Process),
                why: "runs as a process",
                ..BASE
            },
            Case {
                name: "Slurm offered but down: switch to a process",
                duration_secs: Some(3600),
                unavailable: &[Slurm],
                expect: Ok(Process),
                why: "switched to process: slurm is unavailable (engine down: slurm)",
                switched: true,
                ..BASE
            },
            Case {
                name: "a failed launch moves to the next eligible runtime",
                duration_secs: Some(3600),
                failed: &[Slurm],
                expect: Ok(Process),
                why: "slurm failed to launch it (launch broke: slurm)",
                switched: true,
                ..BASE
            },
            Case {
                name: "every eligible runtime failed",
                duration_secs: Some(3600),
                failed: &[Slurm, Process],
                expect: Err("no runtime can run this task"),
                ..BASE
            },
            Case {
                name: "a node that isolates tasks runs one without an image in a container",
                isolate_by_default: true,
                offered: PROCESS_AGENT,
                expect: Ok(Container),
                why: "default container image",
                ..BASE
            },
            Case {
                name: "isolation is best effort: engine down → process",
                isolate_by_default: true,
                offered: PROCESS_AGENT,
                unavailable: &[Container],
                expect: Ok(Process),
                why: "switched to process: container is unavailable",
                switched: true,
                ..BASE
            },
            Case {
                name: "isolation is best effort: failed launch → process",
                isolate_by_default: true,
                offered: PROCESS_AGENT,
                failed: &[Container],
                expect: Ok(Process),
                why: "container failed to launch it",
                switched: true,
                ..BASE
            },
        ];
        for case in &cases {
            let answer = choose_runtime(&question(case));
            match (&case.expect, answer) {
                (Ok(runtime), Ok(choice)) => {
                    assert_eq!(choice.runtime, *runtime, "{}", case.name);
                    assert!(
                        choice.why.contains(case.why),
                        "{}: `{}` lacks `{}`",
                        case.name,
                        choice.why,
                        case.why
                    );
                    assert_eq!(choice.switched, case.switched, "{}", case.name);
                }
                (Err(fragment), Err(refusal)) => assert!(
                    refusal.contains(fragment),
                    "{}: `{refusal}` lacks `{fragment}`",
                    case.name
                ),
                (expected, got) => panic!("{}: expected {expected:?}, got {got:?}", case.name),
            }
        }
    }
}
