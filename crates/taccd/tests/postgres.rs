//! `taccd dev --database postgres://…`: the control plane keeps its state in PostgreSQL.
//! A task submitted with `tcloud` runs to the end, and a restarted server (a new process,
//! the same database) still knows it, its events and its log. Runs against a new
//! database on the server named by `TACC_TEST_POSTGRES_URL` (scripts/ci/setup-postgres.sh);
//! without one it says SKIPPED, except in CI where that is a failure.

mod common;

use common::*;
use tacc_core::{TaskId, TaskState};
use tacc_store::test_database::TestDatabase;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_cluster_on_postgres_keeps_a_finished_task_across_a_restart() {
    let test = "dev_cluster_on_postgres_keeps_a_finished_task_across_a_restart";
    let Some(database) = TestDatabase::create(test).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let home = dir.path().join("home");
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("task.yaml"),
        "name: on-postgres\nrun: |\n  echo stored in postgres\n",
    )
    .unwrap();
    let args = ["--database", database.url.as_str()];

    let mut daemon = start("dev", &data, &args).await;
    let submitted: serde_json::Value = serde_json::from_str(&tcloud(
        &daemon,
        &home,
        &["submit", project.to_str().unwrap(), "--json"],
    ))
    .unwrap();
    let task = TaskId(submitted["task_id"].as_u64().expect("a task id"));
    let finished = wait_terminal(&daemon.client(), task).await;
    assert_eq!(finished.state, TaskState::Succeeded, "{finished:?}");
    // The state is in PostgreSQL, not in an SQLite file of the data directory.
    assert!(!data.join("tacc.db").exists(), "a tacc.db was created");
    daemon.kill9();
    drop(daemon);

    let daemon = start("dev", &data, &args).await;
    let shown: serde_json::Value = serde_json::from_str(&tcloud(
        &daemon,
        &home,
        &["show", &task.to_string(), "--json"],
    ))
    .unwrap();
    assert_eq!(shown["state"], "succeeded", "{shown}");
    assert_eq!(shown["name"], "on-postgres", "{shown}");
    let listed = tcloud(&daemon, &home, &["ps", "--all"]);
    assert!(listed.contains("on-postgres"), "{listed}");
    assert!(
        log_text(&daemon.client(), task)
            .await
            .contains("stored in postgres")
    );
    // A new task gets a new id: the sequence went on where it was.
    let again: serde_json::Value = serde_json::from_str(&tcloud(
        &daemon,
        &home,
        &["submit", project.to_str().unwrap(), "--json"],
    ))
    .unwrap();
    assert!(again["task_id"].as_u64().unwrap() > task.0, "{again}");
}

#[tokio::test]
async fn server_refuses_an_unknown_database_scheme_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_taccd"))
        .args(["server", "--data-dir"])
        .arg(dir.path())
        .args(["--database", "mysql://u:hunter2@h/tacc"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("postgres://") && !err.contains("hunter2"),
        "{err}"
    );
}

/// While the database refuses connections, a request that needs it is answered 503
/// (`unavailable`, saying to check the database server), not 500; once the database is
/// back the same request succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_503_while_the_database_is_unreachable() {
    let test = "requests_are_503_while_the_database_is_unreachable";
    let Some(database) = TestDatabase::create(test).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &["--database", &database.url]).await;
    let client = daemon.client();
    let task = submit(
        &client,
        dir.path(),
        "gone",
        "name: gone\nrun: 'true'\n",
        &[],
    )
    .await;
    wait_terminal(&client, task).await;

    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect(&database.url).await.unwrap();
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    // No new connection is let in, and the server's are cut.
    sqlx::query(&format!("ALTER DATABASE {name} CONNECTION LIMIT 0"))
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    let refused = eventually("a 503 from the server", DEADLINE, || {
        let client = client.clone();
        async move {
            match client.history(&Default::default()).await {
                Err(tacc_client::ClientError::Api {
                    status, message, ..
                }) => Some((status, message)),
                _ => None,
            }
        }
    })
    .await;
    assert_eq!(refused.0, 503, "{refused:?}");
    assert!(refused.1.contains("database"), "{refused:?}");

    sqlx::query(&format!("ALTER DATABASE {name} CONNECTION LIMIT -1"))
        .execute(&mut admin)
        .await
        .unwrap();
    eventually("the server to answer again", DEADLINE, || {
        let client = client.clone();
        async move { client.get_task(task).await.ok() }
    })
    .await;
}

