//! Task file text → [`TaskSpec`], strictly: every key known, every value of the right type,
//! every mistake reported at its line and column.
//!
//! The YAML is parsed by `marked-yaml`, which keeps a span on every node; we then walk the
//! node tree by hand rather than through serde, because serde's errors cannot tell us which
//! key was unknown or where a badly typed value sits.

use std::collections::BTreeMap;
use std::str::FromStr;

use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};
use marked_yaml::{LoadError, LoaderOptions, Node};
use tacc_core::{ByteSize, HumanDuration, Priority, RuntimeKind};
use yaml_rust2::Event as YamlEvent;

use crate::SchemaError;
use crate::error::{Diagnostic, Diagnostics};
use crate::processes::{MAX_PROCESSES_PER_NODE, Processes};
use crate::spans::{Location, Spans, yaml_lines};
use crate::spec::{
    CHECKPOINT_SIGNALS, CheckpointSpec, CodeSpec, CondaSpec, DatasetSpec, EnvironmentSpec,
    LABEL_HELP, PlacementSpec, ResourceSpec, RetryOn, RetrySpec, TaskSpec, placement_label_error,
};

type Result<T> = std::result::Result<T, SchemaError>;

pub(crate) const TASK_FIELDS: &[&str] = &[
    "name",
    "resources",
    "priority",
    "preemptible",
    "code",
    "environment",
    "datasets",
    "setup",
    "run",
    "outputs",
    "retry",
    "checkpoint",
    "runtime",
    "placement",
    "adaptive",
    "array",
    "notify",
    "sweep",
    "on_hang",
    "kind",
    "idle_timeout",
];
pub(crate) const SWEEP_FIELDS: &[&str] = &[
    "method",
    "parameters",
    "metric",
    "goal",
    "max_trials",
    "parallel",
    "seed",
    "asha",
];
pub(crate) const ASHA_FIELDS: &[&str] = &["min_steps", "reduction_factor", "max_steps"];
pub(crate) const RANGE_FIELDS: &[&str] = &["min", "max", "log"];
pub(crate) const NOTIFY_FIELDS: &[&str] = &["webhook", "secret"];
pub(crate) const RESOURCE_FIELDS: &[&str] = &[
    "nodes",
    "gpus",
    "gpu_type",
    "cpus",
    "memory",
    "time_limit",
    "disk",
    "processes",
];
pub(crate) const CODE_FIELDS: &[&str] = &["dir", "exclude"];
pub(crate) const ENVIRONMENT_FIELDS: &[&str] = &[
    "python",
    "pip",
    "requirements",
    "conda",
    "image",
    "vars",
    "secrets",
];
pub(crate) const CONDA_FIELDS: &[&str] = &["name", "channels", "dependencies"];
pub(crate) const DATASET_FIELDS: &[&str] = &["name", "source", "mount"];
pub(crate) const RETRY_FIELDS: &[&str] = &["max_attempts", "on"];
pub(crate) const CHECKPOINT_FIELDS: &[&str] = &["signal", "grace"];
pub(crate) const HANG_FIELDS: &[&str] = &["after", "then"];
pub(crate) const PLACEMENT_FIELDS: &[&str] = &["labels", "partition"];
pub(crate) const ADAPTIVE_FIELDS: &[&str] = &["cpus", "memory"];

/// Sections whose fields people often write one level too high (`gpus:` at the top).
const NESTED_SECTIONS: &[(&str, &[&str])] = &[
    ("resources", RESOURCE_FIELDS),
    ("environment", ENVIRONMENT_FIELDS),
    ("code", CODE_FIELDS),
    ("retry", RETRY_FIELDS),
    ("checkpoint", CHECKPOINT_FIELDS),
    ("on_hang", HANG_FIELDS),
    ("placement", PLACEMENT_FIELDS),
    ("notify", NOTIFY_FIELDS),
];

/// Names other tools use for our fields.
const ALIASES: &[(&str, &str)] = &[
    ("entrypoint", "run"),
    ("command", "run"),
    ("cmd", "run"),
    ("script", "run"),
    ("walltime", "time_limit"),
    ("time", "time_limit"),
    ("timeout", "time_limit"),
    ("mem", "memory"),
    ("disk_size", "disk"),
    ("env", "vars"),
    ("envs", "vars"),
    ("num_nodes", "nodes"),
    ("accelerators", "gpus"),
    ("workdir", "dir"),
    ("docker", "image"),
    ("container", "image"),
    ("file_mounts", "datasets"),
    ("node_selector", "labels"),
    ("nodeselector", "labels"),
    ("constraint", "labels"),
    ("queue", "partition"),
];

/// Parse YAML text into a node tree, turning the loader's errors into located diagnostics.
pub(crate) fn load_yaml(text: &str, spans: &Spans) -> Result<Node> {
    reject_second_document(text, spans)?;
    reject_deep_nesting(text, spans)?;
    let options = LoaderOptions::default()
        .error_on_duplicate_keys(true)
        // Keep `may_coerce` false for quoted scalars, so `"null"` stays text while `null` is null.
        .prevent_coercion(true);
    marked_yaml::parse_yaml_with_options(0, text, options).map_err(|error| {
        let at = |marker: &marked_yaml::Marker| spans.marker_position(marker);
        match error {
            LoadError::TopLevelMustBeMapping(marker) => spans.error_at_location(
                at(&marker),
                "a task file must be a mapping of fields",
                Some("start with fields such as `name: my-task` and `run: python train.py`".into()),
            ),
            LoadError::TopLevelMustBeSequence(marker) => {
                spans.error_at_location(at(&marker), "expected a list at the top level", None)
            }
            LoadError::UnexpectedAnchor(marker) => spans.error_at_location(
                at(&marker),
                "YAML anchors and aliases (`&name`, `*name`) are not supported in task files",
                Some("write the value out in full where it is used".into()),
            ),
            LoadError::UnexpectedTag(marker) => spans.error_at_location(
                at(&marker),
                "YAML tags (`!tag`) are not supported in task files",
                Some("remove the tag; write the value as plain text".into()),
            ),
            LoadError::MappingKeyMustBeScalar(marker) => spans.error_at_location(
                at(&marker),
                "a key must be plain text, not a list or mapping",
                Some("write keys as `name: value`".into()),
            ),
            LoadError::ScanError(marker, scan) => spans.error_at_location(
                at(&marker),
                format!("invalid YAML: {}", scan.info()),
                Some(
                    "check the indentation (spaces only) and that quotes and brackets are closed"
                        .into(),
                ),
            ),
            LoadError::DuplicateKey(duplicate) => {
                let first = spans.scalar_location(&duplicate.prev_key);
                spans.error_at_location(
                    spans.scalar_location(&duplicate.key),
                    format!("duplicate key `{}`", duplicate.key.as_str()),
                    Some(format!(
                        "`{}` is already set on line {}; keep only one of them",
                        duplicate.key.as_str(),
                        first.line
                    )),
                )
            }
        }
    })
}

