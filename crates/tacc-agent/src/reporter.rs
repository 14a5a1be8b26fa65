//! Sends the agent's reports to the server in the order they happened for each attempt,
//! retrying until they are accepted: a server restart delays reports, it never drops
//! them. Flow control, end to end:
//!
//! - each attempt's output waits in a [`Spool`] of its own (bounded memory, then a spill
//!   file), so however much a task prints and however long the server is away, the
//!   agent's memory stays bounded and the task never stalls;
//! - an attempt's other reports (`started`, `finished`, usage samples) wait beside its
//!   output, tagged with how much output came before them, and are sent only after it;
//! - a batch takes a bounded share from every attempt in turn ([`ATTEMPT_SHARE`],
//!   round robin), so a chatty task never delays another's `started` or `finished`;
//! - a batch stays below [`BATCH_BYTES`], far under the server's limit
//!   ([`tacc_proto::MAX_REPORTS_BODY_BYTES`]); should the server refuse one anyway (a 4xx
//!   answer), it is split and sent again in halves, and a single report it refuses is
//!   dropped with a line in its task's log saying so — a refused batch never wedges the
//!   stream.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tacc_client::ClientError;
use tacc_proto::{AgentReport, AttemptRef};
use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedSender;

use crate::handed_work::{AskWork, HandedWork};
use tokio_util::sync::CancellationToken;

use crate::ends::EndRecords;
use crate::spool::Spool;
use crate::{Backoff, Shared};

/// The most a batch's JSON body may take (an estimate that never undercounts).
pub(crate) const BATCH_BYTES: usize = 4 << 20;
/// How long reports that are nothing but attempts' starts wait for company: a short
/// task's end then travels with its start — one request, and one durable commit on the
/// server, instead of two — while a long task shows `running` this much later.
pub(crate) const START_LINGER: Duration = Duration::from_millis(50);
/// What one attempt's output may take of a batch per turn.
pub(crate) const ATTEMPT_SHARE: usize = 256 << 10;
/// What a log report costs beside its text (its tags and ids, generously).
const LOG_OVERHEAD: usize = 128;
const _: () = assert!(BATCH_BYTES * 2 <= tacc_proto::MAX_REPORTS_BODY_BYTES);

/// Everything not yet delivered, per attempt.
#[derive(Debug)]
pub(crate) struct Reports {
    queues: Mutex<Queues>,
    /// Attempts whose `finished` report the server has not acknowledged yet (queued or
    /// in flight): still this node's to claim when it registers again, so an attempt that
    /// ended while the server was away is reported as ended, never lost and run again.
    ending: Mutex<BTreeSet<AttemptRef>>,
    /// The same ends on disk, for the agent's next life should it stop first.
    end_records: EndRecords,
    wake: Notify,
    /// Where spool files go (emptied when the agent starts).
    dir: PathBuf,
}

#[derive(Debug, Default)]
struct Queues {
    attempts: BTreeMap<AttemptRef, AttemptQueue>,
    /// The attempt whose turn comes first in the next batch.
    next: Option<AttemptRef>,
    /// Output already taken of attempts whose queue emptied (and was dropped), in bytes:
    /// where a new queue's output starts, so the offsets the server sees only grow.
    taken_before: BTreeMap<AttemptRef, u64>,
}

#[derive(Debug)]
struct AttemptQueue {
    log: Spool,
    /// Output of this attempt taken before this queue existed.
    base: u64,
    /// Reports other than output, each after the output that came before it.
    events: VecDeque<(u64, AgentReport)>,
}

impl AttemptQueue {
    fn is_empty(&self) -> bool {
        self.log.is_empty() && self.events.is_empty()
    }

    /// The next report of this attempt, its output taking at most `max_text` bytes.
    fn take(&mut self, attempt: AttemptRef, max_text: usize) -> Option<AgentReport> {
        if let Some((after, _)) = self.events.front() {
            if *after <= self.log.taken() {
                return self.events.pop_front().map(|(_, report)| report);
            }
            let due = usize::try_from(*after - self.log.taken()).unwrap_or(usize::MAX);
            let offset = Some(self.base + self.log.taken());
            let text = self.log.take(max_text.min(due))?;
            return Some(AgentReport::Log {
                attempt,
                text,
                offset,
            });
        }
        let offset = Some(self.base + self.log.taken());
        let text = self.log.take(max_text)?;
        Some(AgentReport::Log {
            attempt,
            text,
            offset,
        })
    }
}

