//! Hung attempts: the GPUs a hang burns are the most wasted ones. An attempt is hung when
//! every rank still running has been silent — no output, no CPU or GPU use, as its usage
//! samples say — for the policy's `after`, whether or not some rank already exited (one
//! rank exiting 0 early while the others wait forever in a collective is the classic
//! case). A rank with no sample yet is not known to be silent: nothing is ended on a guess.

use std::collections::BTreeMap;
use std::time::Duration;

use tacc_core::Timestamp;
use tacc_proto::AttemptRef;

/// One running attempt, as the hang check sees it.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::control) struct AttemptSilence {
    pub attempt: AttemptRef,
    /// Its node ranks.
    pub ranks: u32,
    /// The silence that means hung (the task's `on_hang.after`, or the cluster's).
    pub after: Duration,
    pub started_at: Timestamp,
    /// Ranks that already ended their part, and when.
    pub finished: BTreeMap<u32, Timestamp>,
    /// The last sign of life of each rank still running that has been sampled.
    pub alive_at: BTreeMap<u32, Timestamp>,
}

/// An attempt found hung, with the reason its end will carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::control) struct Hang {
    pub attempt: AttemptRef,
    pub reason: String,
}

/// The attempts hung at `now`.
pub(in crate::control) fn find(attempts: &[AttemptSilence], now: Timestamp) -> Vec<Hang> {
    attempts
        .iter()
        .filter_map(|a| {
            hung(a, now).map(|reason| Hang {
                attempt: a.attempt,
                reason,
            })
        })
        .collect()
}

fn hung(attempt: &AttemptSilence, now: Timestamp) -> Option<String> {
    let after = attempt.after.as_millis() as u64;
    if now.millis_since(attempt.started_at) < after {
        return None;
    }
    let running: Vec<u32> = (0..attempt.ranks)
        .filter(|rank| !attempt.finished.contains_key(rank))
        .collect();
    if running.is_empty() {
        return None;
    }
    let mut silent_since = now;
    for rank in &running {
        let alive = attempt.alive_at.get(rank)?;
        if now.millis_since(*alive) < after {
            return None;
        }
        silent_since = silent_since.min(*alive);
    }
    let quiet = crate::usage::human_duration(Duration::from_millis(
        now.millis_since(
            running
                .iter()
                .filter_map(|r| attempt.alive_at.get(r))
                .max()
                .copied()
                .unwrap_or(silent_since),
        ),
    ));
    let silent = format!(
        "{} silent for {quiet} (no output, no CPU or GPU use)",
        ranks_text(&running)
    );
    let exited: Vec<String> = attempt
        .finished
        .iter()
        .map(|(rank, at)| format!("rank {rank} exited 0 at {}", clock_time(*at)))
        .collect();
    Some(if exited.is_empty() {
        format!("hung: {silent}")
    } else {
        format!("hung: {}; {silent}", exited.join(", "))
    })
}

/// `rank 3`, `ranks 0–2`, `ranks 0, 2, 5`.
fn ranks_text(ranks: &[u32]) -> String {
    match ranks {
        [one] => format!("rank {one}"),
        [first, .., last] if last - first + 1 == ranks.len() as u32 => {
            format!("ranks {first}–{last}")
        }
        _ => {
            let listed: Vec<String> = ranks.iter().map(u32::to_string).collect();
            format!("ranks {}", listed.join(", "))
        }
    }
}

/// `12:02:03 UTC` (the time of day is all a reason needs: the event carries the date).
fn clock_time(at: Timestamp) -> String {
    let secs = at.as_millis() / 1000 % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId};

    const MIN: u64 = 60_000;
    /// 12:00:00 UTC on some day.
    const NOON: u64 = 1_700_049_600_000;

    fn gang(ranks: u32) -> AttemptSilence {
        AttemptSilence {
            attempt: AttemptRef {
                task: TaskId(7),
                attempt: AttemptNo(1),
            },
            ranks,
            after: Duration::from_secs(600),
            started_at: Timestamp(NOON),
            finished: BTreeMap::new(),
            alive_at: BTreeMap::new(),
        }
    }

    #[test]
    fn a_rank_that_exited_early_and_silent_others_are_a_hang_named_by_rank() {
        let mut a = gang(4);
        a.finished.insert(3, Timestamp(NOON + 2 * MIN + 3_000));
        for rank in 0..3 {
            a.alive_at.insert(rank, Timestamp(NOON + 2 * MIN));
        }
        let at = |m| Timestamp(NOON + m * MIN);
        assert_eq!(find(std::slice::from_ref(&a), at(11)), []);
        let found = find(&[a], at(12));
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].reason,
            "hung: rank 3 exited 0 at 12:02:03 UTC; ranks 0–2 silent for 10 min (no output, \
             no CPU or GPU use)"
        );
    }

    #[test]
    fn a_gang_whose_ranks_all_sleep_silently_is_hung() {
        let mut a = gang(3);
        for rank in 0..3 {
            a.alive_at.insert(rank, Timestamp(NOON + MIN));
        }
        let found = find(&[a], Timestamp(NOON + 11 * MIN));
        assert_eq!(
            found[0].reason,
            "hung: ranks 0–2 silent for 10 min (no output, no CPU or GPU use)"
        );
    }

    #[test]
    fn one_rank_alive_is_no_hang_and_neither_is_a_rank_never_sampled() {
        let mut a = gang(3);
        a.alive_at.insert(0, Timestamp(NOON));
        a.alive_at.insert(1, Timestamp(NOON + 20 * MIN));
        a.alive_at.insert(2, Timestamp(NOON));
        assert_eq!(
            find(std::slice::from_ref(&a), Timestamp(NOON + 25 * MIN)),
            []
        );
        a.alive_at.remove(&1);
        assert_eq!(find(&[a], Timestamp(NOON + 25 * MIN)), [], "rank 1 unknown");
    }

    #[test]
    fn nothing_is_hung_before_it_has_run_for_the_silence() {
        let mut a = gang(2);
        a.started_at = Timestamp(NOON + 5 * MIN);
        a.alive_at.insert(0, Timestamp(NOON));
        a.alive_at.insert(1, Timestamp(NOON));
        assert_eq!(
            find(std::slice::from_ref(&a), Timestamp(NOON + 14 * MIN)),
            []
        );
        assert_eq!(find(&[a], Timestamp(NOON + 15 * MIN)).len(), 1);
    }

    #[test]
    fn every_rank_finished_is_no_hang() {
        let mut a = gang(2);
        a.finished.insert(0, Timestamp(NOON));
        a.finished.insert(1, Timestamp(NOON));
        assert_eq!(find(&[a], Timestamp(NOON + 60 * MIN)), []);
    }

    #[test]
    fn ranks_read_as_a_range_a_list_or_one() {
        assert_eq!(ranks_text(&[2]), "rank 2");
        assert_eq!(ranks_text(&[0, 1, 2]), "ranks 0–2");
        assert_eq!(ranks_text(&[0, 2, 5]), "ranks 0, 2, 5");
    }
}