/// marked-yaml reads only the first document of a stream and would silently drop the rest.
fn reject_second_document(text: &str, spans: &Spans) -> Result<()> {
    let mut seen_content = false;
    // Lines as the parser counts them: a `---` after a lone `\r` starts a document too.
    for (index, line) in yaml_lines(text).enumerate() {
        let is_separator = line == "---" || line.starts_with("--- ");
        if is_separator && seen_content {
            return Err(spans.error_at_location(
                Location {
                    line: index + 1,
                    column: 1,
                    width: 3,
                },
                "a task file holds one YAML document, but a second one starts here",
                Some("remove the `---` line and everything after it, or merge the two".into()),
            ));
        }
        let trimmed = line.trim();
        if !(trimmed.is_empty() || trimmed.starts_with('#') || is_separator) {
            seen_content = true;
        }
    }
    Ok(())
}

/// Far deeper than any task file needs: the deepest value, a `tuxiv.conf`'s `pip:` list
/// inside `environment.dependencies`, sits five levels down.
const MAX_NESTING: usize = 32;

/// The YAML parser builds nodes recursively, a few stack frames per level of block nesting,
/// so a few kilobytes of `- - - - …` overflowed the stack and aborted the process (it caps
/// flow nesting, `[[[…`, itself). Its events come out of an explicit state machine, so
/// walking them first is safe: refuse the document once it nests past [`MAX_NESTING`].
/// Syntax errors are left to the loader, which reports them the same way.
fn reject_deep_nesting(text: &str, spans: &Spans) -> Result<()> {
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    let mut depth = 0usize;
    while let Ok((event, marker)) = parser.next_token() {
        match event {
            YamlEvent::SequenceStart(..) | YamlEvent::MappingStart(..) => {
                depth += 1;
                if depth > MAX_NESTING {
                    let marker = marked_yaml::Marker::new(
                        0,
                        marker.index(),
                        marker.line(),
                        marker.col() + 1,
                    );
                    return Err(spans.error_at_location(
                        spans.marker_position(&marker),
                        format!("the task file nests lists and mappings more than {MAX_NESTING} levels deep"),
                        Some("a task file needs only a few levels; check the indentation and the `-` list markers".into()),
                    ));
                }
            }
            YamlEvent::SequenceEnd | YamlEvent::MappingEnd => depth = depth.saturating_sub(1),
            // Only the first document is loaded (a second one is refused before this).
            YamlEvent::DocumentEnd | YamlEvent::StreamEnd => break,
            _ => {}
        }
    }
    Ok(())
}

/// A plain `null`, `~` or nothing at all: the field is treated as not written.
pub(crate) fn is_null(node: &Node) -> bool {
    match node {
        Node::Scalar(scalar) => {
            scalar.may_coerce() && matches!(scalar.as_str(), "" | "~" | "null" | "Null" | "NULL")
        }
        _ => false,
    }
}

/// `datasets.0.mount` → `datasets[0].mount`, the way people read it.
pub(crate) fn display_path(path: &str) -> String {
    let mut shown = String::new();
    for segment in path.split('.') {
        if segment.chars().all(|c| c.is_ascii_digit()) && !shown.is_empty() {
            shown.push_str(&format!("[{segment}]"));
        } else {
            if !shown.is_empty() {
                shown.push('.');
            }
            shown.push_str(segment);
        }
    }
    shown
}

pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The candidate closest to `input`, when it is close enough to be a likely typo.
pub(crate) fn closest<'c>(input: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let input = input.to_ascii_lowercase();
    // Jaro-Winkler catches swapped letters and shared prefixes (`memroy`, `time`); the edit
    // distance catches dropped letters in short names (`mnt`), which Jaro-Winkler scores low.
    let plausible = |candidate: &str| {
        let edits = strsim::damerau_levenshtein(&input, candidate);
        strsim::jaro_winkler(&input, candidate) >= 0.8
            || (edits <= 2 && 2 * edits < candidate.len())
    };
    candidates
        .iter()
        .filter(|candidate| plausible(candidate))
        .map(|candidate| (strsim::jaro_winkler(&input, candidate), *candidate))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

fn describe_found(node: &Node) -> String {
    match node {
        Node::Scalar(scalar) => format!("`{}`", scalar.as_str()),
        Node::Mapping(_) => "a mapping".to_string(),
        Node::Sequence(_) => "a list".to_string(),
    }
}

/// The fields of one mapping in the file, already checked against the allowed names.
pub(crate) struct Fields<'n> {
    pub path: String,
    pub map: &'n MarkedMappingNode,
    pub key: Option<&'n MarkedScalarNode>,
}

impl<'n> Fields<'n> {
    /// The value of `key`, or `None` when it is missing or null.
    pub fn get(&self, key: &str) -> Option<&'n Node> {
        self.map.get_node(key).filter(|node| !is_null(node))
    }

    pub fn has(&self, key: &str) -> bool {
        self.map.get_node(key).is_some()
    }

    pub fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }
}

/// Walks the node tree, recording every field's location as it goes, and the mistakes it
/// could read past (an unknown field, a field's bad value) so that one run reports them all.
pub(crate) struct Reader<'s> {
    pub spans: &'s mut Spans,
    /// Mistakes read past so far; [`Reader::finish`] turns them into the error.
    found: Vec<Diagnostic>,
}

impl<'s> Reader<'s> {
    pub fn new(spans: &'s mut Spans) -> Self {
        Reader {
            spans,
            found: Vec::new(),
        }
    }

