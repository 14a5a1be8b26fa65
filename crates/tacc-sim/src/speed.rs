//! The per-job speed model of `tacc-sim --adaptive`: every job belongs to a class drawn
//! from its job id (a stable hash, so a replay is deterministic and the same job has the
//! same class in every run), and its class says how fast it runs at a given number of
//! CPUs per GPU, `s(c) = min(1, c / c_sat)^α`, how much CPU and memory it would use,
//! and what it requests. The defaults live in `speed-model.toml` beside this crate's
//! manifest (docs/ADAPTIVE.md explains them); a file passed with `--speed-model`
//! replaces the sections it names.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use tacc_adaptive::{Rules, StepPolicyConfig};
use tacc_core::Resources;

const GIB: f64 = (1u64 << 30) as f64;

/// The default model, compiled in so the binary needs no file beside it.
pub const DEFAULT_MODEL_TOML: &str = include_str!("../speed-model.toml");

/// What a job requests per GPU before its class scales it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestDefaults {
    pub cpus_per_gpu: f64,
    pub memory_gib_per_gpu: f64,
}

/// One job class.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassParams {
    /// Relative weight of the class in the mix (the shares need not sum to 1).
    pub share: f64,
    /// `c_sat`: CPUs per GPU at which it reaches full speed, and the most it uses.
    pub saturation_cpus_per_gpu: f64,
    /// `α`: how steeply it slows below `c_sat` (0: not at all).
    pub exponent: f64,
    /// Fraction of its memory request it uses, whatever its allocation.
    pub memory_use: f64,
    /// Multiplies the default request (CPUs and memory).
    pub request_scale: f64,
}

impl ClassParams {
    /// Speed as a fraction of full speed at `cpus_per_gpu`.
    pub fn speed(&self, cpus_per_gpu: f64) -> f64 {
        if self.exponent == 0.0 || self.saturation_cpus_per_gpu <= 0.0 {
            return 1.0;
        }
        (cpus_per_gpu / self.saturation_cpus_per_gpu)
            .clamp(0.0, 1.0)
            .powf(self.exponent)
    }
}

/// The cluster's default adaptation bounds and the simulator's sampling.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveParams {
    /// No job is shrunk below this many CPUs per GPU (nor below its request, if less).
    pub min_cpus_per_gpu: f64,
    /// Nor grown beyond this multiple of its CPU request.
    pub max_cpu_factor: f64,
    pub min_memory_factor: f64,
    pub max_memory_factor: f64,
    /// Virtual seconds between two samples of every running job.
    pub sample_every_s: u64,
    /// How much history the classifier sees.
    pub window_s: u64,
}

/// The model as a file holds it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    request: Option<RequestDefaults>,
    classes: Option<BTreeMap<String, ClassParams>>,
    adaptive: Option<AdaptiveParams>,
    /// The classifier's thresholds; the live cluster's defaults when absent.
    rules: Option<Rules>,
    /// The re-allocation policy's settings; the live cluster's defaults when absent.
    policy: Option<StepPolicyConfig>,
}

/// A class's index in [`SpeedModel::classes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClassId(pub usize);

/// The whole model: classes (in name order), requests, bounds, and the classifier and
/// policy settings the adaptive replay uses.
#[derive(Debug, Clone)]
pub struct SpeedModel {
    pub request: RequestDefaults,
    pub classes: Vec<(String, ClassParams)>,
    pub adaptive: AdaptiveParams,
    pub rules: Rules,
    pub policy: StepPolicyConfig,
    /// Upper ends of each class's slice of [0, 1), for drawing a class from a hash.
    cumulative: Vec<f64>,
}

impl SpeedModel {
    /// The model of `speed-model.toml`.
    pub fn default_model() -> SpeedModel {
        SpeedModel::parse(DEFAULT_MODEL_TOML, None).expect("the compiled-in speed model is valid")
    }

    /// A model where no job's speed depends on its CPUs and every job requests the
    /// default 4 CPUs and 32 GiB per GPU: plain `run_nodes`.
    pub fn neutral() -> SpeedModel {
        let defaults = SpeedModel::default_model();
        let class = ClassParams {
            share: 1.0,
            saturation_cpus_per_gpu: defaults.request.cpus_per_gpu,
            exponent: 0.0,
            memory_use: 0.6,
            request_scale: 1.0,
        };
        SpeedModel::build(
            defaults.request,
            vec![("neutral".to_string(), class)],
            defaults.adaptive,
            defaults.rules,
            defaults.policy,
        )
        .expect("the neutral model is valid")
    }

