//! Pipeline files: one YAML file with a `name:` and an ordered map of `stages:`, each a
//! task spec of its own (resources, environment, code, run, outputs, array …) plus
//! `needs: [stage, …]`. Each stage is read by the task reader with its own spans, so a
//! mistake inside a stage is reported at its place in the file; the graph (unknown needs,
//! cycles, duplicates, no stages) is checked here, located when there is a file and by
//! field when the pipeline arrived as JSON.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

use marked_yaml::types::{MarkedScalarNode, Node};
use serde::{Deserialize, Serialize};

use crate::reader::{self, Reader};
use crate::spans::Spans;
use crate::{SchemaError, TaskSpec, task_name_from};

/// The most stages one pipeline may have.
pub const MAX_STAGES: usize = 100;

/// One stage: its name in the pipeline, the stages it needs, and its task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageSpec {
    pub name: String,
    #[serde(default)]
    pub needs: Vec<String>,
    pub task: TaskSpec,
}

/// A validated pipeline: stages in file order, every need naming an earlier-or-later
/// stage of the same file, no cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineSpec {
    pub name: String,
    pub stages: Vec<StageSpec>,
    /// A webhook called once, when every stage has ended (the stages notify nothing
    /// themselves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<crate::NotifySpec>,
}

/// A pipeline read from a file, with each stage's code directory resolved.
#[derive(Debug, Clone)]
pub struct LoadedPipeline {
    pub spec: PipelineSpec,
    pub source: PathBuf,
    /// Per stage, in order: the directory its code snapshot is taken from.
    pub code_roots: Vec<PathBuf>,
}

impl PipelineSpec {
    /// Check every stage's task and the graph; for a pipeline received as JSON.
    pub fn validate(&self) -> Result<(), SchemaError> {
        for stage in &self.stages {
            stage.task.validate().map_err(|e| match e {
                SchemaError::Invalid {
                    field,
                    message,
                    help,
                } => SchemaError::Invalid {
                    field: format!("stages.{}.{field}", stage.name),
                    message,
                    help,
                },
                other => other,
            })?;
        }
        if let Some(problem) = self.notify.as_ref().and_then(crate::spec::check_notify) {
            return Err(SchemaError::Invalid {
                field: problem.field,
                message: problem.message,
                help: problem.help,
            });
        }
        self.check_graph().map_err(|problem| SchemaError::Invalid {
            field: problem.field,
            message: problem.message,
            help: Some(problem.help),
        })
    }

    /// The stages in an order where every stage comes after all it needs.
    pub fn topological_order(&self) -> Vec<usize> {
        order(&self.stages).unwrap_or_else(|_| (0..self.stages.len()).collect())
    }

    fn check_graph(&self) -> Result<(), GraphProblem> {
        if self.stages.is_empty() {
            return Err(GraphProblem {
                field: "stages".into(),
                message: "a pipeline needs at least one stage".into(),
                help: "add a stage under `stages:`, e.g. `train: {run: python train.py}`".into(),
            });
        }
        if self.stages.len() > MAX_STAGES {
            return Err(GraphProblem {
                field: "stages".into(),
                message: format!(
                    "a pipeline has at most {MAX_STAGES} stages; this one has {}",
                    self.stages.len()
                ),
                help: "merge small stages, or make a repeated stage an `array:`".into(),
            });
        }
        let mut seen = BTreeSet::new();
        for stage in &self.stages {
            if !seen.insert(stage.name.as_str()) {
                return Err(GraphProblem {
                    field: format!("stages.{}", stage.name),
                    message: format!("the stage name `{}` is used twice", stage.name),
                    help: "give every stage its own name".into(),
                });
            }
            if !valid_stage_name(&stage.name) {
                return Err(GraphProblem {
                    field: format!("stages.{}", stage.name),
                    message: format!(
                        "`{}` is not a valid stage name: it becomes a directory `inputs/{}/`",
                        stage.name, stage.name
                    ),
                    help: "use letters, digits, `-` and `_` only, e.g. `train`".into(),
                });
            }
        }
        let names: Vec<&str> = self.stages.iter().map(|s| s.name.as_str()).collect();
        for stage in &self.stages {
            let mut needed = BTreeSet::new();
            for (i, need) in stage.needs.iter().enumerate() {
                if need == &stage.name {
                    return Err(GraphProblem {
                        field: format!("stages.{}.needs.{i}", stage.name),
                        message: format!("stage `{}` needs itself", stage.name),
                        help: "a stage can only need other stages; remove it from `needs`".into(),
                    });
                }
                if !names.contains(&need.as_str()) {
                    let hint = match reader::closest(need, &names) {
                        Some(close) => format!("did you mean `{close}`? "),
                        None => String::new(),
                    };
                    return Err(GraphProblem {
                        field: format!("stages.{}.needs.{i}", stage.name),
                        message: format!(
                            "stage `{}` needs `{need}`, which is no stage of this pipeline",
                            stage.name
                        ),
                        help: format!("{hint}stages: {}", names.join(", ")),
                    });
                }
                if !needed.insert(need.as_str()) {
                    return Err(GraphProblem {
                        field: format!("stages.{}.needs.{i}", stage.name),
                        message: format!("stage `{}` needs `{need}` twice", stage.name),
                        help: "name each needed stage once".into(),
                    });
                }
            }
        }
        order(&self.stages)
            .map(|_| ())
            .map_err(|cycle| GraphProblem {
                field: format!("stages.{}.needs", cycle[0]),
                message: format!(
                    "the stages' needs form a cycle: {} → {}",
                    cycle.join(" → "),
                    cycle[0]
                ),
                help: "a stage runs after everything it needs; remove one of these needs".into(),
            })
    }
}