    /// Remember a mistake and read on.
    pub fn push(&mut self, error: SchemaError) {
        match error {
            SchemaError::Located(diagnostics) => self.found.extend(diagnostics.into_vec()),
            // The reader only makes located errors; anything else is kept at the file's start.
            other => self.found.push(Diagnostic {
                severity: crate::error::Severity::Error,
                message: other.to_string(),
                file: self.spans.source_name().to_string(),
                line: 1,
                column: 1,
                source_line: String::new(),
                underline: 1,
                help: None,
            }),
        }
    }

    /// The value of `result`, or `None` with its mistake remembered (the caller uses the
    /// field's default and reads on).
    pub fn keep<T>(&mut self, result: Result<T>) -> Option<T> {
        result.map_err(|error| self.push(error)).ok()
    }

    /// The mistakes read past, as one error in file order.
    pub fn finish(self) -> Result<()> {
        match Diagnostics::new(self.found) {
            Some(diagnostics) => Err(SchemaError::Located(diagnostics)),
            None => Ok(()),
        }
    }

    /// The mistakes read past, handed over (to be listed with later ones).
    pub fn take_found(&mut self) -> Vec<Diagnostic> {
        std::mem::take(&mut self.found)
    }

    pub fn error_at_node(
        &self,
        node: &Node,
        message: impl Into<String>,
        help: impl Into<String>,
    ) -> SchemaError {
        self.spans
            .error_at_location(self.spans.node_location(node), message, Some(help.into()))
    }

