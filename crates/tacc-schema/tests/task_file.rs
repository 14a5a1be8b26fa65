//! The task file as users write it: what is accepted, what it means, and how mistakes read.

use tacc_core::{ByteSize, HumanDuration, Priority, Resources};
use tacc_schema::{
    CheckpointSpec, CondaSpec, DatasetSpec, RetryOn, SchemaError, TaskSpec, parse_task,
};

const FILE: &str = "examples/bad/task.yaml";

const DESIGN_EXAMPLE: &str = r#"name: mnist-ddp
resources:            # per node
  nodes: 2            # >1 = gang: all nodes start together or not at all
  gpus: 4
  gpu_type: A100
  cpus: 16
  memory: 64GiB
  time_limit: 4h      # enforced; also what backfill plans with
priority: normal      # low | normal | high (capped per user by the admin)
preemptible: true
code: { dir: ., exclude: ["data/", "*.ckpt"] }
environment:
  python: "3.11"
  pip: ["numpy==2.1.*"]
  image: null
  vars: { OMP_NUM_THREADS: "4" }
datasets:
  - { name: mnist, source: /shared/datasets/mnist, mount: data/mnist }
setup: pip list
run: |
  torchrun --nnodes "$TACC_NUM_NODES" --node_rank "$TACC_NODE_RANK" \
           --master_addr "$TACC_MASTER_ADDR" --master_port "$TACC_MASTER_PORT" train.py
outputs: [checkpoints/, results/]
retry: { max_attempts: 3, on: [node_failure, preempted] }
checkpoint: { signal: SIGUSR1, grace: 60s }
runtime: auto
"#;

fn parse(text: &str) -> Result<TaskSpec, SchemaError> {
    parse_task(FILE, text).map(|(spec, _)| spec)
}

