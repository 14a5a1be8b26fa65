//! Authentication and authorisation of every request: bearer tokens (users, agent join
//! tokens, node credentials), the per-route access rules and the ownership rule decided
//! in one place ([`policy`]), and the audit trail.

pub mod audit;
pub mod authenticate;
pub mod failures;
pub mod policy;
pub mod tokens;

pub use audit::{AuditSettings, AuditTrail};
pub use authenticate::Authenticator;
pub use policy::{Access, Caller, Refusal, UserCaller, decide, may_act_for};
