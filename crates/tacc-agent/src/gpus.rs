//! The node's GPUs: what they are (index, UUID, model, memory, health) for registration,
//! and what an attempt's GPUs use (utilisation, memory) for the sampler. Behind the
//! [`GpuProbe`] trait: [`NvmlProbe`] asks NVML (`libnvidia-ml.so.1`, loaded at run
//! time, so the agent builds and runs on machines without GPUs or drivers), and
//! [`FakeGpus`] stands for `--gpus N --gpu-type T` on a machine without them (it
//! describes them and measures nothing) and, with readings set, for tests.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, Once};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use tacc_proto::{GpuDevice, GpuSample};

use crate::mig::{MigSlice, Offered, PhysicalGpu, offer};

/// What the agent knows of its GPUs.
pub trait GpuProbe: Send + Sync + Debug {
    /// `nvml` or `fake`.
    fn kind(&self) -> &'static str;

    /// Every GPU offered to tasks, by index.
    fn devices(&self) -> Vec<GpuDevice>;

    /// What the GPUs `indices` use now; a GPU that cannot be read is left out (a fake
    /// one is never read).
    fn sample(&self, indices: &[u32]) -> Vec<GpuSample>;

    /// The processes holding a context on the GPUs `indices`, as (GPU index, pid).
    fn holders(&self, indices: &[u32]) -> Vec<(u32, u32)>;

    /// `CUDA_VISIBLE_DEVICES` for the GPUs `indices` when their indices do not name them:
    /// the `MIG-…` UUIDs where any is a MIG slice. `None` keeps the indices.
    fn visible_devices(&self, _indices: &[u32]) -> Option<String> {
        None
    }
}

