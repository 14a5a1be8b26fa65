//! One handler per event of the control plane, each a synchronous function over the
//! [`Core`](super::Core): `fn on_x(core, fx, …, input) -> reply`. A handler decides and
//! changes the core; what must happen outside — store changes, nodes to wake, log lines,
//! scheduler events, metrics — goes into [`Effects`](super::effects::Effects) for the shell
//! (`shell.rs`) to carry out after it, the changes in the turn's one transaction.
//! Handlers never do I/O: no `async`, store, clock, lock or channel here
//! (`architecture.rs` checks it), so each is tested by calling it (`lifecycle_tests.rs`
//! drives them through the shell; the rules they apply are in `rules/`).
//!
//! Ported so far: an attempt starting, a rank finishing, an attempt ending (retried,
//! requeued, lost with its node), cancels of a task or a group, a node's registration and
//! poll, the liveness tick with its hang and idle-GPU checks, node administration,
//! submits and held tasks released, a workflow's tasks accepted (an array's, a sweep's
//! trials, a pipeline's stages) and stage tasks released when a sweep ends, a failed
//! stage's dependents ended, recovery from the store, the scheduler's decision and its
//! plan, and adaptive resizes (see
//! docs/ARCHITECTURE.md, "One turn of the control plane").

pub(crate) mod accepted;
pub(crate) mod cancel;
pub(crate) mod decide;
pub(crate) mod dependents;
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
pub(crate) mod resize;
pub(crate) mod started;
pub(crate) mod submit;
pub(crate) mod sweep_ended;