/// The length of `text` as a JSON string, never less than serde_json writes. Every byte
/// a task prints passes here, so it goes eight bytes at a time, looking at single bytes
/// only in the words that hold one JSON escapes (it was a sixth of the agent's time for
/// a task printing long lines, in a debug build).
fn json_len(text: &str) -> usize {
    let mut words = text.as_bytes().chunks_exact(8);
    let mut len = 2;
    for word in &mut words {
        let value = u64::from_le_bytes(word.try_into().expect("chunks of eight"));
        len += if may_escape(value) {
            word.iter().copied().map(escaped_len).sum()
        } else {
            8
        };
    }
    len + words
        .remainder()
        .iter()
        .copied()
        .map(escaped_len)
        .sum::<usize>()
}

/// What one byte of a string takes in JSON (at most; `\u2028` and the like are kept as
/// they are by serde_json).
fn escaped_len(byte: u8) -> usize {
    match byte {
        b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
        0..=0x1f => 6,
        _ => 1,
    }
}

/// Whether a byte of `word` may need escaping in JSON: a control byte, a quote or a
/// backslash. Never false when one does (the tests for a byte below n and a zero byte
/// are exact as "any byte" tests, see "Bit Twiddling Hacks"); true otherwise only
/// costs a look at the word's bytes.
fn may_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    const SPACES: u64 = ONES * 0x20;
    let below = |x: u64, n: u64| x.wrapping_sub(n) & !x & HIGHS != 0;
    below(word, SPACES) || below(word ^ QUOTES, ONES) || below(word ^ BACKSLASHES, ONES)
}

/// The size of a report in a batch's JSON body (an estimate that never undercounts).
fn report_len(report: &AgentReport) -> usize {
    match report {
        AgentReport::Log { text, .. } => json_len(text) + LOG_OVERHEAD,
        other => serde_json::to_vec(other).map_or(LOG_OVERHEAD, |json| json.len() + 1),
    }
}

