//! The contract for the access records: users, tokens, audit, secrets, snapshot owners.
//! Each check expects a fresh, empty store.

use tacc_core::{NodeId, Role, SnapshotId, Timestamp};

use crate::{
    NewAuditEntry, NewToken, SecretRecord, SnapshotOwner, Store, StoreError, TokenKind, UserRecord,
};

fn user(name: &str, group: Option<&str>, role: Role, at: u64) -> UserRecord {
    UserRecord {
        name: name.to_string(),
        group: group.map(str::to_string),
        role,
        created_at: Timestamp(at),
    }
}

/// A lower-case hex SHA-256-shaped hash made from one repeated digit.
fn hash(digit: char) -> String {
    digit.to_string().repeat(64)
}

fn user_token(hash: String, user: &str, at: u64) -> NewToken {
    NewToken {
        kind: TokenKind::User,
        hash,
        user: Some(user.to_string()),
        node: None,
        created_at: Timestamp(at),
        expires_at: None,
        label: format!("{user}'s laptop"),
        join: None,
    }
}

fn audit(at: u64, action: &str) -> NewAuditEntry {
    NewAuditEntry {
        at: Timestamp(at),
        actor: "user:alice".into(),
        action: action.to_string(),
        target: "task:17".into(),
        outcome: "ok".into(),
        detail: format!("detail of {action}"),
    }
}

fn secret(user: &str, name: &str, value: &[u8], at: u64) -> SecretRecord {
    SecretRecord {
        user: user.to_string(),
        name: name.to_string(),
        nonce: vec![0, 1, 2, 0xff, 0, 5, 6, 7, 8, 9, 10, 11],
        ciphertext: value.to_vec(),
        updated_at: Timestamp(at),
    }
}

fn snapshot(digits: &str) -> SnapshotId {
    digits.repeat(32).parse().expect("valid snapshot id")
}

// ------------------------------------------------------------ users

pub async fn users_round_trip_and_list_by_name(store: &dyn Store) {
    let alice = user("alice", Some("vision"), Role::GroupAdmin, 10);
    let root = user("root", None, Role::Admin, 11);
    let bob = user("bob", Some("vision"), Role::User, 12);
    for u in [&root, &bob, &alice] {
        store.create_user(u.clone()).await.unwrap();
    }
    assert_eq!(store.get_user("alice").await.unwrap(), Some(alice.clone()));
    assert_eq!(store.get_user("root").await.unwrap(), Some(root.clone()));
    assert!(store.get_user("mallory").await.unwrap().is_none());
    assert_eq!(
        store.list_users().await.unwrap(),
        vec![alice, bob, root],
        "users are listed by name"
    );
}

pub async fn users_duplicate_name_refused(store: &dyn Store) {
    let first = user("alice", None, Role::User, 10);
    store.create_user(first.clone()).await.unwrap();
    let err = store
        .create_user(user("alice", Some("ops"), Role::Admin, 20))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::AlreadyExists { what: "user", name } if name == "alice"),
        "{err}"
    );
    assert_eq!(
        store.get_user("alice").await.unwrap(),
        Some(first),
        "the refused duplicate changed nothing (no role escalation)"
    );
    assert_eq!(store.list_users().await.unwrap().len(), 1);
}

// ------------------------------------------------------------ tokens

pub async fn tokens_found_by_hash_and_id(store: &dyn Store) {
    let node = NewToken {
        kind: TokenKind::Node,
        hash: hash('b'),
        user: None,
        node: Some(NodeId(7)),
        created_at: Timestamp(30),
        expires_at: Some(Timestamp(1_000_000)),
        label: "node gpu-07".into(),
        join: None,
    };
    let first = store
        .create_token(user_token(hash('a'), "alice", 20))
        .await
        .unwrap();
    let second = store.create_token(node.clone()).await.unwrap();
    assert!(second.id > first.id, "ids must increase");
    assert_eq!(first.kind, TokenKind::User);
    assert_eq!(first.user.as_deref(), Some("alice"));
    assert_eq!(first.revoked_at, None);
    assert_eq!(
        (
            second.kind,
            &second.hash,
            &second.user,
            second.node,
            second.created_at,
            second.expires_at,
            &second.label,
        ),
        (
            node.kind,
            &node.hash,
            &node.user,
            node.node,
            node.created_at,
            node.expires_at,
            &node.label,
        ),
        "every field of the new token is kept"
    );
    assert_eq!(
        store.token_by_hash(&hash('b')).await.unwrap(),
        Some(second.clone())
    );
    assert_eq!(store.get_token(first.id).await.unwrap(), Some(first));
    assert!(store.token_by_hash(&hash('c')).await.unwrap().is_none());
    assert!(store.get_token(second.id + 100).await.unwrap().is_none());
}

