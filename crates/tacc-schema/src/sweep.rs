//! A sweep (`sweep:` in the task file): one task run as many trials, each with its own
//! point of a parameter space, the best found by a metric the trials report. This module
//! holds the format, its checks, the expansion of the space into trial points (grid: all
//! combinations in order; random and ASHA over ranges: seeded samples, the same seed
//! giving the same points on every machine) and the substitution of a point into `run`
//! (`{{lr}}`) and the environment (`TACC_PARAM_LR`). It does no I/O.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::spec::{Problem, problem};

/// At most this many trials in one sweep.
pub const MAX_SWEEP_TRIALS: u32 = 10_000;
/// The prefix of the environment variable that carries a parameter: `TACC_PARAM_LR`.
pub const PARAM_VARIABLE_PREFIX: &str = "TACC_PARAM_";

/// How the trials' points are chosen, and whether bad trials are stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SweepMethod {
    /// Every combination of the listed values, in order (capped by `max_trials`).
    Grid,
    /// `max_trials` seeded samples: a list is sampled uniformly, a range `{min, max, log}`
    /// uniformly (or log-uniformly).
    Random,
    /// Asynchronous successive halving: the grid's points when every parameter is a
    /// list, random samples otherwise; at each rung a trial continues only when it is in
    /// the top 1/η of the trials that reached the rung.
    Asha,
}

impl SweepMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            SweepMethod::Grid => "grid",
            SweepMethod::Random => "random",
            SweepMethod::Asha => "asha",
        }
    }
}

/// Whether a smaller or a larger metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Goal {
    #[default]
    Minimize,
    Maximize,
}

impl Goal {
    /// `a` is strictly better than `b`.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Goal::Minimize => a < b,
            Goal::Maximize => a > b,
        }
    }

    /// The comparison a value must pass, for reasons: `≤` or `≥`.
    pub fn at_least_as_good(self) -> &'static str {
        match self {
            Goal::Minimize => "≤",
            Goal::Maximize => "≥",
        }
    }
}

/// The values one parameter takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ParameterSpec {
    /// These values, as written (`[0.1, 0.01]`, `[adam, sgd]`).
    Values(Vec<String>),
    /// A number between `min` and `max` (random and ASHA only), log-uniform with `log: true`.
    Range {
        min: f64,
        max: f64,
        #[serde(default)]
        log: bool,
    },
}

/// Asynchronous successive halving: rungs at `min_steps · η^k` reported steps, below
/// `max_steps`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AshaSpec {
    /// The step of rung 0, in the steps the trials report.
    pub min_steps: u64,
    /// η: at each rung the top 1/η continue.
    #[serde(default = "default_reduction_factor")]
    pub reduction_factor: u32,
    /// The steps of a trial that is never stopped (no rung at or beyond it).
    pub max_steps: u64,
}

fn default_reduction_factor() -> u32 {
    3
}

/// `sweep:` in the task file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    pub method: SweepMethod,
    /// Parameter name (`a-z`, `0-9`, `_`, starting with a letter) → its values.
    pub parameters: BTreeMap<String, ParameterSpec>,
    /// The name of the metric the trials report in `$TACC_METRICS` (e.g. `val_loss`).
    pub metric: String,
    #[serde(default)]
    pub goal: Goal,
    /// Trials in all (for a grid, at most its number of combinations).
    pub max_trials: u32,
    /// At most this many trials queued or running at once.
    pub parallel: u32,
    /// The seed of random samples.
    #[serde(default)]
    pub seed: u64,
    /// Required with `method: asha`, refused otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asha: Option<AshaSpec>,
}

/// One trial's parameter values, by name.
pub type TrialPoint = BTreeMap<String, String>;

impl SweepSpec {
    /// The number of grid combinations when every parameter is a list.
    pub fn grid_size(&self) -> Option<u64> {
        self.parameters
            .values()
            .map(|p| match p {
                ParameterSpec::Values(values) => Some(values.len() as u64),
                ParameterSpec::Range { .. } => None,
            })
            .try_fold(1u64, |acc, n| n.map(|n| acc.saturating_mul(n)))
    }

    fn is_grid(&self) -> bool {
        match self.method {
            SweepMethod::Grid => true,
            SweepMethod::Random => false,
            SweepMethod::Asha => self.grid_size().is_some(),
        }
    }

    /// The points of the trials, in launch order: `max_trials` of them (fewer for a
    /// smaller grid). Deterministic: the same spec gives the same points.
    pub fn trials(&self) -> Vec<TrialPoint> {
        let wanted = self.max_trials as usize;
        if self.is_grid() {
            return grid(&self.parameters, wanted);
        }
        let mut rng = SplitMix64(self.seed);
        (0..wanted)
            .map(|_| {
                self.parameters
                    .iter()
                    .map(|(name, p)| (name.clone(), sample(p, &mut rng)))
                    .collect()
            })
            .collect()
    }
}

