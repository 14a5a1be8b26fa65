//! The contract of the task uid map: a user's uid is allocated once, from the base
//! upwards, and kept; no uid is ever given to two users, also when allocations race or the
//! base changes.

use std::collections::BTreeSet;

use crate::Store;

pub async fn task_uids_allocated_from_the_base_and_kept(store: &dyn Store) {
    assert_eq!(store.list_task_uids().await.unwrap(), vec![]);
    let alice = store.task_uid("alice", 200_000).await.unwrap();
    let bob = store.task_uid("bob", 200_000).await.unwrap();
    assert_eq!((alice, bob), (200_000, 200_001));
    assert_eq!(store.task_uid("alice", 200_000).await.unwrap(), alice);
    assert_eq!(
        store.list_task_uids().await.unwrap(),
        vec![("alice".to_string(), alice), ("bob".to_string(), bob)]
    );
}

pub async fn task_uids_never_repeat_when_the_base_changes(store: &dyn Store) {
    let alice = store.task_uid("alice", 1_000).await.unwrap();
    // A lower base never hands out a uid below one already given.
    let bob = store.task_uid("bob", 500).await.unwrap();
    assert_eq!((alice, bob), (1_000, 1_001));
    // A higher base starts there; users keep what they have.
    let carol = store.task_uid("carol", 5_000).await.unwrap();
    assert_eq!(carol, 5_000);
    assert_eq!(store.task_uid("alice", 5_000).await.unwrap(), alice);
    assert_eq!(store.task_uid("dave", 10).await.unwrap(), 5_001);
    // Never root, whatever the base.
    assert_ne!(store.task_uid("erin", 0).await.unwrap(), 0);
}

pub async fn task_uids_racing_allocations_never_share_a_uid(store: &dyn Store) {
    let base = 300_000;
    // Every user asked for twice at once: on a server database these run on separate
    // connections and race for the same next uid.
    let (a1, b1, c1, a2, b2, c2, d1, d2) = tokio::join!(
        store.task_uid("alice", base),
        store.task_uid("bob", base),
        store.task_uid("carol", base),
        store.task_uid("alice", base),
        store.task_uid("bob", base),
        store.task_uid("carol", base),
        store.task_uid("dave", base),
        store.task_uid("dave", base),
    );
    let pairs = [(a1, a2), (b1, b2), (c1, c2), (d1, d2)];
    let mut uids = BTreeSet::new();
    for (first, second) in pairs {
        let (first, second) = (first.unwrap(), second.unwrap());
        assert_eq!(first, second, "one user was given two uids");
        assert!(first >= base, "uid {first} below the base {base}");
        uids.insert(first);
    }
    assert_eq!(uids.len(), 4, "two users share a uid: {uids:?}");
    let listed = store.list_task_uids().await.unwrap();
    assert_eq!(listed.len(), 4, "{listed:?}");
    let listed: BTreeSet<u32> = listed.into_iter().map(|(_, uid)| uid).collect();
    assert_eq!(listed, uids);
}