pub async fn tokens_duplicate_hash_refused(store: &dyn Store) {
    let first = store
        .create_token(user_token(hash('a'), "alice", 20))
        .await
        .unwrap();
    let err = store
        .create_token(user_token(hash('a'), "mallory", 21))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::AlreadyExists { what: "token", .. }),
        "{err}"
    );
    assert_eq!(
        store.token_by_hash(&hash('a')).await.unwrap(),
        Some(first),
        "the hash still maps to the first token"
    );
    assert_eq!(store.list_tokens(None).await.unwrap().len(), 1);
}

pub async fn tokens_listed_by_user(store: &dyn Store) {
    let a1 = store
        .create_token(user_token(hash('1'), "alice", 20))
        .await
        .unwrap();
    let b1 = store
        .create_token(user_token(hash('2'), "bob", 21))
        .await
        .unwrap();
    let a2 = store
        .create_token(user_token(hash('3'), "alice", 22))
        .await
        .unwrap();
    let join = store
        .create_token(NewToken {
            kind: TokenKind::AgentJoin,
            user: None,
            label: "join token for rack 3".into(),
            ..user_token(hash('4'), "nobody", 23)
        })
        .await
        .unwrap();
    let ids = |tokens: Vec<crate::TokenRecord>| tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list_tokens(None).await.unwrap()),
        vec![a1.id, b1.id, a2.id, join.id],
        "all tokens, by id"
    );
    assert_eq!(
        ids(store.list_tokens(Some("alice")).await.unwrap()),
        vec![a1.id, a2.id]
    );
    assert_eq!(
        ids(store.list_tokens(Some("bob")).await.unwrap()),
        vec![b1.id]
    );
    assert!(store.list_tokens(Some("carol")).await.unwrap().is_empty());
}

pub async fn tokens_revoke_once(store: &dyn Store) {
    let token = store
        .create_token(user_token(hash('a'), "alice", 20))
        .await
        .unwrap();
    let other = store
        .create_token(user_token(hash('b'), "alice", 21))
        .await
        .unwrap();
    assert!(store.revoke_token(token.id, Timestamp(50)).await.unwrap());
    assert!(
        !store.revoke_token(token.id, Timestamp(60)).await.unwrap(),
        "a revoked token cannot be revoked again"
    );
    assert!(
        !store
            .revoke_token(other.id + 100, Timestamp(60))
            .await
            .unwrap(),
        "a missing token cannot be revoked"
    );
    let revoked = store
        .token_by_hash(&hash('a'))
        .await
        .unwrap()
        .expect("a revoked token is still found by its hash");
    assert_eq!(
        revoked.revoked_at,
        Some(Timestamp(50)),
        "the first revocation's time is kept"
    );
    assert!(!revoked.is_valid_at(Timestamp(40)));
    assert_eq!(
        store.get_token(other.id).await.unwrap().unwrap().revoked_at,
        None,
        "revoking one token leaves the others alone"
    );
}

pub async fn tokens_expire(store: &dyn Store) {
    store
        .create_token(NewToken {
            expires_at: Some(Timestamp(100)),
            ..user_token(hash('a'), "alice", 20)
        })
        .await
        .unwrap();
    store
        .create_token(user_token(hash('b'), "alice", 20))
        .await
        .unwrap();
    let expiring = store.token_by_hash(&hash('a')).await.unwrap().unwrap();
    assert_eq!(expiring.expires_at, Some(Timestamp(100)));
    assert!(expiring.is_valid_at(Timestamp(99)));
    assert!(
        !expiring.is_valid_at(Timestamp(100)),
        "expired at its expiry"
    );
    assert!(!expiring.is_valid_at(Timestamp(101)));
    let lasting = store.token_by_hash(&hash('b')).await.unwrap().unwrap();
    assert_eq!(lasting.expires_at, None);
    assert!(lasting.is_valid_at(Timestamp(u64::MAX / 2)));
}

// ------------------------------------------------------------ audit

pub async fn audit_lists_oldest_first(store: &dyn Store) {
    assert!(store.list_audit(None, 10).await.unwrap().is_empty());
    for (at, action) in [(10, "user.add"), (20, "token.create"), (20, "auth.failed")] {
        store.append_audit(audit(at, action)).await.unwrap();
    }
    let entries = store.list_audit(None, 10).await.unwrap();
    assert_eq!(
        entries
            .iter()
            .map(|e| (e.at.0, e.action.as_str()))
            .collect::<Vec<_>>(),
        vec![(10, "user.add"), (20, "token.create"), (20, "auth.failed")]
    );
    assert!(
        entries.windows(2).all(|w| w[0].id < w[1].id),
        "ids increase"
    );
    let first = &entries[0];
    assert_eq!(
        (
            first.actor.as_str(),
            first.target.as_str(),
            first.outcome.as_str(),
            first.detail.as_str()
        ),
        ("user:alice", "task:17", "ok", "detail of user.add"),
        "every field is kept"
    );
}

