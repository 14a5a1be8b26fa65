//! A damaged database file, against a real `taccd`: 16 KiB of garbage written into the
//! middle of the `tacc.db` a real server made. The server must not start on it (before,
//! it started, `/v1/health` said ok and submits answered 500 "database disk image is
//! malformed"); it exits naming the file and the way back.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use common::*;

/// Deterministic garbage: what a failing disk or a stray write leaves.
fn garbage(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refuses_to_start_on_a_damaged_database_and_says_how_to_recover() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut server = start("server", &data, &[]).await;
    let admin = server.client();
    for n in 0..40 {
        server.user_client(&format!("user{n}"), None, "user").await;
    }
    admin.put_secret("KEY", b"value".to_vec()).await.unwrap();
    server.kill9();
    // Fold the write-ahead log into the file, so the damage hits pages in use.
    let db = data.join("tacc.db");
    {
        use sqlx::{ConnectOptions, Connection};
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .connect()
            .await
            .unwrap();
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
    }
    let size = std::fs::metadata(&db).unwrap().len();
    let mut file = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    file.seek(SeekFrom::Start(size / 2)).unwrap();
    file.write_all(&garbage(16 << 10)).unwrap();
    drop(file);

    let _ = std::fs::remove_file(data.join("taccd.json"));
    let mut child = taccd()
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("taccd kept running on a damaged database");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        !data.join("taccd.json").exists(),
        "it listened (and would have answered health checks) before refusing"
    );
    for needed in [
        db.display().to_string(),
        "damaged".to_string(),
        "backup".to_string(),
        ".recover".to_string(),
    ] {
        assert!(
            stderr.contains(&needed),
            "`{needed}` missing from: {stderr}"
        );
    }
}
