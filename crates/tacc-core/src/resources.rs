use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ByteSize;

/// A resource vector: what one node offers, or what a task asks for on each node.
///
/// CPUs are counted in thousandths so fractional requests (`cpus: 0.5`) stay exact.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub gpus: u32,
}

impl Resources {
    pub const ZERO: Resources = Resources {
        cpu_millis: 0,
        memory_bytes: 0,
        gpus: 0,
    };

    pub fn new(cpu_millis: u64, memory_bytes: u64, gpus: u32) -> Self {
        Resources {
            cpu_millis,
            memory_bytes,
            gpus,
        }
    }

    /// True when every component of `self` is at least that of `other`.
    pub fn covers(&self, other: &Resources) -> bool {
        self.cpu_millis >= other.cpu_millis
            && self.memory_bytes >= other.memory_bytes
            && self.gpus >= other.gpus
    }

    pub fn saturating_sub(&self, other: &Resources) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis.saturating_sub(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_sub(other.memory_bytes),
            gpus: self.gpus.saturating_sub(other.gpus),
        }
    }

    pub fn add(&self, other: &Resources) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis + other.cpu_millis,
            memory_bytes: self.memory_bytes + other.memory_bytes,
            gpus: self.gpus + other.gpus,
        }
    }

    pub fn times(&self, n: u32) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis * n as u64,
            memory_bytes: self.memory_bytes * n as u64,
            gpus: self.gpus * n,
        }
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cpus = self.cpu_millis as f64 / 1000.0;
        write!(f, "{cpus} cpu, {}", ByteSize::from_bytes(self.memory_bytes))?;
        if self.gpus > 0 {
            write!(f, ", {} gpu", self.gpus)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_is_componentwise() {
        let node = Resources::new(4000, 8 << 30, 2);
        assert!(node.covers(&Resources::new(4000, 8 << 30, 2)));
        assert!(!node.covers(&Resources::new(4001, 0, 0)));
        assert!(!node.covers(&Resources::new(0, 0, 3)));
        assert_eq!(
            node.saturating_sub(&Resources::new(5000, 1, 1)),
            Resources::new(0, (8 << 30) - 1, 1)
        );
        assert_eq!(
            Resources::new(500, 10, 1).times(3),
            Resources::new(1500, 30, 3)
        );
        assert_eq!(node.to_string(), "4 cpu, 8GiB, 2 gpu");
    }
}
