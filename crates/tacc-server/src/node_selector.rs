//! Which nodes a task may run on, as the scheduler's `node_selector`: the runtime the task
//! needs becomes one of the `tacc.io/runtime.*` labels agents register with, its Slurm
//! partition the `tacc.io/slurm-partition` label, and its `placement.labels` are taken
//! as written. A task the cluster has no such node for waits, with the scheduler's
//! reason, rather than being refused: agents come and go.

use std::collections::BTreeMap;

use tacc_core::labels;
use tacc_schema::TaskSpec;

/// The labels every node of the task must carry.
pub(crate) fn of(spec: &TaskSpec) -> BTreeMap<String, String> {
    let mut selector = spec.placement.labels.clone();
    let runtime = match spec.runtime {
        Some(kind) => Some(kind.label()),
        // An image runs only in a container, wherever `auto` would otherwise place it.
        None if spec.environment.image.is_some() => Some(labels::RUNTIME_CONTAINER),
        // Any runtime the node offers will do; a partition alone already means Slurm.
        None => None,
    };
    if let Some(runtime) = runtime {
        selector.insert(runtime.to_string(), labels::OFFERED.to_string());
    }
    if let Some(partition) = &spec.placement.partition {
        selector.insert(labels::SLURM_PARTITION.to_string(), partition.clone());
    }
    selector
}

/// What an operator can do about a task that waits for nodes matching `selector`, for
/// `tcloud why`.
pub(crate) fn advice(selector: &BTreeMap<String, String>) -> String {
    let mut needs = Vec::new();
    for (key, value) in selector {
        needs.push(match key.as_str() {
            labels::RUNTIME_SLURM => {
                "a Slurm agent (`taccd agent --backend slurm` on a Slurm login node)".to_string()
            }
            labels::RUNTIME_CONTAINER => {
                "an agent with a Docker engine (`taccd agent`, where /var/run/docker.sock answers, or with `--docker-socket`)".to_string()
            }
            labels::RUNTIME_PROCESS => "a process agent (`taccd agent`)".to_string(),
            labels::SLURM_PARTITION => {
                format!("a Slurm agent for partition {value} (`--slurm-partition {value}`)")
            }
            _ => format!("an agent started with `--label {key}={value}`"),
        });
    }
    format!(
        "no registered node matches its runtime and placement; it needs {}. The labels of \
         each node are in `tcloud nodes --json`",
        needs.join(", and ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> TaskSpec {
        tacc_schema::parse_task("task.yaml", yaml).unwrap().0
    }

    fn pairs(selector: &BTreeMap<String, String>) -> Vec<(&str, &str)> {
        selector
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[test]
    fn each_runtime_selects_the_nodes_that_offer_it() {
        let cases = [
            ("run: x\n", vec![]),
            ("run: x\nruntime: auto\n", vec![]),
            (
                "run: x\nruntime: process\n",
                vec![("tacc.io/runtime.process", "true")],
            ),
            (
                "run: x\nruntime: container\nenvironment: {image: python:3.11}\n",
                vec![("tacc.io/runtime.container", "true")],
            ),
            (
                "run: x\nenvironment: {image: python:3.11}\n",
                vec![("tacc.io/runtime.container", "true")],
            ),
            (
                "run: x\nruntime: slurm\n",
                vec![("tacc.io/runtime.slurm", "true")],
            ),
        ];
        for (yaml, expected) in cases {
            assert_eq!(pairs(&of(&spec(yaml))), expected, "{yaml}");
        }
    }

    #[test]
    fn placement_adds_labels_and_the_partition() {
        let selector = of(&spec(
            "run: x\nruntime: slurm\nplacement: {labels: {gpu-gen: hopper}, partition: debug}\n",
        ));
        assert_eq!(
            pairs(&selector),
            vec![
                ("gpu-gen", "hopper"),
                ("tacc.io/runtime.slurm", "true"),
                ("tacc.io/slurm-partition", "debug"),
            ]
        );
        // With `auto`, the partition is what makes it a Slurm task.
        let selector = of(&spec("run: x\nplacement: {partition: debug}\n"));
        assert_eq!(pairs(&selector), vec![("tacc.io/slurm-partition", "debug")]);
        let selector = of(&spec("run: x\nplacement: {labels: {rack: r7}}\n"));
        assert_eq!(pairs(&selector), vec![("rack", "r7")]);
    }

    #[test]
    fn advice_names_the_agent_to_start() {
        let text = advice(&of(&spec(
            "run: x\nruntime: slurm\nplacement: {labels: {rack: r7}, partition: debug}\n",
        )));
        assert!(text.contains("`--label rack=r7`"), "{text}");
        assert!(text.contains("`taccd agent --backend slurm`"), "{text}");
        assert!(text.contains("`--slurm-partition debug`"), "{text}");
    }
}
