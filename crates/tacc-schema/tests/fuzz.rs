//! Fuzzing of the task-file parser (`parse_task`) and the legacy `tuxiv.conf` translator
//! (through `load_task`), bounded so it runs in every CI build.
//!
//! Inputs are arbitrary bytes, YAML-flavoured noise, generated YAML trees over the real
//! field names, and valid files mutated line by line with hostile values (`1e999GiB`,
//! `-0s`, numbers past `u64`, anchors and aliases, very long strings). For every input:
//! nothing panics, the answer comes back quickly, an accepted file gives a spec that
//! passes `TaskSpec::validate` and survives a JSON round trip, and every error (and every
//! legacy warning) points at a line and column that exist in the text.
//!
//! Cases are generated from a pinned seed, so CI replays the same ones each run;
//! `PROPTEST_RNG_SEED=N` and `PROPTEST_CASES=N` explore more locally. A failure found is
//! recorded in `fuzz.proptest-regressions` (commit it) and replayed first on every run, and
//! each bug found this way also gets a named test at the end of this file.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, RngSeed};
use tacc_schema::{LEGACY_FILE_NAME, SchemaError, TaskSpec, load_task, parse_task};

const PINNED_SEED: u64 = 0x7acc_f022;

fn pinned(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(PINNED_SEED),
        // Integration tests have no lib.rs or main.rs beside them, which the default
        // `SourceParallel` looks for: keep the regressions next to this file.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// The name errors are reported against in `parse_task`.
const TASK_FILE: &str = "fuzz/task.yaml";

/// How long one input may take, debug build included. Real inputs take well under a
/// millisecond; this is far above that so a loaded CI machine does not flake, and far below
/// what a blow-up (an alias bomb, quadratic scanning of a long line) would cost.
const TIME_BOUND: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------
// What must hold for every input
// ---------------------------------------------------------------------------------------

/// The lines of `text` as YAML counts them: broken at `\r\n`, `\n` or a lone `\r`. A
/// text ending in a line break has an empty last line, where the end of input sits.
fn yaml_lines(text: &str) -> Vec<&str> {
    text.split('\n')
        .flat_map(|line| line.strip_suffix('\r').unwrap_or(line).split('\r'))
        .collect()
}

/// `line:column` (1-based, columns in characters) names a place in `text`: a character of
/// a line, or the end of that line.
fn check_position(text: &str, line: usize, column: usize, what: &str) -> Result<(), TestCaseError> {
    let lines = yaml_lines(text);
    prop_assert!(
        (1..=lines.len()).contains(&line),
        "{what}: line {line} is outside the text's {} line(s)",
        lines.len()
    );
    let width = lines[line - 1].chars().count();
    prop_assert!(
        (1..=width + 1).contains(&column),
        "{what}: column {column} is outside line {line}, which has {width} character(s)"
    );
    Ok(())
}

/// An error about a file is located inside that file's text, and renders.
fn check_error(error: &SchemaError, file: &str, text: &str) -> Result<(), TestCaseError> {
    let rendered = error.to_string();
    let Some(diagnostic) = error.diagnostic() else {
        return Err(TestCaseError::fail(format!(
            "an error about a file must be located: {rendered}"
        )));
    };
    prop_assert_eq!(&diagnostic.file, file);
    check_position(text, diagnostic.line, diagnostic.column, &rendered)?;
    let line = yaml_lines(text)[diagnostic.line - 1];
    prop_assert_eq!(
        diagnostic.source_line.as_str(),
        line,
        "the quoted line is not line {} of the text: {}",
        diagnostic.line,
        rendered
    );
    prop_assert!(diagnostic.underline >= 1, "{}", rendered);
    prop_assert!(!diagnostic.message.is_empty(), "{}", rendered);
    Ok(())
}

/// A spec that was accepted is valid on its own and survives the JSON the server receives.
fn check_accepted(spec: &TaskSpec) -> Result<(), TestCaseError> {
    if let Err(error) = spec.validate() {
        return Err(TestCaseError::fail(format!(
            "accepted a spec that does not validate: {error}\n{spec:#?}"
        )));
    }
    let json = serde_json::to_string(spec).expect("a spec serialises");
    let back: TaskSpec = serde_json::from_str(&json)
        .map_err(|e| TestCaseError::fail(format!("{e} reading back {json}")))?;
    prop_assert_eq!(&back, spec);
    Ok(())
}

fn check_task_text(text: &str) -> Result<(), TestCaseError> {
    let started = Instant::now();
    let result = parse_task(TASK_FILE, text);
    let elapsed = started.elapsed();
    prop_assert!(
        elapsed < TIME_BOUND,
        "parsing {} bytes took {elapsed:?}",
        text.len()
    );
    match result {
        Ok((spec, _spans)) => check_accepted(&spec),
        Err(error) => check_error(&error, TASK_FILE, text),
    }
}

/// A project directory holding only a `tuxiv.conf`, rewritten for each input.
struct LegacyProject {
    dir: tempfile::TempDir,
}

impl LegacyProject {
    fn new() -> Self {
        LegacyProject {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join(LEGACY_FILE_NAME)
    }

    fn check(&self, text: &str) -> Result<(), TestCaseError> {
        fs::write(self.file(), text).expect("write tuxiv.conf");
        check_legacy_file(self.dir.path(), &self.file(), text)
    }
}

fn check_legacy_file(dir: &Path, file: &Path, text: &str) -> Result<(), TestCaseError> {
    let started = Instant::now();
    let result = load_task(dir);
    let elapsed = started.elapsed();
    prop_assert!(
        elapsed < TIME_BOUND,
        "translating {} bytes took {elapsed:?}",
        text.len()
    );
    let file = file.display().to_string();
    match result {
        Ok(loaded) => {
            check_accepted(&loaded.spec)?;
            // Warnings read `FILE:LINE:COL: message` and point into the file too.
            for warning in &loaded.warnings {
                let Some(rest) = warning.strip_prefix(&format!("{file}:")) else {
                    return Err(TestCaseError::fail(format!(
                        "a warning that names no place in {file}: {warning}"
                    )));
                };
                let mut parts = rest.splitn(3, ':');
                let line = parts.next().and_then(|n| n.parse().ok());
                let column = parts.next().and_then(|n| n.parse().ok());
                let (Some(line), Some(column)) = (line, column) else {
                    return Err(TestCaseError::fail(format!(
                        "a warning without `line:column`: {warning}"
                    )));
                };
                check_position(text, line, column, warning)?;
            }
            Ok(())
        }
        Err(error) => check_error(&error, &file, text),
    }
}

// ---------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------

/// Values chosen to hit the edges of every scalar the schema reads: counts, numbers,
/// sizes, durations, flags, signals, names and paths, plus YAML syntax that must be
/// refused (anchors, aliases, tags) and text that is merely odd.
const HOSTILE_SCALARS: &[&str] = &[
    "1e999GiB",
    "1e308GiB",
    "1e-999GiB",
    "-0s",
    "-0",
    "-1",
    "0",
    "0s",
    "0B",
    "18446744073709551615",
    "18446744073709551616",
    "18446744073709551615s",
    "18446744073709551615d",
    "213503982334601d",
    "99999999999999999999999999999999",
    "4294967295",
    "4294967296",
    "-4294967296",
    "1.5.5GiB",
    "..GiB",
    ".",
    "GiB",
    "1 GiB",
    "16EiB",
    "9007199254740993",
    "1.7976931348623157e309",
    "1e-320",
    ".inf",
    "-.inf",
    ".nan",
    "NaN",
    "inf",
    "infinity",
    "0x10",
    "0o17",
    "1_000",
    "_",
    "1__0",
    "١٢٣",
    "１２",
    "4h30",
    "1h-30m",
    "5 d 3 h",
    "1hour2",
    "99999999999999999999s",
    "",
    "~",
    "null",
    "Null",
    "true",
    "FALSE",
    "yes",
    "\"quoted\"",
    "'single'",
    "\"\"",
    "\"unterminated",
    "'also",
    "\"\\u0000\"",
    "\"\\x1b[2J\\x1b]0;title\\x07\"",
    "[a, b",
    "{a: 1",
    "[]",
    "{}",
    "[[[[[[[[]]]]]]]]",
    "*alias",
    "&anchor value",
    "&a [*a]",
    "!tag value",
    "!!str 5",
    "!!binary aGVsbG8=",
    "|",
    ">-",
    "|+9",
    "- item",
    "? complex",
    "%YAML 1.2",
    "@reserved",
    "`reserved",
    "a: b: c",
    "a:b",
    "key: value # comment",
    "#",
    "---",
    "...",
    "\t",
    "\u{feff}bom",
    "\u{202e}txet",
    "\u{1F600}",
    "\u{1b}[31mred",
    "\u{7f}",
    "\u{85}next-line",
    "\u{2028}separator",
    "SIGKILL",
    "sigusr1",
    "SIG",
    "usr1",
    "../..",
    "/etc/passwd",
    "a/../../b",
    "C:\\windows",
    "python:3.11",
    "low",
    "HIGH",
    "auto",
    "node_failure",
];

fn hostile_scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(HOSTILE_SCALARS).prop_map(str::to_string),
        2 => "[a-zA-Z0-9_.:/ -]{0,24}",
        1 => any::<String>(),
        // Up to 4096 repetitions: long enough to matter, short enough to keep cases fast
        // (the megabyte inputs are fixed tests below).
        1 => (1usize..=6, prop::sample::select(&["a", "9", "ä", " ", "\u{1F600}", "\\\""][..]))
            .prop_map(|(power, piece)| piece.repeat(1 << (power * 2))),
        1 => (any::<u64>(), prop::sample::select(&["", "s", "m", "h", "d", "GiB", "MB", "K"][..]))
            .prop_map(|(n, unit)| format!("{n}{unit}")),
        1 => (any::<f64>(), prop::sample::select(&["", "GiB", "TB", "m"][..]))
            .prop_map(|(n, unit)| format!("{n}{unit}")),
    ]
}

