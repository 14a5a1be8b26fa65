//! Managed environments and datasets in their compiled form.
//!
//! `environment.python` / `pip` / `requirements` / `conda` become an [`EnvPlan`]: the spec
//! normalised so that two task files asking for the same packages in a different order or
//! spelling get the same plan, and hence the same [`EnvPlan::spec_key`]. A node turns the
//! spec key into its **env key** with [`env_key`], adding what only the node knows: the
//! bytes of the requirements file (it lives in the snapshot), the exact interpreter version
//! and the platform. A node builds one environment per env key and reuses it.
//!
//! `datasets` become [`DatasetMount`]s whose source is a path or a URL once
//! [`resolve_datasets`] has replaced the names an administrator registered.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tacc_schema::{DatasetSpec, EnvironmentSpec};

use crate::CompilerError;
use crate::snapshot::validate_relative_path;

/// A normalised managed environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EnvPlan {
    /// A Python virtual environment (`uv venv` or `python -m venv`), then `pip install`.
    Venv {
        /// Requested interpreter version prefix (`"3.11"`), `None` for the node's `python3`.
        python: Option<String>,
        /// Requirement specifiers, normalised, sorted and deduplicated.
        packages: Vec<String>,
        /// A requirements file, relative to the working directory.
        requirements: Option<String>,
        /// See [`EnvPlan::build_vars`].
        build_vars: BTreeMap<String, String>,
    },
    /// A conda prefix built with mamba or conda, then `pip install` into it.
    Conda {
        python: Option<String>,
        channels: Vec<String>,
        /// Sorted and deduplicated.
        dependencies: Vec<String>,
        packages: Vec<String>,
        requirements: Option<String>,
        build_vars: BTreeMap<String, String>,
    },
}

/// Prefixes of `environment.vars` that configure the package tools (an index URL,
/// `PIP_NO_INDEX`, a conda channel alias): they are set for the build too, and are part
/// of the spec key because they change what gets installed.
pub const BUILD_VAR_PREFIXES: [&str; 3] = ["PIP_", "UV_", "CONDA_"];

/// The environment part of an instruction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstructionEnvironment {
    pub plan: EnvPlan,
    /// BLAKE3 of the plan; the node folds it into its env key (see [`env_key`]).
    pub spec_key: String,
}

impl EnvPlan {
    /// The managed environment `spec` asks for, or `None` when it asks for none (the task
    /// then runs with the node's own tools, as before managed environments existed).
    pub fn from_spec(spec: &EnvironmentSpec) -> Option<EnvPlan> {
        let python = spec
            .python
            .as_deref()
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string);
        let packages = normalise_requirements(&spec.pip);
        let requirements = spec
            .requirements
            .as_deref()
            .map(|r| r.trim().trim_start_matches("./").to_string());
        let build_vars: BTreeMap<String, String> = spec
            .vars
            .iter()
            .filter(|(name, _)| BUILD_VAR_PREFIXES.iter().any(|p| name.starts_with(p)))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        if let Some(conda) = &spec.conda {
            let mut dependencies: Vec<String> = conda
                .dependencies
                .iter()
                .map(|d| d.split_whitespace().collect::<String>())
                .filter(|d| !d.is_empty())
                .collect();
            dependencies.sort();
            dependencies.dedup();
            return Some(EnvPlan::Conda {
                python,
                // Channel order is priority order in conda: kept as written.
                channels: conda
                    .channels
                    .iter()
                    .map(|c| c.trim().to_string())
                    .collect(),
                dependencies,
                packages,
                requirements,
                build_vars,
            });
        }
        if python.is_none() && packages.is_empty() && requirements.is_none() {
            return None;
        }
        Some(EnvPlan::Venv {
            python,
            packages,
            requirements,
            build_vars,
        })
    }

    /// BLAKE3 over the plan's JSON form. The JSON of this enum is deterministic (fixed
    /// field order, sorted lists), so equal plans give equal keys.
    pub fn spec_key(&self) -> String {
        let json = serde_json::to_vec(self).expect("an EnvPlan serialises");
        let mut hasher = blake3::Hasher::new_derive_key("tacc environment spec v1");
        hasher.update(&json);
        hasher.finalize().to_hex().to_string()
    }

    pub fn python(&self) -> Option<&str> {
        match self {
            EnvPlan::Venv { python, .. } | EnvPlan::Conda { python, .. } => python.as_deref(),
        }
    }

    pub fn packages(&self) -> &[String] {
        match self {
            EnvPlan::Venv { packages, .. } | EnvPlan::Conda { packages, .. } => packages,
        }
    }

    /// Variables set for the build (see [`BUILD_VAR_PREFIXES`]).
    pub fn build_vars(&self) -> &BTreeMap<String, String> {
        match self {
            EnvPlan::Venv { build_vars, .. } | EnvPlan::Conda { build_vars, .. } => build_vars,
        }
    }

    pub fn requirements(&self) -> Option<&str> {
        match self {
            EnvPlan::Venv { requirements, .. } | EnvPlan::Conda { requirements, .. } => {
                requirements.as_deref()
            }
        }
    }
}

