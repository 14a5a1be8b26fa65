//! The compiler layer against real daemons: resumable and fault-proof snapshot upload,
//! chunk garbage collection, managed environments, datasets and reruns.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use serde_json::json;
use tacc_client::Client;
use tacc_compiler::{ChunkHash, ChunkerParams, Manifest};
use tacc_core::TaskState;

/// Deterministic bytes that do not compress away and cut into several chunks.
fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

fn project(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for index in 0..4u64 {
        std::fs::write(
            dir.join(format!("file{index}.bin")),
            pseudo_random(index, 300 * 1024),
        )
        .unwrap();
    }
}

fn chunk_files(store: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for fan_out in std::fs::read_dir(store).unwrap().flatten() {
        if fan_out.file_name() == "tmp" || !fan_out.path().is_dir() {
            continue;
        }
        for file in std::fs::read_dir(fan_out.path()).unwrap().flatten() {
            files.push(format!(
                "{}{}",
                fan_out.file_name().to_string_lossy(),
                file.file_name().to_string_lossy()
            ));
        }
    }
    files.sort();
    files
}

async fn put_raw(client: &Client, hash: &str, bytes: &[u8]) -> Result<(), String> {
    let compressed = zstd::bulk::compress(bytes, 3).unwrap();
    client
        .put_chunk(hash, compressed)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_upload_resumes_with_only_the_missing_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let code = dir.path().join("code");
    project(&code);
    let data = dir.path().join("server");
    let mut server = start("server", &data, &[]).await;
    let client = server.client();
    let tree = tacc_compiler::scan(&code, &[]).unwrap();
    let manifest = serde_json::to_value(&tree.manifest).unwrap();
    let offer = client.offer_snapshot(manifest.clone()).await.unwrap();
    assert!(offer.missing.len() >= 8, "{} chunks", offer.missing.len());
    let (sent, unsent) = offer.missing.split_at(offer.missing.len() / 2);
    for hash in sent {
        let bytes = tree.read_chunk(&hash.parse().unwrap()).unwrap();
        put_raw(&client, hash, &bytes).await.unwrap();
    }
    let early = client.commit_snapshot(manifest.clone()).await.unwrap_err();
    assert!(
        early
            .to_string()
            .contains(&format!("{} chunk(s)", unsent.len())),
        "{early}"
    );

    // The "interrupted" client and a crashed server: what was stored stays stored.
    server.kill9();
    let server = start("server", &data, &[]).await;
    let client = server.client();
    let again = client.offer_snapshot(manifest.clone()).await.unwrap();
    assert_eq!(
        again.missing, unsent,
        "only the chunks never sent are asked for"
    );
    let unknown = client.get_snapshot(&offer.snapshot).await.unwrap_err();
    assert!(unknown.to_string().contains("does not exist"), "{unknown}");
    for hash in &again.missing {
        let bytes = tree.read_chunk(&hash.parse().unwrap()).unwrap();
        put_raw(&client, hash, &bytes).await.unwrap();
    }
    let committed = client.commit_snapshot(manifest.clone()).await.unwrap();
    assert_eq!(committed.snapshot, offer.snapshot);
    assert!(
        client
            .offer_snapshot(manifest)
            .await
            .unwrap()
            .missing
            .is_empty()
    );
}

fn manifest_with(entries: Vec<serde_json::Value>) -> serde_json::Value {
    json!({
        "format_version": 1,
        "chunker": ChunkerParams::default(),
        "entries": entries,
    })
}

fn file_entry(path: &str, chunk: &[u8]) -> serde_json::Value {
    json!({"path": path, "kind": {"type": "file", "executable": false, "size": chunk.len(),
        "chunks": [{"hash": ChunkHash::of(chunk), "size": chunk.len()}]}})
}