/// Keys that are not the task file's own: the legacy and Slurm names it suggests
/// aliases for, near misses, and hostile spellings.
const OTHER_KEYS: &[&str] = &[
    "entrypoint",
    "job",
    "general",
    "env",
    "module",
    "url",
    "path",
    "walltime",
    "memroy",
    "NAME",
    "",
    "\"quoted key\"",
    "? [a]",
    "<<",
    "&k name",
    "*k",
];

/// Every key of every section, read from the task file's JSON Schema (so a field added
/// to the spec is fuzzed without touching this file), and [`OTHER_KEYS`].
fn known_keys() -> Vec<String> {
    fn walk(value: &serde_json::Value, keys: &mut std::collections::BTreeSet<String>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::Object(properties)) = map.get("properties") {
                    keys.extend(properties.keys().cloned());
                }
                map.values().for_each(|v| walk(v, keys));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, keys)),
            _ => {}
        }
    }
    let mut keys = std::collections::BTreeSet::new();
    walk(&tacc_schema::json_schema(), &mut keys);
    assert!(
        keys.contains("secrets") && keys.contains("time_limit"),
        "{keys:?}"
    );
    keys.extend(OTHER_KEYS.iter().map(|k| k.to_string()));
    keys.into_iter().collect()
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(known_keys()),
        1 => "[a-zA-Z_][a-zA-Z0-9_.-]{0,12}",
        1 => hostile_scalar(),
    ]
}