    /// Reads a model file; sections it leaves out keep the defaults.
    pub fn load(path: &Path) -> Result<SpeedModel> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the speed model {}", path.display()))?;
        SpeedModel::from_toml(&text).with_context(|| {
            format!(
                "{} is not a valid speed model (see crates/tacc-sim/speed-model.toml for \
                 the format)",
                path.display()
            )
        })
    }

    /// A model from TOML text; sections it leaves out keep the defaults.
    pub fn from_toml(text: &str) -> Result<SpeedModel> {
        SpeedModel::parse(text, Some(&SpeedModel::default_model()))
    }

    fn parse(text: &str, defaults: Option<&SpeedModel>) -> Result<SpeedModel> {
        let file: ModelFile = toml::from_str(text)?;
        let pick = |what: &str| format!("the default model lacks [{what}]");
        let request = match (file.request, defaults) {
            (Some(r), _) => r,
            (None, Some(d)) => d.request.clone(),
            (None, None) => bail!(pick("request")),
        };
        let classes = match (file.classes, defaults) {
            (Some(c), _) => c.into_iter().collect(),
            (None, Some(d)) => d.classes.clone(),
            (None, None) => bail!(pick("classes")),
        };
        let adaptive = match (file.adaptive, defaults) {
            (Some(a), _) => a,
            (None, Some(d)) => d.adaptive.clone(),
            (None, None) => bail!(pick("adaptive")),
        };
        SpeedModel::build(
            request,
            classes,
            adaptive,
            file.rules.unwrap_or_default(),
            file.policy.unwrap_or_default(),
        )
    }

    fn build(
        request: RequestDefaults,
        classes: Vec<(String, ClassParams)>,
        adaptive: AdaptiveParams,
        rules: Rules,
        policy: StepPolicyConfig,
    ) -> Result<SpeedModel> {
        if classes.is_empty() {
            bail!("[classes] names no class: give at least one");
        }
        for (name, c) in &classes {
            if !(c.share >= 0.0
                && c.saturation_cpus_per_gpu > 0.0
                && c.exponent >= 0.0
                && c.memory_use >= 0.0
                && c.request_scale > 0.0)
            {
                bail!(
                    "class {name}: share, exponent and memory_use must be ≥ 0, \
                     saturation_cpus_per_gpu and request_scale > 0"
                );
            }
        }
        let total: f64 = classes.iter().map(|(_, c)| c.share).sum();
        if total <= 0.0 {
            bail!("the class shares sum to 0: give at least one class a positive share");
        }
        if request.cpus_per_gpu <= 0.0 || request.memory_gib_per_gpu <= 0.0 {
            bail!("[request] cpus_per_gpu and memory_gib_per_gpu must be positive");
        }
        if !(adaptive.min_cpus_per_gpu >= 0.0
            && adaptive.max_cpu_factor >= 1.0
            && adaptive.min_memory_factor > 0.0
            && adaptive.min_memory_factor <= 1.0
            && adaptive.max_memory_factor >= 1.0)
        {
            bail!(
                "[adaptive] bounds must contain the request: min_cpus_per_gpu ≥ 0, \
                 max_cpu_factor ≥ 1, 0 < min_memory_factor ≤ 1, max_memory_factor ≥ 1"
            );
        }
        if adaptive.sample_every_s == 0 || adaptive.window_s < adaptive.sample_every_s {
            bail!("[adaptive] sample_every_s must be positive and window_s at least as long");
        }
        let mut running = 0.0;
        let cumulative = classes
            .iter()
            .map(|(_, c)| {
                running += c.share / total;
                running
            })
            .collect();
        Ok(SpeedModel {
            request,
            classes,
            adaptive,
            rules,
            policy,
            cumulative,
        })
    }

    /// The class of a job: its id hashed (FNV-1a and a mixer, stable across builds and
    /// platforms)
    /// to a point of [0, 1), which falls in one class's share.
    pub fn class_of(&self, job_id: &str) -> ClassId {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in job_id.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        // FNV alone spreads ids that differ in their last digit poorly: finish with
        // MurmurHash3's 64-bit mixer.
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        hash ^= hash >> 33;
        let point = (hash >> 11) as f64 / (1u64 << 53) as f64;
        let index = self
            .cumulative
            .iter()
            .position(|upper| point < *upper)
            .unwrap_or(self.classes.len() - 1);
        ClassId(index)
    }

    /// The class called `name`, if the model has one.
    pub fn class_named(&self, name: &str) -> Option<ClassId> {
        self.classes
            .iter()
            .position(|(n, _)| n == name)
            .map(ClassId)
    }

    pub fn class(&self, id: ClassId) -> &ClassParams {
        &self.classes[id.0].1
    }

    pub fn class_name(&self, id: ClassId) -> &str {
        &self.classes[id.0].0
    }

    /// What a job of this class asks for per node, for `gpus` GPUs on the node.
    pub fn request(&self, class: ClassId, gpus: u32) -> Resources {
        let scale = self.class(class).request_scale * f64::from(gpus);
        Resources::new(
            round_millis(self.request.cpus_per_gpu * scale * 1000.0),
            (self.request.memory_gib_per_gpu * scale * GIB).round() as u64,
            gpus,
        )
    }

    /// Speed at an allocation of `cpu_millis` per node with `gpus` GPUs per node (a job
    /// with no GPU counts its CPUs as for one GPU).
    pub fn speed(&self, class: ClassId, cpu_millis: u64, gpus: u32) -> f64 {
        self.class(class)
            .speed(cpu_millis as f64 / 1000.0 / f64::from(gpus.max(1)))
    }

    /// CPU (thousandths per node) the job would use given all it wants.
    pub fn cpu_demand(&self, class: ClassId, gpus: u32) -> u64 {
        round_millis(self.class(class).saturation_cpus_per_gpu * f64::from(gpus.max(1)) * 1000.0)
    }

    /// Memory (bytes per node) the job uses.
    pub fn memory_use(&self, class: ClassId, gpus: u32) -> u64 {
        (self.request(class, gpus).memory_bytes as f64 * self.class(class).memory_use) as u64
    }
}

