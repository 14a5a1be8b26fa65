//! Task identities resolved a moment ago, kept for a few seconds: resolving one asks the
//! node's name service (`getpwuid`/`getgrgid`, or `getpwnam` for a mapped account; with
//! systemd's NSS module a round trip each) on every attempt, about a twentieth of the
//! agent's CPU for a trivial task. An entry lives [`IDENTITY_TTL`], so an account the
//! operator adds, removes or changes (a uid that now clashes with a local account, a
//! mapped account gone) is seen again within seconds; only identities that resolved are
//! kept — a refusal is looked up again at the next attempt; at most
//! [`IDENTITY_CACHE_SIZE`] are kept.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::identity::TaskIdentity;

/// How long a resolved identity is used without asking the name service again.
pub(crate) const IDENTITY_TTL: Duration = Duration::from_secs(5);

/// How many resolved identities are kept at most (distinct users with tasks on the node
/// within [`IDENTITY_TTL`]); past it, the expired go, and if that is not enough, all.
pub(crate) const IDENTITY_CACHE_SIZE: usize = 256;

/// What an identity is resolved from: the TACC user, the operator's mapped account, the
/// uid the server allocated.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct IdentityKey {
    pub user: String,
    pub unix_user: Option<String>,
    pub task_uid: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct IdentityCache {
    ttl: Duration,
    size: usize,
    entries: Mutex<HashMap<IdentityKey, (Instant, TaskIdentity)>>,
}

impl Default for IdentityCache {
    fn default() -> Self {
        IdentityCache::new(IDENTITY_TTL, IDENTITY_CACHE_SIZE)
    }
}

impl IdentityCache {
    pub fn new(ttl: Duration, size: usize) -> IdentityCache {
        IdentityCache {
            ttl,
            size,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The identity of `key` as resolved within the TTL before `now`, else `resolve()`'s
    /// (kept when it is one; a refusal is returned and not kept).
    pub fn get_or_resolve(
        &self,
        key: &IdentityKey,
        now: Instant,
        resolve: impl FnOnce() -> Result<TaskIdentity, String>,
    ) -> Result<TaskIdentity, String> {
        {
            let entries = self.entries.lock().expect("identity cache lock");
            if let Some((at, identity)) = entries.get(key) {
                if now.saturating_duration_since(*at) < self.ttl {
                    return Ok(identity.clone());
                }
            }
        }
        // Not under the lock: the name service may be slow.
        let identity = resolve()?;
        let mut entries = self.entries.lock().expect("identity cache lock");
        if entries.len() >= self.size && !entries.contains_key(key) {
            let ttl = self.ttl;
            entries.retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            if entries.len() >= self.size {
                entries.clear();
            }
        }
        entries.insert(key.clone(), (now, identity.clone()));
        Ok(identity)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use tacc_exec::RunAs;

    use super::*;

    fn key(user: &str) -> IdentityKey {
        IdentityKey {
            user: user.to_string(),
            unix_user: None,
            task_uid: Some(3_000_000_001),
        }
    }

    fn identity(uid: u32) -> TaskIdentity {
        TaskIdentity {
            run_as: Some(RunAs { uid, gid: uid }),
            name: Some("alice".into()),
            home: None,
        }
    }

    #[test]
    fn an_identity_is_resolved_once_within_the_ttl_and_again_after_it() {
        let cache = IdentityCache::new(Duration::from_secs(5), 8);
        let lookups = Cell::new(0);
        let resolve = |uid| {
            lookups.set(lookups.get() + 1);
            Ok(identity(uid))
        };
        let t0 = Instant::now();
        assert_eq!(
            cache.get_or_resolve(&key("alice"), t0, || resolve(7)),
            Ok(identity(7))
        );
        let soon = t0 + Duration::from_secs(4);
        assert_eq!(
            cache.get_or_resolve(&key("alice"), soon, || resolve(8)),
            Ok(identity(7))
        );
        assert_eq!(lookups.get(), 1);
        // The operator changed the account: seen once the entry is older than the TTL.
        let later = t0 + Duration::from_secs(5);
        assert_eq!(
            cache.get_or_resolve(&key("alice"), later, || resolve(8)),
            Ok(identity(8))
        );
        assert_eq!(lookups.get(), 2);
    }

    #[test]
    fn a_refusal_is_not_kept() {
        let cache = IdentityCache::default();
        let t0 = Instant::now();
        let refused = cache.get_or_resolve(&key("bob"), t0, || Err("uid clashes".into()));
        assert_eq!(refused, Err("uid clashes".to_string()));
        // Fixed by the operator a moment later: resolved at once, not refused from memory.
        assert_eq!(
            cache.get_or_resolve(&key("bob"), t0, || Ok(identity(9))),
            Ok(identity(9))
        );
    }

    #[test]
    fn different_users_and_mappings_are_different_entries_and_the_cache_is_bounded() {
        let cache = IdentityCache::new(Duration::from_secs(5), 2);
        let t0 = Instant::now();
        cache
            .get_or_resolve(&key("a"), t0, || Ok(identity(1)))
            .unwrap();
        let mapped = IdentityKey {
            unix_user: Some("nobody".into()),
            ..key("a")
        };
        assert_eq!(
            cache.get_or_resolve(&mapped, t0, || Ok(identity(2))),
            Ok(identity(2))
        );
        cache
            .get_or_resolve(&key("c"), t0, || Ok(identity(3)))
            .unwrap();
        assert!(cache.entries.lock().unwrap().len() <= 2);
    }
}