/// The key a node builds and caches one environment under: the spec key plus what only
/// the node knows. `interpreter` is the exact version the node would use (`3.11.7`, or the
/// conda tool's version), `platform` e.g. `linux-x86_64`.
pub fn env_key(
    spec_key: &str,
    requirements_file: Option<&[u8]>,
    interpreter: &str,
    platform: &str,
) -> String {
    let mut hasher = blake3::Hasher::new_derive_key("tacc environment key v1");
    for part in [
        spec_key.as_bytes(),
        interpreter.as_bytes(),
        platform.as_bytes(),
    ] {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    match requirements_file {
        Some(bytes) => {
            hasher.update(&[1]);
            hasher.update(blake3::hash(bytes).as_bytes());
        }
        None => {
            hasher.update(&[0]);
        }
    }
    // 32 hex digits (128 bits) keep directory names short and are plenty against collisions.
    hasher.finalize().to_hex()[..32].to_string()
}

/// Normalises pip requirement specifiers: whitespace outside environment markers removed,
/// the project name lower-cased with `_` and `.` read as `-` (PEP 503), then sorted and
/// deduplicated. `NumPy == 2.1.*` and `numpy==2.1.*` are the same requirement.
pub fn normalise_requirements(requirements: &[String]) -> Vec<String> {
    let mut normalised: Vec<String> = requirements
        .iter()
        .filter_map(|requirement| normalise_requirement(requirement))
        .collect();
    normalised.sort();
    normalised.dedup();
    normalised
}

fn normalise_requirement(requirement: &str) -> Option<String> {
    let (specifier, marker) = match requirement.split_once(';') {
        Some((specifier, marker)) => (specifier, Some(marker.trim())),
        None => (requirement, None),
    };
    let specifier = specifier.trim();
    if specifier.is_empty() {
        return None;
    }
    // Paths and URLs (`./pkg`, `file:///…`, `pkg @ https://…`) are kept as written, bar
    // surrounding whitespace: their case and punctuation matter.
    let looks_like_location = specifier.contains('/') || specifier.contains(':');
    let mut text = if looks_like_location {
        specifier.to_string()
    } else {
        let compact: String = specifier.split_whitespace().collect();
        let name_end = compact
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'))
            .unwrap_or(compact.len());
        let name: String = compact[..name_end]
            .chars()
            .map(|c| match c {
                '_' | '.' => '-',
                other => other.to_ascii_lowercase(),
            })
            .collect();
        format!("{name}{}", &compact[name_end..])
    };
    if let Some(marker) = marker.filter(|m| !m.is_empty()) {
        text.push_str("; ");
        text.push_str(marker);
    }
    Some(text)
}

/// One dataset as an instruction carries it: a source a node can fetch, and where the
/// task sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetMount {
    pub name: String,
    /// An absolute path (shared storage) or an `http(s)://` URL once resolved.
    pub source: String,
    /// Relative to the working directory.
    pub mount: String,
}

/// What kind of place a dataset source names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetSource {
    /// An absolute path on a file system the node can read (usually shared storage).
    Path,
    /// An `http://` or `https://` URL of a file.
    Url,
    /// Anything else: the name of a dataset an administrator registered.
    Registered,
}

impl DatasetSource {
    pub fn of(source: &str) -> DatasetSource {
        if source.starts_with("http://") || source.starts_with("https://") {
            DatasetSource::Url
        } else if source.starts_with('/') {
            DatasetSource::Path
        } else {
            DatasetSource::Registered
        }
    }
}

/// The key a node caches a dataset's copy under: BLAKE3 of its resolved source.
pub fn dataset_cache_key(source: &str) -> String {
    let mut hasher = blake3::Hasher::new_derive_key("tacc dataset cache key v1");
    hasher.update(source.as_bytes());
    hasher.finalize().to_hex()[..32].to_string()
}

