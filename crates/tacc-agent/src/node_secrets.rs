//! The secret values of every attempt this agent runs, masked in every task's log — not
//! only in the log of the task they belong to. Another user's task that gets hold of a
//! value (a file left readable, a shared path) cannot publish it through its own log while
//! the owner's task runs here.
//!
//! Each attempt holds its values from before its first log line until its last one is
//! written ([`HeldSecrets`], released on drop); log lines are masked with every value held
//! at that moment.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::secrets::SecretMask;

/// The values held by the attempts running on this node, and the mask they make.
#[derive(Debug, Default)]
pub(crate) struct NodeSecrets {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    held: BTreeMap<u64, Vec<String>>,
    /// Rebuilt whenever `held` changes, so masking a line takes no rebuild.
    mask: Arc<SecretMask>,
}

impl State {
    fn rebuild(&mut self) {
        self.mask = Arc::new(SecretMask::new(self.held.values().flatten()));
    }
}

impl NodeSecrets {
    /// A node's set holding only `values` (for tests of what masks lines).
    #[cfg(test)]
    pub fn fixed(values: &[String]) -> (Arc<NodeSecrets>, HeldSecrets) {
        let secrets = Arc::new(NodeSecrets::default());
        let held = secrets.hold(values.iter().cloned());
        (secrets, held)
    }

    /// Mask `values` in every log until the returned guard is dropped.
    pub fn hold(self: &Arc<Self>, values: impl IntoIterator<Item = String>) -> HeldSecrets {
        let mut state = self.state.lock().unwrap();
        let id = state.next;
        state.next += 1;
        state.held.insert(id, values.into_iter().collect());
        state.rebuild();
        HeldSecrets {
            secrets: self.clone(),
            id,
        }
    }

    /// The mask of every value held now.
    pub fn mask(&self) -> Arc<SecretMask> {
        self.state.lock().unwrap().mask.clone()
    }
}

/// One attempt's values, masked everywhere while this lives.
#[derive(Debug)]
pub(crate) struct HeldSecrets {
    secrets: Arc<NodeSecrets>,
    id: u64,
}

impl Drop for HeldSecrets {
    fn drop(&mut self) {
        let mut state = self.secrets.state.lock().unwrap();
        if state.held.remove(&self.id).is_some() {
            state.rebuild();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_held_value_is_masked_until_its_holder_lets_go() {
        let secrets = Arc::new(NodeSecrets::default());
        let alice = secrets.hold(["alice-secret".to_string()]);
        let bob = secrets.hold(["bob-s3cret".to_string()]);
        let line = "alice-secret bob-s3cret";
        assert_eq!(secrets.mask().apply(line), "*** ***");
        drop(alice);
        assert_eq!(secrets.mask().apply(line), "alice-secret ***");
        drop(bob);
        assert_eq!(secrets.mask().apply(line), line);
    }
}
