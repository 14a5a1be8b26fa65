//! MIG: an NVIDIA GPU in MIG mode is split into slices (`1g.10gb`, `3g.40gb`, …), each
//! its own device with its own `MIG-…` UUID. Where NVML reports slices, the node offers
//! each slice as one GPU of its own type (`A100-MIG-1g.10gb`), so a task file asks for
//! `gpu_type: A100-MIG-1g.10gb` and gets one slice; a GPU not in MIG mode is offered
//! whole, as before. The mapping from what NVML finds to what is offered is a pure
//! function ([`offer`]) so it can be tested without MIG hardware.

use crate::gpus::short_model;

/// One physical GPU as NVML finds it, with its MIG slices when MIG mode is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PhysicalGpu {
    /// NVML's index of the physical GPU.
    pub index: u32,
    pub uuid: String,
    /// NVML's name, e.g. `NVIDIA A100-SXM4-80GB`.
    pub name: String,
    pub memory_total_bytes: u64,
    /// Empty when MIG mode is off (or no slice is configured).
    pub slices: Vec<MigSlice>,
}

/// One MIG slice of a physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MigSlice {
    /// NVML's index of the slice on its GPU.
    pub index: u32,
    /// `MIG-…`: what `CUDA_VISIBLE_DEVICES` names it by.
    pub uuid: String,
    /// NVML's name of the slice, e.g. `NVIDIA A100-SXM4-80GB MIG 1g.10gb`.
    pub name: String,
    pub memory_total_bytes: u64,
}

/// Where an offered GPU comes from: a physical GPU, whole or one of its slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Source {
    pub gpu: u32,
    pub slice: Option<u32>,
}

/// One GPU the node offers to tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Offered {
    pub source: Source,
    pub uuid: String,
    /// The GPU type task files name in `gpu_type`: `A100`, or `A100-MIG-1g.10gb`.
    pub gpu_type: String,
    /// The model as NVML names it.
    pub model: String,
    pub memory_total_bytes: u64,
}

impl Offered {
    pub fn is_slice(&self) -> bool {
        self.source.slice.is_some()
    }
}

/// What the node offers, in order (the offered index is the position): each GPU without
/// slices whole, each slice of a GPU in MIG mode as its own GPU.
pub(crate) fn offer(physical: &[PhysicalGpu]) -> Vec<Offered> {
    let mut offered = Vec::new();
    for gpu in physical {
        let model = short_model(&gpu.name);
        if gpu.slices.is_empty() {
            offered.push(Offered {
                source: Source {
                    gpu: gpu.index,
                    slice: None,
                },
                uuid: gpu.uuid.clone(),
                gpu_type: model,
                model: gpu.name.clone(),
                memory_total_bytes: gpu.memory_total_bytes,
            });
            continue;
        }
        // `A100-SXM4-80GB` → `A100`: the family, which the profile then qualifies.
        let family = model.split('-').next().unwrap_or(&model).to_string();
        for slice in &gpu.slices {
            offered.push(Offered {
                source: Source {
                    gpu: gpu.index,
                    slice: Some(slice.index),
                },
                uuid: slice.uuid.clone(),
                gpu_type: format!("{family}-MIG-{}", profile(&slice.name)),
                model: slice.name.clone(),
                memory_total_bytes: slice.memory_total_bytes,
            });
        }
    }
    offered
}

/// The profile of a slice from its NVML name (`… MIG 1g.10gb` → `1g.10gb`); the last
/// word when the name does not say `MIG`.
fn profile(name: &str) -> String {
    let words: Vec<&str> = name.split_whitespace().collect();
    words
        .iter()
        .position(|w| *w == "MIG")
        .and_then(|at| words.get(at + 1))
        .or(words.last())
        .map_or_else(|| "unknown".to_string(), |w| w.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(index: u32, profile: &str) -> MigSlice {
        MigSlice {
            index,
            uuid: format!("MIG-{index}-{profile}"),
            name: format!("NVIDIA A100-SXM4-80GB MIG {profile}"),
            memory_total_bytes: 10 << 30,
        }
    }

    #[test]
    fn each_mig_slice_is_offered_as_its_own_gpu_type_by_uuid_and_whole_gpus_stay_whole() {
        let physical = vec![
            PhysicalGpu {
                index: 0,
                uuid: "GPU-aaa".into(),
                name: "NVIDIA A100-SXM4-80GB".into(),
                memory_total_bytes: 80 << 30,
                slices: vec![
                    slice(0, "1g.10gb"),
                    slice(1, "1g.10gb"),
                    slice(2, "3g.40gb"),
                ],
            },
            PhysicalGpu {
                index: 1,
                uuid: "GPU-bbb".into(),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total_bytes: 80 << 30,
                slices: vec![],
            },
        ];
        let offered = offer(&physical);
        let summary: Vec<(usize, &str, &str, Source)> = offered
            .iter()
            .enumerate()
            .map(|(i, o)| (i, o.gpu_type.as_str(), o.uuid.as_str(), o.source))
            .collect();
        let from = |gpu, slice| Source { gpu, slice };
        assert_eq!(
            summary,
            vec![
                (0, "A100-MIG-1g.10gb", "MIG-0-1g.10gb", from(0, Some(0))),
                (1, "A100-MIG-1g.10gb", "MIG-1-1g.10gb", from(0, Some(1))),
                (2, "A100-MIG-3g.40gb", "MIG-2-3g.40gb", from(0, Some(2))),
                (3, "H100", "GPU-bbb", from(1, None)),
            ]
        );
        assert!(offered[0].is_slice() && !offered[3].is_slice());
        assert_eq!(offered[0].memory_total_bytes, 10 << 30);
    }

    #[test]
    fn a_slice_name_without_mig_keeps_its_last_word_as_profile() {
        assert_eq!(profile("NVIDIA A30 MIG 2g.12gb"), "2g.12gb");
        assert_eq!(profile("odd 4g.20gb"), "4g.20gb");
        assert_eq!(profile(""), "unknown");
    }
}
