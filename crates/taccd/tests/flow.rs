//! Flow control end to end (issue 10, item 4; the log half of fault scenario R14), on
//! real processes: numbered output survives the agent and the server being killed and a
//! follower reconnecting, exactly; a task printing huge lines fast neither stalls another
//! task on its node nor grows the agent's memory; readers of a large log cost the server
//! a bounded amount of memory.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use tacc_client::Client;
use tacc_core::{TaskId, TaskState};

/// The `tcloud` binary built beside `taccd`.
fn tcloud_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_taccd")).with_file_name("tcloud");
    assert!(
        path.exists(),
        "{} is missing: build every binary first with `cargo build -p taccd -p tcloud --bins`",
        path.display()
    );
    path
}

/// A process's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    memory_line(pid, "VmHWM:")
}

fn memory_line(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    kib * 1024
}

const MIB: u64 = 1 << 20;

/// The CPU time a process has used so far (user and system), in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command (which may hold spaces) in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap();
    ticks as f64 / per_second as f64
}

/// Start `taccd server` again on the address it had (its agents know no other), on the
/// same store.
async fn restart_server(data: &Path, url: &str, backend: &Backend) -> Daemon {
    restart_on("server", data, url, &backend.args()).await
}

/// The chatty task's gigabyte is measured alone: two at once would share two cores.
static CHATTY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The working directory of a task's attempt on the agent with data directory `agent`.
fn workdir(agent: &Path, task: TaskId, attempt: u32) -> PathBuf {
    agent.join("work").join(format!("{task}-{attempt}-r0"))
}

/// Let the task's `gate NAME` go on (the file appears in its working directory).
fn open_gate(agent: &Path, task: TaskId, attempt: u32, name: &str) {
    std::fs::write(workdir(agent, task, attempt).join(name), "").unwrap();
}

async fn wait_log_contains(client: &Client, task: TaskId, what: &str, deadline: Duration) {
    eventually(
        &format!("{what:?} in the log of task {task}"),
        deadline,
        || {
            let client = client.clone();
            async move {
                let (bytes, _) = client.logs(task, 0).await.ok()?;
                String::from_utf8_lossy(&bytes).contains(what).then_some(())
            }
        },
    )
    .await;
}

fn numbered(from: u32, to: u32) -> String {
    (from..=to).map(|i| format!("{}\n", line(i))).collect()
}

fn line(i: u32) -> String {
    format!("line {i} of the numbered output, padded so that it spills the spool")
}

/// Compare every line, saying where the first difference is.
fn assert_same_lines(what: &str, got: &str, expected: &str) {
    let (got_lines, expected_lines): (Vec<&str>, Vec<&str>) =
        (got.lines().collect(), expected.lines().collect());
    if let Some(at) = (0..got_lines.len().max(expected_lines.len()))
        .find(|i| got_lines.get(*i) != expected_lines.get(*i))
    {
        panic!(
            "{what}: line {} differs: got {:?}, expected {:?} ({} lines got, {} expected)",
            at + 1,
            got_lines.get(at),
            expected_lines.get(at),
            got_lines.len(),
            expected_lines.len()
        );
    }
    assert_eq!(got, expected, "{what}: same lines, different bytes");
}

// R14, the log half: 200,000 numbered lines while the agent is killed and restarted (its
// attempt is lost and retried: the retry prints them all again) and the server is
// killed while the task prints, the agent spilling the output to disk meanwhile; a
// `tcloud logs -f` started at the beginning reconnects. The log, read back and as the
// follower printed it, is exactly the lines printed, in order, once each.
on_both_stores!(
    numbered_output_survives_agent_and_server_kills_exactly,
    threads = 2,
    run = numbered_output
);

