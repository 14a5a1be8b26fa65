//! Loading tasks from disk: file lookup in a directory, `code_root`, located errors for later
//! layers, and the import of legacy `tuxiv.conf` files.

use std::fs;
use std::path::Path;

use tacc_core::{ByteSize, HumanDuration};
use tacc_schema::{DatasetSpec, SchemaError, load_task};

/// A project directory as the old TACC quick start laid it out.
const TUXIV_CONF: &str = r#"entrypoint:
    - python ${TACC_WORKDIR}/mnist.py
    - --epoch=3
environment:
    name: torch-env
    dependencies:
        - pytorch=1.6.0
        - torchvision=0.7.0
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
        - output=${TACC_SLURM_USERLOG}/output.log
datasets:
    - imagenet
notes: hello
"#;

fn write(dir: &Path, name: &str, text: &str) {
    fs::write(dir.join(name), text).unwrap();
}

#[test]
fn a_directory_prefers_task_yaml_and_says_what_it_ignored() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "task.yml", "run: from-yml\n");
    write(dir.path(), "tuxiv.conf", TUXIV_CONF);
    write(dir.path(), "task.yaml", "run: from-yaml\n");
    let loaded = load_task(dir.path()).unwrap();
    assert_eq!(loaded.spec.run, "from-yaml");
    assert_eq!(loaded.source, dir.path().join("task.yaml"));
    assert_eq!(loaded.warnings.len(), 2, "{:?}", loaded.warnings);
    assert!(loaded.warnings[0].contains("task.yml was ignored"));
    assert!(loaded.warnings[1].contains("tuxiv.conf was ignored"));

    fs::remove_file(dir.path().join("task.yaml")).unwrap();
    assert_eq!(load_task(dir.path()).unwrap().spec.run, "from-yml");
    fs::remove_file(dir.path().join("task.yml")).unwrap();
    write(dir.path(), "tacc.yaml", "run: from-tacc\n");
    assert_eq!(load_task(dir.path()).unwrap().spec.run, "from-tacc");
}

#[test]
fn a_directory_without_a_task_file_lists_what_was_looked_for() {
    let dir = tempfile::tempdir().unwrap();
    let error = load_task(dir.path()).unwrap_err();
    assert!(matches!(error, SchemaError::TaskFileNotFound { .. }));
    let rendered = error.to_string();
    assert!(
        rendered.contains("`task.yaml`, `task.yml`, `tacc.yaml`, `tuxiv.conf`"),
        "{rendered}"
    );
    assert!(rendered.contains("help: "), "{rendered}");

    let missing = load_task(&dir.path().join("nope.yaml")).unwrap_err();
    assert!(matches!(missing, SchemaError::Read { .. }), "{missing}");
    assert!(missing.to_string().contains("nope.yaml"));
}

#[test]
fn code_root_is_absolute_and_must_exist() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("My Project");
    fs::create_dir_all(project.join("src")).unwrap();
    write(&project, "task.yaml", "run: x\ncode:\n  dir: ./src\n");
    let loaded = load_task(&project.join("task.yaml")).unwrap();
    let expected = fs::canonicalize(project.join("src")).unwrap();
    assert_eq!(loaded.code_root, expected);
    assert!(loaded.code_root.is_absolute());
    // With no `name`, the directory's name is made into a valid one.
    assert_eq!(loaded.spec.name, "My-Project");

    write(&project, "task.yaml", "run: x\ncode:\n  dir: missing\n");
    let rendered = load_task(&project).unwrap_err().to_string();
    assert!(rendered.contains("does not exist"), "{rendered}");
    assert!(rendered.contains("task.yaml:3:8\n"), "{rendered}");
    assert!(rendered.contains("= help: set `code.dir`"), "{rendered}");
}

#[test]
fn later_layers_can_locate_their_errors_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "task.yaml",
        "name: demo\nrun: x\nenvironment:\n  python: \"3.11\"\ndatasets:\n  - { name: d, source: /nowhere }\n",
    );
    let loaded = load_task(dir.path()).unwrap();
    let file = dir.path().join("task.yaml").display().to_string();

    let datasets = loaded
        .error_at(
            "datasets",
            "no dataset at `/nowhere`",
            Some("check `source`".into()),
        )
        .to_string();
    assert!(
        datasets.starts_with("error: no dataset at `/nowhere`\n"),
        "{datasets}"
    );
    assert!(
        datasets.contains(&format!("--> {file}:5:1\n")),
        "{datasets}"
    );
    assert!(datasets.contains(" 5 | datasets:\n"), "{datasets}");
    assert!(datasets.contains("   | ^^^^^^^^\n"), "{datasets}");
    assert!(datasets.ends_with("= help: check `source`"), "{datasets}");

    let source = loaded
        .error_at("datasets.0.source", "gone", None)
        .to_string();
    assert!(source.contains(&format!("--> {file}:6:24\n")), "{source}");

    // `image` was not written: the error falls back to `environment`.
    let image = loaded
        .error_at("environment.image", "image not found", None)
        .to_string();
    assert!(image.contains(&format!("--> {file}:3:1\n")), "{image}");
    let nowhere = loaded.error_at("retry", "no", None).to_string();
    assert!(nowhere.contains(&format!("--> {file}:1:1\n")), "{nowhere}");
}

