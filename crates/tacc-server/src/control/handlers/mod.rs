//! One handler per event of the control plane, each a synchronous function over the
//! [`Core`](super::Core): `fn on_x(core, fx, …, input) -> reply`. A handler decides and
//! changes the core; what must happen outside — store changes, nodes to wake, log lines,
//! scheduler events, metrics — goes into [`Effects`](super::effects::Effects) for the shell
//! (`shell.rs`) to carry out after it, the changes in the turn's one transaction.
//! Handlers never do I/O: no `async`, store, clock, lock or channel here
//! (`architecture.rs` checks it), so each is tested by calling it (`lifecycle_tests.rs`
//! drives them through the shell; the rules they apply are in `rules/`).
//!
//! Ported so far: an attempt starting, a node's rank of an attempt finishing, an attempt
//! ending (with its retry or requeue), a user's cancel, a node's registration and poll, the liveness tick, recovery from the store, node administration, the hang and idle-GPU checks, tasks submitted or released, and the scheduler's decision and its plan applied. Events not yet here still run
//! as the async methods of `Control` in the other files of `control/`.

pub(crate) mod cancel;
pub(crate) mod decide;
pub(crate) mod ending;
pub(crate) mod hangs;
pub(crate) mod idle_gpus;
pub(crate) mod liveness;
pub(crate) mod node_admin;
pub(crate) mod plan;
pub(crate) mod poll;
pub(crate) mod rank_end;
pub(crate) mod register;
pub(crate) mod reload;
pub(crate) mod started;
pub(crate) mod submit;
