//! The layering rules of docs/ARCHITECTURE.md, checked against every crate's manifest so
//! the document and the code cannot drift apart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Which of our crates each crate may depend on (normal dependencies; tests may use more).
const ALLOWED: &[(&str, &[&str])] = &[
    ("tacc-core", &[]),
    ("tacc-schema", &["tacc-core"]),
    ("tacc-compiler", &["tacc-core", "tacc-schema"]),
    ("tacc-scheduler", &["tacc-core"]),
    ("tacc-adaptive", &["tacc-core"]),
    // The launcher depends on nothing of ours (small, and static where built so).
    ("tacc-launch", &[]),
    ("tacc-exec", &["tacc-core", "tacc-launch"]),
    ("tacc-store", &["tacc-core"]),
    ("tacc-proto", &["tacc-core"]),
    ("tacc-plot", &[]),
    ("tacc-client", &["tacc-core", "tacc-proto"]),
    (
        "tacc-server",
        &[
            "tacc-core",
            "tacc-proto",
            "tacc-schema",
            "tacc-compiler",
            "tacc-scheduler",
            "tacc-adaptive",
            "tacc-store",
        ],
    ),
    (
        "tacc-agent",
        &[
            "tacc-core",
            "tacc-proto",
            "tacc-client",
            "tacc-compiler",
            "tacc-exec",
        ],
    ),
    (
        "taccd",
        &[
            "tacc-core",
            "tacc-server",
            "tacc-agent",
            "tacc-scheduler",
            "tacc-exec",
            "tacc-store",
            "tacc-client",
            "tacc-compiler",
        ],
    ),
    (
        "tcloud",
        &[
            "tacc-core",
            "tacc-proto",
            "tacc-schema",
            "tacc-compiler",
            "tacc-client",
            "tacc-plot",
        ],
    ),
    (
        "tacc-sim",
        &["tacc-core", "tacc-scheduler", "tacc-adaptive", "tacc-plot"],
    ),
];

#[test]
fn every_crate_depends_only_on_what_its_layer_allows() {
    let crates_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(name, deps)| (*name, deps.iter().copied().collect()))
        .collect();
    let mut seen = BTreeSet::new();
    for entry in std::fs::read_dir(&crates_dir).unwrap().flatten() {
        let manifest = entry.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        let name = parsed["package"]["name"].as_str().unwrap().to_string();
        let rules = allowed.get(name.as_str()).unwrap_or_else(|| {
            panic!("crate {name} is not in docs/ARCHITECTURE.md's table (and this test's)")
        });
        let ours: BTreeSet<String> = parsed
            .get("dependencies")
            .and_then(|d| d.as_table())
            .map(|deps| {
                deps.keys()
                    .filter(|k| k.starts_with("tacc"))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for dep in &ours {
            assert!(
                rules.contains(dep.as_str()),
                "{name} depends on {dep}, which its layer may not import (docs/ARCHITECTURE.md)"
            );
        }
        seen.insert(name);
    }
    let expected: BTreeSet<String> = allowed.keys().map(|k| k.to_string()).collect();
    assert_eq!(seen, expected, "every crate of the table exists");
}

/// What the control plane's rules (`tacc-server/src/control/rules/`) must not reach: they
/// are plain functions over state with the time passed in, and the shell does the I/O.
const IMPURE: &[&str] = &[
    "async ",
    ".await",
    "tokio",
    "Instant::now",
    "SystemTime",
    "std::fs",
    "std::net",
    "std::thread",
    "dyn Store",
    ".store",
    "Mutex",
    "tracing::",
];

#[test]
fn the_control_plane_rules_do_no_io_and_read_no_clock() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tacc-server/src/control/rules");
    let mut checked = 0;
    for entry in std::fs::read_dir(&rules).unwrap().flatten() {
        let path = entry.path();
        let text = std::fs::read_to_string(&path).unwrap();
        // The unit tests below a rule may build what they need.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (number, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            for word in IMPURE {
                assert!(
                    !line.contains(word),
                    "{}:{}: a rule uses `{word}`; rules decide, the shell in control/ does I/O",
                    path.display(),
                    number + 1
                );
            }
        }
        checked += 1;
    }
    assert!(
        checked >= 4,
        "only {checked} rule files found in {}",
        rules.display()
    );
}

/// What the reactor's core and handlers may not name, beyond [`IMPURE`]: shared or
/// locked state, the clock, and I/O of any kind — time comes in with each event, and
/// everything outside the core goes out as `Effects` for the shell.
const NOT_IN_THE_CORE: &[&str] = &["Arc<", "RwLock", "Clock", "clock", "std::io", "reqwest"];