async fn numbered_output(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("s");
    let agent_dir = dir.path().join("a");
    let mut server = start("server", &data, &backend.args()).await;
    let url = server.url.clone();
    let client = server.client();
    let mut agent = start_agent(&server, &agent_dir, &["--name", "numbered"]);
    wait_nodes(&client, 1).await;
    // Each phase waits for a file the test creates in the working directory, so the
    // faults land at known points of the output.
    let yaml = format!(
        "name: numbered\nretry: {{max_attempts: 2}}\nrun: |\n  \
         gate() {{ while [ ! -e \"$1\" ]; do sleep 0.05; done; }}\n  \
         lines() {{ awk -v a=\"$1\" -v b=\"$2\" 'BEGIN {{ for (i = a; i <= b; i++) printf \"{}\\n\", i }}'; }}\n  \
         echo \"attempt $TACC_ATTEMPT\"\n  \
         lines 1 50000\n  gate a\n  lines 50001 150000\n  gate b\n  lines 150001 200000\n",
        line(0).replace(" 0 ", " %d ")
    );
    let task = submit(&client, dir.path(), "numbered", &yaml, &[]).await;
    let home = dir.path().join("home");
    let follower = Command::new(tcloud_binary())
        .args(["logs", "-f", "--raw", &task.to_string()])
        .env("TACC_HOME", &home)
        .env("TACC_SERVER", &url)
        .env("TACC_TOKEN", &server.token)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read as it prints: a follower blocked on a full pipe would not follow anything.
    let followed = std::thread::spawn(move || follower.wait_with_output().unwrap());

    // Attempt 1 prints its first 50,000 lines; the agent is killed and restarted.
    wait_log_contains(&client, task, &format!("{}\n", line(50_000)), DEADLINE).await;
    agent.kill9();
    let _agent = start_agent(&server, &agent_dir, &["--name", "numbered"]);
    // Its attempt is lost and retried on the restarted agent, which prints from 1 again.
    wait_log_contains(&client, task, "attempt 2\n", DEADLINE).await;
    let attempt_two = format!("attempt 2\n{}", numbered(1, 50_000));
    wait_log_contains(&client, task, &attempt_two, DEADLINE).await;

    // The server is killed; the task prints 100,000 lines while it is away.
    server.kill9();
    open_gate(&agent_dir, task, 2, "a");
    let spool = agent_dir.join("spool").join(format!("{task}-2.log"));
    let spilled = eventually("the agent to spill output to disk", DEADLINE, || {
        let spool = spool.clone();
        async move {
            let size = std::fs::metadata(&spool).ok()?.len();
            (size > 2 * MIB).then_some(size)
        }
    })
    .await;
    let server = restart_server(&data, &url, &backend).await;
    let client = server.client();
    wait_log_contains(&client, task, &format!("{}\n", line(150_000)), DEADLINE).await;
    open_gate(&agent_dir, task, 2, "b");
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt.0, 2, "{view:?}");

    let expected = format!(
        "attempt 1\n{}=== attempt 2 (retry after node_restarted) ===\n{attempt_two}{}",
        numbered(1, 50_000),
        numbered(50_001, 200_000)
    );
    assert_same_lines("the log", &log_text(&client, task).await, &expected);
    let followed = tokio::task::spawn_blocking(move || followed.join().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&followed.stderr);
    assert!(followed.status.success(), "tcloud logs -f failed: {stderr}");
    assert!(
        stderr.contains("reconnected"),
        "the follower never lost the server: {stderr}"
    );
    assert_same_lines(
        "what tcloud logs -f printed",
        &String::from_utf8(followed.stdout).unwrap(),
        &expected,
    );
    eprintln!(
        "R14-logs: 250,003 lines compared exactly (200,000 of the final attempt); the agent \
         spilled {:.1} MiB while the server was down",
        spilled as f64 / MIB as f64
    );
}

/// The chatty task prints lines numbered 1 to this, each its number then `x`s.
const CHATTY_LINES: u32 = 971;
/// Lines of 8, 16 and 32 MiB of `x` among the 1 MiB ones: 1 GiB of `x` in all.
const HUGE_LINES: [(u32, u64); 3] = [(100, 8), (500, 16), (900, 32)];
/// What ends each log line but the last of an output line cut into pieces.
const CONTINUES: &[u8] = b" [tacc: line continues]\n";

/// MiB of `x` on chatty line `i`.
fn chatty_mib(i: u32) -> u64 {
    HUGE_LINES
        .iter()
        .find(|(at, _)| *at == i)
        .map_or(1, |(_, mib)| *mib)
}

/// One log line of the chatty task's log: a piece of an output line.
struct Piece {
    /// What the piece starts with: its line's number on a first piece (the whole text of
    /// the last line, which is not numbered).
    head: Option<String>,
    xs: usize,
    end: &'static [u8],
}