pub async fn audit_since_is_inclusive(store: &dyn Store) {
    for (at, action) in [(10, "a"), (20, "b"), (30, "c")] {
        store.append_audit(audit(at, action)).await.unwrap();
    }
    let actions =
        |entries: Vec<crate::AuditEntry>| entries.into_iter().map(|e| e.action).collect::<Vec<_>>();
    assert_eq!(
        actions(store.list_audit(Some(Timestamp(20)), 10).await.unwrap()),
        vec!["b", "c"]
    );
    assert_eq!(
        actions(store.list_audit(Some(Timestamp(21)), 10).await.unwrap()),
        vec!["c"]
    );
    assert!(
        store
            .list_audit(Some(Timestamp(31)), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn audit_limit_keeps_the_newest(store: &dyn Store) {
    for (at, action) in [(10, "a"), (20, "b"), (30, "c"), (40, "d")] {
        store.append_audit(audit(at, action)).await.unwrap();
    }
    let actions =
        |entries: Vec<crate::AuditEntry>| entries.into_iter().map(|e| e.action).collect::<Vec<_>>();
    assert_eq!(
        actions(store.list_audit(None, 2).await.unwrap()),
        vec!["c", "d"],
        "the newest two, oldest first"
    );
    assert_eq!(
        actions(store.list_audit(Some(Timestamp(20)), 10).await.unwrap()),
        vec!["b", "c", "d"]
    );
    assert_eq!(
        actions(store.list_audit(Some(Timestamp(10)), 3).await.unwrap()),
        vec!["b", "c", "d"],
        "since and limit together"
    );
    assert!(store.list_audit(None, 0).await.unwrap().is_empty());
}

pub async fn audit_prune_deletes_only_older_entries(store: &dyn Store) {
    for (at, action) in [(10, "a"), (20, "b"), (30, "c")] {
        store.append_audit(audit(at, action)).await.unwrap();
    }
    let actions =
        |entries: Vec<crate::AuditEntry>| entries.into_iter().map(|e| e.action).collect::<Vec<_>>();
    assert_eq!(
        store.prune_audit(Timestamp(10)).await.unwrap(),
        0,
        "strictly before"
    );
    assert_eq!(store.prune_audit(Timestamp(21)).await.unwrap(), 2);
    assert_eq!(
        actions(store.list_audit(None, 10).await.unwrap()),
        vec!["c"]
    );
    assert_eq!(
        store.prune_audit(Timestamp(21)).await.unwrap(),
        0,
        "idempotent"
    );
    // Entries appended after a prune still list after the ones kept.
    store.append_audit(audit(40, "d")).await.unwrap();
    let kept = store.list_audit(None, 10).await.unwrap();
    assert_eq!(actions(kept.clone()), vec!["c", "d"]);
    assert!(kept[0].id < kept[1].id, "ids keep increasing after a prune");
}

// ------------------------------------------------------------ secrets

pub async fn secrets_round_trip(store: &dyn Store) {
    // Ciphertext is binary: NUL and high bytes must survive.
    let stored = secret("alice", "WANDB_KEY", &[0, 159, 146, 150, 0, 255], 10);
    store.put_secret(stored.clone()).await.unwrap();
    assert_eq!(
        store.get_secret("alice", "WANDB_KEY").await.unwrap(),
        Some(stored)
    );
    assert!(store.get_secret("alice", "OTHER").await.unwrap().is_none());
}

pub async fn secrets_put_replaces(store: &dyn Store) {
    store
        .put_secret(secret("alice", "WANDB_KEY", b"old", 10))
        .await
        .unwrap();
    let newer = SecretRecord {
        nonce: vec![9; 12],
        ..secret("alice", "WANDB_KEY", b"new", 20)
    };
    store.put_secret(newer.clone()).await.unwrap();
    assert_eq!(
        store.get_secret("alice", "WANDB_KEY").await.unwrap(),
        Some(newer),
        "nonce, ciphertext and time are all replaced"
    );
    assert_eq!(store.list_secrets("alice").await.unwrap().len(), 1);
}

pub async fn secrets_listed_by_name(store: &dyn Store) {
    for name in ["ZETA", "ALPHA", "MID"] {
        store
            .put_secret(secret("alice", name, name.as_bytes(), 10))
            .await
            .unwrap();
    }
    let names: Vec<String> = store
        .list_secrets("alice")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, vec!["ALPHA", "MID", "ZETA"]);
    assert!(store.list_secrets("bob").await.unwrap().is_empty());
}

pub async fn secrets_delete_once(store: &dyn Store) {
    store
        .put_secret(secret("alice", "TOKEN", b"x", 10))
        .await
        .unwrap();
    assert!(store.delete_secret("alice", "TOKEN").await.unwrap());
    assert!(store.get_secret("alice", "TOKEN").await.unwrap().is_none());
    assert!(
        !store.delete_secret("alice", "TOKEN").await.unwrap(),
        "a deleted secret cannot be deleted again"
    );
    assert!(!store.delete_secret("alice", "NEVER").await.unwrap());
}

pub async fn secrets_isolated_per_user(store: &dyn Store) {
    let alice = secret("alice", "API_KEY", b"alice's", 10);
    let bob = secret("bob", "API_KEY", b"bob's", 11);
    store.put_secret(alice.clone()).await.unwrap();
    store.put_secret(bob.clone()).await.unwrap();
    assert_eq!(
        store.get_secret("alice", "API_KEY").await.unwrap(),
        Some(alice.clone())
    );
    assert_eq!(
        store.get_secret("bob", "API_KEY").await.unwrap(),
        Some(bob.clone())
    );
    assert_eq!(store.list_secrets("bob").await.unwrap(), vec![bob.clone()]);
    assert!(
        !store.delete_secret("carol", "API_KEY").await.unwrap(),
        "another user's secret of the same name is not theirs to delete"
    );
    assert!(store.delete_secret("alice", "API_KEY").await.unwrap());
    assert_eq!(
        store.get_secret("bob", "API_KEY").await.unwrap(),
        Some(bob),
        "deleting alice's secret leaves bob's"
    );
    assert!(store.list_secrets("alice").await.unwrap().is_empty());
}

// ------------------------------------------------------------ snapshot ownership

pub async fn snapshot_owners_idempotent(store: &dyn Store) {
    let owner = SnapshotOwner {
        snapshot: snapshot("ab"),
        user: "alice".into(),
    };
    assert!(
        !store
            .is_snapshot_owner(&owner.snapshot, "alice")
            .await
            .unwrap()
    );
    store.add_snapshot_owner(owner.clone()).await.unwrap();
    store.add_snapshot_owner(owner.clone()).await.unwrap();
    assert!(
        store
            .is_snapshot_owner(&owner.snapshot, "alice")
            .await
            .unwrap()
    );
}

pub async fn snapshot_owners_per_user_and_snapshot(store: &dyn Store) {
    let (shared, private) = (snapshot("ab"), snapshot("cd"));
    for (snapshot, user) in [(&shared, "alice"), (&shared, "bob"), (&private, "alice")] {
        store
            .add_snapshot_owner(SnapshotOwner {
                snapshot: snapshot.clone(),
                user: user.to_string(),
            })
            .await
            .unwrap();
    }
    assert!(store.is_snapshot_owner(&shared, "alice").await.unwrap());
    assert!(store.is_snapshot_owner(&shared, "bob").await.unwrap());
    assert!(store.is_snapshot_owner(&private, "alice").await.unwrap());
    assert!(
        !store.is_snapshot_owner(&private, "bob").await.unwrap(),
        "knowing a hash is not owning it"
    );
    assert!(
        !store
            .is_snapshot_owner(&snapshot("ef"), "alice")
            .await
            .unwrap()
    );
}

pub async fn chunk_owners_per_user_in_batches(store: &dyn Store) {
    let hashes: Vec<String> = (0..1200).map(|i| format!("{i:064x}")).collect();
    store
        .add_chunk_owners("alice", &hashes[..700])
        .await
        .unwrap();
    store
        .add_chunk_owners("alice", &hashes[..10])
        .await
        .unwrap();
    store
        .add_chunk_owners("bob", &hashes[1000..])
        .await
        .unwrap();
    let alice = store.owned_chunks("alice", &hashes).await.unwrap();
    assert_eq!(alice.len(), 700);
    assert!(alice.contains(&hashes[699]) && !alice.contains(&hashes[700]));
    let bob = store.owned_chunks("bob", &hashes[..1000]).await.unwrap();
    assert!(
        bob.is_empty(),
        "another user's upload proves nothing for bob"
    );
    assert!(store.owned_chunks("carol", &[]).await.unwrap().is_empty());
}