impl Reports {
    /// The queues of an agent whose data directory is `data_dir`, spilling under
    /// `DATA/spool` (which is emptied: a previous life's undelivered output is lost),
    /// with the ends a previous life recorded but did not deliver queued again (see
    /// [`crate::ends`]).
    pub(crate) fn open(data_dir: &std::path::Path) -> std::io::Result<Reports> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = data_dir.join("spool");
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        let (end_records, ends) = EndRecords::open(crate::ends::dir_of(data_dir))?;
        let reports = Reports {
            queues: Mutex::new(Queues::default()),
            ending: Mutex::new(BTreeSet::new()),
            end_records,
            wake: Notify::new(),
            dir,
        };
        for end in ends {
            tracing::info!(
                "task {} attempt {} ended before this agent stopped; reporting its end",
                AgentReport::attempt(&end).task,
                AgentReport::attempt(&end).attempt
            );
            reports.queue(end);
        }
        Ok(reports)
    }

    /// Queue a report for delivery (never blocks on the server); an attempt's end is
    /// recorded on disk first.
    pub(crate) fn send(&self, report: AgentReport) {
        if matches!(report, AgentReport::Finished { .. }) {
            self.end_records.record(&report);
        }
        self.queue(report);
    }

    fn queue(&self, report: AgentReport) {
        let attempt = AgentReport::attempt(&report);
        if matches!(report, AgentReport::Finished { .. }) {
            self.ending.lock().unwrap().insert(attempt);
        }
        {
            let mut queues = self.queues.lock().unwrap();
            let queues = &mut *queues;
            let base = &mut queues.taken_before;
            let queue = queues
                .attempts
                .entry(attempt)
                .or_insert_with(|| AttemptQueue {
                    base: base.remove(&attempt).unwrap_or(0),
                    log: Spool::new(
                        self.dir
                            .join(format!("{}-{}.log", attempt.task, attempt.attempt)),
                    ),
                    events: VecDeque::new(),
                });
            match report {
                AgentReport::Log { text, .. } => queue.log.append(text),
                other => queue.events.push_back((queue.log.appended(), other)),
            }
        }
        self.wake.notify_one();
    }

    /// The next batch: a turn for each attempt with something to say (but those in
    /// `busy`: a batch carrying their reports is on its way), round robin, until the batch
    /// is full or nothing is left; empty when nothing waits.
    pub(crate) fn take_batch(
        &self,
        budget: usize,
        busy: &BTreeSet<AttemptRef>,
    ) -> Vec<AgentReport> {
        let mut queues = self.queues.lock().unwrap();
        let mut batch: Vec<AgentReport> = Vec::new();
        let mut room = budget;
        // The attempts in turn order, from the one whose turn it is.
        let mut order: Vec<AttemptRef> = queues
            .attempts
            .keys()
            .filter(|attempt| !busy.contains(attempt))
            .copied()
            .collect();
        if let Some(next) = queues.next {
            let first = order.partition_point(|a| *a < next);
            order.rotate_left(first);
        }
        let mut last_served = None;
        'rounds: loop {
            let mut progress = false;
            for attempt in &order {
                // Output costs up to six bytes of JSON per byte: ask for no more than fits.
                let max_text = ATTEMPT_SHARE.min(room.saturating_sub(LOG_OVERHEAD + 2) / 6);
                if max_text < 64 {
                    break 'rounds;
                }
                let Some(queue) = queues.attempts.get_mut(attempt) else {
                    continue;
                };
                let Some(report) = queue.take(*attempt, max_text) else {
                    continue;
                };
                let len = report_len(&report);
                room = room.saturating_sub(len);
                progress = true;
                last_served = Some(*attempt);
                // Consecutive output of one attempt travels as one report.
                match (batch.last_mut(), report) {
                    (
                        Some(AgentReport::Log {
                            attempt: previous,
                            text: so_far,
                            ..
                        }),
                        AgentReport::Log { attempt, text, .. },
                    ) if *previous == attempt => so_far.push_str(&text),
                    (_, report) => batch.push(report),
                }
            }
            if !progress {
                break;
            }
        }
        let Queues {
            attempts,
            taken_before,
            ..
        } = &mut *queues;
        attempts.retain(|attempt, queue| {
            if !queue.is_empty() {
                return true;
            }
            taken_before.insert(*attempt, queue.base + queue.log.taken());
            false
        });
        // An attempt that ended sends no more output.
        for report in &batch {
            if let AgentReport::Finished { attempt, .. } = report {
                taken_before.remove(attempt);
            }
        }
        // Next time, the turn passes to the attempt after the last one served.
        queues.next = last_served.and_then(|last| {
            queues
                .attempts
                .range((std::ops::Bound::Excluded(last), std::ops::Bound::Unbounded))
                .next()
                .map(|(a, _)| *a)
        });
        batch
    }

    /// An attempt starts here: the room for recording its end is taken now.
    pub(crate) fn starting(&self, attempt: AttemptRef) {
        self.end_records.reserve(attempt);
    }

    /// Attempts that ended here whose end the server has not acknowledged.
    pub(crate) fn undelivered_ends(&self) -> Vec<AttemptRef> {
        self.ending.lock().unwrap().iter().copied().collect()
    }

    /// The server has answered for these reports (accepted, or refused for good).
    fn delivered(&self, part: &[AgentReport]) {
        let mut ending = self.ending.lock().unwrap();
        for report in part {
            if let AgentReport::Finished { attempt, .. } = report {
                ending.remove(attempt);
                self.end_records.delivered(*attempt);
            }
        }
    }

    /// What waits to be sent of the attempts not in `busy`.
    fn waiting(&self, busy: &BTreeSet<AttemptRef>) -> Waiting {
        let queues = self.queues.lock().unwrap();
        let mut waiting = Waiting::Nothing;
        for (attempt, queue) in &queues.attempts {
            if busy.contains(attempt) || queue.is_empty() {
                continue;
            }
            let only_starts = queue.log.is_empty()
                && queue
                    .events
                    .iter()
                    .all(|(_, report)| matches!(report, AgentReport::Started { .. }));
            if !only_starts {
                return Waiting::Reports;
            }
            waiting = Waiting::OnlyStarts;
        }
        waiting
    }

    /// Wait until something may have been queued.
    async fn queued(&self) {
        self.wake.notified().await;
    }
}