impl Piece {
    fn len(&self) -> u64 {
        (self.head.as_ref().map_or(0, String::len) + self.xs + self.end.len()) as u64
    }

    fn write_into(&self, out: &mut Vec<u8>, xs: &[u8]) {
        out.clear();
        if let Some(head) = &self.head {
            out.extend_from_slice(head.as_bytes());
        }
        out.extend_from_slice(&xs[..self.xs]);
        out.extend_from_slice(self.end);
    }
}

/// The chatty task's log, log line by log line: an output line longer than
/// `tacc_exec::MAX_LINE_BYTES` is cut in pieces of that size, every piece but the last
/// ending with the continuation mark.
fn chatty_log() -> impl Iterator<Item = Piece> {
    const PIECE: usize = tacc_exec::MAX_LINE_BYTES;
    (1..=CHATTY_LINES)
        .flat_map(|i| {
            let number = i.to_string();
            let len = number.len() + (chatty_mib(i) * MIB) as usize;
            (0..len.div_ceil(PIECE)).map(move |k| {
                let (start, end) = (k * PIECE, ((k + 1) * PIECE).min(len));
                let first = (k == 0).then(|| number.clone());
                Piece {
                    xs: end - start - first.as_ref().map_or(0, String::len),
                    head: first,
                    end: if end < len { CONTINUES } else { b"\n" },
                }
            })
        })
        .chain(std::iter::once(Piece {
            head: Some("chatty-done".into()),
            xs: 0,
            end: b"\n",
        }))
}

/// Compares a stream of log bytes, as it arrives, with the chatty task's log from an
/// offset (a gigabyte is never held whole).
struct LogCheck {
    pieces: Box<dyn Iterator<Item = Piece> + Send>,
    xs: Vec<u8>,
    expected: Vec<u8>,
    /// How much of `expected` was matched.
    matched: usize,
    /// The log offset of the next byte.
    offset: u64,
}

impl LogCheck {
    fn at(offset: u64) -> Self {
        let mut check = LogCheck {
            pieces: Box::new(chatty_log()),
            xs: vec![b'x'; tacc_exec::MAX_LINE_BYTES],
            expected: Vec::new(),
            matched: 0,
            offset: 0,
        };
        while let Some(piece) = check.pieces.next() {
            if check.offset + piece.len() > offset {
                piece.write_into(&mut check.expected, &check.xs);
                check.matched = (offset - check.offset) as usize;
                check.offset = offset;
                return check;
            }
            check.offset += piece.len();
        }
        assert_eq!(
            check.offset, offset,
            "offset {offset} is past the log's end"
        );
        check
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.matched == self.expected.len() {
                let piece = self.pieces.next().unwrap_or_else(|| {
                    panic!("the log goes on past its expected end at {}", self.offset)
                });
                piece.write_into(&mut self.expected, &self.xs);
                self.matched = 0;
            }
            let n = bytes.len().min(self.expected.len() - self.matched);
            let (got, want) = (&bytes[..n], &self.expected[self.matched..self.matched + n]);
            if got != want {
                let wrong = got.iter().zip(want).position(|(g, w)| g != w).unwrap();
                let show =
                    |b: &[u8]| String::from_utf8_lossy(&b[wrong..(wrong + 60).min(n)]).into_owned();
                panic!(
                    "the log differs at byte {}: {:?} where {:?} was expected",
                    self.offset + wrong as u64,
                    show(got),
                    show(want)
                );
            }
            self.matched += n;
            self.offset += n as u64;
            bytes = &bytes[n..];
        }
    }

    /// Where the check is, asserting it is at the log's end.
    fn at_end(mut self) -> u64 {
        assert!(
            self.matched == self.expected.len() && self.pieces.next().is_none(),
            "the log ends early, at {}",
            self.offset
        );
        self.offset
    }
}

// A task printing 1 GiB of long lines (1 MiB, and three of 8, 16 and 32 MiB) as fast
// as it can does not stall another task on the same node, the agent's memory stays
// bounded, and every line arrives whole, in pieces, exactly; then six concurrent full
// readers of its log (three following it, three reading ranges) cost the server a
// bounded amount of memory.
on_both_stores!(
    a_chatty_task_neither_stalls_its_node_nor_grows_memory,
    threads = 2,
    run = chatty_task
);