/// A YAML document as a tree, rendered to text in block or flow style.
#[derive(Debug, Clone)]
enum Yaml {
    Scalar(String),
    List(Vec<Yaml>),
    Map(Vec<(String, Yaml)>),
}

fn yaml_tree() -> impl Strategy<Value = Yaml> {
    hostile_scalar()
        .prop_map(Yaml::Scalar)
        .prop_recursive(6, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Yaml::List),
                prop::collection::vec((key(), inner), 0..6).prop_map(Yaml::Map),
            ]
        })
}

/// Block style down to `block_depth` levels, flow style below.
fn render(top: &[(String, Yaml)], block_depth: usize) -> String {
    let mut out = String::new();
    render_map_block(top, 0, block_depth, &mut out);
    out
}

fn render_map_block(map: &[(String, Yaml)], indent: usize, block_depth: usize, out: &mut String) {
    for (key, value) in map {
        write!(out, "{:indent$}{key}:", "").unwrap();
        render_block_value(value, indent, block_depth, out);
    }
}

fn render_block_value(value: &Yaml, indent: usize, block_depth: usize, out: &mut String) {
    match value {
        Yaml::List(items) if block_depth > 0 && !items.is_empty() => {
            out.push('\n');
            for item in items {
                write!(out, "{:width$}-", "", width = indent + 2).unwrap();
                render_block_value(item, indent + 2, block_depth - 1, out);
            }
        }
        Yaml::Map(map) if block_depth > 0 && !map.is_empty() => {
            out.push('\n');
            render_map_block(map, indent + 2, block_depth - 1, out);
        }
        other => {
            out.push(' ');
            render_flow(other, out);
            out.push('\n');
        }
    }
}

fn render_flow(value: &Yaml, out: &mut String) {
    match value {
        Yaml::Scalar(text) => out.push_str(text),
        Yaml::List(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                render_flow(item, out);
            }
            out.push(']');
        }
        Yaml::Map(map) => {
            out.push('{');
            for (index, (key, value)) in map.iter().enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                out.push_str(key);
                out.push_str(": ");
                render_flow(value, out);
            }
            out.push('}');
        }
    }
}

/// Values for one kind of field: ones the schema accepts, and ones at or past its edges.
type Values = (&'static [&'static str], &'static [&'static str]);

fn value(values: Values) -> BoxedStrategy<Yaml> {
    let (valid, edge) = values;
    prop_oneof![
        30 => prop::sample::select(valid).prop_map(|v| Yaml::Scalar(v.to_string())),
        5 => prop::sample::select(edge).prop_map(|v| Yaml::Scalar(v.to_string())),
        1 => hostile_scalar().prop_map(Yaml::Scalar),
        1 => yaml_tree(),
    ]
    .boxed()
}

/// A field whose value is mostly valid for it (so the checks behind the parser are
/// reached), sometimes at its edges, sometimes hostile or a subtree of the wrong shape.
fn field(name: &'static str, values: Values) -> BoxedStrategy<(String, Yaml)> {
    value(values)
        .prop_map(move |value| (name.to_string(), value))
        .boxed()
}

fn list_field(name: &'static str, values: Values) -> BoxedStrategy<(String, Yaml)> {
    prop_oneof![
        20 => prop::collection::vec(value(values), 0..4).prop_map(Yaml::List),
        1 => value(values),
    ]
    .prop_map(move |value| (name.to_string(), value))
    .boxed()
}

fn nested(
    name: &'static str,
    value: impl Strategy<Value = Yaml> + 'static,
) -> BoxedStrategy<(String, Yaml)> {
    value
        .prop_map(move |value| (name.to_string(), value))
        .boxed()
}

