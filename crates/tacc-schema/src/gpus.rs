//! `resources.gpus` in the JSON Schema: whole GPUs or a share of one GPU. The value type
//! is [`tacc_core::GpuCount`]; tacc-core stays free of schemars, so it is mirrored here.

use schemars::JsonSchema;

// Mirrors `GpuCount` for the JSON Schema only.
/// GPUs per node: whole GPUs (e.g. `2`), or a share of one GPU in hundredths (e.g. `0.5`,
/// `0.25`) packed with other tasks of the same user (or group) on one GPU. A share above
/// one GPU that is not whole (`1.5`) is refused.
#[derive(JsonSchema)]
#[schemars(rename = "Gpus")]
#[allow(dead_code)]
pub(crate) struct GpusSchema(#[schemars(range(min = 0))] f64);