#[test]
fn the_reactor_core_and_its_handlers_are_plain_and_synchronous() {
    let control = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tacc-server/src/control");
    let mut files = vec![control.join("core.rs"), control.join("effects.rs")];
    files.extend(
        std::fs::read_dir(control.join("handlers"))
            .unwrap()
            .flatten()
            .map(|e| e.path()),
    );
    let mut checked = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (number, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            for word in IMPURE.iter().chain(NOT_IN_THE_CORE) {
                assert!(
                    !line.contains(word),
                    "{}:{}: uses `{word}`; the core is plain data and handlers are synchronous \
                     functions over it — I/O, time and locks belong to the shell (shell.rs)",
                    path.display(),
                    number + 1
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} core and handler files found");
}

/// The API's handlers read the durable state only through `query.rs` (the read-only
/// view) and change it only through `Control` and the services that own each change.
/// The writes still made from handlers are listed with their owner: they leave the API
/// with the services (the reactor issue).
const API_STORE_WRITES: &[(&str, &str)] = &[
    (
        "api/secrets.rs",
        "a user's secret set or deleted, audited (the secrets service)",
    ),
    (
        "api/admin.rs",
        "users and tokens made or revoked through `accounts`, audited",
    ),
    (
        "api/mod.rs",
        "wiring: the dashboard's sessions kept in the store",
    ),
];

#[test]
fn the_api_reads_through_the_query_module_and_names_no_store_elsewhere() {
    let api = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tacc-server/src/api");
    let mut checked = 0;
    for path in files_under(&api) {
        let relative = path
            .strip_prefix(api.parent().unwrap())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        checked += 1;
        let allowed = API_STORE_WRITES.iter().any(|(file, _)| *file == relative);
        for (number, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            if line.contains("control.store") && !allowed {
                panic!(
                    "{relative}:{}: a handler reaches the store; read through \
                     `control.query()` (query.rs), change state through `Control`",
                    number + 1
                );
            }
        }
        if allowed {
            // Even there, reads go through the query module.
            for read in [
                "get_task(",
                "list_tasks(",
                "get_token(",
                "get_secret(",
                "list_users(",
            ] {
                assert!(
                    !code.contains(&format!("store.{read}")),
                    "{relative}: reads `store.{read}`; use `control.query()`"
                );
            }
        }
    }
    assert!(checked >= 20, "only {checked} API files found");
}

/// Whether `line` opens an `impl` block of `Control` (`impl Control`, `impl crate::Control`,
/// `impl Trait for Control`, with or without generics).
fn implements_control(line: &str) -> bool {
    let line = line.split("//").next().unwrap_or_default().trim_start();
    let Some(rest) = line.strip_prefix("impl") else {
        return false;
    };
    if !(rest.starts_with(' ') || rest.starts_with('<')) {
        return false;
    }
    let head = rest.split('{').next().unwrap_or_default();
    let target = match head.rsplit_once(" for ") {
        Some((_, target)) => target,
        None => head,
    };
    target
        .split_whitespace()
        .next_back()
        .is_some_and(|name| name == "Control" || name.ends_with("::Control"))
}

/// The control plane is one type whose methods live in `control/` (issue 23: in at most
/// two files there); the services around it (usage, metrics, accounting, enrolment,
/// notifications, chunk access, artifacts…) are types of their own, never more methods of
/// `Control` in another file.
#[test]
fn control_is_implemented_only_in_its_entry_points_and_its_shell() {
    // `Control` is the reactor's shell and its entry points, nothing else: reads are
    // `Facts`, decisions are handlers and rules, workflows and services are types of their
    // own (docs/ARCHITECTURE.md, "One turn of the control plane").
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tacc-server/src");
    let allowed = [src.join("control/mod.rs"), src.join("control/shell.rs")];
    let mut checked = 0;
    let mut implementing = std::collections::BTreeSet::new();
    for path in files_under(&src) {
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        checked += 1;
        for (number, line) in text.lines().enumerate() {
            if !implements_control(line) {
                continue;
            }
            implementing.insert(path.clone());
            assert!(
                allowed.contains(&path),
                "{}:{}: `{}`: `impl Control` lives only in control/mod.rs (entry points) and \
                 control/shell.rs (the turn); make this a read on `Facts`, a handler, or a \
                 service of its own (see docs/ARCHITECTURE.md)",
                path.display(),
                number + 1,
                line.trim()
            );
        }
    }
    assert!(checked >= 60, "only {checked} server files found");
    assert!(implementing.len() <= 2, "impl Control in {implementing:?}");
}

#[test]
fn impl_blocks_of_control_are_recognised_in_every_spelling() {
    for line in [
        "impl Control {",
        "impl crate::Control {",
        "impl crate::control::Control {",
        "impl Durable for Control {",
        "impl<'a> Trait<'a> for crate::Control {",
        "    impl Control {",
    ] {
        assert!(implements_control(line), "{line}");
    }
    for line in [
        "impl ControlPlane {",
        "impl Durable for StoreSync {",
        "// impl Control {",
        "implements Control",
        "let control = Control::open(store, config).await?;",
    ] {
        assert!(!implements_control(line), "{line}");
    }
}

/// Every file under `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            pending.extend(
                std::fs::read_dir(&path)
                    .unwrap()
                    .flatten()
                    .map(|e| e.path()),
            );
        } else {
            found.push(path);
        }
    }
    found
}