/// `taccd server --database postgres://…` with its first admin made by
/// `taccd admin --database …` (users and tokens live in the database, not the data
/// directory): the token works against the running server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_adds_a_user_to_a_server_on_postgres() {
    let test = "admin_adds_a_user_to_a_server_on_postgres";
    let Some(database) = TestDatabase::create(test).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("s");
    let args = ["--database", database.url.as_str()];
    // The server creates the schema; the operator adds the admin once it answers.
    let server = tokio::spawn({
        let data = data.clone();
        let url = database.url.clone();
        async move {
            std::fs::create_dir_all(&data).unwrap();
            // An empty admin.token: `launch` waits for the token below instead of adding
            // an admin itself (without --database).
            std::fs::write(data.join("admin.token"), "").unwrap();
            launch(
                "server",
                &data,
                &["--listen", "127.0.0.1:0", "--database", &url],
            )
            .await
        }
    });
    let token = eventually("taccd admin to add the user", DEADLINE, || {
        let data = data.clone();
        async move {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_taccd"))
                .arg("admin")
                .arg("--data-dir")
                .arg(&data)
                .args(args)
                .args(["user", "add", "root-admin", "--role", "admin"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
    })
    .await;
    std::fs::write(data.join("admin.token"), &token).unwrap();
    let server = server.await.unwrap();
    let client = server.client();
    let users = eventually("the server to answer", DEADLINE, || {
        let client = client.clone();
        async move { client.list_users().await.ok() }
    })
    .await;
    assert!(users.iter().any(|u| u.name == "root-admin"), "{users:?}");
    assert!(!data.join("tacc.db").exists(), "a tacc.db was created");
}

/// The control plane reaches PostgreSQL over TLS and checks the server's certificate
/// (`sslmode=verify-full`): its connections show in `pg_stat_ssl`, none in the clear. A
/// certificate no trusted root signed is refused, and the message says what to check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_reaches_postgres_over_verified_tls() {
    use sqlx::Connection;
    let test = "the_server_reaches_postgres_over_verified_tls";
    let Some(database) = TestDatabase::create(test).await else {
        return;
    };
    // Debian's PostgreSQL serves the machine's self-signed "snakeoil" certificate, valid
    // for `localhost` (scripts/ci/setup-postgres.sh checks that TLS is on).
    let certificate = std::path::Path::new("/etc/ssl/certs/ssl-cert-snakeoil.pem");
    assert!(
        certificate.exists(),
        "{test}: no {} for the server's TLS",
        certificate.display()
    );
    let by_name = database.url.replacen("@127.0.0.1:", "@localhost:", 1);
    assert!(by_name.contains("@localhost:"), "{by_name}");
    let verified = format!(
        "{by_name}?sslmode=verify-full&sslrootcert={}",
        certificate.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let server = start("server", &dir.path().join("s"), &["--database", &verified]).await;
    server.client().list_nodes().await.unwrap();
    let mut probe = sqlx::PgConnection::connect(&database.url).await.unwrap();
    let (encrypted, clear): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
         FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()",
    )
    .fetch_one(&mut probe)
    .await
    .unwrap();
    assert!(
        encrypted >= 1 && clear == 0,
        "the server's connections: {encrypted} over TLS, {clear} in the clear"
    );
    drop(server);

    // Public roots did not sign the snakeoil certificate.
    let unverifiable =
        format!("{by_name}?sslmode=verify-full&sslrootcert=/etc/ssl/certs/ca-certificates.crt");
    let refused = taccd()
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("refused"))
        .args(["--database", &unverifiable])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("invalid peer certificate"), "{said}");
    assert!(said.contains("sslrootcert"), "{said}");
    assert!(!said.contains(":tacc@"), "the password is shown: {said}");
}