/// A mapping holding each optional field or not and every required one, in a random
/// order, now and then with a stray key.
fn section(
    required: Vec<BoxedStrategy<(String, Yaml)>>,
    optional: Vec<BoxedStrategy<(String, Yaml)>>,
) -> BoxedStrategy<Yaml> {
    let optional: Vec<_> = optional
        .into_iter()
        .map(|field| prop::option::weighted(0.5, field))
        .collect();
    (
        required,
        optional,
        prop::option::weighted(0.03, (key(), hostile_scalar())),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(required, optional, stray, rotation)| {
            let mut map: Vec<(String, Yaml)> = required
                .into_iter()
                .chain(optional.into_iter().flatten())
                .collect();
            if !map.is_empty() {
                let by = rotation.index(map.len());
                map.rotate_left(by);
            }
            map.extend(stray.map(|(k, v)| (k, Yaml::Scalar(v))));
            Yaml::Map(map)
        })
        .boxed()
}

const COUNTS: Values = (
    &["1", "2", "4", "8"],
    &["0", "64", "65", "1_0", "4294967295", "-0"],
);
const CPUS: Values = (
    &["0.5", "16", "1", "0.001", "1e2"],
    &["0.0004", "256", "257", "-1", ".5", "0"],
);
const SIZES: Values = (
    &["64GiB", "512MiB", "1.5G", "1MiB", "2TB"],
    &["1023KiB", "1048576", "0.5", "1e999GiB", "16TiB", "0B"],
);
const DURATIONS: Values = (
    &["4h", "1h30m", "90s", "2d", "30 min"],
    &["0s", "-0s", "213503982334601d", "1y"],
);
const NAMES: Values = (
    &["mnist", "a", "x.y_z-1", "1"],
    &["-bad", "a b", "\"\"", "ä"],
);
const COMMANDS: Values = (
    &["python train.py", "echo hi", "set -e; make"],
    &["\"\"", "\"|\"", "\"\\t\""],
);
const PATHS: Values = (
    &["data/", ".", "sub/dir", "\"*.ckpt\""],
    &["../up", "/abs", "a/../../b", "\"\""],
);

/// A task file shaped like a real one: known sections holding known fields.
fn task_document() -> impl Strategy<Value = Vec<(String, Yaml)>> {
    let resources = section(
        vec![],
        vec![
            field("nodes", COUNTS),
            field("gpus", COUNTS),
            field("gpu_type", (&["A100", "H100"], &["\"\"", "\" \""])),
            field("cpus", CPUS),
            field("memory", SIZES),
            field("time_limit", DURATIONS),
        ],
    );
    let code = section(
        vec![],
        vec![field("dir", PATHS), list_field("exclude", PATHS)],
    );
    let conda = section(
        vec![],
        vec![
            field("name", NAMES),
            list_field("channels", (&["conda-forge", "pytorch"], &["\"\""])),
            list_field("dependencies", (&["python=3.11", "pytorch"], &["\"\""])),
        ],
    );
    let vars = prop::collection::btree_map(
        prop::sample::select(&["OMP_NUM_THREADS", "A", "PATH", "lower"][..]),
        value((&["\"4\"", "x"], &["\"\"", "~", "[a]"])),
        0..4,
    )
    .prop_map(|vars| Yaml::Map(vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect()));
    let environment = section(
        vec![],
        vec![
            field("python", (&["\"3.11\"", "3.11"], &["3", "\"\""])),
            list_field("pip", (&["numpy==2.1.*", "torch"], &["\"\""])),
            field(
                "requirements",
                (&["requirements.txt"], &["\"\"", "../r.txt"]),
            ),
            field("image", (&["python:3.11", "ubuntu"], &["\"\""])),
            nested("conda", conda),
            nested("vars", vars),
        ],
    );
    let dataset = section(
        vec![
            field("name", NAMES),
            field(
                "source",
                (&["/shared/mnist", "s3://bucket/x"], &["\"\"", "relative"]),
            ),
        ],
        vec![field("mount", PATHS)],
    );
    let retry = section(
        vec![],
        vec![
            field("max_attempts", COUNTS),
            list_field(
                "on",
                (&["node_failure", "preempted", "failed", "lost"], &["oom"]),
            ),
        ],
    );
    let checkpoint = section(
        vec![],
        vec![
            field(
                "signal",
                (&["SIGUSR1", "SIGTERM", "usr2"], &["SIGKILL", "sig"]),
            ),
            field("grace", DURATIONS),
        ],
    );
    let top = section(
        vec![field("run", COMMANDS)],
        vec![
            field("name", NAMES),
            nested("resources", resources),
            field("priority", (&["low", "normal", "high"], &["urgent", "Low"])),
            field("preemptible", (&["true", "false"], &["yes", "1"])),
            nested("code", code),
            nested("environment", environment),
            nested(
                "datasets",
                prop::collection::vec(dataset, 0..3).prop_map(Yaml::List),
            ),
            field("setup", COMMANDS),
            list_field("outputs", PATHS),
            nested("retry", retry),
            nested("checkpoint", checkpoint),
            field(
                "runtime",
                (&["auto", "process", "container", "slurm"], &["k8s"]),
            ),
        ],
    );
    top.prop_map(|top| match top {
        Yaml::Map(map) => map,
        _ => unreachable!("a section is a mapping"),
    })
}