    /// Check `node` is a mapping whose keys are all in `allowed`, and record where each is.
    pub fn fields<'n>(
        &mut self,
        node: &'n Node,
        key: Option<&'n MarkedScalarNode>,
        path: &str,
        allowed: &[&str],
    ) -> Result<Fields<'n>> {
        let Node::Mapping(map) = node else {
            let shown = if path.is_empty() {
                "the task file".to_string()
            } else {
                format!("`{}`", display_path(path))
            };
            return Err(self.error_at_node(
                node,
                format!(
                    "expected a mapping of fields for {shown}, found {}",
                    describe_found(node)
                ),
                format!(
                    "write its fields indented below it, one per line; valid fields: {}",
                    allowed.join(", ")
                ),
            ));
        };
        for (field_key, value) in map.iter() {
            let name = field_key.as_str();
            if !allowed.contains(&name) {
                // Reported, and the rest of the mapping is still read.
                let error = self.unknown_field(field_key, path, allowed);
                self.push(error);
                continue;
            }
            self.spans.record(&join(path, name), Some(field_key), value);
        }
        Ok(Fields {
            path: path.to_string(),
            map,
            key,
        })
    }

    fn unknown_field(&self, key: &MarkedScalarNode, path: &str, allowed: &[&str]) -> SchemaError {
        let name = key.as_str();
        let within = if path.is_empty() {
            String::new()
        } else {
            format!(" in `{}`", display_path(path))
        };
        let valid = format!("Valid fields: {}", allowed.join(", "));
        let alias = ALIASES
            .iter()
            .find(|(other, _)| other.eq_ignore_ascii_case(name))
            .map(|(_, ours)| *ours)
            .filter(|ours| allowed.contains(ours));
        let misplaced = if path.is_empty() {
            NESTED_SECTIONS
                .iter()
                .find(|(_, fields)| fields.contains(&name))
                .map(|(section, _)| *section)
        } else {
            None
        };
        let help = if let Some(suggestion) = alias.or_else(|| closest(name, allowed)) {
            format!("did you mean `{suggestion}`? {valid}")
        } else if let Some(section) = misplaced {
            format!("`{name}` belongs under `{section}:`, indented. {valid}")
        } else {
            valid
        };
        self.spans.error_at_location(
            self.spans.scalar_location(key),
            format!("unknown field `{name}`{within}"),
            Some(help),
        )
    }

    pub(crate) fn missing(&self, fields: &Fields<'_>, name: &str, example: &str) -> SchemaError {
        let location = match fields.key {
            Some(key) => self.spans.scalar_location(key),
            None => self.spans.location(&fields.path).unwrap_or(Location {
                line: 1,
                column: 1,
                width: 1,
            }),
        };
        let within = if fields.path.is_empty() {
            String::new()
        } else {
            format!(" in `{}`", display_path(&fields.path))
        };
        self.spans.error_at_location(
            location,
            format!("missing field `{name}`{within}"),
            Some(format!("add `{example}`")),
        )
    }

    fn scalar<'n>(
        &self,
        node: &'n Node,
        path: &str,
        expected: &str,
        example: &str,
    ) -> Result<&'n MarkedScalarNode> {
        match node {
            Node::Scalar(scalar) => Ok(scalar),
            other => Err(self.error_at_node(
                other,
                format!(
                    "expected {expected} for `{}`, found {}",
                    display_path(path),
                    describe_found(other)
                ),
                format!("write e.g. `{example}`"),
            )),
        }
    }

    pub fn text(&self, node: &Node, path: &str, example: &str) -> Result<String> {
        Ok(self
            .scalar(node, path, "text", example)?
            .as_str()
            .to_string())
    }

    /// Whole GPUs (`gpus: 2`) or a share of one GPU in hundredths (`gpus: 0.5`).
    pub fn gpus(&self, node: &Node, path: &str) -> Result<tacc_core::GpuCount> {
        let scalar = self.scalar(node, path, "a number of GPUs", "gpus: 1")?;
        tacc_core::GpuCount::parse(scalar.as_str()).map_err(|e| {
            self.error_at_node(
                node,
                format!("`{}`: {e}", display_path(path)),
                e.help().to_string(),
            )
        })
    }

    pub fn count(&self, node: &Node, path: &str, example: &str) -> Result<u32> {
        let scalar = self.scalar(node, path, "a whole number", example)?;
        let text = scalar.as_str().trim().replace('_', "");
        let shown = display_path(path);
        if let Some(rest) = text.strip_prefix('-')
            && rest.parse::<u64>().is_ok()
        {
            return Err(self.error_at_node(
                node,
                format!("`{shown}` cannot be negative, found `{}`", scalar.as_str()),
                format!("write e.g. `{example}`"),
            ));
        }
        let value: u64 = text.parse().map_err(|_| {
            self.error_at_node(
                node,
                format!(
                    "expected a whole number for `{shown}`, found `{}`",
                    scalar.as_str()
                ),
                format!("write e.g. `{example}`"),
            )
        })?;
        u32::try_from(value).map_err(|_| {
            self.error_at_node(
                node,
                format!("`{shown}` is far too large, found `{}`", scalar.as_str()),
                format!("write e.g. `{example}`"),
            )
        })
    }

    pub fn number(&self, node: &Node, path: &str, example: &str) -> Result<f64> {
        let scalar = self.scalar(node, path, "a number", example)?;
        scalar
            .as_str()
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|value| value.is_finite())
            .ok_or_else(|| {
                self.error_at_node(
                    node,
                    format!(
                        "expected a number for `{}`, found `{}`",
                        display_path(path),
                        scalar.as_str()
                    ),
                    format!("write e.g. `{example}`"),
                )
            })
    }

    pub fn flag(&self, node: &Node, path: &str) -> Result<bool> {
        let field = path.rsplit('.').next().unwrap_or(path);
        let example = format!("{field}: true");
        let scalar = self.scalar(node, path, "true or false", &example)?;
        match scalar.as_str() {
            "true" | "True" | "TRUE" => Ok(true),
            "false" | "False" | "FALSE" => Ok(false),
            other => Err(self.error_at_node(
                node,
                format!(
                    "expected true or false for `{}`, found `{other}`",
                    display_path(path)
                ),
                format!("write `{field}: true` or `{field}: false`"),
            )),
        }
    }

    pub fn duration(&self, node: &Node, path: &str, example: &str) -> Result<HumanDuration> {
        let scalar = self.scalar(node, path, "a duration", example)?;
        HumanDuration::from_str(scalar.as_str()).map_err(|error| {
            self.error_at_node(
                node,
                format!("bad duration for `{}`: {error}", display_path(path)),
                format!("write a number and a unit (s, m, h, d), e.g. `{example}`"),
            )
        })
    }

    pub fn size(&self, node: &Node, path: &str, example: &str) -> Result<ByteSize> {
        let scalar = self.scalar(node, path, "a size", example)?;
        ByteSize::from_str(scalar.as_str()).map_err(|error| {
            self.error_at_node(
                node,
                format!("bad size for `{}`: {error}", display_path(path)),
                format!("write a number and a unit (MiB, GiB, TiB), e.g. `{example}`"),
            )
        })
    }

    /// A list of text items, each located at `path.N`.
    pub fn texts(&mut self, node: &Node, path: &str, example: &str) -> Result<Vec<String>> {
        let Node::Sequence(items) = node else {
            return Err(self.error_at_node(
                node,
                format!(
                    "expected a list for `{}`, found {}",
                    display_path(path),
                    describe_found(node)
                ),
                format!("write a list, e.g. `{example}`"),
            ));
        };
        let mut values = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let item_path = join(path, &index.to_string());
            self.spans.record(&item_path, None, item);
            values.push(self.text(item, &item_path, example)?);
        }
        Ok(values)
    }

    /// `resources.processes`: `per_node`, `per_gpu` or a number of processes.
    pub fn processes(&self, node: &Node) -> Result<Processes> {
        const PATH: &str = "resources.processes";
        let scalar = self.scalar(
            node,
            PATH,
            "`per_node`, `per_gpu` or a number",
            "processes: per_gpu",
        )?;
        if scalar
            .as_str()
            .trim()
            .starts_with(|c: char| c.is_ascii_digit() || c == '-')
        {
            let count = self.count(node, PATH, "processes: 4")?;
            if count == 0 || count > MAX_PROCESSES_PER_NODE {
                return Err(self.error_at_node(
                    node,
                    format!(
                        "`processes` must be between 1 and {MAX_PROCESSES_PER_NODE}, found {count}"
                    ),
                    "write the processes each node starts, e.g. `processes: 4` or `processes: per_gpu`"
                        .to_string(),
                ));
            }
            return Ok(Processes::Count(count));
        }
        self.choice(
            node,
            PATH,
            "process layout",
            &[
                ("per_node", Processes::PerNode),
                ("per_gpu", Processes::PerGpu),
            ],
        )
    }

    /// One of a fixed set of names, with a did-you-mean when it is close to one.
    pub fn choice<T: Copy>(
        &self,
        node: &Node,
        path: &str,
        what: &str,
        options: &[(&str, T)],
    ) -> Result<T> {
        let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
        let field = path.rsplit('.').next().unwrap_or(path);
        let example = format!("{field}: {}", names[0]);
        let scalar = self.scalar(node, path, what, &example)?;
        let input = scalar.as_str();
        if let Some((_, value)) = options.iter().find(|(name, _)| *name == input) {
            return Ok(*value);
        }
        let valid = format!("valid values: {}", names.join(", "));
        let help = match closest(input, &names) {
            Some(suggestion) => format!("did you mean `{suggestion}`? {valid}"),
            None => valid,
        };
        Err(self.error_at_node(node, format!("unknown {what} `{input}`"), help))
    }
}

