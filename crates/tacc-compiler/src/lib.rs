//! TEMPORARY lib.rs: the snapshot module below is a stand-in until branch wip-compiler
//! lands; `instruction` is the real thing.

pub mod instruction;
mod snapshot;

pub use instruction::{Instruction, NodeContext, compile};
pub use snapshot::*;