/// Text made mostly of the characters that mean something to YAML.
fn yaml_noise() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => prop::sample::select(
            &[
                ":", ": ", "-", "- ", " ", "  ", "\n", "\r\n", "\r", "\t", "[", "]", "{", "}",
                ",", "&", "*", "!", "|", ">", "'", "\"", "#", "%", "@", "`", "?", ".", "---",
                "...", "\\", "0", "1", "e", "name", "run", "resources", "gpus", "a",
            ][..]
        )
        .prop_map(str::to_string),
        1 => any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..160).prop_map(|pieces| pieces.concat())
}

/// Valid task files the mutations start from.
const VALID_TASKS: &[&str] = &[
    "name: t\nrun: echo hi\n",
    r#"name: mnist-ddp
resources:
  nodes: 2
  gpus: 4
  gpu_type: A100
  cpus: 16
  memory: 64GiB
  time_limit: 4h
priority: normal
preemptible: true
code: { dir: ., exclude: ["data/", "*.ckpt"] }
environment:
  python: "3.11"
  pip: ["numpy==2.1.*"]
  vars: { OMP_NUM_THREADS: "4" }
datasets:
  - { name: mnist, source: /shared/datasets/mnist, mount: data/mnist }
setup: pip list
run: |
  torchrun --nnodes "$TACC_NUM_NODES" train.py
outputs: [checkpoints/, results/]
retry: { max_attempts: 3, on: [node_failure, preempted] }
checkpoint: { signal: SIGUSR1, grace: 60s }
runtime: auto
"#,
    r#"# comment
name: conda-task
environment:
  conda:
    name: torch
    channels:
      - conda-forge
    dependencies:
      - python=3.11
      - pytorch
datasets:
  - name: imagenet
    source: /shared/imagenet
resources:
  memory: 1.5G
  cpus: 0.5
run: >-
  python -c 'print(1)'
"#,
];

/// Valid `tuxiv.conf` files the mutations start from.
const VALID_LEGACY: &[&str] = &[
    "entrypoint: python hello.py\n",
    r#"entrypoint:
    - python ${TACC_WORKDIR}/mnist.py
    - --epoch=3
environment:
    name: torch-env
    dependencies:
        - pytorch=1.6.0
        - pip:
            - wandb
            - tqdm==4.66.1
    channels: pytorch
job:
    name: test
    general:
        - nodes=2
        - ntasks-per-node=1
        - cpus-per-task=4
        - gres=gpu:v100:2
        - mem=16G
        - time=2-00:00:00
        - partition=x
    env:
        - OMP_NUM_THREADS=4
datasets:
    - imagenet
    - { name: mnist, url: /shared/mnist, mount: data/mnist }
notes: hello
"#,
];

/// One edit of a text's lines; indices wrap around the number of lines.
#[derive(Debug, Clone)]
enum Mutation {
    /// Replace what follows the first `: ` or `- ` on a line.
    ReplaceValue(usize, String),
    InsertLine(usize, usize, String, String),
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    Reindent(usize, usize),
    InsertText(usize, String),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => (any::<usize>(), hostile_scalar()).prop_map(|(at, v)| Mutation::ReplaceValue(at, v)),
        3 => (any::<usize>(), 0usize..10, key(), hostile_scalar())
            .prop_map(|(at, indent, k, v)| Mutation::InsertLine(at, indent, k, v)),
        1 => any::<usize>().prop_map(Mutation::DeleteLine),
        1 => any::<usize>().prop_map(Mutation::DuplicateLine),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        1 => (any::<usize>(), 0usize..12).prop_map(|(at, indent)| Mutation::Reindent(at, indent)),
        1 => (any::<usize>(), yaml_noise()).prop_map(|(at, text)| Mutation::InsertText(at, text)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(text: &str, mutations: &[Mutation]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for mutation in mutations {
        if lines.is_empty() {
            lines.push(String::new());
        }
        let count = lines.len();
        let at = |index: &usize| index % count;
        match mutation {
            Mutation::ReplaceValue(index, value) => {
                let line = &mut lines[at(index)];
                let cut = line
                    .find(": ")
                    .map(|i| i + 2)
                    .or_else(|| line.find("- ").map(|i| i + 2))
                    .unwrap_or(line.len());
                line.replace_range(cut.., value);
            }
            Mutation::InsertLine(index, indent, key, value) => {
                let index = at(index);
                lines.insert(index, format!("{:indent$}{key}: {value}", ""));
            }
            Mutation::DeleteLine(index) => {
                let index = at(index);
                lines.remove(index);
            }
            Mutation::DuplicateLine(index) => {
                let index = at(index);
                let copy = lines[index].clone();
                lines.insert(index, copy);
            }
            Mutation::SwapLines(a, b) => {
                let (a, b) = (at(a), at(b));
                lines.swap(a, b);
            }
            Mutation::Reindent(index, indent) => {
                let line = &mut lines[at(index)];
                *line = format!("{:indent$}{}", "", line.trim_start());
            }
            Mutation::InsertText(index, text) => {
                let line = &mut lines[at(index)];
                let mut cut = index % (line.len() + 1);
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                line.insert_str(cut, text);
            }
            Mutation::Truncate(index) => {
                let keep = at(index);
                lines.truncate(keep + 1);
            }
        }
    }
    let mut joined = lines.join("\n");
    joined.push('\n');
    joined
}

/// A Slurm option as `tuxiv.conf` writes them under `job.general`, with numbers at the
/// edges of what the translator parses.
fn slurm_option() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        prop::sample::select(
            &[
                "0",
                "1",
                "2",
                "60",
                "4294967295",
                "4294967296",
                "18446744073709551615",
                "307445734561825861",
                "5124095576030432",
                "213503982334602",
                "99999999999999999999",
                "-1",
                "",
                "x",
                "1.5",
                "inf",
                "NaN",
            ][..]
        )
        .prop_map(str::to_string),
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..100_000).prop_map(|n| n.to_string()),
    ];
    let time = prop_oneof![
        number.clone(),
        (number.clone(), number.clone()).prop_map(|(a, b)| format!("{a}:{b}")),
        (number.clone(), number.clone(), number.clone())
            .prop_map(|(a, b, c)| format!("{a}:{b}:{c}")),
        (number.clone(), number.clone()).prop_map(|(d, h)| format!("{d}-{h}")),
        (
            number.clone(),
            number.clone(),
            number.clone(),
            number.clone()
        )
            .prop_map(|(d, h, m, s)| format!("{d}-{h}:{m}:{s}")),
        Just("UNLIMITED".to_string()),
    ];
    let name = prop::sample::select(
        &[
            "nodes",
            "--nodes",
            "-N",
            "ntasks",
            "ntasks-per-node",
            "cpus-per-task",
            "-c",
            "gres",
            "gpus",
            "gpus-per-node",
            "-G",
            "mem",
            "time",
            "--time",
            "-t",
            "job-name",
            "-J",
            "output",
            "partition",
            "-p",
            "exclusive",
            "-x",
        ][..],
    );
    let separator = prop::sample::select(&["=", " ", "", "=="][..]);
    let value = prop_oneof![
        time,
        (
            number.clone(),
            prop::sample::select(&["", "K", "M", "G", "T", "GB", "Q"][..])
        )
            .prop_map(|(n, unit)| format!("{n}{unit}")),
        (number.clone(), number.clone()).prop_map(|(a, b)| format!("{a}-{b}")),
        number.clone().prop_map(|n| format!("gpu:{n}")),
        (hostile_scalar(), number).prop_map(|(t, n)| format!("gpu:{t}:{n}")),
        hostile_scalar(),
    ];
    (name, separator, value)
        .prop_map(|(name, separator, value)| format!("{name}{separator}{value}"))
}

