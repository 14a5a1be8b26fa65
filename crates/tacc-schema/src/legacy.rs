//! Import of TACC's legacy `tuxiv.conf`, so old project directories still submit.
//!
//! The old format is loose YAML: `entrypoint` (a command, or a list of its words),
//! `environment` (a conda environment whose `dependencies` may hold a `{pip: [...]}` entry),
//! `job` (`name`, and `general`: raw Slurm options such as `nodes=2` or `gres=gpu:v100:2`) and
//! `datasets` (names of cluster datasets). What maps onto a [`TaskSpec`] is translated; what
//! cannot be honoured is dropped with a warning naming its `file:line:col`, because failing a
//! submission that used to work over, say, a partition name would help nobody.

use marked_yaml::Node;
use marked_yaml::types::MarkedScalarNode;
use tacc_core::{ByteSize, HumanDuration};

use crate::reader::{self, Reader, is_null};
use crate::spans::{Location, Spans};
use crate::spec::{CondaSpec, DatasetSpec, EnvironmentSpec, TaskSpec, name_error};
use crate::{SchemaError, task_name_from};

type Result<T> = std::result::Result<T, SchemaError>;

pub(crate) struct Translated {
    pub spec: TaskSpec,
    pub spans: Spans,
    pub warnings: Vec<String>,
    pub changes: Vec<LegacyChange>,
}

/// A legacy option the translation could not honour as written: what was asked, what
/// applies instead and why. Kept with the task (as an override) besides the warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyChange {
    /// The legacy key the option sits under (`job.general`).
    pub key: String,
    /// The option as written (`nodes=2-4`).
    pub asked: String,
    /// What applies instead (`resources.nodes: 2`, `ignored`).
    pub applied: String,
    /// Why, with where it was written (`tuxiv.conf:4:7`).
    pub why: String,
}

pub(crate) fn translate(source_name: &str, text: &str, fallback_name: &str) -> Result<Translated> {
    let mut spans = Spans::new(source_name, text);
    let root = reader::load_yaml(text, &spans)?;
    let mut translator = Translator {
        reader: Reader::new(&mut spans),
        warnings: Vec::new(),
        changes: Vec::new(),
        spec: TaskSpec {
            name: String::new(),
            resources: Default::default(),
            priority: Default::default(),
            preemptible: false,
            code: Default::default(),
            environment: Default::default(),
            datasets: Vec::new(),
            setup: None,
            run: String::new(),
            outputs: Vec::new(),
            retry: Default::default(),
            checkpoint: None,
            runtime: Default::default(),
            placement: Default::default(),
            adaptive: None,
            array: None,
            notify: None,
            sweep: None,
            on_hang: None,
            kind: Default::default(),
            idle_timeout: None,
        },
        slurm_job_name: None,
    };
    let Node::Mapping(top) = &root else {
        unreachable!("the loader only returns a mapping at the top level")
    };
    let mut has_entrypoint = false;
    let mut job_name = None;
    for (key, value) in top.iter() {
        match key.as_str() {
            "entrypoint" => {
                translator.entrypoint(key, value)?;
                has_entrypoint = true;
            }
            "environment" if !is_null(value) => translator.environment(key, value)?,
            "job" if !is_null(value) => job_name = translator.job(key, value)?,
            "datasets" if !is_null(value) => translator.datasets(value)?,
            "environment" | "job" | "datasets" => {}
            other => {
                let location = translator.reader.spans.scalar_location(key);
                translator.warn(location, format!("unknown key `{other}` was ignored"));
            }
        }
    }
    if !has_entrypoint {
        return Err(translator.reader.spans.error_at(
            "run",
            "tuxiv.conf has no `entrypoint`, so there is nothing to run",
            Some("add the command to run, e.g. `entrypoint: [python train.py]`".into()),
        ));
    }
    let name = job_name
        .or_else(|| translator.slurm_job_name.take())
        .unwrap_or_else(|| (fallback_name.to_string(), None));
    translator.spec.name = translator.task_name(name.0, name.1);

    let Translator {
        spec,
        warnings,
        changes,
        ..
    } = translator;
    if let Some(error) = spans.located_problems(spec.problems(), Vec::new()) {
        return Err(error);
    }
    Ok(Translated {
        spec,
        spans,
        warnings,
        changes,
    })
}