/// Build the spec from a parsed task file. `fallback_name` is used when `name` is left out.
///
/// Every field is read on its own: a field whose value is wrong is reported and its default
/// stands in, so the checks after it still run and one error lists every mistake of the
/// file, in file order.
pub(crate) fn read_task(root: &Node, spans: &mut Spans, fallback_name: &str) -> Result<TaskSpec> {
    let mut reader = Reader::new(spans);
    let top = reader.fields(root, None, "", TASK_FIELDS)?;

    // Read one field: its value, or `default` with the mistake remembered.
    macro_rules! field {
        ($key:literal, $default:expr, |$node:ident| $read:expr) => {
            match top.get($key) {
                Some($node) => {
                    let read = $read;
                    reader.keep(read).unwrap_or_else(|| $default)
                }
                None => $default,
            }
        };
    }

    let name = field!("name", fallback_name.to_string(), |node| reader.text(
        node,
        "name",
        "name: mnist-ddp"
    ));
    let resources = field!("resources", ResourceSpec::default(), |node| {
        read_resources(&mut reader, node, top.map_key("resources"))
    });
    let priority = field!("priority", Priority::default(), |node| reader.choice(
        node,
        "priority",
        "priority",
        &[
            ("low", Priority::Low),
            ("normal", Priority::Normal),
            ("high", Priority::High),
        ],
    ));
    let preemptible = field!("preemptible", false, |node| reader
        .flag(node, "preemptible"));
    let code = field!("code", CodeSpec::default(), |node| {
        read_code(&mut reader, node, top.map_key("code"))
    });
    let environment = field!("environment", EnvironmentSpec::default(), |node| {
        read_environment(&mut reader, node, top.map_key("environment"))
    });
    let datasets = field!("datasets", Vec::new(), |node| read_datasets(
        &mut reader,
        node
    ));
    let setup = field!("setup", None, |node| reader
        .text(node, "setup", "setup: pip list")
        .map(Some));
    let kind = field!("kind", crate::TaskKind::Batch, |node| reader.choice(
        node,
        "kind",
        "task kind",
        &[
            ("batch", crate::TaskKind::Batch),
            ("interactive", crate::TaskKind::Interactive),
        ],
    ));
    let idle_timeout = field!("idle_timeout", None, |node| reader
        .duration(node, "idle_timeout", "idle_timeout: 2h")
        .map(Some));
    let run = match top.get("run") {
        Some(node) => {
            let read = reader.text(node, "run", "run: python train.py");
            reader.keep(read).unwrap_or_default()
        }
        None if top.has("run") => String::new(),
        // A dev session without a command of its own holds its allocation.
        None if kind == crate::TaskKind::Interactive => crate::DEV_HOLDER.to_string(),
        None => {
            let error = reader.spans.error_at(
                "run",
                "missing required field `run`",
                Some("add the command every node runs, e.g. `run: python train.py`".into()),
            );
            reader.push(error);
            String::new()
        }
    };
    let outputs = field!("outputs", Vec::new(), |node| reader.texts(
        node,
        "outputs",
        "outputs: [checkpoints/, results/]"
    ));
    let retry = field!("retry", RetrySpec::default(), |node| {
        read_retry(&mut reader, node, top.map_key("retry"))
    });
    let checkpoint = field!("checkpoint", None, |node| read_checkpoint(
        &mut reader,
        node,
        top.map_key("checkpoint")
    )
    .map(Some));
    let runtime = field!("runtime", None, |node| reader.choice(
        node,
        "runtime",
        "runtime",
        &[
            ("auto", None),
            ("process", Some(RuntimeKind::Process)),
            ("container", Some(RuntimeKind::Container)),
            ("slurm", Some(RuntimeKind::Slurm)),
        ],
    ));
    let placement = field!("placement", PlacementSpec::default(), |node| {
        read_placement(&mut reader, node, top.map_key("placement"))
    });
    let adaptive = field!("adaptive", None, |node| read_adaptive(
        &mut reader,
        node,
        top.map_key("adaptive")
    )
    .map(Some));
    let array = field!("array", None, |node| reader
        .text(node, "array", "array: 0-999")
        .and_then(|written| written
            .parse::<crate::ArraySpec>()
            .map(Some)
            .map_err(|e| reader.error_at_node(node, e.message, e.help))));
    let notify = field!("notify", None, |node| read_notify(
        &mut reader,
        node,
        top.map_key("notify")
    )
    .map(Some));
    let sweep = field!("sweep", None, |node| read_sweep(
        &mut reader,
        node,
        top.map_key("sweep")
    )
    .map(Some));
    let on_hang = field!("on_hang", None, |node| read_on_hang(
        &mut reader,
        node,
        top.map_key("on_hang")
    )
    .map(Some));
    if let (Some(_), Some(node)) = (&sweep, top.get("array")) {
        let error = reader.error_at_node(
            node,
            "a task is an array or a sweep, not both",
            "remove `array:`; every trial of a sweep gets its own parameters instead",
        );
        reader.push(error);
    }

    let spec = TaskSpec {
        sweep,
        adaptive,
        name,
        resources,
        priority,
        preemptible,
        code,
        environment,
        datasets,
        setup,
        run,
        outputs,
        retry,
        checkpoint,
        runtime,
        placement,
        array,
        notify,
        on_hang,
        kind,
        idle_timeout,
    };
    let found = reader.take_found();
    match reader.spans.located_problems(spec.problems(), found) {
        Some(error) => Err(error),
        None => Ok(spec),
    }
}

impl<'n> Fields<'n> {
    /// The key node of a field, used to point at `resources:` when the whole section is wrong.
    pub(crate) fn map_key(&self, key: &str) -> Option<&'n MarkedScalarNode> {
        self.map.keys().find(|candidate| candidate.as_str() == key)
    }
}

fn read_resources<'n>(
    reader: &mut Reader<'_>,
    node: &'n Node,
    key: Option<&'n MarkedScalarNode>,
) -> Result<ResourceSpec> {
    let fields = reader.fields(node, key, "resources", RESOURCE_FIELDS)?;
    let mut resources = ResourceSpec::default();
    // Each field on its own: a bad one is reported and keeps its default.
    if let Some(node) = fields.get("nodes") {
        let read = reader.count(node, "resources.nodes", "nodes: 2");
        resources.nodes = reader.keep(read).unwrap_or(resources.nodes);
    }
    if let Some(node) = fields.get("gpus") {
        let read = reader.gpus(node, "resources.gpus");
        resources.gpus = reader.keep(read).unwrap_or(resources.gpus);
    }
    if let Some(node) = fields.get("gpu_type") {
        let read = reader.text(node, "resources.gpu_type", "gpu_type: A100");
        resources.gpu_type = reader.keep(read);
    }
    if let Some(node) = fields.get("cpus") {
        let read = reader.number(node, "resources.cpus", "cpus: 16");
        resources.cpus = reader.keep(read).unwrap_or(resources.cpus);
    }
    if let Some(node) = fields.get("memory") {
        let read = reader.size(node, "resources.memory", "memory: 64GiB");
        resources.memory = reader.keep(read).unwrap_or(resources.memory);
    }
    if let Some(node) = fields.get("time_limit") {
        let read = reader.duration(node, "resources.time_limit", "time_limit: 4h");
        resources.time_limit = reader.keep(read);
    }
    if let Some(node) = fields.get("disk") {
        resources.disk = Some(reader.size(node, "resources.disk", "disk: 10GiB")?);
    }
    if let Some(node) = fields.get("processes") {
        let read = reader.processes(node);
        resources.processes = reader.keep(read).unwrap_or(resources.processes);
    }
    Ok(resources)
}

