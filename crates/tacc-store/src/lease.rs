//! The leadership lease of server replicas sharing one database: who leads, at which URL,
//! under which fencing epoch, until when. Taking the lease over (free, or lapsed) raises the
//! epoch; renewing keeps it. Acquire and renew are each one conditional statement (an
//! upsert or update with `RETURNING`), so two replicas racing for a lapsed lease cannot
//! both win. A store that holds the lease remembers its epoch ([`Fence`]) and checks it in
//! every transaction that changes task state: after a takeover those transactions fail
//! with [`StoreError::Fenced`](crate::StoreError::Fenced) instead of committing.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tacc_core::Timestamp;

/// The lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderLease {
    /// The replica holding it (an id it chose at start).
    pub holder: String,
    /// Where the holder serves the API, for followers to forward to.
    pub leader_url: String,
    /// Raised on every takeover; never lowered.
    pub epoch: u64,
    /// When it lapses unless renewed.
    pub expires_at: Timestamp,
}

impl LeaderLease {
    /// Whether it has lapsed at `now`.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.expires_at <= now
    }
}

/// A replica's claim to the lease: who, where, at which time, for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseClaim {
    pub holder: String,
    pub leader_url: String,
    pub now: Timestamp,
    pub ttl_ms: u64,
}

impl LeaseClaim {
    pub(crate) fn expires_at(&self) -> Timestamp {
        Timestamp(self.now.0.saturating_add(self.ttl_ms))
    }
}

/// The upsert that takes the lease when there is none or it lapsed (raising the epoch);
/// binds holder, url, expiry, now. No row comes back when another replica holds it.
pub(crate) const ACQUIRE_SQL: &str = "INSERT INTO leader_lease (id, holder, leader_url, epoch, expires_at) \
     VALUES (1, ?, ?, 1, ?) \
     ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, leader_url = excluded.leader_url, \
         epoch = leader_lease.epoch + 1, expires_at = excluded.expires_at \
     WHERE leader_lease.expires_at <= ? \
     RETURNING holder, leader_url, epoch, expires_at";

/// The update that renews the lease while no one took it over; binds expiry, holder,
/// epoch.
pub(crate) const RENEW_SQL: &str = "UPDATE leader_lease SET expires_at = ? \
     WHERE id = 1 AND holder = ? AND epoch = ? \
     RETURNING holder, leader_url, epoch, expires_at";

pub(crate) const CURRENT_SQL: &str =
    "SELECT holder, leader_url, epoch, expires_at FROM leader_lease WHERE id = 1";

/// What a store knows of its own leadership: nothing yet (not replicated: writes are not
/// checked), or the epoch it last acquired (0: it holds none, so every checked write fails).
#[derive(Debug, Clone)]
pub(crate) struct Fence(Arc<AtomicI64>);

impl Default for Fence {
    fn default() -> Self {
        Fence(Arc::new(AtomicI64::new(-1)))
    }
}

impl Fence {
    /// The epoch to check writes against; `None` while the store never took part in an
    /// election (a single server).
    pub(crate) fn epoch(&self) -> Option<u64> {
        u64::try_from(self.0.load(Ordering::SeqCst)).ok()
    }

    /// A fence that checks `epoch`, apart from every other.
    pub(crate) fn fixed(epoch: u64) -> Fence {
        Fence(Arc::new(AtomicI64::new(epoch as i64)))
    }

    /// After an election: the epoch won, or none (lost).
    pub(crate) fn set(&self, won: Option<u64>) {
        self.0.store(won.map_or(0, |e| e as i64), Ordering::SeqCst);
    }
}