/// The rendered error for a file that must be rejected.
fn rejected(text: &str) -> String {
    match parse(text) {
        Ok(spec) => panic!("accepted a bad task file:\n{text}\nas {spec:#?}"),
        Err(error) => {
            assert!(
                error.diagnostic().is_some(),
                "errors in a file must be located: {error}"
            );
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
    let help_line = rendered
        .lines()
        .find(|l| l.trim_start().starts_with("= help: "))
        .unwrap_or_else(|| panic!("no help line in:\n{rendered}"));
    assert!(
        help_line.contains(help_part),
        "expected help to mention `{help_part}`:\n{rendered}"
    );
}

#[test]
fn the_design_example_parses_to_what_it_says() {
    let spec = parse(DESIGN_EXAMPLE).unwrap();
    assert_eq!(spec.name, "mnist-ddp");
    assert_eq!(spec.resources.nodes, 2);
    assert_eq!(spec.resources.gpus, 4.into());
    assert_eq!(spec.resources.gpu_type.as_deref(), Some("A100"));
    assert_eq!(spec.resources.cpus, 16.0);
    assert_eq!(spec.resources.memory, ByteSize::gib(64));
    assert_eq!(
        spec.resources.time_limit,
        Some(HumanDuration::from_secs(4 * 3600))
    );
    assert_eq!(
        spec.resources.per_node(),
        Resources::new(16_000, 64 << 30, 4)
    );
    assert_eq!(spec.priority, Priority::Normal);
    assert!(spec.preemptible);
    assert_eq!(spec.code.dir, ".");
    assert_eq!(spec.code.exclude, ["data/", "*.ckpt"]);
    assert_eq!(spec.environment.python.as_deref(), Some("3.11"));
    assert_eq!(spec.environment.pip, ["numpy==2.1.*"]);
    assert_eq!(spec.environment.image, None);
    assert_eq!(spec.environment.vars["OMP_NUM_THREADS"], "4");
    assert_eq!(
        spec.datasets,
        [DatasetSpec {
            name: "mnist".into(),
            source: "/shared/datasets/mnist".into(),
            mount: "data/mnist".into(),
        }]
    );
    assert_eq!(spec.setup.as_deref(), Some("pip list"));
    assert!(spec.run.starts_with("torchrun --nnodes"));
    assert!(spec.run.contains("train.py"));
    assert_eq!(spec.outputs, ["checkpoints/", "results/"]);
    assert_eq!(spec.retry.max_attempts, 3);
    assert_eq!(spec.retry.on, [RetryOn::NodeFailure, RetryOn::Preempted]);
    assert_eq!(
        spec.checkpoint,
        Some(CheckpointSpec {
            signal: "SIGUSR1".into(),
            grace: HumanDuration::from_secs(60),
        })
    );
    assert_eq!(spec.runtime, None);
}

#[test]
fn a_minimal_file_gets_defaults_and_its_directory_name() {
    let (spec, _) = parse_task("projects/my mnist/task.yaml", "run: python train.py\n").unwrap();
    assert_eq!(spec.name, "my-mnist");
    assert_eq!(spec.resources.nodes, 1);
    assert_eq!(spec.resources.gpus, 0.into());
    assert_eq!(spec.resources.cpus, 1.0);
    assert_eq!(spec.resources.memory, ByteSize::gib(1));
    assert_eq!(spec.resources.time_limit, None);
    assert_eq!(spec.priority, Priority::Normal);
    assert_eq!(spec.code.dir, ".");
    assert_eq!(spec.retry.max_attempts, 1);
    assert_eq!(spec.runtime, None);
    assert_eq!(spec.checkpoint, None);
    let (spec, _) = parse_task("task.yaml", "run: x\n").unwrap();
    assert_eq!(spec.name, "task");
}

#[test]
fn runtime_travels_in_json_as_the_task_file_writes_it() {
    let (auto, _) = parse_task("task.yaml", "run: x\n").unwrap();
    let json = serde_json::to_value(&auto).unwrap();
    assert_eq!(json["runtime"], "auto");
    assert_eq!(serde_json::from_value::<TaskSpec>(json).unwrap(), auto);
    let (slurm, _) = parse_task("task.yaml", "runtime: slurm\nrun: x\n").unwrap();
    let json = serde_json::to_value(&slurm).unwrap();
    assert_eq!(json["runtime"], "slurm");
    assert_eq!(serde_json::from_value::<TaskSpec>(json).unwrap(), slurm);
    let mut odd = serde_json::to_value(&auto).unwrap();
    odd["runtime"] = "fake".into();
    let error = serde_json::from_value::<TaskSpec>(odd).unwrap_err();
    assert!(
        error.to_string().contains("unknown variant `fake`"),
        "{error}"
    );
}

#[test]
fn fractional_cpus_sizes_and_durations_are_accepted() {
    let spec = parse(
        "run: x\nresources: { cpus: 0.5, memory: 512MiB, time_limit: 1h30m }\ncheckpoint: { signal: usr2 }\n",
    )
    .unwrap();
    assert_eq!(spec.resources.per_node(), Resources::new(500, 512 << 20, 0));
    assert_eq!(
        spec.resources.time_limit,
        Some(HumanDuration::from_secs(5400))
    );
    assert_eq!(spec.resources.disk, None);
    let limited = parse("run: x\nresources: { disk: 1GiB }\n").unwrap();
    assert_eq!(limited.resources.disk, Some(ByteSize::gib(1)));
    // Signals are normalised to their full upper-case name; grace takes its default.
    assert_eq!(spec.checkpoint.unwrap().signal, "SIGUSR2");
}

#[test]
fn unknown_field_renders_like_a_compiler_error() {
    let text = "name: demo\nrun: python train.py\nresources:\n  gpus: 1\n  memroy: 64GiB\n";
    let expected = "\
error: unknown field `memroy` in `resources`
  --> examples/bad/task.yaml:5:3
   |
 5 |   memroy: 64GiB
   |   ^^^^^^
   = help: did you mean `memory`? Valid fields: nodes, gpus, gpu_type, cpus, memory, time_limit, disk, processes";
    assert_eq!(rejected(text), expected);
}

#[test]
fn unknown_fields_suggest_where_they_belong() {
    let misplaced = rejected("run: x\ngpus: 4\n");
    assert!(misplaced.contains("unknown field `gpus`"), "{misplaced}");
    assert_located(&misplaced, 2, 1, "`gpus` belongs under `resources:`");

    let alias = rejected("entrypoint: python train.py\n");
    assert_located(&alias, 1, 1, "did you mean `run`?");

    let nested = rejected("run: x\nretry: { max_attempts: 2, onn: [failed] }\n");
    assert_located(&nested, 2, 27, "did you mean `on`?");

    let in_list = rejected("run: x\ndatasets:\n  - name: a\n    source: /a\n    mnt: a\n");
    assert!(in_list.contains("in `datasets[0]`"), "{in_list}");
    assert_located(&in_list, 5, 5, "did you mean `mount`?");
}

#[test]
fn wrong_types_are_named_with_an_example() {
    let many = rejected("run: x\nresources:\n  gpus: many\n");
    assert!(
        many.contains("`resources.gpus`: `many` is not a number of GPUs"),
        "{many}"
    );
    assert!(
        many.contains("   |         ^^^^\n"),
        "caret under `many`:\n{many}"
    );
    assert_located(&many, 3, 9, "gpus: 2");

    let negative = rejected("run: x\nresources:\n  gpus: -2\n");
    assert!(negative.contains("cannot be negative"), "{negative}");
    assert_located(&negative, 3, 9, "gpus: 2");

    let mapping = rejected("run: x\nresources: 4\n");
    assert_located(&mapping, 2, 12, "valid fields: nodes, gpus");

    let list = rejected("run: [a, b]\n");
    assert_located(&list, 1, 6, "run: python train.py");

    let flag = rejected("run: x\npreemptible: maybe\n");
    assert_located(&flag, 2, 14, "`preemptible: true` or `preemptible: false`");

    let cpus = rejected("run: x\nresources: { cpus: lots }\n");
    assert_located(&cpus, 2, 20, "cpus: 16");
}

#[test]
fn absurd_quantities_are_refused_at_their_value() {
    let cases = [
        ("resources: { gpus: 2000 }", 20, "at most 1024"),
        ("resources: { nodes: 0 }", 21, "between 1 and 4096"),
        ("resources: { nodes: 5000 }", 21, "between 1 and 4096"),
        ("resources: { cpus: 0 }", 20, "more than 0"),
        ("resources: { cpus: -1 }", 20, "more than 0"),
        ("resources: { cpus: 5000 }", 20, "at most 4096"),
        ("resources: { memory: 0 }", 22, "more than 0"),
        ("resources: { memory: 65TiB }", 22, "at most 64TiB"),
        ("resources: { memory: 2048 }", 22, "forget the unit"),
        ("resources: { disk: 0 }", 20, "more than 0"),
        ("resources: { disk: 2000TiB }", 20, "at most 1024TiB"),
        ("resources: { disk: 4096 }", 20, "forget the unit"),
        ("resources: { time_limit: 0s }", 26, "more than 0s"),
        ("resources: { time_limit: 400d }", 26, "at most 365d"),
        ("retry: { max_attempts: 0 }", 24, "between 1 and 100"),
        ("retry: { max_attempts: 101 }", 24, "between 1 and 100"),
    ];
    for (line, column, why) in cases {
        let rendered = rejected(&format!("run: x\n{line}\n"));
        assert!(rendered.contains(why), "{line}: {rendered}");
        assert!(
            rendered.contains(&format!("--> {FILE}:2:{column}\n")),
            "{line}: {rendered}"
        );
        assert!(rendered.contains("= help: "), "{line}: {rendered}");
    }
}

#[test]
fn run_is_required_and_not_empty() {
    let missing = rejected("name: demo\n");
    assert!(
        missing.contains("missing required field `run`"),
        "{missing}"
    );
    assert_located(&missing, 1, 1, "run: python train.py");

    let empty = rejected("name: demo\nrun: \"  \"\n");
    assert!(empty.contains("`run` is empty"), "{empty}");
    assert_located(&empty, 2, 6, "run: python train.py");

    let null = rejected("name: demo\nrun:\n");
    assert_located(&null, 2, 1, "run: python train.py");
}

#[test]
fn bad_durations_and_sizes_explain_the_format() {
    let duration = rejected("run: x\nresources:\n  time_limit: 4 hours later\n");
    assert!(
        duration.contains("bad duration for `resources.time_limit`"),
        "{duration}"
    );
    assert!(
        duration.contains("unknown unit `hourslater`") || duration.contains("later"),
        "{duration}"
    );
    assert_located(&duration, 3, 15, "time_limit: 4h");

    let size = rejected("run: x\nresources:\n  memory: lots\n");
    assert!(size.contains("bad size for `resources.memory`"), "{size}");
    assert!(size.contains("   |           ^^^^\n"), "{size}");
    assert_located(&size, 3, 11, "memory: 64GiB");
}

#[test]
fn bad_priority_and_runtime_names_suggest_the_closest() {
    let priority = rejected("run: x\npriority: hihg\n");
    assert!(priority.contains("unknown priority `hihg`"), "{priority}");
    assert_located(
        &priority,
        2,
        11,
        "did you mean `high`? valid values: low, normal, high",
    );

    let runtime = rejected("run: x\nruntime: docker\n");
    assert_located(
        &runtime,
        2,
        10,
        "valid values: auto, process, container, slurm",
    );

    let retry = rejected("run: x\nretry: { on: [node_fail] }\n");
    assert_located(&retry, 2, 15, "did you mean `node_failure`?");

    let signal = rejected("run: x\ncheckpoint: { signal: SIGKILL }\n");
    assert_located(&signal, 2, 23, "SIGUSR1");
}

#[test]
fn task_names_follow_the_rules() {
    for good in ["a", "mnist-ddp", "Run_2.b", &"x".repeat(63)] {
        parse(&format!("name: {good}\nrun: x\n")).unwrap();
    }
    for (bad, why) in [
        ("-leading", "must start with a letter or digit"),
        ("has space", "contains ` `"),
        ("slash/name", "contains `/`"),
        (&"x".repeat(64), "64 characters long"),
        ("\"\"", "is empty"),
    ] {
        let rendered = rejected(&format!("run: x\nname: {bad}\n"));
        assert!(rendered.contains(why), "{bad}: {rendered}");
        assert_located(&rendered, 2, 7, "1–63 characters");
    }
}

#[test]
fn environment_variable_names_must_be_shell_identifiers() {
    let rendered = rejected("run: x\nenvironment:\n  vars:\n    GOOD: 1\n    MY-VAR: 2\n");
    assert!(
        rendered.contains("`MY-VAR` is not a valid environment variable name"),
        "{rendered}"
    );
    assert_located(&rendered, 5, 5, "OMP_NUM_THREADS");
    let digit = rejected("run: x\nenvironment: { vars: { 1ST: a } }\n");
    assert_located(&digit, 2, 24, "not starting with a digit");
    // Numbers are fine as values; they arrive as text.
    let spec = parse("run: x\nenvironment: { vars: { THREADS: 4 } }\n").unwrap();
    assert_eq!(spec.environment.vars["THREADS"], "4");
}

#[test]
fn oversized_vars_and_commands_are_refused_where_they_are_written() {
    let big = "x".repeat(tacc_schema::MAX_VAR_VALUE_BYTES + 1);
    let rendered = rejected(&format!(
        "run: x\nenvironment:\n  vars:\n    SMALL: a\n    BLOB: {big}\n"
    ));
    assert!(
        rendered.contains("the value of `BLOB` is 65 KiB"),
        "{rendered}"
    );
    assert!(
        rendered.len() < 2000,
        "the 65 KiB line is cut in the error:\n{rendered}"
    );
    assert_located(&rendered, 5, 5, "file in the code directory");
    // Each value within its limit, together past theirs: refused at the one crossing it.
    let half = "y".repeat(tacc_schema::MAX_VAR_VALUE_BYTES - 16);
    let many: String = (0..10).map(|i| format!("    V{i}: {half}\n")).collect();
    let rendered = rejected(&format!("run: x\nenvironment:\n  vars:\n{many}"));
    assert!(
        rendered.contains("at most 512 KiB are allowed in all"),
        "{rendered}"
    );
    assert_located(&rendered, 12, 5, "their paths");
    let long_run = format!("run: echo {}\n", "z".repeat(tacc_schema::MAX_COMMAND_BYTES));
    let rendered = rejected(&long_run);
    assert!(rendered.contains("`run` is 65 KiB"), "{rendered}");
    assert_located(&rendered, 1, 6, "bash train.sh");
    let long_setup = format!(
        "run: x\nsetup: echo {}\n",
        "z".repeat(tacc_schema::MAX_COMMAND_BYTES)
    );
    assert_located(&rejected(&long_setup), 2, 8, "script");
    // At the limits, accepted.
    let fits = "w".repeat(tacc_schema::MAX_VAR_VALUE_BYTES);
    parse(&format!(
        "run: x\nenvironment: {{ vars: {{ FITS: {fits} }} }}\n"
    ))
    .unwrap();
}

#[test]
fn paths_must_stay_inside_the_task_directory() {
    let mount = rejected("run: x\ndatasets:\n  - { name: d, source: /data, mount: /mnt/d }\n");
    assert!(mount.contains("`/mnt/d` is an absolute path"), "{mount}");
    assert_located(&mount, 3, 38, "without `..`");

    let output = rejected("run: x\noutputs: [ok/, ../escape]\n");
    assert!(output.contains("climbs out"), "{output}");
    assert_located(&output, 2, 16, "without `..`");

    let code = rejected("run: x\ncode:\n  dir: ../elsewhere\n");
    assert_located(&code, 3, 8, "without `..`");
}

#[test]
fn exclusive_environment_fields_are_refused() {
    let pip = rejected("run: x\nenvironment:\n  pip: [numpy]\n  requirements: requirements.txt\n");
    assert!(
        pip.contains("`pip` and `requirements` cannot both be given"),
        "{pip}"
    );
    assert_located(&pip, 4, 17, "not both");

    let image = rejected(
        "run: x\nenvironment:\n  conda: { dependencies: [pytorch] }\n  image: pytorch/pytorch:2.4\n",
    );
    assert!(
        image.contains("`image` and `conda` cannot both be given"),
        "{image}"
    );
    assert_located(&image, 4, 10, "install the conda packages in the image");

    let container = rejected("run: x\nruntime: container\n");
    assert_located(&container, 2, 10, "add `image:");
}

#[test]
fn duplicate_keys_point_at_the_second() {
    let rendered = rejected("run: x\nresources:\n  gpus: 1\n  cpus: 2\n  gpus: 2\n");
    assert!(rendered.contains("duplicate key `gpus`"), "{rendered}");
    assert_located(&rendered, 5, 3, "already set on line 3");
}

#[test]
fn yaml_syntax_errors_are_located() {
    let rendered = rejected("run: x\nresources:\n  gpus: [1, 2\n");
    assert!(rendered.contains("invalid YAML"), "{rendered}");
    assert!(
        rendered.contains("= help: check the indentation"),
        "{rendered}"
    );

    let anchors = rejected("base: &b 1\nrun: *b\n");
    assert!(anchors.contains("anchors and aliases"), "{anchors}");

    let second = rejected("run: x\n---\nrun: y\n");
    assert_located(&second, 2, 1, "remove the `---` line");

    let list = rejected("- run: x\n");
    assert!(list.contains("must be a mapping"), "{list}");
}

#[test]
fn quoted_null_is_text_but_plain_null_is_absent() {
    let spec = parse("run: x\nenvironment: { image: null, python: ~ }\n").unwrap();
    assert_eq!(spec.environment.image, None);
    assert_eq!(spec.environment.python, None);
    let spec = parse("run: x\nenvironment: { image: \"null\" }\n").unwrap();
    assert_eq!(spec.environment.image.as_deref(), Some("null"));
}

#[test]
fn spans_locate_fields_for_later_checks() {
    let (_, spans) = parse_task(FILE, DESIGN_EXAMPLE).unwrap();
    let memory = spans.location("resources.memory").unwrap();
    assert_eq!((memory.line, memory.column, memory.width), (7, 11, 5));
    let mount = spans.location("datasets.0.mount").unwrap();
    assert_eq!((mount.line, mount.column), (18, 59));

    let rendered = spans
        .error_at(
            "datasets.0.source",
            "no such dataset",
            Some("check the path".into()),
        )
        .to_string();
    assert!(
        rendered.contains(&format!("--> {FILE}:18:28\n")),
        "{rendered}"
    );
    assert!(rendered.contains("^^^^^^^^^^^^^^^^^^^^^^"), "{rendered}");
    assert!(rendered.ends_with("= help: check the path"), "{rendered}");

    // A field that was not written falls back to its parent, then to the file's start.
    let image = spans.error_at("environment.image", "x", None).to_string();
    assert!(
        image.contains(&format!("--> {FILE}:15:3\n")),
        "a null value points at its key: {image}"
    );
    let absent = spans
        .error_at("environment.requirements", "x", None)
        .to_string();
    assert!(absent.contains(&format!("--> {FILE}:12:1\n")), "{absent}");
    let nowhere = spans.error_at("nothing.here", "x", None).to_string();
    assert!(nowhere.contains(&format!("--> {FILE}:1:1\n")), "{nowhere}");
}

#[test]
fn specs_round_trip_through_json_and_validate() {
    let spec = parse(DESIGN_EXAMPLE).unwrap();
    let json = serde_json::to_string(&spec).unwrap();
    assert!(json.contains("\"memory\":\"64GiB\""), "{json}");
    let back: TaskSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, spec);
    back.validate().unwrap();

    // A JSON spec gets the same rules, reported by field path.
    let mut bad = spec.clone();
    bad.resources.gpus = 5000.into();
    let error = bad.validate().unwrap_err();
    assert!(matches!(&error, SchemaError::Invalid { field, .. } if field == "resources.gpus"));
    assert!(error.to_string().contains("at most 1024"), "{error}");
    assert!(error.help().is_some());

    let mut bad = spec;
    bad.environment.conda = Some(CondaSpec::default());
    bad.environment.image = Some("python:3.11".into());
    assert!(
        bad.validate()
            .unwrap_err()
            .to_string()
            .contains("`image` and `conda`")
    );

    let unknown: Result<TaskSpec, _> = serde_json::from_str(r#"{"run":"x","gpus":2}"#);
    assert!(
        unknown
            .unwrap_err()
            .to_string()
            .contains("unknown field `gpus`")
    );
    let minimal: TaskSpec = serde_json::from_str(r#"{"name":"a","run":"x"}"#).unwrap();
    assert_eq!(minimal.resources.memory, ByteSize::gib(1));
    minimal.validate().unwrap();
}

#[test]
fn processes_per_node_accept_names_and_numbers_and_refuse_the_rest_where_written() {
    use tacc_schema::Processes;
    let spec = parse("run: x\nresources: { gpus: 4, processes: per_gpu }\n").unwrap();
    assert_eq!(spec.resources.processes, Processes::PerGpu);
    assert_eq!(spec.resources.processes_per_node(), 4);
    let spec = parse("run: x\nresources: { processes: 3 }\n").unwrap();
    assert_eq!(spec.resources.processes_per_node(), 3);
    let spec = parse("run: x\n").unwrap();
    assert_eq!(spec.resources.processes_per_node(), 1);
    let cases = [
        ("resources: { processes: 0 }", 25, "between 1 and 1024"),
        ("resources: { processes: 2000 }", 25, "between 1 and 1024"),
        ("resources: { processes: -2 }", 25, "cannot be negative"),
        ("resources: { processes: per_gpus }", 25, "per_gpu"),
        ("resources: { processes: per_gpu }", 25, "`gpus` is 0"),
    ];
    for (line, column, why) in cases {
        let rendered = rejected(&format!("run: x\n{line}\n"));
        assert!(rendered.contains(why), "{line}: {rendered}");
        assert!(
            rendered.contains(&format!("--> {FILE}:2:{column}\n")),
            "{line}: {rendered}"
        );
    }
    // The same spec sent as JSON (what the server receives) round-trips.
    let spec = parse("run: x\nresources: { gpus: 2, processes: per_gpu }\n").unwrap();
    let back: TaskSpec = serde_json::from_value(serde_json::to_value(&spec).unwrap()).unwrap();
    assert_eq!(back, spec);
}

#[test]
fn adaptive_bounds_parse_and_bad_ranges_are_located_with_a_fix() {
    let spec = parse(
        "run: x\nresources: {cpus: 4, memory: 16GiB}\nadaptive: {cpus: 2..8, memory: 8GiB..32GiB}\n",
    )
    .unwrap();
    let adaptive = spec.adaptive.expect("adaptive bounds");
    assert_eq!(adaptive.cpu_millis(&spec.resources), (2000, 8000));
    assert_eq!(adaptive.memory_bytes(&spec.resources), (8 << 30, 32 << 30));
    // A maximum below the request.
    let rendered = rejected("run: x\nresources: {cpus: 4}\nadaptive:\n  cpus: 1..2\n");
    assert!(
        rendered.contains("the maximum 2 is below the 4 CPUs"),
        "{rendered}"
    );
    assert_located(&rendered, 4, 9, "raise the maximum to at least 4");
    // A minimum above the request.
    let rendered =
        rejected("run: x\nresources: {memory: 4GiB}\nadaptive:\n  memory: 8GiB..32GiB\n");
    assert_located(&rendered, 4, 11, "lower the minimum to at most 4GiB");
    // Reversed, and not a range at all.
    let rendered = rejected("run: x\nadaptive: {cpus: 8..2}\n");
    assert!(
        rendered.contains("write the smaller number first"),
        "{rendered}"
    );
    let rendered = rejected("run: x\nadaptive:\n  cpus: 4\n");
    assert_located(&rendered, 3, 9, "MIN..MAX");
}

#[test]
fn array_and_notify_are_read() {
    let spec = parse(
        "name: sweep\nrun: echo $TACC_ARRAY_INDEX\narray: 0-999:2\nnotify:\n  webhook: https://hooks.example.com/tacc\n  secret: HOOK_KEY\n",
    )
    .unwrap();
    let array = spec.array.expect("array is read");
    assert_eq!(array.len(), 500);
    assert_eq!(array.to_string(), "0-999:2");
    let notify = spec.notify.expect("notify is read");
    assert_eq!(notify.webhook, "https://hooks.example.com/tacc");
    assert_eq!(notify.secret, "HOOK_KEY");
    assert_eq!(
        parse("run: x\narray: 1,3,7\n")
            .unwrap()
            .array
            .unwrap()
            .indices(),
        [1, 3, 7]
    );
}

#[test]
fn a_backwards_array_range_is_located_with_a_fix() {
    let rendered = rejected("name: sweep\nrun: x\narray: 5-2\n");
    assert_located(&rendered, 3, 8, "`2-5`");
    assert!(rendered.contains("ends before it starts"), "{rendered}");
}

#[test]
fn an_array_over_the_limit_is_located() {
    let rendered = rejected("run: x\narray: 0-100000\n");
    assert_located(&rendered, 2, 8, "split it");
    assert!(rendered.contains("100001 elements"), "{rendered}");
}

#[test]
fn a_bad_webhook_is_located() {
    let rendered = rejected("run: x\nnotify:\n  webhook: ftp://x\n  secret: k\n");
    assert_located(&rendered, 3, 12, "https://hooks.example.com");
    let rendered = rejected("run: x\nnotify:\n  webhook: https://x\n");
    assert!(rendered.contains("missing field `secret`"), "{rendered}");
}

/// Three mistakes in one file (a negative `cpus` on line 3, a misspelt key on line 4, a
/// bad duration on line 5) are reported together, in file order, each located with its
/// line, caret and help: one run of `tcloud check`, not three.
#[test]
fn every_mistake_of_a_file_is_reported_at_once_in_file_order() {
    let text = "name: three-mistakes\nresources:\n  cpus: -2\n  memroy: 4GiB\n  time_limit: 5 fortnights\nrun: python train.py\n";
    let error = parse(text).unwrap_err();
    let lines: Vec<usize> = error.diagnostics().iter().map(|d| d.line).collect();
    assert_eq!(lines, vec![3, 4, 5], "{error}");
    let rendered = error.to_string();
    let at = |needle: &str| {
        rendered
            .find(needle)
            .unwrap_or_else(|| panic!("`{needle}` missing from:\n{rendered}"))
    };
    let cpus = at(&format!("--> {FILE}:3:9"));
    let memroy = at(&format!("--> {FILE}:4:3"));
    let duration = at(&format!("--> {FILE}:5:15"));
    assert!(cpus < memroy && memroy < duration, "{rendered}");
    assert!(
        rendered.contains("`cpus` must be more than 0"),
        "{rendered}"
    );
    assert!(rendered.contains("did you mean `memory`?"), "{rendered}");
    assert!(
        rendered.contains("bad duration for `resources.time_limit`"),
        "{rendered}"
    );
    assert!(rendered.contains(" 4 |   memroy: 4GiB\n"), "{rendered}");
    assert_eq!(rendered.matches("= help: ").count(), 3, "{rendered}");
    assert!(
        rendered.ends_with(&format!("error: {FILE} has 3 errors")),
        "{rendered}"
    );
    // The first diagnostic is the first in the file, whatever found it.
    assert_eq!(error.diagnostic().unwrap().line, 3);
}

/// Mistakes in different sections, and a semantic check next to a reading error, are all
/// listed; a field that could not be read is not judged again by its stand-in default.
#[test]
fn mistakes_across_sections_are_all_listed_once() {
    let text = "name: bad name!\nresources:\n  gpus: lots\npriority: urgent\nrun: python train.py\nretry: {max_attempts: 0}\nbogus: 1\n";
    let error = parse(text).unwrap_err();
    let found: Vec<(usize, &str)> = error
        .diagnostics()
        .iter()
        .map(|d| (d.line, d.message.as_str()))
        .collect();
    assert_eq!(found.len(), 5, "{error}");
    let lines: Vec<usize> = found.iter().map(|(line, _)| *line).collect();
    assert_eq!(lines, vec![1, 3, 4, 6, 7], "{error}");
    assert!(
        found[1]
            .1
            .contains("`resources.gpus`: `lots` is not a number of GPUs"),
        "{error}"
    );
    assert!(found[2].1.contains("unknown priority `urgent`"), "{error}");
    assert!(found[4].1.contains("unknown field `bogus`"), "{error}");
}

/// A file with more mistakes than fit a screen shows the first
/// [`tacc_schema::MAX_SHOWN_DIAGNOSTICS`] and counts the rest.
#[test]
fn past_the_cap_the_rest_are_counted_not_shown() {
    let mut text = String::from("name: many\nrun: python train.py\n");
    for index in 0..25 {
        text.push_str(&format!("unknown_{index}: 1\n"));
    }
    let error = parse(&text).unwrap_err();
    assert_eq!(error.diagnostics().len(), 25);
    let rendered = error.to_string();
    assert_eq!(
        rendered.matches("\nerror: unknown field").count()
            + usize::from(rendered.starts_with("error: unknown field")),
        tacc_schema::MAX_SHOWN_DIAGNOSTICS,
        "{rendered}"
    );
    assert!(
        rendered.contains("error: and 5 more errors in"),
        "{rendered}"
    );
    assert!(
        rendered.contains("unknown_19") && !rendered.contains("unknown_20"),
        "{rendered}"
    );
}

#[test]
fn on_hang_says_how_long_a_silence_means_hung_and_what_follows() {
    let spec = parse("run: train\non_hang: {after: 10m, then: retry}\n").unwrap();
    let hang = spec.on_hang.expect("on_hang is kept");
    assert_eq!(hang.after, Some(HumanDuration::from_secs(600)));
    assert_eq!(hang.then, tacc_schema::HangAction::Retry);
    let spec = parse("run: train\non_hang: {after: 90s}\n").unwrap();
    assert_eq!(
        spec.on_hang.unwrap().then,
        tacc_schema::HangAction::Fail,
        "failing is the default"
    );
    let off = parse("run: train\non_hang: off\n")
        .unwrap()
        .on_hang
        .unwrap();
    assert_eq!(off.after, None);
    assert_eq!(parse("run: train\n").unwrap().on_hang, None);
    // A round trip through the JSON the server stores keeps it.
    let spec = parse("run: train\non_hang: {after: 10m, then: retry}\n").unwrap();
    let json = serde_json::to_value(&spec).unwrap();
    let back: TaskSpec = serde_json::from_value(json).unwrap();
    assert_eq!(back.on_hang, spec.on_hang);
}

#[test]
fn on_hang_mistakes_are_located() {
    let rendered = rejected("run: train\non_hang: {after: 10m, then: explode}\n");
    assert_located(&rendered, 2, 29, "fail, retry");
    let rendered = rejected("run: train\non_hang: {then: retry}\n");
    assert!(rendered.contains("after"), "{rendered}");
    let rendered = rejected("run: train\non_hang: {after: soon}\n");
    assert_located(&rendered, 2, 18, "");
}

#[test]
fn a_share_of_one_gpu_is_read_in_hundredths_and_other_fractions_are_refused_where_written() {
    let half = parse("run: x\nresources:\n  gpus: 0.5\n").unwrap();
    assert_eq!(half.resources.gpus.hundredths(), 50);
    assert_eq!(half.resources.gpu_share_percent(), Some(50));
    // A share holds no whole GPU; the scheduler packs shares on their own.
    assert_eq!(half.resources.per_node().gpus, 0);
    let json = serde_json::to_string(&half).unwrap();
    assert!(json.contains("\"gpus\":0.5"), "{json}");
    assert_eq!(serde_json::from_str::<TaskSpec>(&json).unwrap(), half);

    let whole = parse("run: x\nresources:\n  gpus: 2\n").unwrap();
    assert_eq!(whole.resources.gpu_share_percent(), None);
    assert_eq!(whole.resources.per_node().gpus, 2);
    assert!(
        serde_json::to_string(&whole)
            .unwrap()
            .contains("\"gpus\":2")
    );

    let above_one = rejected("run: x\nresources:\n  gpus: 1.5\n");
    assert!(
        above_one.contains("more than one GPU but not a whole number"),
        "{above_one}"
    );
    assert_located(&above_one, 3, 9, "whole GPUs (e.g. `gpus: 2`)");

    let too_fine = rejected("run: x\nresources:\n  gpus: 0.333\n");
    assert!(
        too_fine.contains("finer than a hundredth of a GPU"),
        "{too_fine}"
    );
    assert_located(&too_fine, 3, 9, "hundredths of a GPU");

    let negative = rejected("run: x\nresources:\n  gpus: -0.5\n");
    assert_located(&negative, 3, 9, "`gpus: 0.5`");
}