/// Sends `head` and `body` on a fresh connection, half-closes it and returns the answer.
/// Send `head` (request line and headers, with the admin's bearer token added) and `body`.
fn raw_http(server: &Daemon, head: &str, body: &[u8]) -> String {
    let (line, rest) = head.split_once("\r\n").unwrap();
    let head = format!("{line}\r\nAuthorization: Bearer {}\r\n{rest}", server.token);
    let address = server.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_faults_are_rejected_and_nothing_lands_outside_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    let server = start("server", &data, &[]).await;
    let client = server.client();
    let chunk = b"print('hello')\n".to_vec();
    let hash = ChunkHash::of(&chunk).to_string();

    let bad_manifests = [
        (
            manifest_with(vec![file_entry("../escape.py", &chunk)]),
            "`..` component",
        ),
        (
            manifest_with(vec![file_entry("/etc/passwd", &chunk)]),
            "absolute",
        ),
        (
            manifest_with(vec![
                json!({"path": "link", "kind": {"type": "symlink", "target": "../../etc"}}),
            ]),
            "escapes the snapshot root",
        ),
        (
            manifest_with(vec![
                json!({"path": "tty", "kind": {"type": "char_device"}}),
            ]),
            "malformed manifest",
        ),
        (
            manifest_with(vec![
                json!({"path": "a.py", "kind": {"type": "file", "executable": false, "size": 99,
                "chunks": [{"hash": hash, "size": chunk.len()}]}}),
            ]),
            "claims 99 bytes",
        ),
    ];
    for (manifest, expected) in bad_manifests {
        for result in [
            client.offer_snapshot(manifest.clone()).await.map(|_| ()),
            client.commit_snapshot(manifest.clone()).await.map(|_| ()),
        ] {
            let error = result.unwrap_err().to_string();
            assert!(error.contains(expected), "{expected}: {error}");
        }
    }

    // A chunk whose bytes do not match its name.
    let error = put_raw(&client, &hash, b"something else")
        .await
        .unwrap_err();
    assert!(error.contains("has hash"), "{error}");
    // A name that is not a hash cannot address a file.
    let error = put_raw(&client, "..%2F..%2Fescape", &chunk)
        .await
        .unwrap_err();
    assert!(error.contains("invalid chunk hash"), "{error}");
    // Truncated zstd data.
    let compressed = zstd::bulk::compress(&pseudo_random(9, 100_000), 3).unwrap();
    let error = client
        .put_chunk(
            &ChunkHash::of(&pseudo_random(9, 100_000)).to_string(),
            compressed[..compressed.len() / 2].to_vec(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("bad zstd data"), "{error}");
    // A body cut short of its Content-Length: the connection ends mid-upload.
    let answer = raw_http(
        &server,
        &format!(
            "PUT /v1/chunks/{hash} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            chunk.len() + 1000
        ),
        &chunk,
    );
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 400"),
        "{answer}"
    );

    // A size lie the manifest checks cannot see: chunk and file agree on 14 bytes, but
    // the chunk named is 15 bytes long.
    put_raw(&client, &hash, &chunk).await.unwrap();
    let lying = manifest_with(vec![
        json!({"path": "a.py", "kind": {"type": "file", "executable": false, "size": chunk.len() - 1,
        "chunks": [{"hash": hash, "size": chunk.len() - 1}]}}),
    ]);
    let error = client.commit_snapshot(lying).await.unwrap_err().to_string();
    assert!(error.contains("lists chunk"), "{error}");

    // Only the one honest chunk was stored, nothing half-written is left, and no file
    // appeared outside the data directory's own layout.
    assert_eq!(chunk_files(&data.join("chunks")), vec![hash.clone()]);
    assert_eq!(
        std::fs::read_dir(data.join("chunks").join("tmp"))
            .unwrap()
            .count(),
        0
    );
    let mut top: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("tacc.db"))
        .collect();
    top.sort();
    assert_eq!(
        top,
        [
            "admin.token",
            "chunks",
            "logs",
            "outputs",
            "secret.key",
            "server.log",
            "taccd.json"
        ]
    );
    assert!(!dir.path().join("escape").exists() && !dir.path().join("escape.py").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreferenced_chunks_are_collected_after_the_retention() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    let server = start("server", &data, &["--chunk-retention", "2s"]).await;
    let client = server.client();
    let code = dir.path().join("code");
    project(&code);
    let snapshot = upload(&client, &code).await;
    let manifest: Manifest =
        serde_json::from_value(client.get_snapshot(&snapshot).await.unwrap()).unwrap();
    let orphan = pseudo_random(77, 40_000);
    let orphan_hash = ChunkHash::of(&orphan).to_string();
    put_raw(&client, &orphan_hash, &orphan).await.unwrap();
    assert!(chunk_files(&data.join("chunks")).contains(&orphan_hash));

    eventually("the unreferenced chunk to be collected", DEADLINE, || {
        let store = data.join("chunks");
        let orphan_hash = orphan_hash.clone();
        async move { (!chunk_files(&store).contains(&orphan_hash)).then_some(()) }
    })
    .await;
    // Well past the retention now: a pass keeps every chunk of the committed snapshot.
    let report = client.collect_garbage().await.unwrap();
    assert_eq!(report.chunks_removed, 0);
    let expected: Vec<String> = manifest.chunk_set().iter().map(|h| h.to_string()).collect();
    assert_eq!(chunk_files(&data.join("chunks")), expected);
    assert_eq!(report.chunks_kept, expected.len() as u64);
}