struct Translator<'s> {
    reader: Reader<'s>,
    warnings: Vec<String>,
    changes: Vec<LegacyChange>,
    spec: TaskSpec,
    /// A `job-name=` Slurm option, used when `job.name` is absent.
    slurm_job_name: Option<(String, Option<Location>)>,
}

impl Translator<'_> {
    fn warn(&mut self, location: Location, message: impl AsRef<str>) {
        let at = self.reader.spans.describe(location);
        self.warnings.push(format!("{at}: {}", message.as_ref()));
    }

    /// A Slurm option of `job.general` not honoured as written: warned of, and kept as
    /// a change (what was asked, what applies).
    fn changed(
        &mut self,
        location: Location,
        option: &str,
        applied: impl Into<String>,
        message: impl AsRef<str>,
    ) {
        let at = self.reader.spans.describe(location);
        self.changes.push(LegacyChange {
            key: "job.general".into(),
            asked: option.to_string(),
            applied: applied.into(),
            why: format!("{} ({at})", message.as_ref()),
        });
        self.warn(location, message);
    }

    fn location(&self, node: &Node) -> Location {
        self.reader.spans.node_location(node)
    }

    /// Old names could hold any characters; make a valid one rather than refuse the file.
    fn task_name(&mut self, written: String, location: Option<Location>) -> String {
        if let Some(location) = location {
            self.reader.spans.record_location("name", location);
        }
        if name_error(&written).is_none() {
            return written;
        }
        let usable = task_name_from(&written);
        if let Some(location) = location {
            self.warn(
                location,
                format!("job name `{written}` is not a valid task name; using `{usable}`"),
            );
        }
        usable
    }

    /// The old CLI joined a list entrypoint with spaces: its examples split one command's
    /// arguments over several items.
    fn entrypoint(&mut self, key: &MarkedScalarNode, value: &Node) -> Result<()> {
        self.reader.spans.record("run", Some(key), value);
        self.spec.run = match value {
            Node::Sequence(words) => {
                let mut parts = Vec::with_capacity(words.len());
                for (index, word) in words.iter().enumerate() {
                    let path = format!("entrypoint.{index}");
                    parts.push(self.reader.text(word, &path, "- python train.py")?);
                }
                parts.join(" ")
            }
            other if is_null(other) => String::new(),
            other => self
                .reader
                .text(other, "entrypoint", "entrypoint: python train.py")?,
        };
        Ok(())
    }

    fn environment(&mut self, key: &MarkedScalarNode, value: &Node) -> Result<()> {
        self.reader.spans.record("environment", Some(key), value);
        self.reader
            .spans
            .record("environment.conda", Some(key), value);
        let Node::Mapping(map) = value else {
            return Err(self.reader.error_at_node(
                value,
                "expected a mapping for `environment`",
                "write `environment:` with `name`, `channels` and `dependencies` below it",
            ));
        };
        let mut conda = CondaSpec::default();
        let mut pip = Vec::new();
        for (field, node) in map.iter() {
            if is_null(node) {
                continue;
            }
            match field.as_str() {
                "name" => {
                    conda.name = Some(self.reader.text(
                        node,
                        "environment.name",
                        "name: torch-env",
                    )?)
                }
                "channels" => {
                    conda.channels = match node {
                        Node::Scalar(channel) => vec![channel.as_str().to_string()],
                        other => self.reader.texts(
                            other,
                            "environment.channels",
                            "channels: [pytorch]",
                        )?,
                    }
                }
                "dependencies" => self.dependencies(node, &mut conda, &mut pip)?,
                other => {
                    let location = self.reader.spans.scalar_location(field);
                    self.warn(
                        location,
                        format!("unknown key `environment.{other}` was ignored"),
                    );
                }
            }
        }
        self.spec.environment = EnvironmentSpec {
            conda: Some(conda),
            pip,
            ..EnvironmentSpec::default()
        };
        Ok(())
    }

    fn dependencies(
        &mut self,
        node: &Node,
        conda: &mut CondaSpec,
        pip: &mut Vec<String>,
    ) -> Result<()> {
        let Node::Sequence(items) = node else {
            return Err(self.reader.error_at_node(
                node,
                "expected a list for `environment.dependencies`",
                "write e.g. `dependencies: [pytorch=1.6.0, {pip: [wandb]}]`",
            ));
        };
        for item in items.iter() {
            match item {
                Node::Scalar(package) => conda.dependencies.push(package.as_str().to_string()),
                Node::Mapping(nested) => {
                    for (manager, packages) in nested.iter() {
                        if manager.as_str() == "pip" {
                            let first_index = pip.len();
                            let names = self.reader.texts(
                                packages,
                                "environment.dependencies.pip",
                                "pip: [wandb]",
                            )?;
                            if let Node::Sequence(entries) = packages {
                                for (offset, entry) in entries.iter().enumerate() {
                                    let path = format!("environment.pip.{}", first_index + offset);
                                    self.reader.spans.record(&path, None, entry);
                                }
                            }
                            pip.extend(names);
                        } else {
                            let location = self.reader.spans.scalar_location(manager);
                            self.warn(
                                location,
                                format!(
                                    "`{}` dependencies are not supported and were ignored",
                                    manager.as_str()
                                ),
                            );
                        }
                    }
                }
                Node::Sequence(_) => {
                    let location = self.location(item);
                    self.warn(location, "a nested list in `dependencies` was ignored");
                }
            }
        }
        Ok(())
    }

    /// Returns `job.name` and where it was written.
    fn job(
        &mut self,
        key: &MarkedScalarNode,
        value: &Node,
    ) -> Result<Option<(String, Option<Location>)>> {
        let Node::Mapping(map) = value else {
            return Err(self.reader.error_at_node(
                value,
                "expected a mapping for `job`",
                "write `job:` with `name` and `general` below it",
            ));
        };
        self.reader.spans.record("resources", Some(key), value);
        let mut name = None;
        for (field, node) in map.iter() {
            if is_null(node) {
                continue;
            }
            match field.as_str() {
                "name" => {
                    let written = self.reader.text(node, "job.name", "name: mnist")?;
                    name = Some((written, Some(self.location(node))));
                }
                "general" => {
                    let Node::Sequence(options) = node else {
                        return Err(self.reader.error_at_node(
                            node,
                            "expected a list of Slurm options for `job.general`",
                            "write e.g. `general: [nodes=2, gres=gpu:1]`",
                        ));
                    };
                    for (index, option) in options.iter().enumerate() {
                        let text = self.reader.text(
                            option,
                            &format!("job.general.{index}"),
                            "- nodes=2",
                        )?;
                        let location = self.location(option);
                        self.slurm_option(text.trim(), location)?;
                    }
                }
                "env" => self.job_env(node)?,
                "module" => {
                    let location = self.reader.spans.scalar_location(field);
                    self.warn(location, "environment modules (`job.module`) are not supported and were ignored; install the software through `environment` instead");
                }
                other => {
                    let location = self.reader.spans.scalar_location(field);
                    self.warn(location, format!("unknown key `job.{other}` was ignored"));
                }
            }
        }
        Ok(name)
    }

    fn job_env(&mut self, node: &Node) -> Result<()> {
        let assignments = self
            .reader
            .texts(node, "job.env", "env: [OMP_NUM_THREADS=4]")?;
        let Node::Sequence(items) = node else {
            return Ok(());
        };
        for (assignment, item) in assignments.into_iter().zip(items.iter()) {
            let location = self.location(item);
            match assignment.split_once('=') {
                Some((name, value)) => {
                    let name = name.trim().trim_start_matches("export ").trim().to_string();
                    self.reader
                        .spans
                        .record_location(&format!("environment.vars.{name}"), location);
                    self.spec.environment.vars.insert(name, value.to_string());
                }
                None => self.warn(
                    location,
                    format!("`{assignment}` is not `NAME=value` and was ignored"),
                ),
            }
        }
        Ok(())
    }

    fn slurm_option(&mut self, option: &str, location: Location) -> Result<()> {
        let Some((name, value)) = split_slurm_option(option) else {
            self.changed(
                location,
                option,
                "ignored",
                format!("Slurm option `{option}` is not supported and was ignored"),
            );
            return Ok(());
        };
        let bad_value = |this: &Self, help: &str| {
            this.reader.spans.error_at_location(
                location,
                format!("cannot understand the Slurm option `{option}`"),
                Some(help.to_string()),
            )
        };
        let record = |this: &mut Self, field: &str| {
            this.reader.spans.record_location(field, location);
        };
        match name.as_str() {
            "nodes" => {
                // `nodes=2-4` lets Slurm choose; a gang needs one number, so take the minimum.
                let (minimum, ranged) = match value.split_once('-') {
                    Some((low, _)) => (low, true),
                    None => (value.as_str(), false),
                };
                self.spec.resources.nodes = minimum
                    .parse()
                    .map_err(|_| bad_value(self, "write the node count, e.g. `nodes=2`"))?;
                record(self, "resources.nodes");
                if ranged {
                    self.changed(location, option, format!("resources.nodes: {minimum}"), format!("node range `{value}` is not supported; asking for {minimum} nodes"));
                }
            }
            "ntasks-per-node" if value == "1" => {}
            "ntasks-per-node" | "ntasks" => self.changed(
                location,
                option,
                "ignored",
                format!("Slurm option `{option}` was ignored: TACC starts one process per node; start more workers from your command (e.g. `torchrun --nproc_per_node`)"),
            ),
            "cpus-per-task" => {
                self.spec.resources.cpus = value
                    .parse()
                    .map_err(|_| bad_value(self, "write a CPU count, e.g. `cpus-per-task=4`"))?;
                record(self, "resources.cpus");
            }
            "gres" => {
                for resource in value.split(',') {
                    if let Some(gpus) = resource.strip_prefix("gpu") {
                        let (gpu_type, count) = parse_gpu_count(gpus.strip_prefix(':').unwrap_or(gpus))
                            .ok_or_else(|| bad_value(self, "write e.g. `gres=gpu:2` or `gres=gpu:v100:2`"))?;
                        self.set_gpus(gpu_type, count, location);
                    } else {
                        self.changed(location, option, "ignored", format!("generic resource `{resource}` is not supported and was ignored"));
                    }
                }
            }
            "gpus" | "gpus-per-node" | "gpus-per-task" => {
                let (gpu_type, count) = parse_gpu_count(&value)
                    .ok_or_else(|| bad_value(self, "write e.g. `gpus=2` or `gpus=v100:2`"))?;
                self.set_gpus(gpu_type, count, location);
            }
            "mem" if value == "0" => self.changed(
                location,
                option,
                "the default memory request",
                "`mem=0` (all of a node's memory) is not supported; the default memory request was kept",
            ),
            "mem" => {
                self.spec.resources.memory = slurm_memory(&value)
                    .ok_or_else(|| bad_value(self, "write e.g. `mem=16G` or `mem=16000` (MiB)"))?;
                record(self, "resources.memory");
            }
            "time" => match slurm_time(&value) {
                Some(secs) => {
                    self.spec.resources.time_limit = Some(HumanDuration::from_secs(secs));
                    record(self, "resources.time_limit");
                }
                None if matches!(value.to_ascii_lowercase().as_str(), "unlimited" | "infinite") => {
                    self.changed(location, option, "no time limit", format!("`{option}` is not supported; the task has no time limit"));
                }
                None => return Err(bad_value(self, "write e.g. `time=01:00:00` or `time=2-00:00:00`")),
            },
            "job-name" => self.slurm_job_name = Some((value, Some(location))),
            "output" | "error" => self.changed(
                location,
                option,
                "ignored",
                format!("Slurm option `{option}` was ignored: TACC keeps every node's log itself (see `tcloud logs`)"),
            ),
            _ => self.changed(location, option, "ignored", format!("Slurm option `{option}` is not supported and was ignored")),
        }
        Ok(())
    }

    fn set_gpus(&mut self, gpu_type: Option<String>, count: u32, location: Location) {
        self.spec.resources.gpus = count.into();
        self.spec.resources.gpu_type = gpu_type;
        self.reader
            .spans
            .record_location("resources.gpus", location);
        self.reader
            .spans
            .record_location("resources.gpu_type", location);
    }

    fn datasets(&mut self, value: &Node) -> Result<()> {
        let Node::Sequence(items) = value else {
            return Err(self.reader.error_at_node(
                value,
                "expected a list for `datasets`",
                "write e.g. `datasets: [mnist]`",
            ));
        };
        for (index, item) in items.iter().enumerate() {
            let path = format!("datasets.{index}");
            self.reader.spans.record(&path, None, item);
            let location = self.location(item);
            let (name, source, mount) = match item {
                Node::Scalar(written) => {
                    let source = written.as_str().to_string();
                    (source.clone(), source, None)
                }
                Node::Mapping(fields) => {
                    let mut name = None;
                    let mut source = None;
                    let mut mount = None;
                    for (field, node) in fields.iter() {
                        let field_path = format!("{path}.{}", field.as_str());
                        match field.as_str() {
                            "name" => {
                                name = Some(self.reader.text(node, &field_path, "name: mnist")?)
                            }
                            "url" | "source" | "path" => {
                                source = Some(self.reader.text(
                                    node,
                                    &field_path,
                                    "url: /shared/datasets/mnist",
                                )?)
                            }
                            "mount" => {
                                mount = Some(self.reader.text(
                                    node,
                                    &field_path,
                                    "mount: data/mnist",
                                )?)
                            }
                            other => {
                                let at = self.reader.spans.scalar_location(field);
                                self.warn(at, format!("unknown dataset key `{other}` was ignored"));
                            }
                        }
                    }
                    let Some(name) = name.or_else(|| source.clone()) else {
                        return Err(self.reader.error_at_node(
                            item,
                            "a dataset needs a `name` or a `url`",
                            "write e.g. `- name: mnist`",
                        ));
                    };
                    let source = source.unwrap_or_else(|| name.clone());
                    (name, source, mount)
                }
                Node::Sequence(_) => {
                    return Err(self.reader.error_at_node(
                        item,
                        "expected a dataset name, found a list",
                        "write e.g. `- mnist`",
                    ));
                }
            };
            let name = task_name_from(
                name.rsplit('/')
                    .find(|part| !part.is_empty())
                    .unwrap_or(&name),
            );
            let mount = match mount {
                Some(mount) => mount,
                None => {
                    let mount = format!("datasets/{name}");
                    self.warn(
                        location,
                        format!("dataset `{name}` is mounted at `{mount}` in the task's working directory (tuxiv.conf linked datasets into $TACC_USERDIR)"),
                    );
                    mount
                }
            };
            self.spec.datasets.push(DatasetSpec {
                name,
                source,
                mount,
            });
        }
        Ok(())
    }
}

