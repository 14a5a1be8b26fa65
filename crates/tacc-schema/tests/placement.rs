//! `placement:` in the task file: node labels and the Slurm partition a task may run on,
//! and how mistakes in it read.

use std::collections::BTreeMap;

use tacc_core::RuntimeKind;
use tacc_schema::{PlacementSpec, SchemaError, TaskSpec, parse_task};

const FILE: &str = "examples/bad/task.yaml";

fn parse(text: &str) -> Result<TaskSpec, SchemaError> {
    parse_task(FILE, text).map(|(spec, _)| spec)
}

/// The rendered error for a file that must be rejected; it must be located.
fn rejected(text: &str) -> String {
    match parse(text) {
        Ok(spec) => panic!("accepted a bad task file:\n{text}\nas {spec:#?}"),
        Err(error) => {
            assert!(error.diagnostic().is_some(), "not located: {error}");
            error.to_string()
        }
    }
}

fn assert_located(rendered: &str, line: usize, column: usize, help_part: &str) {
    let location = format!("--> {FILE}:{line}:{column}\n");
    assert!(
        rendered.contains(&location),
        "expected `{location}` in:\n{rendered}"
    );
    assert!(
        rendered
            .lines()
            .any(|l| l.trim_start().starts_with("= help: ") && l.contains(help_part)),
        "expected help to mention `{help_part}`:\n{rendered}"
    );
}

#[test]
fn labels_and_partition_are_read_as_written() {
    let spec = parse(
        "run: x\nplacement:\n  labels: {gpu-gen: hopper, example.org/rack: r7, ssd: true, tier: 2}\n  partition: debug\n",
    )
    .unwrap();
    assert_eq!(
        spec.placement,
        PlacementSpec {
            labels: BTreeMap::from([
                ("example.org/rack".to_string(), "r7".to_string()),
                ("gpu-gen".to_string(), "hopper".to_string()),
                // YAML's booleans and numbers are label text, as the node's labels are.
                ("ssd".to_string(), "true".to_string()),
                ("tier".to_string(), "2".to_string()),
            ]),
            partition: Some("debug".to_string()),
        }
    );
    // Without `placement` nothing is restricted, and nothing extra is serialised.
    let plain = parse("run: x\n").unwrap();
    assert!(plain.placement.is_empty());
    assert!(
        !serde_json::to_string(&plain).unwrap().contains("placement"),
        "an unrestricted spec stays as it was"
    );
    let empty = parse("run: x\nplacement: {}\n").unwrap();
    assert!(empty.placement.is_empty());
}

#[test]
fn a_placement_survives_the_json_the_server_receives() {
    let spec =
        parse("run: x\nruntime: slurm\nplacement: {labels: {a: b}, partition: gpu}\n").unwrap();
    assert_eq!(spec.runtime, Some(RuntimeKind::Slurm));
    let json = serde_json::to_string(&spec).unwrap();
    let back: TaskSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, spec);
    back.validate().unwrap();

    let unknown: Result<TaskSpec, _> =
        serde_json::from_str(r#"{"run":"x","placement":{"partitions":"a"}}"#);
    assert!(
        unknown
            .unwrap_err()
            .to_string()
            .contains("unknown field `partitions`")
    );
    // A JSON spec gets the same rules as a file, by field path.
    let mut bad = back;
    bad.placement
        .labels
        .insert("tacc.io/runtime.slurm".into(), "true".into());
    let error = bad.validate().unwrap_err();
    assert!(
        matches!(&error, SchemaError::Invalid { field, .. } if field == "placement.labels.tacc.io/runtime.slurm"),
        "{error:?}"
    );
}

#[test]
fn unknown_and_misplaced_fields_are_located() {
    let unknown = rejected("run: x\nplacement:\n  lables: {a: b}\n");
    assert!(
        unknown.contains("unknown field `lables` in `placement`"),
        "{unknown}"
    );
    assert_located(&unknown, 3, 3, "did you mean `labels`?");

    let alias = rejected("run: x\nplacement:\n  node_selector: {a: b}\n");
    assert_located(&alias, 3, 3, "did you mean `labels`?");

    let misplaced = rejected("run: x\npartition: debug\n");
    assert_located(&misplaced, 2, 1, "`partition` belongs under `placement:`");
}