async fn chatty_task(backend: Backend) {
    let _alone = CHATTY.lock().await;
    /// How long printing and delivering 1 GiB may take (33–61 s measured in a debug
    /// build, on 2 cores shared with compilers).
    const PRINT_DEADLINE: Duration = Duration::from_secs(300);
    let dir = tempfile::tempdir().unwrap();
    // The log is a little over 1 GiB, the default cap.
    let server = start(
        "server",
        &dir.path().join("s"),
        &backend.with(&["--max-log", "2GiB"]),
    )
    .await;
    let client = server.client();
    let agent = start_agent(
        &server,
        &dir.path().join("a"),
        &["--name", "chatty", "--cpus", "2"],
    );
    wait_nodes(&client, 1).await;
    let huge: String = HUGE_LINES
        .iter()
        .map(|(at, mib)| format!("if (i == {at}) n = {mib}; "))
        .collect();
    let printing = Instant::now();
    let chatty = submit(
        &client,
        dir.path(),
        "chatty",
        &format!(
            "name: chatty\nresources: {{cpus: 1}}\nrun: |\n  \
             awk 'BEGIN {{ ORS = \"\"; s = \"x\"; for (k = 0; k < 20; k++) s = s s; \
             for (i = 1; i <= {CHATTY_LINES}; i++) {{ n = 1; {huge}\
             print i; for (j = 0; j < n; j++) print s; print \"\\n\" }} }}'\n  \
             echo chatty-done\n"
        ),
        &[],
    )
    .await;
    wait_log_contains(&client, chatty, "xxxxxxxx", DEADLINE).await;
    let started = Instant::now();
    let quiet = submit(
        &client,
        dir.path(),
        "quiet",
        "name: quiet\nresources: {cpus: 1}\nrun: echo quiet-done\n",
        &[],
    )
    .await;
    let view = wait_terminal(&client, quiet).await;
    let quiet_took = started.elapsed();
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(log_text(&client, quiet).await, "quiet-done\n");
    let chatty_state = client.get_task(chatty).await.unwrap().state;
    assert!(
        quiet_took < Duration::from_secs(20),
        "the quiet task took {quiet_took:?} beside the chatty one"
    );

    let view = eventually("the chatty task to end", PRINT_DEADLINE, || {
        let client = client.clone();
        async move {
            let view = client.get_task(chatty).await.ok()?;
            view.state.is_terminal().then_some(view)
        }
    })
    .await;
    let printed_in = printing.elapsed();
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    let agent_peak = peak_rss(agent.pid());
    let (agent_cpu, server_cpu) = (cpu_seconds(agent.pid()), cpu_seconds(server.pid()));
    let expected_size: u64 = chatty_log().map(|piece| piece.len()).sum();
    let (tail, size) = client.logs(chatty, expected_size - 200).await.unwrap();
    assert_eq!(size, expected_size, "the log's size");
    let mut check = LogCheck::at(expected_size - 200);
    check.feed(&tail);
    check.at_end();

    // Six full readers at once: three follow the log from its start, three read it in
    // ranges, each streamed and checked byte for byte as it arrives.
    let server_before = peak_rss(server.pid());
    let reading = Instant::now();
    let followers: Vec<_> = (0..3)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                use futures::StreamExt;
                let stream = client.follow_logs(chatty, 0).await.unwrap();
                futures::pin_mut!(stream);
                let mut check = LogCheck::at(0);
                while let Some(chunk) = stream.next().await {
                    check.feed(&chunk.unwrap());
                }
                check.at_end()
            })
        })
        .collect();
    let http = reqwest::Client::new();
    let ranged: Vec<_> = (0..3u64)
        .map(|k| {
            let (http, url, token) = (http.clone(), server.url.clone(), server.token.clone());
            tokio::spawn(async move {
                // Each reader starts a third of the way further and goes round.
                const RANGE: u64 = 200 * MIB;
                let start = size / 3 * k;
                let mut ranges = Vec::new();
                let mut offset = start;
                while ranges.is_empty() || offset != start {
                    let end = if offset < start { start } else { size };
                    let limit = RANGE.min(end - offset);
                    ranges.push((offset, limit));
                    offset = if offset + limit == size {
                        0
                    } else {
                        offset + limit
                    };
                }
                let mut read = 0;
                for (offset, limit) in ranges {
                    let mut response = http
                        .get(format!("{url}/v1/tasks/{chatty}/logs"))
                        .bearer_auth(&token)
                        .query(&[("offset", offset), ("limit", limit)])
                        .send()
                        .await
                        .unwrap()
                        .error_for_status()
                        .unwrap();
                    let header = response.headers()[tacc_proto::LOG_OFFSET_HEADER].clone();
                    assert_eq!(header.to_str().unwrap(), (offset + limit).to_string());
                    let mut check = LogCheck::at(offset);
                    while let Some(chunk) = response.chunk().await.unwrap() {
                        check.feed(&chunk);
                    }
                    assert_eq!(check.offset, offset + limit, "the range from {offset}");
                    read += limit;
                }
                read
            })
        })
        .collect();
    for reader in followers.into_iter().chain(ranged) {
        assert_eq!(reader.await.unwrap(), size);
    }
    let read_in = reading.elapsed();
    let server_after = peak_rss(server.pid());
    eprintln!(
        "flow: {:.0} MiB of long lines printed and delivered in {printed_in:.2?} (CPU: agent \
         {agent_cpu:.1} s, server {server_cpu:.1} s); the quiet task finished in {quiet_took:.2?} beside the chatty one (which was {chatty_state}); \
         agent peak RSS {:.1} MiB; six concurrent full readers checked the log in \
         {read_in:.2?}, server peak RSS {:.1} MiB before them and {:.1} MiB after",
        size as f64 / MIB as f64,
        agent_peak as f64 / MIB as f64,
        server_before as f64 / MIB as f64,
        server_after as f64 / MIB as f64,
    );
    // 64–92 MiB on an otherwise idle 2-core machine, 62 MiB with four CPU hogs beside it:
    // every buffer on the way is bounded (the executor's line channel, the report queue
    // that spills to disk). It once reached 219 MiB under CPU starvation while the line
    // channel was unbounded.
    assert!(
        agent_peak < 128 * MIB,
        "the agent's peak RSS is {agent_peak} bytes"
    );
    assert!(
        server_after < server_before + 64 * MIB,
        "the readers grew the server from {server_before} to {server_after} bytes"
    );
}