struct GraphProblem {
    field: String,
    message: String,
    help: String,
}

fn valid_stage_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Kahn's order (file order among the ready ones); on a cycle, the stages of one cycle.
fn order(stages: &[StageSpec]) -> Result<Vec<usize>, Vec<String>> {
    let index: BTreeMap<&str, usize> = stages
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let mut done = vec![false; stages.len()];
    let mut out = Vec::with_capacity(stages.len());
    while out.len() < stages.len() {
        let ready = (0..stages.len()).find(|&i| {
            !done[i]
                && stages[i]
                    .needs
                    .iter()
                    .all(|n| index.get(n.as_str()).is_none_or(|&j| done[j]))
        });
        match ready {
            Some(i) => {
                done[i] = true;
                out.push(i);
            }
            None => return Err(a_cycle(stages, &index, &done)),
        }
    }
    Ok(out)
}

/// Walk needs from an unfinished stage until one repeats: that loop is a cycle.
fn a_cycle(stages: &[StageSpec], index: &BTreeMap<&str, usize>, done: &[bool]) -> Vec<String> {
    let Some(mut at) = (0..stages.len()).find(|&i| !done[i]) else {
        return Vec::new();
    };
    let mut path: Vec<usize> = Vec::new();
    loop {
        if let Some(start) = path.iter().position(|&p| p == at) {
            return path[start..]
                .iter()
                .map(|&i| stages[i].name.clone())
                .collect();
        }
        path.push(at);
        at = stages[at]
            .needs
            .iter()
            .filter_map(|n| index.get(n.as_str()).copied())
            .find(|&j| !done[j])
            .unwrap_or(at);
    }
}

/// Whether the text is a pipeline file: a mapping with a top-level `stages:`.
pub fn is_pipeline(text: &str) -> bool {
    text.lines().any(|line| {
        line.strip_prefix("stages")
            .is_some_and(|rest| rest.trim_start().starts_with(':'))
    })
}

