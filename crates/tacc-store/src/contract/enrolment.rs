//! The contract for enrolment: join tokens that enrol a bounded number of nodes (one by
//! default), optionally one name only; and a node's enrolled capacity and approval state,
//! which a restart with its own credential keeps. Each check expects a fresh, empty store.

use std::collections::BTreeMap;

use tacc_core::{NodeId, Resources, Timestamp};

use crate::{
    Enrolment, JoinScope, NewNode, NewToken, NodeEnrolment, Store, TokenKind, TokenRecord,
};

fn join_token(digit: char, join: Option<JoinScope>) -> NewToken {
    NewToken {
        kind: TokenKind::AgentJoin,
        hash: digit.to_string().repeat(64),
        user: Some("operator".into()),
        node: None,
        created_at: Timestamp(10),
        expires_at: Some(Timestamp(3_600_010)),
        label: "agent join token".into(),
        join,
    }
}

async fn enrolled(store: &dyn Store, token: &TokenRecord) -> u32 {
    store.get_token(token.id).await.unwrap().unwrap().enrolled
}

pub async fn join_tokens_enrol_one_node_by_default(store: &dyn Store) {
    let token = store.create_token(join_token('1', None)).await.unwrap();
    assert_eq!(token.join, Some(JoinScope::single_use()));
    assert_eq!(token.enrolled, 0);
    assert_eq!(
        store
            .enrol_node(token.id, "gpu-01", Timestamp(20))
            .await
            .unwrap(),
        Enrolment::Admitted
    );
    // A stolen, used token enrols nothing: not another name, not the same one again.
    for name in ["rogue", "gpu-01"] {
        assert_eq!(
            store
                .enrol_node(token.id, name, Timestamp(30))
                .await
                .unwrap(),
            Enrolment::UsedUp {
                max_nodes: 1,
                enrolled: vec!["gpu-01".into()],
            },
            "{name}"
        );
    }
    assert_eq!(enrolled(store, &token).await, 1);
    // Only join tokens enrol.
    let user = store
        .create_token(NewToken {
            kind: TokenKind::User,
            join: None,
            ..join_token('2', None)
        })
        .await
        .unwrap();
    assert_eq!(user.join, None);
    assert_eq!(
        store
            .enrol_node(user.id, "gpu-02", Timestamp(40))
            .await
            .unwrap(),
        Enrolment::NotJoinToken
    );
    assert_eq!(
        store
            .enrol_node(999, "gpu-02", Timestamp(40))
            .await
            .unwrap(),
        Enrolment::NotJoinToken
    );
}

pub async fn join_tokens_bound_to_a_name_refuse_others(store: &dyn Store) {
    let scope = JoinScope {
        bound_node: Some("gpu-07".into()),
        max_nodes: 1,
    };
    let token = store
        .create_token(join_token('3', Some(scope.clone())))
        .await
        .unwrap();
    assert_eq!(token.join, Some(scope));
    assert_eq!(
        store
            .enrol_node(token.id, "rogue", Timestamp(20))
            .await
            .unwrap(),
        Enrolment::BoundToOther {
            bound: "gpu-07".into()
        }
    );
    assert_eq!(enrolled(store, &token).await, 0, "a refusal uses nothing");
    assert_eq!(
        store
            .enrol_node(token.id, "gpu-07", Timestamp(30))
            .await
            .unwrap(),
        Enrolment::Admitted
    );
    assert!(matches!(
        store
            .enrol_node(token.id, "gpu-07", Timestamp(40))
            .await
            .unwrap(),
        Enrolment::UsedUp { .. }
    ));
}

pub async fn join_tokens_enrol_up_to_their_limit_once_per_name(store: &dyn Store) {
    let token = store
        .create_token(join_token(
            '4',
            Some(JoinScope {
                bound_node: None,
                max_nodes: 2,
            }),
        ))
        .await
        .unwrap();
    assert_eq!(
        store
            .enrol_node(token.id, "n1", Timestamp(20))
            .await
            .unwrap(),
        Enrolment::Admitted
    );
    assert_eq!(
        store
            .enrol_node(token.id, "n1", Timestamp(25))
            .await
            .unwrap(),
        Enrolment::UsedUp {
            max_nodes: 2,
            enrolled: vec!["n1".into()],
        },
        "one name enrols once"
    );
    assert_eq!(
        store
            .enrol_node(token.id, "n2", Timestamp(30))
            .await
            .unwrap(),
        Enrolment::Admitted
    );
    assert_eq!(
        store
            .enrol_node(token.id, "n3", Timestamp(40))
            .await
            .unwrap(),
        Enrolment::UsedUp {
            max_nodes: 2,
            enrolled: vec!["n1".into(), "n2".into()],
        }
    );
    assert_eq!(enrolled(store, &token).await, 2);
}

pub async fn join_token_uses_are_durable_records(store: &dyn Store) {
    let token = store.create_token(join_token('5', None)).await.unwrap();
    store
        .enrol_node(token.id, "gpu-01", Timestamp(20))
        .await
        .unwrap();
    // Read back through every path a server uses.
    let by_hash = store
        .token_by_hash(&token.hash)
        .await
        .unwrap()
        .expect("the token");
    assert_eq!(by_hash.enrolled, 1);
    assert_eq!(by_hash.join, Some(JoinScope::single_use()));
    let listed = store.list_tokens(None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].enrolled, 1);
}

pub async fn nodes_keep_their_enrolled_capacity_and_approval_across_restarts(store: &dyn Store) {
    let node = |cpus: u64, enrolment: Option<NodeEnrolment>| NewNode {
        name: "gpu-01".into(),
        capacity: Resources::new(cpus * 1000, 16 << 30, 0),
        gpu_type: None,
        labels: BTreeMap::new(),
        address: "10.0.0.1".into(),
        registered_at: Timestamp(100),
        enrolment,
    };
    let first = store
        .register_node(node(8, Some(NodeEnrolment { pending: true })))
        .await
        .unwrap();
    assert!(first.pending, "enrolled while approval is required");
    assert_eq!(first.enrolled_capacity.cpu_millis, 8000);
    // A restart with the node's own credential and less to offer keeps both.
    let restarted = store.register_node(node(4, None)).await.unwrap();
    assert_eq!(restarted.id, first.id);
    assert!(restarted.pending);
    assert_eq!(restarted.capacity.cpu_millis, 4000);
    assert_eq!(restarted.enrolled_capacity.cpu_millis, 8000);
    assert!(store.approve_node(first.id).await.unwrap());
    assert!(!store.approve_node(NodeId(999)).await.unwrap());
    let listed = store.list_nodes().await.unwrap();
    assert!(!listed[0].pending, "approval is durable");
    // A new enrolment sets the enrolled capacity (and approval state) afresh.
    let grown = store
        .register_node(node(16, Some(NodeEnrolment { pending: false })))
        .await
        .unwrap();
    assert_eq!(grown.id, first.id);
    assert_eq!(grown.enrolled_capacity.cpu_millis, 16_000);
    assert!(!grown.pending);
    // A node that never enrolled through a token (an older record) counts what it offers.
    let other = store
        .register_node(NewNode {
            name: "gpu-02".into(),
            ..node(2, None)
        })
        .await
        .unwrap();
    assert_eq!(other.enrolled_capacity.cpu_millis, 2000);
    assert!(!other.pending);
}
