//! The agent's watchdog: a small process of its own that stops the agent's tasks when the
//! agent can no longer do it. An agent killed (`kill -9`, the OOM killer, a crash) leaves
//! its tasks running with nobody to stop them, and a stopped or hung agent cannot fence
//! itself; the server then retries their attempts elsewhere after its heartbeat timeout
//! `T`, and the old ones would run beside the new.
//!
//! The agent writes a ping line to the watchdog's standard input every
//! [`PING_EVERY`]: the lease term `T` in milliseconds (0 before registration), from a
//! thread of its own. When the pipe ends (the agent died) the watchdog kills every process
//! group the agent recorded (`run/slot-N.pgid`), and kills and removes its execution
//! cgroups (what the agent's next life would do at its start), then exits. When the pings stop for 2/3 of `T` while the pipe stays open (the agent is
//! stopped or hung), it kills the recorded groups and marks their slots fenced, so the
//! agent, should it resume, reports those attempts `node_fenced` rather than blaming the
//! task; by then the server may retry them, at `T` at the earliest.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tacc_exec::cgroups::Cgroups;

use crate::orphans;

/// How often the agent pings its watchdog.
pub const PING_EVERY: Duration = Duration::from_millis(200);

/// What made the watchdog act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The agent's end of the pipe closed: it is gone.
    AgentGone,
    /// No ping for this long, more than 2/3 of the agent's term.
    AgentSilent(Duration),
}

/// Watch the agent through `pings` (the watchdog's standard input) until it is gone;
/// act on `run_dir`'s records and `cgroups` each time it must. Returns when the agent is
/// gone, after its tasks were killed; `acted` hears of every verdict.
pub fn watch(
    pings: impl Read + Send + 'static,
    run_dir: &Path,
    cgroups: &dyn Cgroups,
    mut acted: impl FnMut(Verdict, usize),
) {
    let (tx, rx) = mpsc::channel::<Heard>();
    std::thread::spawn(move || {
        for line in BufReader::new(pings).lines() {
            let Ok(line) = line else { break };
            if tx.send(Heard::Ping(line.trim().parse().ok())).is_err() {
                return;
            }
        }
        let _ = tx.send(Heard::End);
    });
    let mut term = Duration::ZERO;
    let mut last_ping = Instant::now();
    let mut fenced = false;
    loop {
        match rx.recv_timeout(PING_EVERY) {
            Ok(Heard::Ping(ms)) => {
                if let Some(ms) = ms.filter(|ms| *ms != term.as_millis() as u64) {
                    term = Duration::from_millis(ms);
                    tracing::info!("watchdog: the agent's heartbeat term is {term:?}");
                }
                last_ping = Instant::now();
                fenced = false;
            }
            Ok(Heard::End) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                // What the agent's next life would do at its start, done now.
                let killed = orphans::fence_recorded(run_dir) + cgroups.remove_stale();
                cgroups.close();
                acted(Verdict::AgentGone, killed);
                return;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let silence = last_ping.elapsed();
        if !fenced && !term.is_zero() && silence > term * 2 / 3 {
            fenced = true;
            // The groups, and what left them with `setsid` (still in their cgroups); the
            // cgroups stay for the agent, which removes them as it sees each attempt end.
            let killed = orphans::fence_recorded(run_dir) + kill_in_cgroups(cgroups);
            acted(Verdict::AgentSilent(silence), killed);
        }
    }
}

/// Kill every process in the agent's execution cgroups; how many.
fn kill_in_cgroups(cgroups: &dyn Cgroups) -> usize {
    cgroups
        .existing()
        .iter()
        .filter_map(|name| cgroups.open(name))
        .map(|cgroup| {
            cgroup
                .kill_all(tacc_exec::cgroups::KILL_DEADLINE)
                .killed
                .len()
        })
        .sum()
}

/// What the watchdog heard from the agent.
enum Heard {
    /// A ping, with the agent's term in milliseconds when the line was a number.
    Ping(Option<u64>),
    /// The pipe ended.
    End,
}

/// The agent's side: tell the watchdog, if it has one, that it lives, with its current
/// term. A broken pipe (the watchdog is gone) leaves the agent without one.
pub(crate) fn ping(shared: &crate::Shared) {
    let term = shared.lease.term().map_or(0, |t| t.as_millis() as u64);
    let mut watchdog = shared.watchdog.lock().unwrap();
    let Some(pipe) = watchdog.as_mut() else {
        return;
    };
    match write_ping(pipe, term) {
        Pinged::Sent | Pinged::Full => {}
        Pinged::Gone => {
            tracing::warn!("the agent's watchdog is gone: should the agent die, its tasks run on");
            *watchdog = None;
        }
    }
}

/// The agent's end of the pipe to its watchdog, made non-blocking: a watchdog that stops
/// reading (stopped itself) fills the pipe in some 45 minutes of pings, and a blocking
/// write would then hang the agent on the lock its runtime takes too.
pub(crate) fn nonblocking(pipe: &std::process::ChildStdin) -> std::io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use std::os::fd::AsRawFd;
    let fd = pipe.as_raw_fd();
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// What became of one ping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pinged {
    Sent,
    /// The watchdog reads nothing (the pipe is full): this ping is dropped, the next may go.
    Full,
    /// The watchdog's end is closed.
    Gone,
}

