//! The fault suite's record of what clients saw, and the checker that judges it: every
//! client call (what was asked, what came back or failed, when) is kept, along with the
//! states observed over time and the markers the tasks wrote; `check` then verifies the
//! guarantees of issue 10 against all of it rather than against a final snapshot only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tacc_client::Client;
use tacc_core::{TaskId, TaskState};

/// One call a client made.
#[derive(Debug, Clone)]
pub struct Call {
    pub client: usize,
    /// `submit`, `cancel`, `list`, …
    pub op: &'static str,
    /// The logical request (an idempotency key, a task id).
    pub request: String,
    pub sent: Duration,
    pub answered: Duration,
    /// The task id acknowledged, the state seen, or the error.
    pub outcome: Result<String, String>,
}

/// Every call, and every task state observed, since the scenario began.
pub struct History {
    start: Instant,
    calls: Mutex<Vec<Call>>,
    observed: Mutex<Vec<Observation>>,
}

/// A task's state as one listing showed it: held at some moment between the listing's
/// sending and its answer.
#[derive(Debug, Clone, Copy)]
struct Observation {
    sent: Duration,
    answered: Duration,
    task: TaskId,
    state: TaskState,
    attempt: u32,
}

impl History {
    pub fn new() -> History {
        History {
            start: Instant::now(),
            calls: Mutex::new(Vec::new()),
            observed: Mutex::new(Vec::new()),
        }
    }

    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    pub fn record(
        &self,
        client: usize,
        op: &'static str,
        request: impl Into<String>,
        sent: Duration,
        outcome: Result<String, String>,
    ) {
        let answered = self.now();
        self.calls.lock().unwrap().push(Call {
            client,
            op,
            request: request.into(),
            sent,
            answered,
            outcome,
        });
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// List every task once and keep what was seen (a failed listing is recorded too: the
    /// server may be down).
    pub async fn observe(&self, client: &Client, who: usize) {
        let sent = self.now();
        let query = tacc_client::TaskQuery {
            limit: Some(100_000),
            ..Default::default()
        };
        match client.list_tasks(&query).await {
            Ok(tasks) => {
                let at = self.now();
                let mut observed = self.observed.lock().unwrap();
                for task in &tasks {
                    observed.push(Observation {
                        sent,
                        answered: at,
                        task: task.id,
                        state: task.state,
                        attempt: task.attempt.0,
                    });
                }
                drop(observed);
                self.record(
                    who,
                    "list",
                    "all",
                    sent,
                    Ok(format!("{} tasks", tasks.len())),
                );
            }
            Err(e) => self.record(who, "list", "all", sent, Err(e.to_string())),
        }
    }

    /// The checks every scenario shares: ids acknowledged once per logical request and
    /// never for two, and terminal states that never change once observed.
    pub fn check_acknowledgements(&self) -> BTreeMap<String, TaskId> {
        let mut by_key: BTreeMap<String, TaskId> = BTreeMap::new();
        let mut by_id: BTreeMap<TaskId, String> = BTreeMap::new();
        for call in self.calls().iter().filter(|c| c.op == "submit") {
            let Ok(id) = &call.outcome else { continue };
            let id = TaskId(id.parse().unwrap());
            if let Some(first) = by_key.insert(call.request.clone(), id) {
                assert_eq!(
                    first, id,
                    "key {} was acknowledged as task {first} and as task {id}",
                    call.request
                );
            }
            if let Some(other) = by_id.insert(id, call.request.clone()) {
                assert_eq!(
                    other, call.request,
                    "task {id} was acknowledged for two different submits ({other} and {})",
                    call.request
                );
            }
        }
        by_key
    }

    /// The longest a logical request of `op` waited from its first try to its
    /// acknowledgement (what a client saw of the outages); also checks that no client had
    /// two calls in flight at once, as the recording assumes.
    pub fn longest_wait(&self, op: &str) -> Duration {
        let calls = self.calls();
        let mut by_client: BTreeMap<usize, Vec<&Call>> = BTreeMap::new();
        for call in calls.iter().filter(|c| c.op == op) {
            by_client.entry(call.client).or_default().push(call);
        }
        for (client, calls) in &mut by_client {
            calls.sort_by_key(|c| c.sent);
            for pair in calls.windows(2) {
                assert!(
                    pair[0].answered <= pair[1].sent,
                    "client {client} had two {op} calls in flight at once: {pair:?}"
                );
            }
        }
        let mut first_sent: BTreeMap<&str, Duration> = BTreeMap::new();
        let mut longest = Duration::ZERO;
        for call in calls.iter().filter(|c| c.op == op) {
            let first = *first_sent.entry(call.request.as_str()).or_insert(call.sent);
            if call.outcome.is_ok() {
                longest = longest.max(call.answered - first);
            }
        }
        longest
    }

    /// A task observed in a terminal state is never observed otherwise afterwards (in a
    /// listing sent after the one that saw it answered: concurrent listings are not
    /// ordered), and every terminal observation of it agrees.
    pub fn check_terminal_states_stay(&self) -> usize {
        let observed = self.observed.lock().unwrap();
        let mut ended: BTreeMap<TaskId, (TaskState, u32, Duration)> = BTreeMap::new();
        for seen in observed.iter() {
            let (answered, task, state, attempt) =
                (&seen.answered, &seen.task, &seen.state, &seen.attempt);
            if !state.is_terminal() {
                continue;
            }
            let entry = ended.entry(*task).or_insert((*state, *attempt, *answered));
            assert_eq!(
                (entry.0, entry.1),
                (*state, *attempt),
                "task {task} was seen ended as {:?} (attempt {}) and as {state:?} (attempt {attempt})",
                entry.0,
                entry.1
            );
            entry.2 = entry.2.min(*answered);
        }
        for seen in observed.iter() {
            let (sent, task, state, attempt) = (&seen.sent, &seen.task, &seen.state, &seen.attempt);
            if let Some((first, first_attempt, seen)) = ended.get(task) {
                assert!(
                    sent <= seen || (first, first_attempt) == (state, attempt),
                    "task {task} was {first:?} (attempt {first_attempt}) by {seen:?}, then \
                     {state:?} (attempt {attempt}) in a listing sent at {sent:?}"
                );
            }
        }
        observed.len()
    }
}

/// What the tasks of a scenario write, so that the checker sees processes and not just
/// the server's word: each attempt appends `start A T` and `end A T` (T in ns) to
/// `$MARKERS/<task>`, and before starting checks that no earlier attempt's process is
/// still alive, a zombie being dead (`overlap …` if one is).
pub fn marked_script(body: &str) -> String {
    format!(
        "run: |\n  \
         m=\"$MARKERS/$TACC_TASK_ID\"\n  \
         for f in \"$m\".pid.*; do [ -e \"$f\" ] || continue; s=$(ps -o stat=,comm= -p \"$(cat \"$f\")\" | tr -s ' ' _); case $s in ''|Z*) ;; *) echo \"overlap $f $s\" >> \"$m\";; esac; done\n  \
         echo $$ > \"$m.pid.$TACC_ATTEMPT\"\n  \
         echo \"start $TACC_ATTEMPT $(date +%s%N)\" >> \"$m\"\n  \
         {body}\n  \
         echo \"end $TACC_ATTEMPT $(date +%s%N)\" >> \"$m\"\n"
    )
}

/// The attempts the markers of `task` show: attempt → (start ns, end ns if it ended).
pub fn marked_attempts(markers: &Path, task: TaskId) -> BTreeMap<u32, (u128, Option<u128>)> {
    let text = std::fs::read_to_string(markers.join(task.to_string())).unwrap_or_default();
    let mut attempts: BTreeMap<u32, (u128, Option<u128>)> = BTreeMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["overlap", pid_file, ps @ ..] => {
                panic!("task {task}: an attempt started while {pid_file} was still alive ({ps:?})")
            }
            ["start", attempt, at] => {
                let attempt: u32 = attempt.parse().unwrap();
                let previous = attempts.insert(attempt, (at.parse().unwrap(), None));
                assert!(
                    previous.is_none(),
                    "task {task}: attempt {attempt} started twice"
                );
            }
            ["end", attempt, at] => {
                let attempt: u32 = attempt.parse().unwrap();
                let entry = attempts
                    .get_mut(&attempt)
                    .unwrap_or_else(|| panic!("task {task}: attempt {attempt} ended unstarted"));
                assert!(
                    entry.1.is_none(),
                    "task {task}: attempt {attempt} ended twice"
                );
                entry.1 = Some(at.parse().unwrap());
            }
            _ => panic!("task {task}: unexpected marker line {line:?}"),
        }
    }
    // Attempts in order never overlap: each starts after the previous one ended (or was
    // killed — then the pid check above vouches for it).
    let mut previous_end: Option<u128> = None;
    for (attempt, (start, end)) in &attempts {
        if let Some(end) = previous_end {
            assert!(
                *start >= end,
                "task {task}: attempt {attempt} started before the previous attempt ended"
            );
        }
        previous_end = *end;
    }
    attempts
}

/// A task's events: at most one terminal event, last; attempts never go backwards; an
/// attempt is never running again after a later attempt began.
pub async fn check_events(client: &Client, task: TaskId) -> Vec<(u32, TaskState)> {
    let events = crate::common::attempt_states(client, task).await;
    // An attempt ends at most once, with its last event (a lost attempt may be
    // followed by the next one; nothing follows the task's final end).
    for (i, (attempt, state)) in events.iter().enumerate() {
        if state.is_terminal() {
            assert!(
                events[i + 1..].iter().all(|(a, _)| a > attempt),
                "task {task}: attempt {attempt} changed after it ended {state:?}: {events:?}"
            );
        }
    }
    assert!(
        events.windows(2).all(|w| w[0].0 <= w[1].0),
        "task {task}: attempts go backwards: {events:?}"
    );
    let running: BTreeSet<u32> = events
        .iter()
        .filter(|(_, s)| *s == TaskState::Running)
        .map(|(a, _)| *a)
        .collect();
    assert_eq!(
        running.len(),
        events
            .iter()
            .filter(|(_, s)| *s == TaskState::Running)
            .count(),
        "task {task}: an attempt was running twice: {events:?}"
    );
    events
}