/// A `tuxiv.conf` built from its real sections, with hostile contents.
fn legacy_file() -> impl Strategy<Value = String> {
    let entrypoint = prop_oneof![
        hostile_scalar().prop_map(|s| format!("entrypoint: {s}\n")),
        prop::collection::vec(hostile_scalar(), 0..4).prop_map(|words| {
            let mut out = "entrypoint:\n".to_string();
            for word in words {
                writeln!(out, "  - {word}").unwrap();
            }
            out
        }),
        Just(String::new()),
    ];
    let job = (
        prop::option::of(hostile_scalar()),
        prop::collection::vec(slurm_option(), 0..6),
        prop::collection::vec((hostile_scalar(), hostile_scalar()), 0..3),
    )
        .prop_map(|(name, options, env)| {
            let mut out = "job:\n".to_string();
            if let Some(name) = name {
                writeln!(out, "  name: {name}").unwrap();
            }
            out.push_str("  general:\n");
            for option in options {
                writeln!(out, "    - {option}").unwrap();
            }
            if !env.is_empty() {
                out.push_str("  env:\n");
                for (name, value) in env {
                    writeln!(out, "    - {name}={value}").unwrap();
                }
            }
            out
        });
    let environment = (
        prop::option::of(hostile_scalar()),
        prop::collection::vec(hostile_scalar(), 0..3),
        prop::collection::vec(hostile_scalar(), 0..3),
    )
        .prop_map(|(name, conda, pip)| {
            let mut out = "environment:\n".to_string();
            if let Some(name) = name {
                writeln!(out, "  name: {name}").unwrap();
            }
            out.push_str("  dependencies:\n");
            for package in conda {
                writeln!(out, "    - {package}").unwrap();
            }
            out.push_str("    - pip:\n");
            for package in pip {
                writeln!(out, "      - {package}").unwrap();
            }
            out
        });
    let datasets = prop::collection::vec(
        prop_oneof![
            hostile_scalar().prop_map(|s| format!("  - {s}\n")),
            (hostile_scalar(), hostile_scalar(), hostile_scalar()).prop_map(
                |(name, url, mount)| {
                    format!("  - {{ name: {name}, url: {url}, mount: {mount} }}\n")
                }
            ),
        ],
        0..3,
    )
    .prop_map(|items| format!("datasets:\n{}", items.concat()));
    (
        entrypoint,
        prop::option::of(job),
        prop::option::of(environment),
        prop::option::of(datasets),
    )
        .prop_map(|(entrypoint, job, environment, datasets)| {
            [Some(entrypoint), job, environment, datasets]
                .into_iter()
                .flatten()
                .collect()
        })
}

