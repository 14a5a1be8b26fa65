//! The audit trail under attack, against real `taccd` processes: a flood of failed
//! authentications from one address is limited (429) and audited as a bounded number of
//! rows that still count every failure, while every audited action of a real user keeps
//! its row; an action whose record cannot be written is not done; old rows are pruned.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use reqwest::StatusCode;

/// Failed authentications the flood sends, from 8 connections at once.
const FLOOD: usize = 4000;
const FLOODERS: usize = 8;

/// How many failures an `auth.failed` row stands for: 1 for the first of a window, N for
/// the row that closes it ("N more from …").
fn failures_counted(detail: &str) -> u64 {
    match detail.split_once(" more from ") {
        Some((count, _)) => count.parse().unwrap_or(0),
        None => 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_auth_failure_flood_is_limited_and_aggregated_while_every_audited_action_keeps_its_row()
{
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("d"),
        &["--audit-window", "2s", "--auth-failure-limit", "60"],
    )
    .await;
    let admin = server.client();
    let alice = server.user_client("alice", None, "user").await;

    let started = Instant::now();
    let mut flooders = Vec::new();
    for _ in 0..FLOODERS {
        let url = server.url.clone();
        flooders.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let (mut unauthorized, mut limited, mut retry_after) = (0u64, 0u64, true);
            for _ in 0..FLOOD / FLOODERS {
                let response = http
                    .get(format!("{url}/v1/tasks"))
                    .bearer_auth("tacc_made-up-token-of-an-attacker")
                    .send()
                    .await
                    .unwrap();
                match response.status() {
                    StatusCode::UNAUTHORIZED => unauthorized += 1,
                    StatusCode::TOO_MANY_REQUESTS => {
                        limited += 1;
                        retry_after &= response.headers().contains_key("retry-after");
                    }
                    other => panic!("a bad token got {other}"),
                }
            }
            (unauthorized, limited, retry_after)
        }));
    }
    // Alice's audited actions, in the middle of the flood.
    for n in 0..10 {
        alice
            .put_secret(&format!("S{n}"), format!("value {n}").into_bytes())
            .await
            .unwrap();
    }
    let (mut unauthorized, mut limited) = (0, 0);
    for flooder in flooders {
        let (u, l, retry_after) = flooder.await.unwrap();
        unauthorized += u;
        limited += l;
        assert!(retry_after, "a 429 without Retry-After");
    }
    let flood_secs = started.elapsed().as_secs();
    eprintln!(
        "figure: flood of {FLOOD} in {flood_secs}s: {unauthorized} answered 401, {limited} 429"
    );
    assert_eq!(unauthorized + limited, FLOOD as u64);
    // The bucket holds 60 and refills one a second.
    assert!(
        unauthorized <= 60 + flood_secs + 1,
        "{unauthorized} failures were let through in {flood_secs}s"
    );

    // Every one of Alice's actions took effect and has its own row.
    assert_eq!(alice.list_secrets().await.unwrap().len(), 10);
    let audit = admin.audit(10_000).await.unwrap();
    let recorded: BTreeSet<String> = audit
        .into_iter()
        .filter(|e| e.action == "secret.set" && e.actor == "user:alice" && e.outcome == "ok")
        .map(|e| e.target)
        .collect();
    let expected: BTreeSet<String> = (0..10).map(|n| format!("secret:S{n}")).collect();
    assert_eq!(recorded, expected, "an action without its row");

    // The flood is a handful of rows (the first of each 2 s window, and one counting the
    // rest when it closes) that account for every failure.
    let rows = eventually("the flood's windows to close", DEADLINE, || {
        let admin = admin.clone();
        async move {
            let rows: Vec<_> = admin
                .audit(10_000)
                .await
                .ok()?
                .into_iter()
                .filter(|e| e.action == "auth.failed")
                .collect();
            let counted: u64 = rows.iter().map(|e| failures_counted(&e.detail)).sum();
            (counted == FLOOD as u64).then_some(rows)
        }
    })
    .await;
    let windows = flood_secs / 2 + 2;
    assert!(
        rows.len() as u64 <= 2 * windows,
        "{} rows for a flood of {FLOOD} in {flood_secs}s: {rows:#?}",
        rows.len()
    );
    assert!(
        rows.iter()
            .all(|e| e.detail.contains("127.0.0.1") && e.outcome == "denied"),
        "{rows:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_whose_audit_record_cannot_be_written_is_not_done() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let server = start("server", &data, &[]).await;
    let token = server
        .client()
        .create_user(&tacc_proto::CreateUser {
            name: "alice".into(),
            group: None,
            role: tacc_core::Role::User,
            token_ttl_secs: None,
        })
        .await
        .unwrap()
        .token
        .token;
    let alice = tacc_client::Client::new(&server.url).with_token(token.clone());
    alice.put_secret("BEFORE", b"v".to_vec()).await.unwrap();

    // The database refuses every new audit row from now on (a full table, a broken disk
    // would do the same); everything else still writes.
    {
        use sqlx::{ConnectOptions, Connection};
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(data.join("tacc.db"))
            .busy_timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap();
        sqlx::query(
            "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit \
             BEGIN SELECT RAISE(ABORT, 'the audit table refuses writes'); END",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    }
    let response = reqwest::Client::new()
        .put(format!("{}/v1/secrets/AFTER", server.url))
        .bearer_auth(&token)
        .body("v")
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body = response.text().await.unwrap();
    assert!(status.is_server_error(), "{status}: {body}");
    assert!(
        body.contains("audit record") && body.contains("server's fault"),
        "{body}"
    );
    let names: Vec<String> = alice
        .list_secrets()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["BEFORE"], "the unaudited action took effect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_entries_older_than_the_retention_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("d"),
        &["--audit-retention", "5s"],
    )
    .await;
    let admin = server.client();
    server.user_client("early", None, "user").await;
    let has_row = |audit: &[tacc_proto::AuditView], user: &str| {
        audit
            .iter()
            .any(|e| e.action == "user.add" && e.target == format!("user:{user}"))
    };
    assert!(has_row(&admin.audit(1000).await.unwrap(), "early"));
    eventually("the early row to be pruned", DEADLINE, || {
        let admin = admin.clone();
        async move {
            let audit = admin.audit(1000).await.ok()?;
            (!has_row(&audit, "early")).then_some(())
        }
    })
    .await;
    // Pruning removes old rows, not the trail: a new action is recorded as ever.
    server.user_client("late", None, "user").await;
    assert!(has_row(&admin.audit(1000).await.unwrap(), "late"));
}