// Issue 10, item 3: an attempt that ends while the server is away is reported as ended
// once the server is back (the agent claims it at registration until its end is
// acknowledged) — it is neither marked lost nor run again.
on_both_stores!(
    a_task_that_ends_while_the_server_is_away_is_not_run_again,
    threads = 2,
    run = ended_while_away
);

async fn ended_while_away(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("s");
    let agent_dir = dir.path().join("a");
    let mut server = start("server", &data, &backend.args()).await;
    let url = server.url.clone();
    let client = server.client();
    let _agent = start_agent(&server, &agent_dir, &["--name", "away"]);
    wait_nodes(&client, 1).await;
    let yaml = "name: away\nretry: {max_attempts: 3}\nrun: |\n  \
                gate() { while [ ! -e \"$1\" ]; do sleep 0.05; done; }\n  \
                echo \"attempt $TACC_ATTEMPT\"\n  gate a\n  echo \"finished $TACC_ATTEMPT\"\n";
    let task = submit(&client, dir.path(), "away", yaml, &[]).await;
    wait_log_contains(&client, task, "attempt 1\n", DEADLINE).await;
    server.kill9();
    open_gate(&agent_dir, task, 1, "a");
    // The agent removes the working directory once it has queued the end.
    let workdir = workdir(&agent_dir, task, 1);
    eventually("the attempt to end on the agent", DEADLINE, || {
        let gone = !workdir.exists();
        async move { gone.then_some(()) }
    })
    .await;
    let server = restart_server(&data, &url, &backend).await;
    let client = server.client();
    let view = wait_terminal(&client, task).await;
    assert_eq!(view.state, TaskState::Succeeded, "{view:?}");
    assert_eq!(view.attempt.0, 1, "not run again: {view:?}");
    let (log, _) = client.logs(task, 0).await.unwrap();
    let log = String::from_utf8_lossy(&log);
    assert!(log.contains("finished 1\n"), "{log}");
    assert!(!log.contains("attempt 2"), "{log}");
}