/// A wheel of a one-module package, built with Python's zipfile (no network, no build
/// backend): `import tinypkg; tinypkg.VALUE == "tiny-42"`.
fn build_wheel(dir: &Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let wheel = dir.join("tinypkg-0.1-py3-none-any.whl");
    let script = format!(
        r#"
import zipfile
files = {{
    "tinypkg/__init__.py": 'VALUE = "tiny-42"\n',
    "tinypkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
    "tinypkg-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tacc-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}}
with zipfile.ZipFile({path:?}, "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
    z.writestr("tinypkg-0.1.dist-info/RECORD", "".join(n + ",,\n" for n in files) + "tinypkg-0.1.dist-info/RECORD,,\n")
"#,
        path = wheel.display().to_string()
    );
    let status = std::process::Command::new("python3")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert!(status.success());
    wheel
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environment_is_built_once_reused_and_rerun_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let client = daemon.client();
    let wheel = build_wheel(&dir.path().join("wheels"));
    let requirements = format!("{}\n", wheel.display());
    let yaml = "name: env\nenvironment:\n  requirements: requirements.txt\n  vars: {PIP_NO_INDEX: '1'}\nrun: |\n  python -c 'import tinypkg, sys; print(tinypkg.VALUE, sys.prefix)'\n  echo \"venv=$VIRTUAL_ENV\"\n";
    let first = submit(
        &client,
        dir.path(),
        "first",
        yaml,
        &[("requirements.txt", &requirements)],
    )
    .await;
    let view = wait_terminal(&client, first).await;
    let log = log_text(&client, first).await;
    assert_eq!(view.state, TaskState::Succeeded, "{log}");
    assert!(log.contains("tacc: building environment"), "{log}");
    assert!(log.contains("tiny-42"), "{log}");
    let venv = log
        .lines()
        .find_map(|l| l.strip_prefix("venv="))
        .unwrap()
        .to_string();
    assert!(venv.contains("/envs/"), "{log}");

    // Another task with the same spec (other code) reuses the environment.
    let second = submit(
        &client,
        dir.path(),
        "second",
        yaml,
        &[("requirements.txt", &requirements), ("other.py", "x = 1\n")],
    )
    .await;
    let view = wait_terminal(&client, second).await;
    let log = log_text(&client, second).await;
    assert_eq!(view.state, TaskState::Succeeded, "{log}");
    assert!(log.contains("tacc: reusing environment"), "{log}");
    assert!(log.contains(&format!("venv={venv}")), "{log}");

    // The instruction names the environment; a rerun runs the same snapshot and spec.
    let instruction = client.task_instruction(first).await.unwrap();
    assert_eq!(
        instruction["environment"]["plan"]["requirements"],
        "requirements.txt"
    );
    assert!(instruction["environment"]["spec_key"].is_string());
    let rerun = client.rerun(first).await.unwrap().task_id;
    assert_ne!(rerun, first);
    let view = wait_terminal(&client, rerun).await;
    assert_eq!(view.state, TaskState::Succeeded);
    assert_eq!(
        view.snapshot,
        client.get_task(first).await.unwrap().snapshot
    );
    assert_eq!(
        client.task_instruction(rerun).await.unwrap()["environment"],
        instruction["environment"]
    );
    assert!(
        log_text(&client, rerun)
            .await
            .contains("tacc: reusing environment")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_environment_build_fails_the_task_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start("dev", &dir.path().join("d"), &[]).await;
    let client = daemon.client();
    let yaml = "name: broken-env\nenvironment:\n  pip: [tacc-no-such-package-4f1c9]\n  vars: {PIP_NO_INDEX: '1'}\nrun: echo never\n";
    let task = submit(&client, dir.path(), "broken", yaml, &[]).await;
    let view = wait_terminal(&client, task).await;
    let log = log_text(&client, task).await;
    assert_eq!(view.state, TaskState::Failed, "{log}");
    let reason = view.reason.unwrap_or_default();
    assert!(reason.starts_with("env_build_failed"), "{reason}");
    assert!(reason.contains("tcloud logs"), "{reason}");
    assert!(
        log.contains("[env]") && log.contains("tacc-no-such-package-4f1c9"),
        "{log}"
    );
    assert!(!log.contains("never"), "{log}");

    // conda without conda on the node fails clearly (this machine has none on PATH).
    let has_conda = ["conda", "mamba"].iter().any(|tool| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !has_conda {
        let yaml = "name: conda\nenvironment:\n  conda: {dependencies: [numpy]}\nrun: echo never\n";
        let task = submit(&client, dir.path(), "conda", yaml, &[]).await;
        let view = wait_terminal(&client, task).await;
        let reason = view.reason.unwrap_or_default();
        assert!(
            reason.starts_with("env_build_failed") && reason.contains("neither on its PATH"),
            "{reason}"
        );
    }
}

/// A loopback HTTP server answering every request with `body`; counts requests.
async fn serve_file(body: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/data/weights.bin", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let body = body.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let header = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(header.as_bytes()).await;
                let _ = socket.write_all(&body).await;
            });
        }
    });
    (url, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datasets_from_a_registered_directory_and_a_url_are_mounted_and_cached() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared").join("corpus");
    std::fs::create_dir_all(shared.join("sub")).unwrap();
    std::fs::write(shared.join("sub").join("a.txt"), "corpus-line\n").unwrap();
    let (url, requests) = serve_file(b"weights-bytes\n".to_vec()).await;
    let registration = format!("corpus={}", shared.display());
    let daemon = start("dev", &dir.path().join("d"), &["--dataset", &registration]).await;
    let client = daemon.client();

    let datasets = client.list_datasets().await.unwrap();
    assert_eq!(datasets.len(), 1);
    assert_eq!(datasets[0].name, "corpus");

    let yaml = format!(
        "name: data\ndatasets:\n  - {{name: corpus, source: corpus, mount: data/corpus}}\n  - {{name: weights, source: '{url}', mount: data/weights.bin}}\nrun: |\n  cat data/corpus/sub/a.txt data/weights.bin\n  test -L data/corpus && echo linked\n  touch data/corpus/new 2>/dev/null && [ \"$(id -u)\" != 0 ] && echo writable\n  echo done\n"
    );
    let first = submit(&client, dir.path(), "first", &yaml, &[]).await;
    let view = wait_terminal(&client, first).await;
    let log = log_text(&client, first).await;
    assert_eq!(view.state, TaskState::Succeeded, "{log}");
    for expected in ["corpus-line", "weights-bytes", "linked", "done"] {
        assert!(log.contains(expected), "{expected}: {log}");
    }
    assert!(!log.contains("writable"), "{log}");
    assert!(log.contains("tacc: fetching dataset `weights`"), "{log}");
    let instruction = client.task_instruction(first).await.unwrap();
    assert_eq!(
        instruction["datasets"][0]["source"],
        shared.display().to_string(),
        "registered names are resolved in the instruction"
    );

    let second = submit(&client, dir.path(), "second", &yaml, &[]).await;
    let view = wait_terminal(&client, second).await;
    let log = log_text(&client, second).await;
    assert_eq!(view.state, TaskState::Succeeded, "{log}");
    assert!(
        log.contains("dataset `weights`") && log.contains("is cached on this node"),
        "{log}"
    );
    assert_eq!(requests.load(Ordering::SeqCst), 1, "fetched once per node");

    // A source that is neither a path, a URL nor a registered name is refused at submit.
    let task_dir = dir.path().join("unknown");
    std::fs::create_dir_all(&task_dir).unwrap();
    std::fs::write(
        task_dir.join("task.yaml"),
        "name: unknown\ndatasets:\n  - {name: x, source: imagenet, mount: data/x}\nrun: echo\n",
    )
    .unwrap();
    let loaded = tacc_schema::load_task(&task_dir).unwrap();
    let snapshot = upload(&client, &loaded.code_root).await;
    let error = client
        .submit(&tacc_proto::SubmitTask {
            translated: Vec::new(),
            spec: serde_json::to_value(&loaded.spec).unwrap(),
            snapshot,
            source: None,
            wait_for_capacity: false,
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("`imagenet`") && error.contains("tcloud dataset ls"),
        "{error}"
    );
}