#[test]
fn wrong_types_are_located_with_an_example() {
    let scalar = rejected("run: x\nplacement: debug\n");
    assert!(
        scalar.contains("expected a mapping of fields for `placement`, found `debug`"),
        "{scalar}"
    );
    assert_located(&scalar, 2, 12, "valid fields: labels, partition");

    let list = rejected("run: x\nplacement:\n  labels: [gpu-gen, hopper]\n");
    assert!(
        list.contains("expected a mapping of label names to values for `placement.labels`"),
        "{list}"
    );
    assert_located(&list, 3, 11, "labels: {gpu-gen: hopper}");

    let nested = rejected("run: x\nplacement:\n  labels:\n    gpu-gen: {name: hopper}\n");
    assert!(
        nested.contains("expected text for `placement.labels.gpu-gen`, found a mapping"),
        "{nested}"
    );
    assert_located(&nested, 4, 14, "gpu-gen: hopper");

    let partition = rejected("run: x\nplacement:\n  partition: [a, b]\n");
    assert!(
        partition.contains("expected text for `placement.partition`, found a list"),
        "{partition}"
    );
    assert_located(&partition, 3, 14, "partition: debug");
}

#[test]
fn bad_labels_point_at_the_key_or_the_value() {
    let no_value = rejected("run: x\nplacement:\n  labels:\n    gpu-gen:\n");
    assert!(
        no_value.contains("label `gpu-gen` has no value"),
        "{no_value}"
    );
    assert_located(&no_value, 4, 5, "gpu-gen: hopper");

    let bad_key = rejected("run: x\nplacement:\n  labels: {\"gpu gen\": hopper}\n");
    assert!(bad_key.contains("contains ` `"), "{bad_key}");
    assert_located(&bad_key, 3, 12, "taccd agent --label KEY=VALUE");

    let bad_value = rejected("run: x\nplacement:\n  labels: {gpu-gen: \"a=b\"}\n");
    assert!(bad_value.contains("contains `=`"), "{bad_value}");
    assert_located(&bad_value, 3, 21, "taccd agent --label KEY=VALUE");

    let reserved = rejected("run: x\nplacement:\n  labels: {tacc.io/runtime.slurm: \"true\"}\n");
    assert!(
        reserved.contains("is a label the platform sets itself"),
        "{reserved}"
    );
    assert_located(&reserved, 3, 12, "runtime:");
}

#[test]
fn a_partition_means_slurm() {
    let empty = rejected("run: x\nplacement: {partition: \"\"}\n");
    assert!(empty.contains("the partition is empty"), "{empty}");
    assert_located(&empty, 2, 24, "partition: debug");

    let process = rejected("run: x\nruntime: process\nplacement: {partition: debug}\n");
    assert!(
        process.contains("runs the task as a Slurm job, but the task asks for `runtime: process`"),
        "{process}"
    );
    assert_located(&process, 3, 24, "use `runtime: slurm`");

    let image =
        rejected("run: x\nenvironment: {image: python:3.11}\nplacement: {partition: debug}\n");
    assert!(image.contains("cannot run `environment.image`"), "{image}");
    assert_located(&image, 3, 24, "remove `partition`");

    // Slurm jobs here do not run images, whichever way Slurm is asked for.
    let slurm_image = rejected("run: x\nruntime: slurm\nenvironment: {image: python:3.11}\n");
    assert!(
        slurm_image.contains("`runtime: slurm` cannot run a container image"),
        "{slurm_image}"
    );
    assert_located(&slurm_image, 3, 22, "remove `runtime: slurm`");

    parse("run: x\nruntime: slurm\nplacement: {partition: debug}\n").unwrap();
    parse("run: x\nplacement: {partition: debug}\n").unwrap();
}