/// What waits to be sent (of the attempts no batch on its way carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    Nothing,
    /// Attempts' starts, and nothing else: what [`START_LINGER`] holds back for a moment.
    OnlyStarts,
    /// Output, an end, a sample: it goes at once.
    Reports,
}

/// How many report batches may be on their way at once. Each carries other attempts
/// than the others (an attempt's reports stay in order); one batch at a time made
/// every end on the node wait for the answer to the batch before it — with short tasks
/// the node's slots then took turns instead of running side by side.
pub(crate) const LANES: usize = 4;

pub(crate) async fn run(
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    attempts: Arc<Mutex<crate::Attempts>>,
    handed: UnboundedSender<HandedWork>,
) {
    let ask = Arc::new(AskWork { attempts, handed });
    // Batches on their way, each with the attempts it carries.
    let mut lanes: tokio::task::JoinSet<(BTreeSet<AttemptRef>, Result<(), ()>)> =
        tokio::task::JoinSet::new();
    let mut busy: BTreeSet<AttemptRef> = BTreeSet::new();
    let mut linger: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    let mut lingered = false;
    loop {
        if lanes.len() < LANES {
            let waiting = shared.reports.waiting(&busy);
            let send = match waiting {
                Waiting::Reports => true,
                Waiting::OnlyStarts => lingered,
                Waiting::Nothing => false,
            };
            if waiting != Waiting::OnlyStarts || send {
                linger = None;
                lingered = false;
            } else if linger.is_none() {
                linger = Some(Box::pin(tokio::time::sleep(START_LINGER)));
            }
            if send {
                let batch = shared.reports.take_batch(BATCH_BYTES, &busy);
                if !batch.is_empty() {
                    let carried: BTreeSet<AttemptRef> =
                        batch.iter().map(AgentReport::attempt).collect();
                    busy.extend(carried.iter().copied());
                    let (shared, ask, shutdown) = (shared.clone(), ask.clone(), shutdown.clone());
                    lanes.spawn(async move {
                        let delivered = deliver(&shared, batch, &ask, &shutdown).await;
                        (carried, delivered)
                    });
                    continue;
                }
            }
        }
        tokio::select! {
            _ = shared.reports.queued() => {}
            Some(done) = lanes.join_next(), if !lanes.is_empty() => {
                match done {
                    Ok((carried, Ok(()))) => {
                        for attempt in carried {
                            busy.remove(&attempt);
                        }
                    }
                    // Shut down while retrying.
                    Ok((_, Err(()))) => return,
                    // The delivery panicked, a bug: it goes on up. (Lanes are never
                    // aborted: the set is only dropped with this loop.)
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Err(_) => return,
                }
            }
            _ = async { linger.as_mut().expect("lingering").await }, if linger.is_some() => {
                linger = None;
                lingered = true;
            }
            _ = shutdown.cancelled() => {
                // What is on its way gets a moment to arrive; then what still waits.
                let _ = tokio::time::timeout(Duration::from_secs(2), async {
                    while let Some(done) = lanes.join_next().await {
                        if let Ok((carried, _)) = done {
                            for attempt in carried {
                                busy.remove(&attempt);
                            }
                        }
                    }
                })
                .await;
                flush_on_shutdown(&shared, &busy).await;
                return;
            }
        }
    }
}

/// Whether the server refused the batch for what it holds (retrying it unchanged
/// cannot help), as opposed to being away or failing for reasons of its own.
fn refused(error: &ClientError) -> bool {
    matches!(error, ClientError::Api { status, .. } if matches!(status, 400 | 413 | 422))
}