fn read_code<'n>(
    reader: &mut Reader<'_>,
    node: &'n Node,
    key: Option<&'n MarkedScalarNode>,
) -> Result<CodeSpec> {
    let fields = reader.fields(node, key, "code", CODE_FIELDS)?;
    let mut code = CodeSpec::default();
    if let Some(node) = fields.get("dir") {
        code.dir = reader.text(node, "code.dir", "dir: .")?;
    }
    if let Some(node) = fields.get("exclude") {
        code.exclude = reader.texts(node, "code.exclude", "exclude: [\"data/\", \"*.ckpt\"]")?;
    }
    Ok(code)
}

fn read_environment<'n>(
    reader: &mut Reader<'_>,
    node: &'n Node,
    key: Option<&'n MarkedScalarNode>,
) -> Result<EnvironmentSpec> {
    let fields = reader.fields(node, key, "environment", ENVIRONMENT_FIELDS)?;
    let mut environment = EnvironmentSpec::default();
    if let Some(node) = fields.get("python") {
        environment.python = Some(reader.text(node, "environment.python", "python: \"3.11\"")?);
    }
    if let Some(node) = fields.get("pip") {
        environment.pip = reader.texts(node, "environment.pip", "pip: [\"numpy==2.1.*\"]")?;
    }
    if let Some(node) = fields.get("requirements") {
        environment.requirements = Some(reader.text(
            node,
            "environment.requirements",
            "requirements: requirements.txt",
        )?);
    }
    if let Some(node) = fields.get("conda") {
        let conda = reader.fields(
            node,
            fields.map_key("conda"),
            "environment.conda",
            CONDA_FIELDS,
        )?;
        let mut spec = CondaSpec::default();
        if let Some(node) = conda.get("name") {
            spec.name = Some(reader.text(node, "environment.conda.name", "name: torch-env")?);
        }
        if let Some(node) = conda.get("channels") {
            spec.channels = reader.texts(
                node,
                "environment.conda.channels",
                "channels: [conda-forge]",
            )?;
        }
        if let Some(node) = conda.get("dependencies") {
            spec.dependencies = reader.texts(
                node,
                "environment.conda.dependencies",
                "dependencies: [\"pytorch=2.4\"]",
            )?;
        }
        environment.conda = Some(spec);
    }
    if let Some(node) = fields.get("image") {
        environment.image = Some(reader.text(node, "environment.image", "image: python:3.11")?);
    }
    if let Some(node) = fields.get("vars") {
        environment.vars = read_vars(reader, node)?;
    }
    if let Some(node) = fields.get("secrets") {
        environment.secrets =
            reader.texts(node, "environment.secrets", "secrets: [WANDB_API_KEY]")?;
    }
    Ok(environment)
}

fn read_vars(reader: &mut Reader<'_>, node: &Node) -> Result<BTreeMap<String, String>> {
    let Node::Mapping(map) = node else {
        return Err(reader.error_at_node(
            node,
            format!(
                "expected a mapping of variable names to values for `environment.vars`, found {}",
                describe_found(node)
            ),
            "write e.g. `vars: { OMP_NUM_THREADS: \"4\" }`",
        ));
    };
    let mut vars = BTreeMap::new();
    for (key, value) in map.iter() {
        let path = format!("environment.vars.{}", key.as_str());
        // Errors about a variable are about its name, so point at the key.
        reader.spans.record_key(&path, key);
        let value = if is_null(value) {
            String::new()
        } else {
            reader.text(value, &path, "OMP_NUM_THREADS: \"4\"")?
        };
        vars.insert(key.as_str().to_string(), value);
    }
    Ok(vars)
}

fn read_placement<'n>(
    reader: &mut Reader<'_>,
    node: &'n Node,
    key: Option<&'n MarkedScalarNode>,
) -> Result<PlacementSpec> {
    let fields = reader.fields(node, key, "placement", PLACEMENT_FIELDS)?;
    let mut placement = PlacementSpec::default();
    if let Some(node) = fields.get("labels") {
        placement.labels = read_labels(reader, node)?;
    }
    if let Some(node) = fields.get("partition") {
        placement.partition = Some(reader.text(node, "placement.partition", "partition: debug")?);
    }
    Ok(placement)
}

/// `placement.labels`: each pair checked here, where the key and the value each have a
/// place in the file to point at.
fn read_labels(reader: &mut Reader<'_>, node: &Node) -> Result<BTreeMap<String, String>> {
    let Node::Mapping(map) = node else {
        return Err(reader.error_at_node(
            node,
            format!(
                "expected a mapping of label names to values for `placement.labels`, found {}",
                describe_found(node)
            ),
            "write e.g. `labels: {gpu-gen: hopper}`",
        ));
    };
    let mut labels = BTreeMap::new();
    for (key, value) in map.iter() {
        let path = format!("placement.labels.{}", key.as_str());
        reader.spans.record_key(&path, key);
        if is_null(value) {
            return Err(reader.spans.error_at_location(
                reader.spans.scalar_location(key),
                format!("label `{}` has no value", key.as_str()),
                Some(format!(
                    "write the value the node carries, e.g. `{}: hopper`",
                    key.as_str()
                )),
            ));
        }
        let text = reader.text(value, &path, "gpu-gen: hopper")?;
        if let Some((message, about_key)) = placement_label_error(key.as_str(), &text) {
            let location = if about_key {
                reader.spans.scalar_location(key)
            } else {
                reader.spans.node_location(value)
            };
            return Err(reader.spans.error_at_location(
                location,
                message,
                Some(LABEL_HELP.to_string()),
            ));
        }
        labels.insert(key.as_str().to_string(), text);
    }
    Ok(labels)
}