/// Parse a pipeline file's text; `source_name` is what errors point at.
pub fn parse_pipeline(source_name: &str, text: &str) -> Result<PipelineSpec, SchemaError> {
    let mut spans = Spans::new(source_name, text);
    let root = reader::load_yaml(text, &spans)?;
    let mut top_reader = Reader::new(&mut spans);
    let top = top_reader.fields(&root, None, "", &["name", "stages", "notify"])?;
    let name = match top.get("name") {
        Some(node) => top_reader.text(node, "name", "name: my-pipeline")?,
        None => {
            return Err(top_reader.missing(&top, "name", "name: my-pipeline"));
        }
    };
    let notify = match top.get("notify") {
        Some(node) => Some(reader::read_notify(
            &mut top_reader,
            node,
            top.map_key("notify"),
        )?),
        None => None,
    };
    top_reader.finish()?;
    let stages_node = match top.get("stages") {
        Some(node) => node,
        None => {
            return Err(spans.error_at(
                "stages",
                "a pipeline needs at least one stage",
                Some("add stages under `stages:`, e.g. `train: {run: python train.py}`".into()),
            ));
        }
    };
    let Node::Mapping(map) = stages_node else {
        return Err(spans.error_at(
            "stages",
            "`stages` must be a mapping of stage names to task specs",
            Some("write each stage as `name:` with its fields indented below it".into()),
        ));
    };
    let mut stages = Vec::new();
    let mut needs_nodes: BTreeMap<String, (MarkedScalarNode, Option<Node>)> = BTreeMap::new();
    for (key, value) in map.iter() {
        let stage_name = key.as_str().to_string();
        let mut body = value.clone();
        let mut needs_node = None;
        if let Node::Mapping(fields) = &mut body
            && let Some(needs_key) = fields.keys().find(|k| k.as_str() == "needs").cloned()
        {
            needs_node = fields.remove(&needs_key);
        }
        let mut stage_spans = Spans::new(source_name, text);
        stage_spans.record("", Some(key), value);
        let needs = match &needs_node {
            Some(node) if !reader::is_null(node) => {
                let mut needs_reader = Reader::new(&mut stage_spans);
                needs_reader.texts(node, "needs", "needs: [prepare]")?
            }
            _ => Vec::new(),
        };
        let fallback = task_name_from(&format!("{name}-{stage_name}"));
        let task = reader::read_task(&body, &mut stage_spans, &fallback)?;
        needs_nodes.insert(stage_name.clone(), (key.clone(), needs_node));
        stages.push(StageSpec {
            name: stage_name,
            needs,
            task,
        });
    }
    let spec = PipelineSpec {
        name,
        stages,
        notify,
    };
    if let Some(problem) = spec.notify.as_ref().and_then(crate::spec::check_notify) {
        return Err(spans.error_at(&problem.field, problem.message, problem.help));
    }
    if let Err(problem) = spec.check_graph() {
        // Point at the stage's key, or the offending need inside its list.
        let mut parts = problem.field.splitn(4, '.');
        let _ = parts.next();
        let stage = parts.next();
        let need_index = parts.nth(1).and_then(|i| i.parse::<usize>().ok());
        let location = stage
            .and_then(|stage| needs_nodes.get(stage))
            .map(|(key, needs)| match (needs, need_index) {
                (Some(Node::Sequence(items)), Some(i)) if i < items.len() => {
                    spans.node_location(&items[i])
                }
                (Some(needs @ Node::Sequence(_)), None) => spans.node_location(needs),
                _ => spans.scalar_location(key),
            });
        return Err(match location {
            Some(location) => {
                spans.error_at_location(location, problem.message, Some(problem.help))
            }
            None => spans.error_at(&problem.field, problem.message, Some(problem.help)),
        });
    }
    Ok(spec)
}