/// Deliver a batch, retrying while the server is away; `Err` when shut down meanwhile.
async fn deliver(
    shared: &Shared,
    batch: Vec<AgentReport>,
    ask: &AskWork,
    shutdown: &CancellationToken,
) -> Result<(), ()> {
    // Parts still to send, the next one last.
    let mut parts = vec![batch];
    while let Some(part) = parts.pop() {
        let mut backoff = Backoff::default();
        loop {
            let Some(node) = shared.node() else {
                backoff.wait(shutdown).await?;
                continue;
            };
            let since = ask.since();
            let sent = shared.client.agent_reports_asking_work(
                node,
                &part,
                since.as_ref().map(|(_, since)| since),
            );
            match sent.await {
                Ok(ack) => {
                    if let (Some(work), Some((generation, _))) = (ack.work, since) {
                        // The poll loop is gone only when the agent stops.
                        let _ = ask.handed.send(HandedWork { generation, work });
                    }
                    shared.lease.renewed(std::time::Instant::now());
                    shared.reports.delivered(&part);
                    let samples = part
                        .iter()
                        .filter(|r| matches!(r, AgentReport::Usage(_)))
                        .count();
                    shared.sampling.delivered(samples);
                    if ack.rejected > 0 {
                        tracing::warn!(
                            "the server rejected {} of {} report(s) as not belonging to this \
                             node's current attempts",
                            ack.rejected,
                            part.len()
                        );
                    }
                    break;
                }
                Err(e) if refused(&e) && part.len() > 1 => {
                    tracing::warn!(
                        "the server refused {} report(s) ({e}); sending them again in halves",
                        part.len()
                    );
                    let mut first = part;
                    let second = first.split_off(first.len() / 2);
                    parts.push(second);
                    parts.push(first);
                    break;
                }
                Err(e) if refused(&e) => {
                    shared.reports.delivered(&part);
                    let report = &part[0];
                    tracing::error!(
                        "the server refused a {} report of task {} attempt {} ({e}); it is \
                         dropped so that the reports after it get through",
                        AgentReport::kind(report),
                        AgentReport::attempt(report).task,
                        AgentReport::attempt(report).attempt
                    );
                    if let AgentReport::Log { attempt, text, .. } = report {
                        if !text.starts_with(DROPPED_MARKER) {
                            parts.push(vec![AgentReport::Log {
                                attempt: *attempt,
                                text: format!(
                                    "{DROPPED_MARKER} {} bytes of this task's output: the \
                                     server refused them ({e})\n",
                                    text.len()
                                ),
                                offset: None,
                            }]);
                        }
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(
                        "cannot deliver {} report(s) to the server, will retry: {e}",
                        part.len()
                    );
                    backoff.wait(shutdown).await?;
                }
            }
        }
    }
    Ok(())
}

/// How the log line standing for output the server refused begins.
const DROPPED_MARKER: &str = "tacc: dropped";

/// One bounded attempt to deliver what is queued when the agent stops.
async fn flush_on_shutdown(shared: &Shared, busy: &BTreeSet<AttemptRef>) {
    let batch = shared.reports.take_batch(BATCH_BYTES, busy);
    if let (Some(node), false) = (shared.node(), batch.is_empty()) {
        let send = shared.client.agent_reports(node, &batch);
        let _ = tokio::time::timeout(Duration::from_secs(2), send).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId, Timestamp};
    use tacc_proto::AttemptOutcome;

    fn attempt(task: u64) -> AttemptRef {
        AttemptRef {
            task: TaskId(task),
            attempt: AttemptNo(1),
        }
    }

    fn log(attempt: AttemptRef, text: &str) -> AgentReport {
        AgentReport::Log {
            attempt,
            text: text.to_string(),
            offset: None,
        }
    }

    fn log_at(attempt: AttemptRef, text: &str, offset: u64) -> AgentReport {
        AgentReport::Log {
            attempt,
            text: text.to_string(),
            offset: Some(offset),
        }
    }

    fn finished(attempt: AttemptRef) -> AgentReport {
        AgentReport::Finished {
            attempt,
            at: Timestamp(9),
            outcome: AttemptOutcome::Exited { code: 0 },
            rank: None,
        }
    }

    fn reports() -> (tempfile::TempDir, Reports) {
        let dir = tempfile::tempdir().unwrap();
        let reports = Reports::open(dir.path()).unwrap();
        (dir, reports)
    }

    /// Every batch until nothing is left, each checked against the server's limit.
    fn drain(reports: &Reports) -> Vec<Vec<AgentReport>> {
        let mut batches = Vec::new();
        loop {
            let batch = reports.take_batch(BATCH_BYTES, &BTreeSet::new());
            if batch.is_empty() {
                return batches;
            }
            let body = serde_json::to_vec(&tacc_proto::AgentReports {
                reports: batch.clone(),
                work: None,
            })
            .unwrap();
            assert!(body.len() <= BATCH_BYTES, "{} bytes", body.len());
            batches.push(batch);
        }
    }

    fn text_of(batches: &[Vec<AgentReport>], of: AttemptRef) -> String {
        batches
            .iter()
            .flatten()
            .filter_map(|r| match r {
                AgentReport::Log { attempt, text, .. } if *attempt == of => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_end_stays_claimed_until_the_server_has_answered_for_it() {
        let (_dir, reports) = reports();
        let (a, b) = (attempt(1), attempt(2));
        reports.send(log(a, "out\n"));
        reports.send(finished(a));
        reports.send(log(b, "still running\n"));
        assert_eq!(reports.undelivered_ends(), [a]);
        // Taken into a batch is not delivered: the batch may still fail.
        let batch = reports.take_batch(BATCH_BYTES, &BTreeSet::new());
        assert_eq!(reports.undelivered_ends(), [a]);
        reports.delivered(&batch);
        assert!(reports.undelivered_ends().is_empty());
    }

    #[test]
    fn an_end_not_delivered_is_reported_by_the_agent_s_next_life() {
        let dir = tempfile::tempdir().unwrap();
        let a = attempt(1);
        {
            let reports = Reports::open(dir.path()).unwrap();
            reports.send(log(a, "out\n"));
            reports.send(finished(a));
            // The agent stops before the server took them.
        }
        let next = Reports::open(dir.path()).unwrap();
        assert_eq!(next.undelivered_ends(), [a]);
        let batch = next.take_batch(BATCH_BYTES, &BTreeSet::new());
        assert_eq!(batch, [finished(a)]);
        next.delivered(&batch);
        let after = Reports::open(dir.path()).unwrap();
        assert!(after.undelivered_ends().is_empty());
        assert!(after.take_batch(BATCH_BYTES, &BTreeSet::new()).is_empty());
    }

    #[test]
    fn a_line_larger_than_the_limit_travels_in_batches_under_it() {
        let (_dir, reports) = reports();
        let a = attempt(1);
        // Control characters cost six bytes of JSON each: the worst case, and this line
        // takes more than the server's limit as JSON.
        let huge = "\u{1}".repeat(tacc_proto::MAX_REPORTS_BODY_BYTES / 4) + "\n";
        assert!(json_len(&huge) > tacc_proto::MAX_REPORTS_BODY_BYTES);
        reports.send(log(a, &huge));
        reports.send(finished(a));
        let batches = drain(&reports);
        assert!(batches.len() > 1);
        assert_eq!(text_of(&batches, a), huge);
        assert_eq!(batches.last().unwrap().last(), Some(&finished(a)));
    }

    #[test]
    fn output_keeps_its_order_across_spill_and_replay_and_ends_before_finished() {
        let (_dir, reports) = reports();
        let a = attempt(1);
        let mut expected = String::new();
        for i in 0..300_000 {
            let line = format!("line {i}\n");
            expected.push_str(&line);
            reports.send(log(a, &line));
        }
        assert!(
            expected.len() > crate::spool::MEMORY_BYTES,
            "the test must spill"
        );
        reports.send(finished(a));
        reports.send(log(a, "after the end\n"));
        let batches = drain(&reports);
        let flat: Vec<&AgentReport> = batches.iter().flatten().collect();
        let end = flat.iter().position(|r| **r == finished(a)).unwrap();
        assert_eq!(
            text_of(&[flat[..end].iter().map(|r| (*r).clone()).collect()], a),
            expected
        );
        assert_eq!(
            text_of(&[flat[end..].iter().map(|r| (*r).clone()).collect()], a),
            "after the end\n"
        );
    }

    #[test]
    fn only_starts_are_held_back_for_company() {
        let (_dir, reports) = reports();
        let none = BTreeSet::new();
        assert_eq!(reports.waiting(&none), Waiting::Nothing);
        reports.send(AgentReport::Started {
            attempt: attempt(1),
            at: Timestamp(1),
        });
        reports.send(AgentReport::Started {
            attempt: attempt(2),
            at: Timestamp(1),
        });
        assert_eq!(reports.waiting(&none), Waiting::OnlyStarts);
        reports.send(finished(attempt(1)));
        assert_eq!(
            reports.waiting(&none),
            Waiting::Reports,
            "an end goes at once"
        );
        assert_eq!(
            reports.waiting(&[attempt(1)].into()),
            Waiting::OnlyStarts,
            "unless a batch on its way carries its attempt's reports"
        );
        drain(&reports);
        reports.send(AgentReport::Started {
            attempt: attempt(3),
            at: Timestamp(1),
        });
        reports.send(log(attempt(3), "hello\n"));
        assert_eq!(
            reports.waiting(&none),
            Waiting::Reports,
            "output goes at once"
        );
    }

    #[test]
    fn an_attempt_whose_reports_are_on_their_way_waits_for_their_answer_and_others_do_not() {
        let (_dir, reports) = reports();
        let (carried, other) = (attempt(1), attempt(2));
        reports.send(log(carried, "one\n"));
        let first = reports.take_batch(BATCH_BYTES, &BTreeSet::new());
        assert_eq!(first, [log_at(carried, "one\n", 0)]);
        // While that batch is on its way, the attempt's next reports wait; another
        // attempt's go in a batch of their own.
        reports.send(log(carried, "two\n"));
        reports.send(finished(carried));
        reports.send(finished(other));
        let busy: BTreeSet<AttemptRef> = [carried].into();
        assert_eq!(reports.take_batch(BATCH_BYTES, &busy), [finished(other)]);
        assert!(reports.take_batch(BATCH_BYTES, &busy).is_empty());
        assert_eq!(reports.waiting(&busy), Waiting::Nothing);
        // Answered: they follow, in order, their output where the first batch left it.
        assert_eq!(
            reports.take_batch(BATCH_BYTES, &BTreeSet::new()),
            [log_at(carried, "two\n", 4), finished(carried)]
        );
    }

    #[test]
    fn a_chatty_attempt_does_not_delay_another_attempt_s_reports() {
        let (_dir, reports) = reports();
        let (chatty, quiet) = (attempt(1), attempt(2));
        let line = "y".repeat(1000) + "\n";
        for _ in 0..5_000 {
            reports.send(log(chatty, &line));
        }
        reports.send(AgentReport::Started {
            attempt: quiet,
            at: Timestamp(1),
        });
        reports.send(log(quiet, "hello\n"));
        reports.send(finished(quiet));
        let first = reports.take_batch(BATCH_BYTES, &BTreeSet::new());
        assert!(first.contains(&finished(quiet)), "the quiet task waited");
        // Its output is tagged with where it starts in the attempt's output.
        assert!(first.contains(&AgentReport::Log {
            attempt: quiet,
            text: "hello\n".into(),
            offset: Some(0),
        }));
        let rest = drain(&reports);
        let mut all = vec![first];
        all.extend(rest);
        assert_eq!(text_of(&all, chatty), line.repeat(5_000));
    }

    #[test]
    fn output_reports_carry_where_they_start_in_the_attempt_s_output() {
        let (_dir, reports) = reports();
        let a = attempt(1);
        reports.send(log(a, "one\n"));
        reports.send(finished(a));
        reports.send(log(a, "ignored order\n"));
        let batches = drain(&reports);
        let offsets: Vec<(Option<u64>, &str)> = batches
            .iter()
            .flatten()
            .filter_map(|r| match r {
                AgentReport::Log { text, offset, .. } => Some((*offset, text.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(offsets, [(Some(0), "one\n"), (Some(4), "ignored order\n")]);
    }

    #[test]
    fn json_length_estimate_never_undercounts() {
        let text: String = (0u8..=127).map(char::from).collect::<String>() + "é\u{2028}";
        assert!(json_len(&text) >= serde_json::to_string(&text).unwrap().len());
        // Each byte at each place of a word and in the tail, among plain text and among
        // multi-byte characters: what a word at a time finds is what a byte at a time does.
        for byte in 0u8..=127 {
            for at in 0..19 {
                for filler in ["a", "é"] {
                    let mut text: String = filler.repeat(19);
                    let at = (0..=at).rev().find(|i| text.is_char_boundary(*i)).unwrap();
                    text.insert(at, char::from(byte));
                    let exact: usize = 2 + text.bytes().map(escaped_len).sum::<usize>();
                    assert_eq!(json_len(&text), exact, "{text:?}");
                    assert!(
                        exact >= serde_json::to_string(&text).unwrap().len(),
                        "{text:?}"
                    );
                }
            }
        }
        let report = log(attempt(123_456), &text);
        assert!(report_len(&report) >= serde_json::to_vec(&report).unwrap().len());
    }
}