/// `--nodes=2`, `nodes=2`, `-N 2` → (`nodes`, `2`), with short options spelled out.
fn split_slurm_option(option: &str) -> Option<(String, String)> {
    // tuxiv.conf wrote long options without their dashes (`nodes=2`); accept both spellings.
    let long = option.strip_prefix("--").unwrap_or(option);
    let (name, value) = if !long.starts_with('-') {
        let (name, value) = long.split_once('=').or_else(|| long.split_once(' '))?;
        (name.trim().to_string(), value.trim().to_string())
    } else {
        let short = option.strip_prefix('-')?;
        let mut chars = short.chars();
        let letter = chars.next()?;
        let rest = chars.as_str().trim_start_matches(['=', ' ']).trim();
        let long = match letter {
            'N' => "nodes",
            'n' => "ntasks",
            'c' => "cpus-per-task",
            'G' => "gpus",
            't' => "time",
            'J' => "job-name",
            'o' => "output",
            'e' => "error",
            'p' => "partition",
            _ => return None,
        };
        (long.to_string(), rest.to_string())
    };
    if value.is_empty() {
        None
    } else {
        Some((name, value))
    }
}

/// `1`, `v100:2`, or empty (one GPU) → (type, count).
fn parse_gpu_count(text: &str) -> Option<(Option<String>, u32)> {
    if text.is_empty() {
        return Some((None, 1));
    }
    match text.rsplit_once(':') {
        Some((gpu_type, count)) => Some((Some(gpu_type.to_string()), count.parse().ok()?)),
        None => match text.parse() {
            Ok(count) => Some((None, count)),
            Err(_) => Some((Some(text.to_string()), 1)),
        },
    }
}