/// Read a pipeline file and resolve each stage's code directory (relative to the file).
pub fn load_pipeline(path: &Path) -> Result<LoadedPipeline, SchemaError> {
    let read_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SchemaError::Read { path, source }
    };
    let text = fs::read_to_string(path).map_err(read_error(path))?;
    let source_name = path.display().to_string();
    let spec = parse_pipeline(&source_name, &text)?;
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let dir = fs::canonicalize(parent).map_err(read_error(parent))?;
    let mut code_roots = Vec::new();
    for stage in &spec.stages {
        let root: PathBuf = dir
            .join(&stage.task.code.dir)
            .components()
            .filter(|c| !matches!(c, Component::CurDir))
            .collect();
        if !root.is_dir() {
            return Err(SchemaError::Invalid {
                field: format!("stages.{}.code.dir", stage.name),
                message: format!(
                    "the code directory `{}` of stage `{}` does not exist",
                    root.display(),
                    stage.name
                ),
                help: Some(
                    "set the stage's `code.dir` to a directory relative to the pipeline file"
                        .into(),
                ),
            });
        }
        code_roots.push(root);
    }
    Ok(LoadedPipeline {
        spec,
        source: path.to_path_buf(),
        code_roots,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PipelineSpec, SchemaError> {
        parse_pipeline("pipeline.yaml", text)
    }

    fn rendered(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn a_pipeline_takes_a_notify_and_its_mistakes_are_located() {
        let spec = parse_pipeline(
            "p.yaml",
            "name: n\nnotify: {webhook: \"https://hooks.example.com/x\", secret: K}\nstages:\n  a:\n    run: true\n",
        )
        .unwrap();
        assert_eq!(spec.notify.as_ref().unwrap().secret, "K");
        let error = parse_pipeline(
            "p.yaml",
            "name: n\nnotify: {webhook: \"ftp://x\", secret: K}\nstages:\n  a:\n    run: true\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("p.yaml:2:") && error.contains("webhook"),
            "{error}"
        );
    }

    #[test]
    fn stages_keep_file_order_needs_and_their_own_task_fields() {
        let spec = parse(
            "name: demo\nstages:\n  gen:\n    run: sh gen.sh\n  train:\n    needs: [gen]\n    resources: {cpus: 2}\n    run: sh train.sh\n  eval:\n    needs: [train, gen]\n    array: 0-2\n    run: sh eval.sh\n",
        )
        .unwrap();
        let names: Vec<&str> = spec.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["gen", "train", "eval"]);
        assert_eq!(spec.stages[2].needs, ["train", "gen"]);
        assert_eq!(spec.stages[1].task.resources.cpus, 2.0);
        assert!(spec.stages[2].task.array.is_some());
        assert_eq!(spec.stages[0].task.name, "demo-gen");
        assert_eq!(spec.topological_order(), vec![0, 1, 2]);
        spec.validate().unwrap();
    }

    #[test]
    fn an_unknown_need_is_located_at_the_need_with_a_suggestion() {
        let text =
            "name: demo\nstages:\n  train:\n    run: a\n  eval:\n    needs: [trian]\n    run: b\n";
        let error = rendered(text);
        assert!(error.contains("pipeline.yaml:6:13"), "{error}");
        assert!(error.contains("needs `trian`"), "{error}");
        assert!(error.contains("did you mean `train`"), "{error}");
    }

    #[test]
    fn a_cycle_is_reported_with_its_stages() {
        let text = "name: demo\nstages:\n  a:\n    needs: [b]\n    run: x\n  b:\n    needs: [a]\n    run: y\n";
        let error = rendered(text);
        assert!(error.contains("cycle: a → b → a"), "{error}");
        assert!(error.contains("pipeline.yaml:4:"), "{error}");
    }

    #[test]
    fn a_duplicate_stage_name_is_located() {
        let text = "name: demo\nstages:\n  a:\n    run: x\n  a:\n    run: y\n";
        let error = rendered(text);
        assert!(error.contains("pipeline.yaml:5:"), "{error}");
    }

    #[test]
    fn no_stages_is_refused_with_a_fix() {
        let error = rendered("name: demo\nstages: {}\n");
        assert!(error.contains("at least one stage"), "{error}");
        assert!(error.contains("help"), "{error}");
        let error = rendered("name: demo\nstages:\n");
        assert!(error.contains("at least one stage"), "{error}");
    }

    #[test]
    fn a_mistake_inside_a_stage_points_into_that_stage() {
        let text =
            "name: demo\nstages:\n  a:\n    run: x\n  b:\n    resorces: {cpus: 2}\n    run: y\n";
        let error = rendered(text);
        assert!(error.contains("pipeline.yaml:6:5"), "{error}");
        assert!(error.contains("did you mean `resources`"), "{error}");
    }

    #[test]
    fn a_pipeline_file_is_told_from_a_task_file() {
        assert!(is_pipeline("name: x\nstages:\n  a: {run: b}\n"));
        assert!(!is_pipeline("name: x\nrun: stages\n"));
        assert!(!is_pipeline("name: x\nenvironment:\n  stages: 1\n"));
    }

    #[test]
    fn the_json_form_is_checked_like_the_file() {
        let mut spec =
            parse("name: demo\nstages:\n  a:\n    run: x\n  b:\n    needs: [a]\n    run: y\n")
                .unwrap();
        spec.stages[0].needs = vec!["b".into()];
        let error = spec.validate().unwrap_err().to_string();
        assert!(error.contains("cycle"), "{error}");
        spec.stages[0].needs = vec!["zz".into()];
        let error = spec.validate().unwrap_err().to_string();
        assert!(error.contains("stages.a.needs.0"), "{error}");
    }
}