/// The UUIDs of `indices` in `offered`, joined, when any of them is a MIG slice.
fn slice_uuids(offered: &[Offered], indices: &[u32]) -> Option<String> {
    let chosen: Vec<&Offered> = indices
        .iter()
        .filter_map(|&i| offered.get(i as usize))
        .collect();
    chosen.iter().any(|o| o.is_slice()).then(|| {
        chosen
            .iter()
            .map(|o| o.uuid.as_str())
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// The GPUs NVML finds, the first `limit` of them (`--gpus N` on a machine with more);
/// a GPU in MIG mode is offered as its slices, each its own GPU ([`crate::mig`]).
#[derive(Debug)]
pub struct NvmlProbe {
    nvml: Nvml,
    offered: Vec<Offered>,
}

/// MIG mode as NVML reports it when on (`NVML_DEVICE_MIG_ENABLE`).
const MIG_ENABLED: u32 = 1;

/// A physical GPU and its MIG slices; one that cannot be read is offered whole (and
/// reported unreadable by [`NvmlProbe::devices`]).
fn physical(nvml: &Nvml, index: u32) -> PhysicalGpu {
    let read = || -> Result<PhysicalGpu, NvmlError> {
        let device = nvml.device_by_index(index)?;
        let mig_on = device
            .mig_mode()
            .is_ok_and(|mode| mode.current == MIG_ENABLED);
        let mut slices = Vec::new();
        if mig_on {
            for slice in 0..device.mig_device_count().unwrap_or(0) {
                // Slots without a configured slice are not found: skip them.
                let Ok(handle) = device.mig_device_by_index(slice) else {
                    continue;
                };
                slices.push(MigSlice {
                    index: slice,
                    uuid: handle.uuid()?,
                    name: handle.name()?,
                    memory_total_bytes: handle.memory_info().map_or(0, |m| m.total),
                });
            }
        }
        Ok(PhysicalGpu {
            index,
            uuid: device.uuid()?,
            name: device.name()?,
            memory_total_bytes: device.memory_info()?.total,
            slices,
        })
    };
    read().unwrap_or(PhysicalGpu {
        index,
        uuid: String::new(),
        name: String::new(),
        memory_total_bytes: 0,
        slices: Vec::new(),
    })
}

impl NvmlProbe {
    /// Load NVML; the error says why it cannot be used (no library, no driver, …).
    pub fn open(limit: Option<u32>) -> Result<NvmlProbe, String> {
        let nvml = Nvml::init().map_err(|e| match e {
            NvmlError::LibloadingError(e) => format!("libnvidia-ml.so.1 cannot be loaded ({e})"),
            other => format!("NVML does not start: {other}"),
        })?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML cannot count GPUs: {e}"))?;
        let physical: Vec<PhysicalGpu> = (0..count).map(|i| physical(&nvml, i)).collect();
        let mut offered = offer(&physical);
        offered.truncate(limit.map_or(offered.len(), |l| l as usize));
        Ok(NvmlProbe { nvml, offered })
    }

    /// How many GPUs are offered.
    pub fn count(&self) -> u32 {
        self.offered.len() as u32
    }

    /// The GPU type of the first GPU offered, as task files name it (`H100`,
    /// `A100-MIG-1g.10gb`).
    fn first_type(&self) -> Option<String> {
        self.offered.first().map(|o| o.gpu_type.clone())
    }

    /// NVML's handle of offered GPU `index`: the physical GPU, or its MIG slice.
    fn handle(&self, index: u32) -> Result<Device<'_>, NvmlError> {
        let offered = self
            .offered
            .get(index as usize)
            .ok_or(NvmlError::InvalidArg)?;
        let device = self.nvml.device_by_index(offered.source.gpu)?;
        match offered.source.slice {
            Some(slice) => device.mig_device_by_index(slice),
            None => Ok(device),
        }
    }

    fn device(&self, index: u32) -> Result<GpuDevice, NvmlError> {
        let offered = self
            .offered
            .get(index as usize)
            .ok_or(NvmlError::InvalidArg)?;
        let device = self.handle(index)?;
        let memory = device.memory_info()?;
        // Retired pages are the physical GPU's, whichever slice is asked about.
        let parent = self.nvml.device_by_index(offered.source.gpu)?;
        // Pages waiting to be retired mean uncorrectable memory errors: the GPU needs a
        // reset. Consumer GPUs do not report it, which is no sign of trouble.
        let health = match parent.are_pages_pending_retired() {
            Ok(true) => "retired pages pending".to_string(),
            Ok(false) | Err(NvmlError::NotSupported) => "ok".to_string(),
            Err(e) => format!("unreadable: {e}"),
        };
        Ok(GpuDevice {
            index,
            uuid: device.uuid()?,
            model: device.name()?,
            memory_total_bytes: memory.total,
            health,
        })
    }

    fn reading(&self, index: u32) -> Result<GpuSample, NvmlError> {
        let device = self.handle(index)?;
        let memory = device.memory_info()?;
        Ok(GpuSample {
            index,
            utilization_percent: device.utilization_rates()?.gpu,
            memory_used_bytes: memory.used,
            memory_total_bytes: memory.total,
        })
    }
}

impl GpuProbe for NvmlProbe {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn devices(&self) -> Vec<GpuDevice> {
        (0..self.count())
            .map(|index| {
                self.device(index).unwrap_or_else(|e| GpuDevice {
                    index,
                    uuid: String::new(),
                    model: String::new(),
                    memory_total_bytes: 0,
                    health: format!("unreadable: {e}"),
                })
            })
            .collect()
    }

    fn sample(&self, indices: &[u32]) -> Vec<GpuSample> {
        indices
            .iter()
            .filter(|&&i| i < self.count())
            .filter_map(|&i| self.reading(i).ok())
            .collect()
    }

    fn holders(&self, indices: &[u32]) -> Vec<(u32, u32)> {
        let mut held = Vec::new();
        for &index in indices.iter().filter(|&&i| i < self.count()) {
            let Ok(device) = self.handle(index) else {
                continue;
            };
            let compute = device.running_compute_processes().unwrap_or_default();
            let graphics = device.running_graphics_processes().unwrap_or_default();
            held.extend(compute.iter().chain(&graphics).map(|p| (index, p.pid)));
        }
        held.sort_unstable();
        held.dedup();
        held
    }

    fn visible_devices(&self, indices: &[u32]) -> Option<String> {
        slice_uuids(&self.offered, indices)
    }
}

/// GPUs that are not there: `--gpus N --gpu-type T` on a machine without them. They are
/// described (UUID `fake-N`, health `fake`) and measure nothing, unless a test sets
/// readings with [`FakeGpus::set_reading`].
#[derive(Debug, Default)]
pub struct FakeGpus {
    count: u32,
    model: String,
    /// Set by [`FakeGpus::from_physical`]: GPUs described as NVML would offer them.
    offered: Vec<Offered>,
    readings: Mutex<BTreeMap<u32, GpuSample>>,
    /// Where the readings come from instead, read at each sample
    /// ([`FakeGpus::reading_from`]).
    readings_file: Option<std::path::PathBuf>,
    holders: Mutex<Vec<(u32, u32)>>,
}

impl FakeGpus {
    pub fn new(count: u32, model: Option<String>) -> FakeGpus {
        FakeGpus {
            count,
            model: model.unwrap_or_default(),
            offered: Vec::new(),
            readings: Mutex::default(),
            readings_file: None,
            holders: Mutex::default(),
        }
    }

    /// Read the GPUs' utilisation from `file` at each sample (`taccd agent
    /// --fake-gpu-readings`): one `INDEX PERCENT` line per GPU; a GPU it does not list,
    /// or a file that cannot be read, gives no reading. Fake GPUs measure nothing, so
    /// this is how a demo or a test plays a utilisation series to the idle-GPU policy
    /// through a real agent.
    pub fn reading_from(mut self, file: std::path::PathBuf) -> FakeGpus {
        self.readings_file = Some(file);
        self
    }

    /// GPUs as NVML would offer `physical` (MIG slices each their own GPU), for tests of
    /// the mapping without MIG hardware.
    #[cfg(test)]
    pub(crate) fn from_physical(physical: &[PhysicalGpu]) -> FakeGpus {
        let offered = offer(physical);
        FakeGpus {
            count: offered.len() as u32,
            offered,
            ..FakeGpus::default()
        }
    }

    /// Process `pid` holds GPU `index` from now on (tests).
    pub fn set_holder(&self, index: u32, pid: u32) {
        self.holders.lock().unwrap().push((index, pid));
    }

    /// What GPU `index` reads as from now on (tests).
    pub fn set_reading(&self, index: u32, utilization_percent: u32, memory_used_bytes: u64) {
        self.readings.lock().unwrap().insert(
            index,
            GpuSample {
                index,
                utilization_percent,
                memory_used_bytes,
                memory_total_bytes: 0,
            },
        );
    }
}

impl GpuProbe for FakeGpus {
    fn kind(&self) -> &'static str {
        "fake"
    }

    fn devices(&self) -> Vec<GpuDevice> {
        (0..self.count)
            .map(|index| match self.offered.get(index as usize) {
                Some(offered) => GpuDevice {
                    index,
                    uuid: offered.uuid.clone(),
                    model: offered.gpu_type.clone(),
                    memory_total_bytes: offered.memory_total_bytes,
                    health: "fake".into(),
                },
                None => GpuDevice {
                    index,
                    uuid: format!("fake-{index}"),
                    model: self.model.clone(),
                    memory_total_bytes: 0,
                    health: "fake".into(),
                },
            })
            .collect()
    }

    fn visible_devices(&self, indices: &[u32]) -> Option<String> {
        slice_uuids(&self.offered, indices)
    }

    fn sample(&self, indices: &[u32]) -> Vec<GpuSample> {
        if let Some(file) = &self.readings_file {
            let listed = std::fs::read_to_string(file).unwrap_or_default();
            let readings = readings_listed(&listed);
            return indices
                .iter()
                .filter_map(|i| readings.get(i).cloned())
                .collect();
        }
        let readings = self.readings.lock().unwrap();
        indices
            .iter()
            .filter_map(|i| readings.get(i).cloned())
            .collect()
    }

    fn holders(&self, indices: &[u32]) -> Vec<(u32, u32)> {
        self.holders
            .lock()
            .unwrap()
            .iter()
            .filter(|(index, _)| indices.contains(index))
            .copied()
            .collect()
    }
}

/// The readings a `--fake-gpu-readings` file lists: `INDEX PERCENT` lines (a percent over
/// 100 is 100); other lines are ignored.
fn readings_listed(text: &str) -> BTreeMap<u32, GpuSample> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let index: u32 = words.next()?.parse().ok()?;
            let percent: u32 = words.next()?.parse().ok()?;
            Some((
                index,
                GpuSample {
                    index,
                    utilization_percent: percent.min(100),
                    memory_used_bytes: 0,
                    memory_total_bytes: 0,
                },
            ))
        })
        .collect()
}