/// Slurm's `--mem`: a number with an optional K/M/G/T suffix (binary); no suffix means MiB.
fn slurm_memory(text: &str) -> Option<ByteSize> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let number: u64 = text[..digits_end].parse().ok()?;
    let shift = match text[digits_end..].to_ascii_uppercase().as_str() {
        "K" | "KB" => 10,
        "" | "M" | "MB" => 20,
        "G" | "GB" => 30,
        "T" | "TB" => 40,
        _ => return None,
    };
    number.checked_mul(1 << shift).map(ByteSize::from_bytes)
}

/// Slurm's `--time`: `minutes`, `minutes:seconds`, `hours:minutes:seconds`, `days-hours`,
/// `days-hours:minutes` or `days-hours:minutes:seconds`.
fn slurm_time(text: &str) -> Option<u64> {
    let numbers =
        |part: &str| -> Option<Vec<u64>> { part.split(':').map(|n| n.parse().ok()).collect() };
    match text.split_once('-') {
        Some((days, rest)) => {
            let days: u64 = days.parse().ok()?;
            let clock = numbers(rest)?;
            let (hours, minutes, seconds) = match clock.as_slice() {
                [h] => (*h, 0, 0),
                [h, m] => (*h, *m, 0),
                [h, m, s] => (*h, *m, *s),
                _ => return None,
            };
            seconds_of(days, hours, minutes, seconds)
        }
        None => match numbers(text)?.as_slice() {
            [m] => seconds_of(0, 0, *m, 0),
            [m, s] => seconds_of(0, 0, *m, *s),
            [h, m, s] => seconds_of(0, *h, *m, *s),
            _ => None,
        },
    }
}

