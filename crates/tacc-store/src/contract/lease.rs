//! The contract of the leadership lease: one holder at a time, a takeover only once it
//! lapsed and always with a higher epoch, renewal only by the holder of the current epoch.

use tacc_core::Timestamp;

use crate::{LeaseClaim, Store};

fn claim(holder: &str, now: u64) -> LeaseClaim {
    LeaseClaim {
        holder: holder.to_string(),
        leader_url: format!("http://{holder}:8383"),
        now: Timestamp(now),
        ttl_ms: 5_000,
    }
}

pub async fn lease_free_is_taken_with_epoch_one(store: &dyn Store) {
    assert_eq!(store.current_lease().await.unwrap(), None);
    let lease = store
        .try_acquire_lease(&claim("a", 1_000))
        .await
        .unwrap()
        .expect("a free lease is taken");
    assert_eq!(lease.holder, "a");
    assert_eq!(lease.leader_url, "http://a:8383");
    assert_eq!(lease.epoch, 1);
    assert_eq!(lease.expires_at, Timestamp(6_000));
    assert_eq!(store.current_lease().await.unwrap(), Some(lease));
}

pub async fn lease_held_is_refused_to_another_replica(store: &dyn Store) {
    let held = store.try_acquire_lease(&claim("a", 1_000)).await.unwrap();
    let refused = store.try_acquire_lease(&claim("b", 5_999)).await.unwrap();
    assert_eq!(refused, None, "a lease held until 6000 was taken at 5999");
    assert_eq!(store.current_lease().await.unwrap(), held);
}

pub async fn lease_lapsed_is_taken_over_with_a_higher_epoch(store: &dyn Store) {
    let first = store
        .try_acquire_lease(&claim("a", 1_000))
        .await
        .unwrap()
        .unwrap();
    let taken = store
        .try_acquire_lease(&claim("b", 6_000))
        .await
        .unwrap()
        .expect("a lapsed lease is taken over");
    assert_eq!(taken.holder, "b");
    assert_eq!(taken.leader_url, "http://b:8383");
    assert!(taken.epoch > first.epoch, "{taken:?} after {first:?}");
    assert_eq!(taken.expires_at, Timestamp(11_000));
}

pub async fn lease_renewed_by_its_holder_keeps_its_epoch(store: &dyn Store) {
    let first = store
        .try_acquire_lease(&claim("a", 1_000))
        .await
        .unwrap()
        .unwrap();
    let renewed = store
        .renew_lease(&claim("a", 4_000), first.epoch)
        .await
        .unwrap()
        .expect("the holder renews");
    assert_eq!(renewed.epoch, first.epoch);
    assert_eq!(renewed.expires_at, Timestamp(9_000));
    // Renewed, it is still held at the first expiry.
    let refused = store.try_acquire_lease(&claim("b", 6_000)).await.unwrap();
    assert_eq!(refused, None);
}

pub async fn lease_renewal_after_a_takeover_is_refused(store: &dyn Store) {
    let first = store
        .try_acquire_lease(&claim("a", 1_000))
        .await
        .unwrap()
        .unwrap();
    let taken = store
        .try_acquire_lease(&claim("b", 7_000))
        .await
        .unwrap()
        .unwrap();
    let stale = store
        .renew_lease(&claim("a", 7_500), first.epoch)
        .await
        .unwrap();
    assert_eq!(stale, None, "the old holder renewed a lease taken over");
    assert_eq!(store.current_lease().await.unwrap(), Some(taken));
}

pub async fn lease_renewal_by_another_replica_is_refused(store: &dyn Store) {
    let first = store
        .try_acquire_lease(&claim("a", 1_000))
        .await
        .unwrap()
        .unwrap();
    let refused = store
        .renew_lease(&claim("b", 2_000), first.epoch)
        .await
        .unwrap();
    assert_eq!(refused, None);
    assert_eq!(store.current_lease().await.unwrap(), Some(first));
}