/// The first `wanted` combinations, the last parameter (by name) varying fastest.
fn grid(parameters: &BTreeMap<String, ParameterSpec>, wanted: usize) -> Vec<TrialPoint> {
    let lists: Vec<(&String, &Vec<String>)> = parameters
        .iter()
        .filter_map(|(name, p)| match p {
            ParameterSpec::Values(values) => Some((name, values)),
            ParameterSpec::Range { .. } => None,
        })
        .collect();
    let mut points = Vec::new();
    let mut digits = vec![0usize; lists.len()];
    if lists.iter().any(|(_, values)| values.is_empty()) {
        return points;
    }
    while points.len() < wanted {
        points.push(
            lists
                .iter()
                .zip(&digits)
                .map(|((name, values), d)| ((*name).clone(), values[*d].clone()))
                .collect(),
        );
        // Advance like an odometer; done when the first digit rolls over.
        let mut position = lists.len();
        loop {
            if position == 0 {
                return points;
            }
            position -= 1;
            digits[position] += 1;
            if digits[position] < lists[position].1.len() {
                break;
            }
            digits[position] = 0;
        }
    }
    points
}

fn sample(parameter: &ParameterSpec, rng: &mut SplitMix64) -> String {
    match parameter {
        ParameterSpec::Values(values) => {
            values[(rng.next() % values.len().max(1) as u64) as usize].clone()
        }
        ParameterSpec::Range { min, max, log } => {
            let u = rng.unit();
            let value = if *log {
                (min.ln() + u * (max.ln() - min.ln())).exp()
            } else {
                min + u * (max - min)
            };
            format_number(value)
        }
    }
}

/// Six significant digits, written as short as Rust writes the rounded number.
fn format_number(value: f64) -> String {
    let rounded: f64 = format!("{value:.5e}").parse().unwrap_or(value);
    format!("{rounded}")
}

/// A small, fixed generator (SplitMix64): the points of a seed must not change with a
/// dependency's version, since reruns and docs rely on them.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `{{name}}` (spaces inside the braces allowed) replaced by the point's value.
pub fn substitute(text: &str, point: &TrialPoint) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find("}}") {
            Some(end) => match point.get(after[..end].trim()) {
                Some(value) => {
                    out.push_str(value);
                    rest = &after[end + 2..];
                }
                None => {
                    out.push_str("{{");
                    rest = after;
                }
            },
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The names inside `{{…}}` in `text`.
pub fn placeholders(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        names.push(after[..end].trim().to_string());
        rest = &after[end + 2..];
    }
    names
}

/// The environment variable of a parameter: `lr` → `TACC_PARAM_LR`.
pub fn parameter_variable(name: &str) -> String {
    format!("{PARAM_VARIABLE_PREFIX}{}", name.to_ascii_uppercase())
}

