//! The launcher an execution of a root agent starts as: its code is the crate
//! `tacc_launch` (small, so it builds static and starts quickly: see that crate); this
//! module names it where the process runtime builds its command line and where `taccd
//! launch` runs it.

pub use tacc_launch::{LAUNCH_FAILED, LAUNCH_SUBCOMMAND, Steps, TmpDirs, main, requested};