/// One ping line in one `write`: a pipe writes up to `PIPE_BUF` bytes whole or not at
/// all, so a full pipe never gets half a line.
fn write_ping(pipe: &mut impl Write, term_ms: u64) -> Pinged {
    let line = format!("{term_ms}\n");
    match pipe.write(line.as_bytes()) {
        Ok(_) => Pinged::Sent,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ) =>
        {
            Pinged::Full
        }
        Err(_) => Pinged::Gone,
    }
}

/// Ping every [`PING_EVERY`] from a thread of its own (not a task of the runtime: a busy
/// runtime must not look like a stopped agent), while the agent has a watchdog.
pub(crate) fn keep_pinging(shared: std::sync::Arc<crate::Shared>) {
    if shared.watchdog.lock().unwrap().is_none() {
        return;
    }
    std::thread::spawn(move || {
        while shared.watchdog.lock().unwrap().is_some() {
            ping(&shared);
            std::thread::sleep(PING_EVERY);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orphans::GroupRecord;
    use std::os::unix::process::CommandExt;

    fn sleeper() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .unwrap()
    }

    fn wait_ended(child: &mut std::process::Child) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the task was not killed");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn an_agent_that_dies_leaves_no_task_running() {
        let dir = tempfile::tempdir().unwrap();
        let mut task = sleeper();
        let record = GroupRecord::write(dir.path(), "t1-1", task.id()).unwrap();
        let (reader, mut writer) = std::io::pipe().unwrap();
        writeln!(writer, "3000").unwrap();
        drop(writer); // the agent dies
        let mut verdicts = Vec::new();
        watch(
            reader,
            dir.path(),
            &tacc_exec::cgroups::NoCgroups,
            |v, n| verdicts.push((v, n)),
        );
        assert_eq!(verdicts, [(Verdict::AgentGone, 1)]);
        wait_ended(&mut task);
        assert!(record.fenced(), "the slot says the group was fenced");
    }

    #[test]
    fn a_silent_agent_s_tasks_are_fenced_once_and_it_may_resume() {
        let dir = tempfile::tempdir().unwrap();
        let mut task = sleeper();
        let record = GroupRecord::write(dir.path(), "t2-1", task.id()).unwrap();
        let (reader, mut writer) = std::io::pipe().unwrap();
        let run_dir = dir.path().to_path_buf();
        let (tx, verdicts) = mpsc::channel();
        let watching = std::thread::spawn(move || {
            watch(reader, &run_dir, &tacc_exec::cgroups::NoCgroups, |v, n| {
                tx.send((v, n)).unwrap()
            })
        });
        // A term of 600 ms: silence past 400 ms fences.
        writeln!(writer, "600").unwrap();
        let (verdict, killed) = verdicts.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(matches!(verdict, Verdict::AgentSilent(s) if s > Duration::from_millis(400)));
        assert_eq!(killed, 1);
        wait_ended(&mut task);
        assert!(record.fenced());
        // It resumes and pings: nothing more happens until it is silent again, then dies.
        writeln!(writer, "600").unwrap();
        drop(writer);
        watching.join().unwrap();
        let rest: Vec<_> = verdicts.try_iter().collect();
        assert_eq!(rest.last(), Some(&(Verdict::AgentGone, 0)), "{rest:?}");
    }

    #[test]
    fn pings_to_a_watchdog_that_reads_nothing_never_block_the_agent() {
        // `sleep` never reads its standard input: the pipe fills as a stopped watchdog's.
        let mut reader_not = std::process::Command::new("sleep")
            .arg("300")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut pipe = reader_not.stdin.take().unwrap();
        nonblocking(&pipe).unwrap();
        let started = Instant::now();
        let mut results = std::collections::BTreeMap::new();
        // 100,000 pings: far more than a 64 KiB pipe holds (over five hours of pings).
        for _ in 0..100_000 {
            *results.entry(write_ping(&mut pipe, 30_000)).or_insert(0) += 1;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "pinging took {:?}",
            started.elapsed()
        );
        assert!(results[&Pinged::Sent] > 1000, "{results:?}");
        assert!(results[&Pinged::Full] > 1000, "{results:?}");
        assert!(!results.contains_key(&Pinged::Gone), "{results:?}");

        // Once the watchdog is gone, the agent hears so.
        reader_not.kill().unwrap();
        reader_not.wait().unwrap();
        assert_eq!(write_ping(&mut pipe, 30_000), Pinged::Gone);
    }
}