/// The total in seconds, or `None` past `u64` (the file's numbers are arbitrary).
fn seconds_of(days: u64, hours: u64, minutes: u64, seconds: u64) -> Option<u64> {
    days.checked_mul(86_400)?
        .checked_add(hours.checked_mul(3600)?)?
        .checked_add(minutes.checked_mul(60)?)?
        .checked_add(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_times_in_every_format() {
        for (text, secs) in [
            ("30", 1800),
            ("30:15", 1815),
            ("01:00:00", 3600),
            ("2-00:00:00", 172_800),
            ("1-12", 129_600),
            ("1-00:30", 88_200),
        ] {
            assert_eq!(slurm_time(text), Some(secs), "{text}");
        }
        for bad in [
            "",
            "1:2:3:4",
            "x",
            "1-",
            "UNLIMITED",
            "307445734561825861",
            "0-5124095576030432",
            "213503982334602-0",
            "1-0:0:18446744073709551615",
        ] {
            assert_eq!(slurm_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn slurm_memory_defaults_to_mebibytes() {
        assert_eq!(slurm_memory("16G"), Some(ByteSize::gib(16)));
        assert_eq!(slurm_memory("16000"), Some(ByteSize::mib(16000)));
        assert_eq!(slurm_memory("512k"), Some(ByteSize::from_bytes(512 << 10)));
        assert_eq!(slurm_memory("lots"), None);
        assert_eq!(slurm_memory("4Q"), None);
    }

    #[test]
    fn options_not_honoured_as_written_are_kept_as_changes() {
        let text = "entrypoint: python train.py\njob:\n  general: [nodes=1-2, cpus-per-task=2, time=unlimited, --exclusive]\n";
        let translated = translate("tuxiv.conf", text, "fallback").unwrap();
        let changes: Vec<(&str, &str)> = translated
            .changes
            .iter()
            .map(|c| (c.asked.as_str(), c.applied.as_str()))
            .collect();
        assert_eq!(
            changes,
            [
                ("nodes=1-2", "resources.nodes: 1"),
                ("time=unlimited", "no time limit"),
                ("--exclusive", "ignored"),
            ]
        );
        assert!(translated.changes.iter().all(|c| c.key == "job.general"));
        assert!(
            translated.changes[0].why.contains("tuxiv.conf:3:"),
            "{:?}",
            translated.changes[0]
        );
        // Each is warned of too; an option honoured as written is neither.
        assert_eq!(translated.warnings.len(), 3, "{:?}", translated.warnings);
    }

    #[test]
    fn slurm_options_in_long_and_short_form() {
        let split = |text| split_slurm_option(text);
        assert_eq!(split("nodes=2"), Some(("nodes".into(), "2".into())));
        assert_eq!(split("--nodes=2"), Some(("nodes".into(), "2".into())));
        assert_eq!(split("-N 2"), Some(("nodes".into(), "2".into())));
        assert_eq!(split("-c4"), Some(("cpus-per-task".into(), "4".into())));
        assert_eq!(split("--exclusive"), None);
        assert_eq!(parse_gpu_count(""), Some((None, 1)));
        assert_eq!(parse_gpu_count("2"), Some((None, 2)));
        assert_eq!(parse_gpu_count("v100:2"), Some((Some("v100".into()), 2)));
        assert_eq!(parse_gpu_count("v100:x"), None);
    }
}
