//! The server's listener under connection floods, against a real `taccd`: 2,000 idle
//! connections and 200 slowloris clients (a request head sent a byte at a time) beside
//! normal requests, which are still answered promptly; the slowloris connections are
//! closed at the header timeout and the idle ones at the idle timeout; past
//! `--max-connections` a newcomer waits for a slot instead of exhausting the server.
//!
//! The test raises its own open-file limit (soft to hard) for its 2,200 sockets; the
//! server does the same for itself at start.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IDLE: usize = 2000;
const SLOWLORIS: usize = 200;

/// Raise this process's soft open-file limit to its hard limit; the sockets it may open.
fn raise_open_files() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    hard
}

/// Whether the server closed `stream` (EOF or reset) within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let end = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(end, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A 408 or the like before the close is fine; keep reading until it closes.
            Ok(Ok(_)) => continue,
        }
    }
}

fn address(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_and_slowloris_connections_are_closed_and_normal_requests_still_served() {
    let hard = raise_open_files();
    let idle_count = if hard >= (IDLE + SLOWLORIS + 512) as u64 {
        IDLE
    } else {
        // Said loudly: a hard limit this low tests fewer idle connections.
        let fewer = (hard as usize).saturating_sub(SLOWLORIS + 512);
        eprintln!(
            "######## the hard open-file limit is {hard}: {fewer} idle connections, not {IDLE}"
        );
        fewer
    };
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("d"),
        &["--header-timeout", "2s", "--idle-timeout", "4s"],
    )
    .await;
    let addr = address(&server.url);
    let admin = server.client();

    let opened = Instant::now();
    let mut idle = Vec::with_capacity(idle_count);
    for _ in 0..idle_count {
        idle.push(TcpStream::connect(&addr).await.unwrap());
    }
    // Slowloris: a request line, then a header byte every 300 ms, never the blank line.
    let mut slow = Vec::new();
    for _ in 0..SLOWLORIS {
        let addr = addr.clone();
        slow.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(&addr).await.unwrap();
            stream
                .write_all(b"GET /v1/health HTTP/1.1\r\nhost: x\r\n")
                .await
                .unwrap();
            let first_byte = Instant::now();
            let mut buf = [0u8; 256];
            loop {
                tokio::select! {
                    read = stream.read(&mut buf) => match read {
                        Ok(0) | Err(_) => return first_byte.elapsed(),
                        Ok(_) => {}
                    },
                    _ = tokio::time::sleep(Duration::from_millis(300)) => {
                        if stream.write_all(b"x").await.is_err() {
                            return first_byte.elapsed();
                        }
                    }
                }
                assert!(
                    first_byte.elapsed() < Duration::from_secs(60),
                    "a slowloris connection was never closed"
                );
            }
        }));
    }

    // Normal requests meanwhile, each on a fresh connection, answered promptly.
    let fresh: Vec<_> = (0..20)
        .map(|_| tacc_client::Client::new(&server.url).with_token(server.token.clone()))
        .collect();
    let mut slowest = Duration::ZERO;
    for fresh in fresh {
        let started = Instant::now();
        fresh.whoami().await.unwrap();
        admin.list_nodes().await.unwrap();
        slowest = slowest.max(started.elapsed());
    }
    eprintln!(
        "figure: {idle_count} idle + {SLOWLORIS} slowloris connections; slowest of 20 normal \
         requests {slowest:?}"
    );
    assert!(
        slowest < Duration::from_secs(2),
        "a normal request took {slowest:?}"
    );

    for handle in slow {
        let lasted = handle.await.unwrap();
        assert!(
            lasted < Duration::from_secs(2 + 5),
            "a slowloris head was allowed {lasted:?} (header timeout 2s)"
        );
    }
    // The idle ones are closed at the idle timeout (4 s after they opened).
    for stream in idle.iter_mut().step_by(100) {
        let left = Duration::from_secs(4 + 10).saturating_sub(opened.elapsed());
        assert!(
            closed_within(stream, left).await,
            "an idle connection was still open {:?} after it opened (idle timeout 4s)",
            opened.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_a_newcomer_waits_for_an_idle_one_to_be_closed() {
    raise_open_files();
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        "server",
        &dir.path().join("d"),
        &["--max-connections", "20", "--idle-timeout", "3s"],
    )
    .await;
    let addr = address(&server.url);
    // Whatever the start-up checks left open has closed by now or counts below.
    let opened = Instant::now();
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(TcpStream::connect(&addr).await.unwrap());
    }
    // The newcomer's connection is accepted by the kernel, but the server takes it only
    // when a slot frees: after the idle timeout of the 20 held ones.
    let mut newcomer = TcpStream::connect(&addr).await.unwrap();
    newcomer
        .write_all(b"GET /v1/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), newcomer.read_to_end(&mut answer))
        .await
        .expect("the newcomer was never served")
        .unwrap();
    let waited = opened.elapsed();
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(
        waited >= Duration::from_millis(2500),
        "served after {waited:?}: the 20 held connections did not fill the server"
    );
    drop(held);
}