fn read_datasets(reader: &mut Reader<'_>, node: &Node) -> Result<Vec<DatasetSpec>> {
    let Node::Sequence(items) = node else {
        return Err(reader.error_at_node(
            node,
            format!("expected a list of datasets, found {}", describe_found(node)),
            "write e.g. `datasets: [{ name: mnist, source: /shared/datasets/mnist, mount: data/mnist }]`",
        ));
    };
    let mut datasets = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let path = format!("datasets.{index}");
        reader.spans.record(&path, None, item);
        let fields = reader.fields(item, None, &path, DATASET_FIELDS)?;
        let name = match fields.get("name") {
            Some(node) => reader.text(node, &fields.path_of("name"), "name: mnist")?,
            None => return Err(reader.missing(&fields, "name", "name: mnist")),
        };
        let source = match fields.get("source") {
            Some(node) => reader.text(
                node,
                &fields.path_of("source"),
                "source: /shared/datasets/mnist",
            )?,
            None => {
                return Err(reader.missing(&fields, "source", "source: /shared/datasets/mnist"));
            }
        };
        let mount = match fields.get("mount") {
            Some(node) => reader.text(node, &fields.path_of("mount"), "mount: data/mnist")?,
            None => name.clone(),
        };
        datasets.push(DatasetSpec {
            name,
            source,
            mount,
        });
    }
    Ok(datasets)
}

fn read_retry<'n>(
    reader: &mut Reader<'_>,
    node: &'n Node,
    key: Option<&'n MarkedScalarNode>,
) -> Result<RetrySpec> {
    let fields = reader.fields(node, key, "retry", RETRY_FIELDS)?;
    let mut retry = RetrySpec::default();
    if let Some(node) = fields.get("max_attempts") {
        retry.max_attempts = reader.count(node, "retry.max_attempts", "max_attempts: 3")?;
    }
    if let Some(node) = fields.get("on") {
        let Node::Sequence(items) = node else {
            return Err(reader.error_at_node(
                node,
                format!(
                    "expected a list for `retry.on`, found {}",
                    describe_found(node)
                ),
                "write e.g. `on: [node_failure, preempted]`",
            ));
        };
        let options = RetryOn::ALL.map(|reason| (reason.as_str(), reason));
        let mut reasons = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let path = format!("retry.on.{index}");
            reader.spans.record(&path, None, item);
            let reason = reader.choice(item, &path, "retry reason", &options)?;
            // Listing a reason twice means the same as once.
            if !reasons.contains(&reason) {
                reasons.push(reason);
            }
        }
        retry.on = reasons;
    }
    Ok(retry)
}

fn read_adaptive<'n>(
    reader: &mut Reader<'_>,
    node: &'n Node,
    key: Option<&'n MarkedScalarNode>,
) -> Result<crate::AdaptiveSpec> {
    let fields = reader.fields(node, key, "adaptive", ADAPTIVE_FIELDS)?;
    let mut adaptive = crate::AdaptiveSpec::default();
    if let Some(node) = fields.get("cpus") {
        let text = reader.text(node, "adaptive.cpus", "cpus: 2..8")?;
        adaptive.cpus = Some(text.parse().map_err(|e: String| {
            reader.error_at_node(
                node,
                format!("`adaptive.cpus` must be a range of CPUs: {e}"),
                "write `MIN..MAX` CPUs per node, e.g. `cpus: 2..8`",
            )
        })?);
    }
    if let Some(node) = fields.get("memory") {
        let text = reader.text(node, "adaptive.memory", "memory: 8GiB..32GiB")?;
        adaptive.memory = Some(text.parse().map_err(|e: String| {
            reader.error_at_node(
                node,
                format!("`adaptive.memory` must be a range of sizes: {e}"),
                "write `MIN..MAX` per node, e.g. `memory: 8GiB..32GiB`",
            )
        })?);
    }
    Ok(adaptive)
}

fn read_checkpoint<'n>(
    reader: &mut Reader<'_>,
    node: &'n Node,
    key: Option<&'n MarkedScalarNode>,
) -> Result<CheckpointSpec> {
    let fields = reader.fields(node, key, "checkpoint", CHECKPOINT_FIELDS)?;
    let mut checkpoint = CheckpointSpec::default();
    if let Some(node) = fields.get("signal") {
        let written = reader.text(node, "checkpoint.signal", "signal: SIGUSR1")?;
        checkpoint.signal = canonical_signal(&written);
        if !CHECKPOINT_SIGNALS.contains(&checkpoint.signal.as_str()) {
            let valid = format!("valid signals: {}", CHECKPOINT_SIGNALS.join(", "));
            let help = match closest(&checkpoint.signal, CHECKPOINT_SIGNALS) {
                Some(suggestion) => format!("did you mean `{suggestion}`? {valid}"),
                None => valid,
            };
            return Err(reader.error_at_node(node, format!("unknown signal `{written}`"), help));
        }
    }
    if let Some(node) = fields.get("grace") {
        checkpoint.grace = reader.duration(node, "checkpoint.grace", "grace: 60s")?;
    }
    Ok(checkpoint)
}

fn read_on_hang<'n>(
    reader: &mut Reader<'_>,
    node: &'n Node,
    key: Option<&'n MarkedScalarNode>,
) -> Result<crate::HangSpec> {
    use crate::{HangAction, HangSpec};
    if let Node::Scalar(scalar) = node
        && scalar.as_str() == "off"
    {
        return Ok(HangSpec {
            after: None,
            then: HangAction::Fail,
        });
    }
    let fields = reader.fields(node, key, "on_hang", HANG_FIELDS)?;
    let after = match fields.get("after") {
        Some(node) => {
            let after = reader.duration(node, "on_hang.after", "after: 10m")?;
            if after.as_secs() < 1 {
                return Err(reader.error_at_node(
                    node,
                    "`on_hang.after` must be at least 1s",
                    "give the silence that means hung, e.g. `after: 10m`; `on_hang: off` never ends the task",
                ));
            }
            Some(after)
        }
        None => return Err(reader.missing(&fields, "after", "after: 10m")),
    };
    let then = match fields.get("then") {
        Some(node) => reader.choice(
            node,
            "on_hang.then",
            "hang action",
            &[("fail", HangAction::Fail), ("retry", HangAction::Retry)],
        )?,
        None => HangAction::Fail,
    };
    Ok(HangSpec { after, then })
}