/// The task's datasets with registered names replaced by the source the administrator
/// registered (`registry`: name → path or URL).
pub fn resolve_datasets(
    datasets: &[DatasetSpec],
    registry: &BTreeMap<String, String>,
) -> Result<Vec<DatasetMount>, CompilerError> {
    datasets
        .iter()
        .map(|dataset| {
            validate_relative_path(&dataset.mount).map_err(|e| CompilerError::InvalidDataset {
                name: dataset.name.clone(),
                why: format!("its mount `{}` is not usable: {e}", dataset.mount),
            })?;
            let source = match DatasetSource::of(&dataset.source) {
                DatasetSource::Path | DatasetSource::Url => dataset.source.clone(),
                DatasetSource::Registered => match registry.get(&dataset.source) {
                    Some(registered) => registered.clone(),
                    None => {
                        let known: Vec<&str> = registry.keys().map(String::as_str).collect();
                        return Err(CompilerError::InvalidDataset {
                            name: dataset.name.clone(),
                            why: format!(
                                "its source `{}` is not an absolute path, not an http(s):// URL, \
                                 and not a dataset registered on this cluster (registered: {}); \
                                 `tcloud dataset ls` lists them",
                                dataset.source,
                                if known.is_empty() {
                                    "none".to_string()
                                } else {
                                    known.join(", ")
                                }
                            ),
                        });
                    }
                },
            };
            Ok(DatasetMount {
                name: dataset.name.clone(),
                source,
                mount: dataset.mount.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(yaml: &str) -> EnvironmentSpec {
        tacc_schema::parse_task("t.yaml", &format!("name: t\nrun: x\n{yaml}"))
            .unwrap()
            .0
            .environment
    }

    #[test]
    fn no_managed_environment_without_python_pip_or_requirements() {
        assert_eq!(
            EnvPlan::from_spec(&env("environment: {vars: {A: b}}")),
            None
        );
    }

    #[test]
    fn equal_requirements_in_other_order_and_spelling_give_the_same_key() {
        let a = EnvPlan::from_spec(&env(
            "environment: {python: '3.11', pip: ['NumPy == 2.1.*', 'my_pkg>=1', 'numpy==2.1.*']}",
        ))
        .unwrap();
        let b = EnvPlan::from_spec(&env(
            "environment: {python: '3.11', pip: ['my-pkg>=1', 'numpy==2.1.*']}",
        ))
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.spec_key(), b.spec_key());
        assert_eq!(a.packages(), ["my-pkg>=1", "numpy==2.1.*"]);
        let c = EnvPlan::from_spec(&env(
            "environment: {python: '3.12', pip: ['my-pkg>=1', 'numpy==2.1.*']}",
        ))
        .unwrap();
        assert_ne!(a.spec_key(), c.spec_key());
    }

    #[test]
    fn paths_urls_and_markers_survive_normalisation() {
        let normalised = normalise_requirements(&[
            "./Local_Pkg".into(),
            "Foo_Bar ; python_version < \"3.12\"".into(),
            "  ".into(),
        ]);
        assert_eq!(
            normalised,
            ["./Local_Pkg", "foo-bar; python_version < \"3.12\""]
        );
    }

    #[test]
    fn env_key_depends_on_interpreter_platform_and_requirements_bytes() {
        let spec = "abc";
        let base = env_key(spec, None, "3.11.7", "linux-x86_64");
        assert_eq!(base, env_key(spec, None, "3.11.7", "linux-x86_64"));
        assert_ne!(base, env_key(spec, None, "3.11.8", "linux-x86_64"));
        assert_ne!(base, env_key(spec, None, "3.11.7", "linux-aarch64"));
        assert_ne!(base, env_key(spec, Some(b""), "3.11.7", "linux-x86_64"));
        assert_ne!(
            env_key(spec, Some(b"a"), "3.11.7", "linux-x86_64"),
            env_key(spec, Some(b"b"), "3.11.7", "linux-x86_64")
        );
    }

    #[test]
    fn datasets_resolve_registered_names_and_refuse_unknown_ones() {
        let spec = |source: &str| DatasetSpec {
            name: "d".into(),
            source: source.into(),
            mount: "data/d".into(),
        };
        let registry = BTreeMap::from([("mnist".to_string(), "/shared/mnist".to_string())]);
        let resolved = resolve_datasets(
            &[spec("mnist"), spec("/x"), spec("https://h/f.bin")],
            &registry,
        )
        .unwrap();
        assert_eq!(resolved[0].source, "/shared/mnist");
        assert_eq!(resolved[1].source, "/x");
        assert_eq!(resolved[2].source, "https://h/f.bin");
        let error = resolve_datasets(&[spec("cifar")], &registry)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`cifar`") && error.contains("registered: mnist"),
            "{error}"
        );
        let escaping = DatasetSpec {
            mount: "../out".into(),
            ..spec("/x")
        };
        assert!(resolve_datasets(&[escaping], &registry).is_err());
    }
}