// ---------------------------------------------------------------------------------------
// The fuzz runs
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(pinned(1024))]

    #[test]
    fn task_parser_survives_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_task_text(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn task_parser_survives_arbitrary_unicode(text in any::<String>()) {
        check_task_text(&text)?;
    }

    #[test]
    fn task_parser_survives_yaml_noise(text in yaml_noise()) {
        check_task_text(&text)?;
    }

    #[test]
    fn task_parser_survives_generated_documents(
        top in prop::collection::vec((key(), yaml_tree()), 0..8),
        block_depth in 0usize..6,
    ) {
        check_task_text(&render(&top, block_depth))?;
    }

    #[test]
    fn task_parser_survives_task_shaped_documents(
        top in task_document(),
        block_depth in 0usize..4,
    ) {
        check_task_text(&render(&top, block_depth))?;
    }

    #[test]
    fn task_parser_survives_mutated_task_files(
        base in prop::sample::select(VALID_TASKS),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        check_task_text(&apply(base, &mutations))?;
    }
}

proptest! {
    // Each case writes a file and canonicalises a directory: fewer cases, same coverage
    // per case as above.
    #![proptest_config(pinned(512))]

    #[test]
    fn legacy_translator_survives_generated_files(text in legacy_file()) {
        LegacyProject::new().check(&text)?;
    }

    #[test]
    fn legacy_translator_survives_mutated_files(
        base in prop::sample::select(VALID_LEGACY),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        LegacyProject::new().check(&apply(base, &mutations))?;
    }

    #[test]
    fn legacy_translator_survives_yaml_noise(text in yaml_noise()) {
        LegacyProject::new().check(&text)?;
    }
}

// ---------------------------------------------------------------------------------------
// Fixed inputs: the starting points are valid, and the classic blow-ups stay small
// ---------------------------------------------------------------------------------------

fn assert_task_holds(text: &str) {
    if let Err(failure) = check_task_text(text) {
        panic!("{failure}");
    }
}

#[test]
fn the_mutation_starting_points_are_valid() {
    for text in VALID_TASKS {
        if let Err(error) = parse_task(TASK_FILE, text) {
            panic!("{error}\n{text}");
        }
    }
    for text in VALID_LEGACY {
        let project = LegacyProject::new();
        fs::write(project.file(), text).unwrap();
        if let Err(error) = load_task(project.dir.path()) {
            panic!("{error}\n{text}");
        }
    }
}

/// The "billion laughs" alias bomb: nine levels of ten aliases each would expand to 10^9
/// strings. Anchors are refused at the first one, before anything is expanded.
#[test]
fn an_alias_bomb_is_refused_at_its_first_anchor() {
    let mut text = String::from("name: lol\nrun: echo\nvars: &l0 [\"lol\"]\n");
    for level in 1..=9 {
        let previous = format!("*l{}", level - 1);
        let aliases = vec![previous; 10].join(", ");
        writeln!(text, "l{level}: &l{level} [{aliases}]").unwrap();
    }
    let started = Instant::now();
    let error = parse_task(TASK_FILE, &text).expect_err("anchors are not accepted");
    assert!(started.elapsed() < TIME_BOUND);
    assert!(error.to_string().contains("anchors"), "{error}");
    assert_eq!(error.diagnostic().unwrap().line, 3, "{error}");
    assert_task_holds(&text);
}

#[test]
fn deep_nesting_is_refused_quickly() {
    for depth in [100, 300, 10_000, 100_000] {
        assert_task_holds(&format!("run: {}", "[".repeat(depth)));
        assert_task_holds(&format!(
            "run: {}{}\n",
            "[".repeat(depth),
            "]".repeat(depth)
        ));
        assert_task_holds(&format!("run: {}", "{a: ".repeat(depth)));
        assert_task_holds(&"- ".repeat(depth));
    }
    let mut block = String::new();
    for level in 0..2_000 {
        writeln!(block, "{:level$}k{level}:", "").unwrap();
    }
    assert_task_holds(&block);
}

#[test]
fn huge_inputs_stay_within_bounds() {
    let long = "x".repeat(1 << 18);
    assert_task_holds(&format!("name: t\nrun: {long}\n"));
    assert_task_holds(&format!("name: {long}\nrun: echo\n"));
    assert_task_holds(&format!("{long}: 1\n"));
    assert_task_holds(&format!("name: t\nrun: \"{long}\n"));
    let many_keys: String = (0..10_000).map(|i| format!("  V{i}: \"{i}\"\n")).collect();
    assert_task_holds(&format!(
        "name: t\nrun: echo\nenvironment:\n  vars:\n{many_keys}"
    ));
    let many_items = "- a\n".repeat(20_000);
    assert_task_holds(&format!("name: t\nrun: echo\noutputs:\n{many_items}"));
}

