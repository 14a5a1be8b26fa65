use std::fmt;

use serde::{Deserialize, Serialize};

/// A point in time: milliseconds since the Unix epoch.
///
/// Core types never read a clock; whoever drives them (the live server, the simulator)
/// passes time in.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub const fn from_millis(millis: u64) -> Self {
        Timestamp(millis)
    }
    pub const fn from_secs(secs: u64) -> Self {
        Timestamp(secs * 1000)
    }
    pub const fn as_millis(self) -> u64 {
        self.0
    }
    pub fn plus_secs(self, secs: u64) -> Self {
        Timestamp(self.0.saturating_add(secs.saturating_mul(1000)))
    }
    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
    pub fn millis_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