fn round_millis(millis: f64) -> u64 {
    millis.round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_model_has_four_classes_in_name_order() {
        let model = SpeedModel::default_model();
        let names: Vec<&str> = model.classes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["balanced", "gpu_bound", "input_heavy", "over_provisioned"]
        );
        assert_eq!(model.adaptive.sample_every_s, 60);
    }

    #[test]
    fn speed_rises_with_cpus_up_to_saturation() {
        let model = SpeedModel::default_model();
        let input = model.class_named("input_heavy").unwrap();
        // 4 GPUs on the node: 16 CPUs is 4 per GPU, half of c_sat = 8.
        assert_eq!(model.speed(input, 16_000, 4), 0.5);
        assert_eq!(model.speed(input, 24_000, 4), 0.75);
        assert_eq!(model.speed(input, 32_000, 4), 1.0);
        assert_eq!(model.speed(input, 64_000, 4), 1.0);
        let balanced = model.class_named("balanced").unwrap();
        assert_eq!(model.speed(balanced, 8_000, 4), 2.0f64.powf(-0.5));
        let gpu = model.class_named("gpu_bound").unwrap();
        assert_eq!(model.speed(gpu, 4_000, 4), 1.0);
        assert_eq!(model.speed(gpu, 2_000, 4), 0.5);
    }

    #[test]
    fn requests_and_use_follow_the_class() {
        let model = SpeedModel::default_model();
        let over = model.class_named("over_provisioned").unwrap();
        assert_eq!(
            model.request(over, 2),
            Resources::new(16_000, 128 * (1 << 30), 2)
        );
        assert_eq!(model.cpu_demand(over, 2), 2000);
        assert_eq!(
            model.memory_use(over, 2),
            (128.0 * 0.15 * GIB) as u64,
            "15 % of what it asked for"
        );
    }

    #[test]
    fn classes_are_drawn_from_the_job_id_by_share() {
        let model = SpeedModel::default_model();
        let mut counts = [0usize; 4];
        for i in 0..20_000 {
            counts[model.class_of(&format!("philly-{i:05}")).0] += 1;
        }
        // Shares 0.40 / 0.25 / 0.20 / 0.15 in name order, within 1.5 points.
        for (count, share) in counts.iter().zip([0.40, 0.25, 0.20, 0.15]) {
            let got = *count as f64 / 20_000.0;
            assert!((got - share).abs() < 0.015, "{counts:?}");
        }
        assert_eq!(
            model.class_of("philly-00042"),
            model.class_of("philly-00042")
        );
    }

    #[test]
    fn a_partial_file_keeps_the_other_defaults_and_bad_values_say_what_to_fix() {
        let model =
            SpeedModel::from_toml("[request]\ncpus_per_gpu = 2.0\nmemory_gib_per_gpu = 16.0\n")
                .unwrap();
        assert_eq!(model.request.cpus_per_gpu, 2.0);
        assert_eq!(model.classes.len(), 4);
        let err = SpeedModel::from_toml(
            "[classes.x]\nshare = 0.0\nsaturation_cpus_per_gpu = 1.0\nexponent = 1.0\n\
             memory_use = 0.5\nrequest_scale = 1.0\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("shares sum to 0"), "{err}");
        let err = SpeedModel::from_toml(
            "[adaptive]\nmin_cpus_per_gpu = 1.0\nmax_cpu_factor = 0.5\n\
             min_memory_factor = 0.5\nmax_memory_factor = 2.0\nsample_every_s = 60\n\
             window_s = 300\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("max_cpu_factor ≥ 1"), "{err}");
    }
}