#[test]
fn numbers_past_every_range_are_refused_with_a_location() {
    for (field, value) in [
        ("memory", "1e999GiB"),
        ("memory", "18446744073709551616"),
        ("memory", "-0"),
        ("time_limit", "-0s"),
        ("time_limit", "18446744073709551615d"),
        ("time_limit", "99999999999999999999s"),
        ("gpus", "4294967296"),
        ("gpus", "99999999999999999999999"),
        ("nodes", "-0"),
        ("cpus", ".nan"),
        ("cpus", "1e999"),
    ] {
        let text = format!("name: t\nrun: echo\nresources:\n  {field}: {value}\n");
        let error = parse_task(TASK_FILE, &text).expect_err(&text);
        let diagnostic = error.diagnostic().expect("located");
        assert_eq!(
            (diagnostic.line, diagnostic.column),
            (4, field.len() + 5),
            "{error}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Bugs the fuzzing found, kept as named regressions
// ---------------------------------------------------------------------------------------

/// The YAML scanner breaks lines at a lone `\r`, but the span table and the second-document
/// check split with `str::lines`, which does not: errors quoted the wrong line (or none),
/// and a `---` after a `\r` started a second document that was silently dropped.
#[test]
fn a_lone_carriage_return_breaks_lines_as_the_parser_does() {
    let text = "name: a\rrun: echo\r---\rrun: rm -rf ~\r";
    let error = parse_task(TASK_FILE, text).expect_err("a second document is refused");
    let diagnostic = error.diagnostic().expect("located");
    assert_eq!((diagnostic.line, diagnostic.column), (3, 1), "{error}");
    assert_eq!(diagnostic.source_line, "---", "{error}");

    let text = "name: a\rrun: echo\rresources:\r  gpus: lots\r";
    let error = parse_task(TASK_FILE, text).expect_err("not a number");
    let diagnostic = error.diagnostic().expect("located");
    assert_eq!((diagnostic.line, diagnostic.column), (4, 9), "{error}");
    assert_eq!(diagnostic.source_line, "  gpus: lots", "{error}");

    assert_task_holds("!\r-[: :");
}

/// At the end of a text without a final line break, the scanner reports the end of input
/// one line past the last: the error then quoted an empty line that is not in the file.
#[test]
fn an_error_at_the_end_of_input_points_at_the_end_of_the_last_line() {
    for (text, line, column) in [
        ("{", 1, 2),
        ("name: t\nrun: [echo", 2, 11),
        ("run: [\n", 1, 7),
        ("run: [\n\n", 2, 1),
    ] {
        let error = parse_task(TASK_FILE, text).expect_err(text);
        let diagnostic = error.diagnostic().expect("located");
        assert_eq!(
            (diagnostic.line, diagnostic.column),
            (line, column),
            "{error}"
        );
        assert_task_holds(text);
    }
}

/// `time=` in a `tuxiv.conf` multiplied days, hours and minutes unchecked: a large number
/// panicked with an overflow (and wrapped to a short time limit in release builds).
#[test]
fn a_slurm_time_past_u64_is_refused_not_overflowed() {
    for time in [
        "0-5124095576030432",
        "307445734561825861",
        "213503982334602-0",
        "1-0:0:18446744073709551615",
    ] {
        let project = LegacyProject::new();
        let text = format!("entrypoint: python a.py\njob:\n  general:\n    - time={time}\n");
        fs::write(project.file(), &text).unwrap();
        let error = load_task(project.dir.path()).expect_err(&text);
        let diagnostic = error.diagnostic().expect("located");
        assert_eq!((diagnostic.line, diagnostic.column), (4, 7), "{error}");
        if let Err(failure) = project.check(&text) {
            panic!("{failure}");
        }
    }
}

/// The YAML parser recurses once per level of block nesting: `- - - …` a few kilobytes
/// long overflowed the stack and aborted the process (`tcloud submit` on such a file).
#[test]
fn block_nesting_deep_enough_to_overflow_the_stack_is_refused() {
    let mut indented = String::from("run: echo\nenvironment:\n");
    for level in 1..2_000 {
        writeln!(indented, "{:level$}k{level}:", "").unwrap();
    }
    for text in [
        "- ".repeat(100_000),
        format!("name: t\nrun:\n  {}x\n", "- ".repeat(1_000)),
        indented,
    ] {
        let error = parse_task(TASK_FILE, &text).expect_err("too deep");
        assert!(error.to_string().contains("levels deep"), "{error}");
        assert_task_holds(&text);

        let project = LegacyProject::new();
        if let Err(failure) = project.check(&text) {
            panic!("{failure}");
        }
    }
    let error = parse_task(
        TASK_FILE,
        &format!("name: t\nrun:\n  {}x\n", "- ".repeat(40)),
    )
    .expect_err("too deep");
    let diagnostic = error.diagnostic().expect("located");
    assert_eq!(diagnostic.line, 3, "{error}");
}

/// A spec reaches the server as JSON, where sizes were written with `Display`, which rounds
/// to one decimal: `memory: 2TB` arrived as 1.8TiB (about 21 GB less), `100MB` as 95.4MiB.
#[test]
fn a_size_survives_the_json_round_trip_exactly() {
    for (memory, bytes) in [
        ("2TB", 2_000_000_000_000u64),
        ("100MB", 100_000_000),
        ("1.5G", 3 << 29),
    ] {
        let text = format!("name: t\nrun: echo\nresources:\n  memory: {memory}\n");
        let (spec, _) = parse_task(TASK_FILE, &text).expect("valid");
        assert_eq!(spec.resources.memory.as_bytes(), bytes);
        let json = serde_json::to_string(&spec).unwrap();
        let back: TaskSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back.resources.memory.as_bytes(), bytes, "{json}");
        assert_task_holds(&text);
    }
}