/// The probe of this node: NVML where it loads and finds GPUs (the first `asked` of
/// them with `--gpus N`), else `asked` fake GPUs of model `model` (none without
/// `--gpus`). Where NVML is unusable the log says so once.
pub fn choose_probe(
    asked: Option<u32>,
    model: Option<String>,
    fake_readings: Option<std::path::PathBuf>,
) -> Arc<dyn GpuProbe> {
    match NvmlProbe::open(asked) {
        Ok(probe) if probe.count() > 0 => {
            tracing::info!("NVML finds {} GPU(s) to offer", probe.count());
            Arc::new(probe)
        }
        found => {
            let why = match found {
                Ok(_) => "NVML finds no GPU".to_string(),
                Err(why) => why,
            };
            static SAID: Once = Once::new();
            SAID.call_once(|| match asked {
                Some(n) if n > 0 => tracing::info!(
                    "no GPU through NVML ({why}): offering {n} fake GPU(s) as --gpus asks; they measure nothing"
                ),
                _ => tracing::info!("no GPU through NVML ({why}): this node offers no GPUs"),
            });
            let fake = FakeGpus::new(asked.unwrap_or(0), model);
            Arc::new(match fake_readings {
                Some(file) => fake.reading_from(file),
                None => fake,
            })
        }
    }
}

