//! `tacc-compiler`: layer 2 of TACC's four (schema → **compiler** → scheduling →
//! execution). It turns a validated `TaskSpec` plus a code snapshot into an instruction,
//! everything a node needs to run the task; this part holds the content-addressed code
//! snapshots: chunking a directory (FastCDC + BLAKE3), the manifest that names it, a
//! chunk store on disk, and materialising a snapshot into a working directory.
//!
//! It depends only on `tacc-core` and `tacc-schema` among our crates. It must not
//! use tokio or the network: all I/O here is synchronous `std` file I/O, so that the CLI,
//! the agent and tests can call it from any context.

mod environment;
mod error;
pub mod instruction;
pub mod snapshot;

pub use environment::{
    BUILD_VAR_PREFIXES, DatasetMount, DatasetSource, EnvPlan, InstructionEnvironment,
    dataset_cache_key, env_key, normalise_requirements, resolve_datasets,
};
pub use error::CompilerError;
pub use instruction::{
    ArrayElement, CHECKPOINT_DIR, INSTRUCTION_FORMAT, Instruction, METRICS_FILE, NodeContext,
    compile,
};
pub use snapshot::{
    ChunkHash, ChunkRef, ChunkSource, ChunkerParams, DirChunkStore, Entry, EntryKind, GcStats,
    MANIFEST_FORMAT_VERSION, Manifest, MaterializeStats, ScannedTree, materialize,
    materialize_cached, scan,
};