#[test]
fn a_legacy_tuxiv_conf_is_translated_with_warnings() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "tuxiv.conf", TUXIV_CONF);
    let loaded = load_task(dir.path()).unwrap();
    let spec = &loaded.spec;
    assert_eq!(spec.name, "test");
    assert_eq!(spec.run, "python ${TACC_WORKDIR}/mnist.py --epoch=3");
    assert_eq!(spec.resources.nodes, 2);
    assert_eq!(spec.resources.cpus, 4.0);
    assert_eq!(spec.resources.gpus, 2.into());
    assert_eq!(spec.resources.gpu_type.as_deref(), Some("v100"));
    assert_eq!(spec.resources.memory, ByteSize::gib(16));
    assert_eq!(
        spec.resources.time_limit,
        Some(HumanDuration::from_secs(2 * 86_400))
    );
    let conda = spec.environment.conda.as_ref().unwrap();
    assert_eq!(conda.name.as_deref(), Some("torch-env"));
    assert_eq!(conda.channels, ["pytorch"]);
    assert_eq!(conda.dependencies, ["pytorch=1.6.0", "torchvision=0.7.0"]);
    assert_eq!(spec.environment.pip, ["wandb", "tqdm==4.66.1"]);
    assert_eq!(
        spec.datasets,
        [DatasetSpec {
            name: "imagenet".into(),
            source: "imagenet".into(),
            mount: "datasets/imagenet".into(),
        }]
    );
    spec.validate().unwrap();

    let file = dir.path().join("tuxiv.conf").display().to_string();
    let expected = [
        format!("{file}:22:11: Slurm option `partition=x` is not supported and was ignored"),
        format!(
            "{file}:23:11: Slurm option `output=${{TACC_SLURM_USERLOG}}/output.log` was ignored"
        ),
        format!("{file}:25:7: dataset `imagenet` is mounted at `datasets/imagenet`"),
        format!("{file}:26:1: unknown key `notes` was ignored"),
    ];
    assert_eq!(
        loaded.warnings.len(),
        expected.len(),
        "{:#?}",
        loaded.warnings
    );
    for (warning, start) in loaded.warnings.iter().zip(&expected) {
        assert!(
            warning.starts_with(start.as_str()),
            "{warning}\n  vs {start}"
        );
    }

    // Errors found later point into tuxiv.conf, at the option the field came from.
    let gpus = loaded
        .error_at("resources.gpus", "no v100 here", None)
        .to_string();
    assert!(gpus.contains(&format!("--> {file}:19:11\n")), "{gpus}");
    assert!(gpus.ends_with("|           ^^^^^^^^^^^^^^^"), "{gpus}");
}

#[test]
fn legacy_mistakes_that_cannot_be_guessed_are_located_errors() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "tuxiv.conf",
        "entrypoint: python a.py\njob:\n  general:\n    - nodes=many\n",
    );
    let rendered = load_task(dir.path()).unwrap_err().to_string();
    assert!(
        rendered.contains("cannot understand the Slurm option `nodes=many`"),
        "{rendered}"
    );
    assert!(rendered.contains("tuxiv.conf:4:7\n"), "{rendered}");
    assert!(
        rendered.contains("= help: write the node count"),
        "{rendered}"
    );

    write(dir.path(), "tuxiv.conf", "job:\n  name: x\n");
    let rendered = load_task(dir.path()).unwrap_err().to_string();
    assert!(rendered.contains("no `entrypoint`"), "{rendered}");
    assert!(rendered.contains("tuxiv.conf:1:1\n"), "{rendered}");

    // The same semantic rules apply to what was translated.
    write(
        dir.path(),
        "tuxiv.conf",
        "entrypoint: python a.py\njob:\n  general:\n    - gres=gpu:2000\n",
    );
    let rendered = load_task(dir.path()).unwrap_err().to_string();
    assert!(rendered.contains("at most 1024"), "{rendered}");
    assert!(rendered.contains("tuxiv.conf:4:7\n"), "{rendered}");
}

#[test]
fn legacy_names_and_short_options_are_made_usable() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "tuxiv.conf",
        "entrypoint: python a.py\njob:\n  name: my job\n  general:\n    - -N 3\n    - --gpus=1\n    - mem=2048\n    - time=90\n  env:\n    - OMP_NUM_THREADS=8\n",
    );
    let loaded = load_task(dir.path()).unwrap();
    assert_eq!(loaded.spec.name, "my-job");
    assert_eq!(loaded.spec.resources.nodes, 3);
    assert_eq!(loaded.spec.resources.gpus, 1.into());
    assert_eq!(loaded.spec.resources.memory, ByteSize::mib(2048));
    assert_eq!(
        loaded.spec.resources.time_limit,
        Some(HumanDuration::from_secs(90 * 60))
    );
    assert_eq!(loaded.spec.environment.vars["OMP_NUM_THREADS"], "8");
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    assert!(
        loaded.warnings[0]
            .contains(":3:9: job name `my job` is not a valid task name; using `my-job`")
    );
}

/// Warnings print like the errors do: the place, the line and a caret under what is
/// warned about.
#[test]
fn located_warnings_render_like_a_compiler() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "tuxiv.conf", TUXIV_CONF);
    let loaded = load_task(dir.path()).unwrap();
    let rendered = loaded.rendered_warnings();
    assert_eq!(rendered.len(), loaded.warnings.len());
    let file = dir.path().join("tuxiv.conf").display().to_string();
    let first = &rendered[0];
    assert!(
        first.starts_with("warning: Slurm option `partition=x` is not supported"),
        "{first}"
    );
    assert!(first.contains(&format!("--> {file}:22:11\n")), "{first}");
    assert!(first.contains("\n 22 | "), "{first}");
    assert!(
        first.lines().last().unwrap().trim_start().starts_with("| "),
        "{first}"
    );
    assert!(first.ends_with('^'), "{first}");
}