pub(crate) fn read_notify<'n>(
    reader: &mut Reader<'_>,
    node: &'n Node,
    key: Option<&'n MarkedScalarNode>,
) -> Result<crate::NotifySpec> {
    let fields = reader.fields(node, key, "notify", NOTIFY_FIELDS)?;
    let webhook = match fields.get("webhook") {
        Some(node) => reader.text(
            node,
            "notify.webhook",
            "webhook: https://hooks.example.com/tacc",
        )?,
        None => {
            return Err(reader.missing(
                &fields,
                "webhook",
                "webhook: https://hooks.example.com/tacc",
            ));
        }
    };
    let secret = match fields.get("secret") {
        Some(node) => reader.text(node, "notify.secret", "secret: HOOK_KEY")?,
        None => return Err(reader.missing(&fields, "secret", "secret: HOOK_KEY")),
    };
    Ok(crate::NotifySpec { webhook, secret })
}

fn read_sweep<'n>(
    reader: &mut Reader<'_>,
    node: &'n Node,
    key: Option<&'n MarkedScalarNode>,
) -> Result<crate::SweepSpec> {
    use crate::{AshaSpec, Goal, ParameterSpec, SweepMethod};
    let fields = reader.fields(node, key, "sweep", SWEEP_FIELDS)?;
    let method = match fields.get("method") {
        Some(node) => reader.choice(
            node,
            "sweep.method",
            "sweep method",
            &[
                ("grid", SweepMethod::Grid),
                ("random", SweepMethod::Random),
                ("asha", SweepMethod::Asha),
            ],
        )?,
        None => return Err(reader.missing(&fields, "method", "method: grid")),
    };
    let mut parameters = std::collections::BTreeMap::new();
    match fields.get("parameters") {
        Some(Node::Mapping(map)) => {
            for (name_node, value) in map.iter() {
                let name = name_node.as_str().to_string();
                let path = join("sweep.parameters", &name);
                reader.spans.record(&path, Some(name_node), value);
                let parameter = match value {
                    Node::Sequence(_) => {
                        ParameterSpec::Values(reader.texts(value, &path, "lr: [0.1, 0.01]")?)
                    }
                    Node::Mapping(_) => {
                        let range = reader.fields(value, Some(name_node), &path, RANGE_FIELDS)?;
                        let example = "{min: 0.0001, max: 0.1, log: true}";
                        let bound = |reader: &Reader<'_>, field: &str| match range.get(field) {
                            Some(node) => reader.number(node, &join(&path, field), example),
                            None => Err(reader.missing(&range, field, example)),
                        };
                        let min = bound(reader, "min")?;
                        let max = bound(reader, "max")?;
                        let log = match range.get("log") {
                            Some(node) => reader.flag(node, &join(&path, "log"))?,
                            None => false,
                        };
                        ParameterSpec::Range { min, max, log }
                    }
                    other => {
                        return Err(reader.error_at_node(
                            other,
                            format!("expected a list of values or a range for parameter `{name}`"),
                            format!("write e.g. `{name}: [0.1, 0.01]` or `{name}: {{min: 0.0001, max: 0.1, log: true}}`"),
                        ));
                    }
                };
                parameters.insert(name, parameter);
            }
        }
        Some(other) => {
            return Err(reader.error_at_node(
                other,
                "expected a mapping of parameter names to their values for `sweep.parameters`",
                "write e.g. `parameters: {lr: [0.1, 0.01], batch: [32, 64]}`",
            ));
        }
        None => return Err(reader.missing(&fields, "parameters", "parameters: {lr: [0.1, 0.01]}")),
    }
    let metric = match fields.get("metric") {
        Some(node) => reader.text(node, "sweep.metric", "metric: val_loss")?,
        None => return Err(reader.missing(&fields, "metric", "metric: val_loss")),
    };
    let goal = match fields.get("goal") {
        Some(node) => reader.choice(
            node,
            "sweep.goal",
            "goal",
            &[("minimize", Goal::Minimize), ("maximize", Goal::Maximize)],
        )?,
        None => Goal::Minimize,
    };
    let asha = match fields.get("asha") {
        Some(node) => {
            let asha = reader.fields(node, fields.map_key("asha"), "sweep.asha", ASHA_FIELDS)?;
            let example = "asha: {min_steps: 10, reduction_factor: 3, max_steps: 270}";
            let steps = |reader: &Reader<'_>, field: &str| match asha.get(field) {
                Some(node) => reader
                    .count(node, &join("sweep.asha", field), example)
                    .map(u64::from),
                None => Err(reader.missing(&asha, field, example)),
            };
            let min_steps = steps(reader, "min_steps")?;
            let max_steps = steps(reader, "max_steps")?;
            let reduction_factor = match asha.get("reduction_factor") {
                Some(node) => reader.count(node, "sweep.asha.reduction_factor", example)?,
                None => 3,
            };
            Some(AshaSpec {
                min_steps,
                reduction_factor,
                max_steps,
            })
        }
        None => None,
    };
    let mut spec = crate::SweepSpec {
        method,
        parameters,
        metric,
        goal,
        max_trials: 0,
        parallel: 4,
        seed: 0,
        asha,
    };
    spec.max_trials = match fields.get("max_trials") {
        Some(node) => reader.count(node, "sweep.max_trials", "max_trials: 20")?,
        None => match spec.grid_size() {
            Some(size) => size.min(u64::from(crate::MAX_SWEEP_TRIALS)) as u32,
            // A grid over a range: the check of the spec says what is wrong with it.
            None if method == SweepMethod::Grid => 1,
            None => return Err(reader.missing(&fields, "max_trials", "max_trials: 20")),
        },
    };
    if let Some(node) = fields.get("parallel") {
        spec.parallel = reader.count(node, "sweep.parallel", "parallel: 4")?;
    }
    if let Some(node) = fields.get("seed") {
        spec.seed = u64::from(reader.count(node, "sweep.seed", "seed: 42")?);
    }
    Ok(spec)
}

/// `usr1`, `SIGusr1` and `SIGUSR1` all mean the same signal; store the last form.
pub(crate) fn canonical_signal(written: &str) -> String {
    let upper = written.trim().to_ascii_uppercase();
    if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    }
}