/// NVML's count of GPUs and the model of the first, as task files name it in
/// `gpu_type` (`NVIDIA H100 80GB HBM3` → `H100`); `(0, None)` without NVML.
pub fn detect_gpus() -> (u32, Option<String>) {
    let Ok(probe) = NvmlProbe::open(None) else {
        return (0, None);
    };
    (probe.count(), probe.first_type())
}

/// The model word of a GPU's name: the first that starts with a letter and holds a
/// digit (`NVIDIA H100 80GB HBM3` → `H100`), else the whole name.
pub(crate) fn short_model(name: &str) -> String {
    name.split_whitespace()
        .find(|word| {
            word.chars().any(|c| c.is_ascii_digit())
                && word.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        })
        .unwrap_or(name)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_gpus_read_what_their_readings_file_lists_at_each_sample() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("readings");
        let gpus = FakeGpus::new(2, None).reading_from(file.clone());
        assert_eq!(gpus.sample(&[0, 1]), vec![], "no file yet: no reading");
        std::fs::write(&file, "0 87\n1 250\nnot a reading\n").unwrap();
        let read: Vec<(u32, u32)> = gpus
            .sample(&[0, 1])
            .iter()
            .map(|s| (s.index, s.utilization_percent))
            .collect();
        assert_eq!(read, vec![(0, 87), (1, 100)]);
        std::fs::write(&file, "1 3\n").unwrap();
        let read: Vec<(u32, u32)> = gpus
            .sample(&[0, 1])
            .iter()
            .map(|s| (s.index, s.utilization_percent))
            .collect();
        assert_eq!(read, vec![(1, 3)], "GPU 0 is no longer listed");
    }

    #[test]
    fn gpu_model_is_the_short_name() {
        assert_eq!(short_model("NVIDIA H100 80GB HBM3"), "H100");
        assert_eq!(short_model("Tesla V100-SXM2-16GB"), "V100-SXM2-16GB");
        assert_eq!(short_model("Odd"), "Odd");
    }

    #[test]
    fn fake_gpus_are_described_and_measure_only_what_a_test_sets() {
        let fake = FakeGpus::new(2, Some("A100".into()));
        let devices = fake.devices();
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[1].uuid, "fake-1");
        assert_eq!(devices[1].model, "A100");
        assert_eq!(devices[1].health, "fake");
        assert!(fake.sample(&[0, 1]).is_empty());
        fake.set_reading(1, 75, 3 << 30);
        let samples = fake.sample(&[0, 1]);
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].index, 1);
        assert_eq!(samples[0].utilization_percent, 75);
    }

    #[test]
    fn mig_slices_are_offered_as_their_own_gpus_and_named_by_uuid_to_cuda() {
        use crate::mig::MigSlice;
        let slice = |index: u32| MigSlice {
            index,
            uuid: format!("MIG-5a1c{index}"),
            name: "NVIDIA A100-SXM4-40GB MIG 1g.10gb".into(),
            memory_total_bytes: 10 << 30,
        };
        let probe = FakeGpus::from_physical(&[
            PhysicalGpu {
                index: 0,
                uuid: "GPU-0".into(),
                name: "NVIDIA A100-SXM4-40GB".into(),
                memory_total_bytes: 40 << 30,
                slices: vec![slice(0), slice(1)],
            },
            PhysicalGpu {
                index: 1,
                uuid: "GPU-1".into(),
                name: "NVIDIA A100-SXM4-40GB".into(),
                memory_total_bytes: 40 << 30,
                slices: vec![],
            },
        ]);
        let devices = probe.devices();
        let types: Vec<&str> = devices.iter().map(|d| d.model.as_str()).collect();
        assert_eq!(
            types,
            ["A100-MIG-1g.10gb", "A100-MIG-1g.10gb", "A100-SXM4-40GB"]
        );
        assert_eq!(devices[1].uuid, "MIG-5a1c1");
        // A task given offered GPU 1 sees that slice by UUID; a whole GPU keeps its index.
        assert_eq!(probe.visible_devices(&[1]).as_deref(), Some("MIG-5a1c1"));
        assert_eq!(probe.visible_devices(&[2]), None);
        let mut env = BTreeMap::from([("CUDA_VISIBLE_DEVICES".to_string(), "1".to_string())]);
        crate::gpu_share_env::apply(&mut env, &probe, &[1], None, None);
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "MIG-5a1c1");
        assert_eq!(FakeGpus::new(2, None).visible_devices(&[0, 1]), None);
    }

    #[test]
    fn the_probe_is_nvml_where_it_finds_gpus_else_what_gpus_asks_for() {
        match NvmlProbe::open(None) {
            Ok(nvml) if nvml.count() > 0 => {
                // A machine with GPUs: NVML describes and measures each.
                for device in nvml.devices() {
                    assert!(device.uuid.starts_with("GPU-"), "{device:?}");
                    assert!(device.memory_total_bytes > 0, "{device:?}");
                }
                let samples = nvml.sample(&[0]);
                assert_eq!(samples.len(), 1);
                assert!(samples[0].utilization_percent <= 100);
                assert_eq!(choose_probe(None, None, None).kind(), "nvml");
                assert_eq!(detect_gpus().0, nvml.count());
            }
            _ => {
                assert_eq!(choose_probe(None, None, None).devices().len(), 0);
                let probe = choose_probe(Some(3), Some("T4".into()), None);
                assert_eq!(probe.kind(), "fake");
                assert_eq!(probe.devices().len(), 3);
                assert_eq!(detect_gpus(), (0, None));
            }
        }
    }
}