fn valid_parameter_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The first thing wrong with a sweep, at its field.
pub(crate) fn check_sweep(sweep: &SweepSpec, run: &str, setup: Option<&str>) -> Option<Problem> {
    if sweep.parameters.is_empty() {
        return Some(problem(
            "sweep.parameters",
            "a sweep needs at least one parameter",
            "add e.g. `parameters: {lr: [0.1, 0.01, 0.001]}`",
        ));
    }
    for (name, parameter) in &sweep.parameters {
        let field = format!("sweep.parameters.{name}");
        if !valid_parameter_name(name) {
            return Some(problem(
                field,
                format!("parameter name `{name}` is not usable in `{{{{…}}}}` and the environment"),
                "use lowercase letters, digits and `_`, starting with a letter, e.g. `lr` or `batch_size`",
            ));
        }
        match parameter {
            ParameterSpec::Values(values) if values.is_empty() => {
                return Some(problem(
                    field,
                    format!("parameter `{name}` has no values"),
                    format!("list at least one, e.g. `{name}: [0.1, 0.01]`"),
                ));
            }
            ParameterSpec::Values(_) => {}
            ParameterSpec::Range { min, max, log } => {
                if sweep.method == SweepMethod::Grid {
                    return Some(problem(
                        field,
                        format!("a grid cannot enumerate the range of `{name}`"),
                        format!(
                            "list the values (e.g. `{name}: [0.1, 0.01]`) or use `method: random`"
                        ),
                    ));
                }
                if !(min.is_finite() && max.is_finite()) || min >= max {
                    return Some(problem(
                        field,
                        format!("the range of `{name}` is empty: min {min}, max {max}"),
                        "write the smaller bound as `min`, e.g. `{min: 0.0001, max: 0.1}`",
                    ));
                }
                if *log && *min <= 0.0 {
                    return Some(problem(
                        field,
                        format!("a log range of `{name}` must be above zero, min is {min}"),
                        "use a positive `min`, e.g. `{min: 0.0001, max: 0.1, log: true}`",
                    ));
                }
            }
        }
    }
    let used: Vec<String> = placeholders(run)
        .into_iter()
        .chain(setup.map(placeholders).unwrap_or_default())
        .collect();
    if let Some(unknown) = used.iter().find(|n| !sweep.parameters.contains_key(*n)) {
        let known: Vec<&str> = sweep.parameters.keys().map(String::as_str).collect();
        return Some(problem(
            "run",
            format!("`{{{{{unknown}}}}}` is not a parameter of the sweep"),
            format!("the parameters are: {}", known.join(", ")),
        ));
    }
    if sweep.metric.trim().is_empty() || sweep.metric == "step" {
        return Some(problem(
            "sweep.metric",
            format!("`{}` cannot be the sweep's metric", sweep.metric),
            "name a value the trials report, e.g. `metric: val_loss`",
        ));
    }
    if sweep.max_trials == 0 || sweep.max_trials > MAX_SWEEP_TRIALS {
        return Some(problem(
            "sweep.max_trials",
            format!(
                "`max_trials` must be between 1 and {MAX_SWEEP_TRIALS}, found {}",
                sweep.max_trials
            ),
            "write e.g. `max_trials: 20`",
        ));
    }
    if sweep.parallel == 0 {
        return Some(problem(
            "sweep.parallel",
            "`parallel` must be at least 1",
            "write how many trials may run at once, e.g. `parallel: 4`",
        ));
    }
    match (&sweep.asha, sweep.method) {
        (None, SweepMethod::Asha) => {
            return Some(problem(
                "sweep.method",
                "`method: asha` needs its rungs",
                "add `asha: {min_steps: 10, reduction_factor: 3, max_steps: 270}`",
            ));
        }
        (Some(_), SweepMethod::Grid | SweepMethod::Random) => {
            return Some(problem(
                "sweep.asha",
                format!(
                    "`asha:` only applies to `method: asha`, not {}",
                    sweep.method.as_str()
                ),
                "remove `asha:` or write `method: asha`",
            ));
        }
        (Some(asha), SweepMethod::Asha) => {
            if asha.min_steps == 0 || asha.min_steps >= asha.max_steps {
                return Some(problem(
                    "sweep.asha",
                    format!(
                        "`min_steps` ({}) must be at least 1 and below `max_steps` ({})",
                        asha.min_steps, asha.max_steps
                    ),
                    "e.g. `asha: {min_steps: 10, max_steps: 270}`",
                ));
            }
            if asha.reduction_factor < 2 {
                return Some(problem(
                    "sweep.asha",
                    format!(
                        "`reduction_factor` must be at least 2, found {}",
                        asha.reduction_factor
                    ),
                    "write e.g. `reduction_factor: 3` (the top third continues at each rung)",
                ));
            }
        }
        (None, _) => {}
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(items: &[&str]) -> ParameterSpec {
        ParameterSpec::Values(items.iter().map(|s| s.to_string()).collect())
    }

    fn sweep(method: SweepMethod, parameters: Vec<(&str, ParameterSpec)>, max: u32) -> SweepSpec {
        SweepSpec {
            method,
            parameters: parameters
                .into_iter()
                .map(|(n, p)| (n.to_string(), p))
                .collect(),
            metric: "val_loss".into(),
            goal: Goal::Minimize,
            max_trials: max,
            parallel: 2,
            seed: 7,
            asha: None,
        }
    }

    #[test]
    fn a_grid_is_every_combination_in_order_capped_by_max_trials() {
        let spec = sweep(
            SweepMethod::Grid,
            vec![("a", values(&["1", "2"])), ("b", values(&["x", "y", "z"]))],
            100,
        );
        let points = spec.trials();
        assert_eq!(points.len(), 6);
        let shown: Vec<String> = points
            .iter()
            .map(|p| format!("{}{}", p["a"], p["b"]))
            .collect();
        assert_eq!(shown, ["1x", "1y", "1z", "2x", "2y", "2z"]);
        let capped = SweepSpec {
            max_trials: 4,
            ..spec
        };
        assert_eq!(capped.trials().len(), 4);
    }

    #[test]
    fn random_samples_are_seeded_and_inside_their_ranges() {
        let spec = sweep(
            SweepMethod::Random,
            vec![
                (
                    "lr",
                    ParameterSpec::Range {
                        min: 1e-4,
                        max: 1e-1,
                        log: true,
                    },
                ),
                ("opt", values(&["adam", "sgd"])),
            ],
            50,
        );
        let first = spec.trials();
        assert_eq!(first, spec.trials(), "the same seed gives the same points");
        assert_eq!(first.len(), 50);
        for point in &first {
            let lr: f64 = point["lr"].parse().unwrap();
            assert!((1e-4..=1e-1).contains(&lr), "{lr}");
            assert!(["adam", "sgd"].contains(&point["opt"].as_str()));
        }
        let other = SweepSpec { seed: 8, ..spec }.trials();
        assert_ne!(first, other, "another seed gives other points");
        // Log-uniform: about as many below 0.0032 (the geometric middle) as above.
        let low = first
            .iter()
            .filter(|p| p["lr"].parse::<f64>().unwrap() < 0.00316)
            .count();
        assert!((10..=40).contains(&low), "{low} of 50 in the lower half");
    }

    #[test]
    fn asha_uses_the_grid_when_every_parameter_is_a_list() {
        let mut spec = sweep(SweepMethod::Asha, vec![("lr", values(&["1", "2", "3"]))], 9);
        assert_eq!(spec.trials().len(), 3);
        spec.parameters.insert(
            "wd".into(),
            ParameterSpec::Range {
                min: 0.0,
                max: 1.0,
                log: false,
            },
        );
        assert_eq!(spec.trials().len(), 9);
    }

    #[test]
    fn substitution_replaces_known_placeholders_only() {
        let point: TrialPoint = [("lr".to_string(), "0.01".to_string())].into();
        assert_eq!(
            substitute("train --lr {{lr}} --x {{ lr }} {{other}} {{", &point),
            "train --lr 0.01 --x 0.01 {{other}} {{"
        );
        assert_eq!(placeholders("a {{lr}} b {{ wd }}"), ["lr", "wd"]);
        assert_eq!(parameter_variable("batch_size"), "TACC_PARAM_BATCH_SIZE");
    }

    #[test]
    fn checks_name_the_field_that_is_wrong() {
        let spec = sweep(SweepMethod::Grid, vec![("lr", values(&["1"]))], 1);
        assert!(check_sweep(&spec, "x {{lr}}", None).is_none());
        let unknown = check_sweep(&spec, "x {{lrr}}", None).unwrap();
        assert_eq!(unknown.field, "run");
        let range = sweep(
            SweepMethod::Grid,
            vec![(
                "lr",
                ParameterSpec::Range {
                    min: 0.0,
                    max: 1.0,
                    log: false,
                },
            )],
            1,
        );
        assert_eq!(
            check_sweep(&range, "x", None).unwrap().field,
            "sweep.parameters.lr"
        );
        let asha = sweep(SweepMethod::Asha, vec![("lr", values(&["1"]))], 1);
        assert_eq!(check_sweep(&asha, "x", None).unwrap().field, "sweep.method");
    }
}

#[cfg(test)]
mod file_tests {
    use super::*;

    #[test]
    fn a_sweep_is_read_from_the_task_file_with_defaults() {
        let (spec, _) = crate::parse_task(
            "task.yaml",
            "name: t\nrun: python train.py --lr {{lr}}\nsweep:\n  method: asha\n  parameters:\n    lr: [0.1, 0.01]\n    wd: {min: 0.001, max: 0.1, log: true}\n  metric: val_loss\n  max_trials: 6\n  asha: {min_steps: 2, max_steps: 18}\n",
        )
        .unwrap();
        let sweep = spec.sweep.unwrap();
        assert_eq!(sweep.method, SweepMethod::Asha);
        assert_eq!(sweep.goal, Goal::Minimize);
        assert_eq!(sweep.parallel, 4);
        assert_eq!(sweep.asha.unwrap().reduction_factor, 3);
        assert_eq!(
            sweep.parameters["wd"],
            ParameterSpec::Range {
                min: 0.001,
                max: 0.1,
                log: true
            }
        );
    }

    #[test]
    fn mistakes_are_located_with_a_hint() {
        let error = crate::parse_task(
            "task.yaml",
            "name: t\nrun: python train.py --lr {{lr}}\nsweep:\n  method: grid\n  parameters:\n    lr: {min: 0.1, max: 1}\n  metric: val_loss\n",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("task.yaml:6:"), "{error}");
        assert!(error.contains("a grid cannot enumerate"), "{error}");
        assert!(error.contains("method: random"), "{error}");
        let error = crate::parse_task(
            "task.yaml",
            "name: t\nrun: x {{lr}}\nsweep:\n  method: gird\n  parameters: {lr: [1]}\n  metric: m\n",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("task.yaml:4:11"), "{error}");
        assert!(error.contains("did you mean `grid`"), "{error}");
        let error = crate::parse_task(
            "task.yaml",
            "name: t\nrun: x {{lrate}}\nsweep: {method: grid, parameters: {lr: [1]}, metric: m}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("`{{lrate}}` is not a parameter"), "{error}");
    }
}
