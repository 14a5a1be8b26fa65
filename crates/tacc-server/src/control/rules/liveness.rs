//! Node liveness: a node is lost once silent for longer than the heartbeat timeout, and
//! its attempts with it (a rank that already finished its part lost nothing; a cancel
//! nobody is left to confirm ends). A server that did not check for a while was stalled
//! (stopped, swapped out, a long lock): that silence was its own, so every node gets a
//! fresh term, as Nomad does. A node lost often lately is held back when it returns,
//! until it has stayed up long enough.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tacc_core::NodeId;
use tacc_proto::AttemptRef;

use crate::control::LiveNode;
use crate::control::nodes::FLAP_WINDOW;

/// Checks further apart than this mean the server itself was stalled.
pub(in crate::control) const STALLED_AFTER: Duration = Duration::from_secs(3);

/// A node found silent, taken offline.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::control) struct LostNode {
    pub node: NodeId,
    pub name: String,
    /// Its attempts, now lost.
    pub attempts: Vec<AttemptRef>,
    /// The scheduler counted it as up (and must hear it is down).
    pub was_schedulable: bool,
    /// A restarted server expected it back with its attempts, and it never came.
    pub after_restart: bool,
}

/// What one liveness check found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(in crate::control) struct LivenessCheck {
    /// The server was stalled this long: every node was given a fresh term.
    pub stalled_for: Option<Duration>,
    /// Held-back nodes that stayed up long enough: they get work again.
    pub stable: Vec<NodeId>,
    pub lost: Vec<LostNode>,
}

/// Check every node at `now`; `last_check` is when the previous check ran.
pub(in crate::control) fn check(
    nodes: &mut BTreeMap<NodeId, LiveNode>,
    finished_ranks: &BTreeMap<AttemptRef, BTreeMap<u32, tacc_core::Timestamp>>,
    last_check: &mut Instant,
    now: Instant,
    timeout: Duration,
) -> LivenessCheck {
    let mut found = LivenessCheck::default();
    let since_last = now.saturating_duration_since(*last_check);
    *last_check = now;
    if since_last > STALLED_AFTER {
        found.stalled_for = Some(since_last);
        for live in nodes.values_mut() {
            live.last_seen = now;
        }
    }
    for (id, live) in nodes.iter_mut() {
        if live.online && live.held_back_until.is_some_and(|until| now >= until) {
            live.held_back_until = None;
            found.stable.push(*id);
        }
    }
    for (id, live) in nodes.iter_mut() {
        let silent = now.saturating_duration_since(live.last_seen) > timeout;
        let holds_work = !live.assignments.is_empty() || !live.cancelling.is_empty();
        if !silent || !(live.online || holds_work) {
            continue;
        }
        let was_schedulable = live.schedulable() || live.expected;
        let after_restart = std::mem::take(&mut live.expected);
        if live.online {
            live.losses
                .retain(|at| now.saturating_duration_since(*at) < FLAP_WINDOW);
            live.losses.push(now);
        }
        live.online = false;
        live.held_back_until = None;
        let mut attempts: Vec<AttemptRef> = live
            .assignments
            .values()
            .filter(|a| {
                !finished_ranks
                    .get(&a.attempt)
                    .is_some_and(|done| done.contains_key(&a.node_rank))
            })
            .map(|a| a.attempt)
            .collect();
        attempts.extend(std::mem::take(&mut live.cancelling));
        found.lost.push(LostNode {
            node: *id,
            name: live.record.name.clone(),
            attempts,
            was_schedulable,
            after_restart,
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::{AttemptNo, TaskId};

    const TERM: Duration = Duration::from_secs(30);
    const SECOND: Duration = Duration::from_secs(1);

    use crate::control::rules::test_node as node;

    fn attempt(task: u64) -> AttemptRef {
        AttemptRef {
            task: TaskId(task),
            attempt: AttemptNo(1),
        }
    }

    /// Checks once a second from `from` for `seconds`, as a server does.
    fn every_second(
        nodes: &mut BTreeMap<NodeId, LiveNode>,
        from: Instant,
        seconds: u64,
    ) -> Vec<LivenessCheck> {
        let mut last = from;
        (1..=seconds)
            .map(|s| {
                check(
                    nodes,
                    &BTreeMap::new(),
                    &mut last,
                    from + SECOND * s as u32,
                    TERM,
                )
            })
            .collect()
    }

    #[test]
    fn a_node_is_lost_the_first_check_after_its_term_with_its_attempts() {
        let t0 = Instant::now();
        let mut live = node(1, t0);
        live.cancelling.insert(attempt(9));
        let mut nodes = BTreeMap::from([(NodeId(1), live)]);
        let checks = every_second(&mut nodes, t0, 31);
        assert!(checks[..30].iter().all(|c| c.lost.is_empty()));
        assert_eq!(
            checks[30].lost,
            [LostNode {
                node: NodeId(1),
                name: "n1".into(),
                attempts: vec![attempt(9)],
                was_schedulable: true,
                after_restart: false,
            }]
        );
        let live = &nodes[&NodeId(1)];
        assert!(!live.online && live.cancelling.is_empty());
        assert_eq!(live.losses.len(), 1);
        // Down and holding nothing: not lost again.
        assert!(
            every_second(&mut nodes, t0 + SECOND * 31, 60)
                .iter()
                .all(|c| c.lost.is_empty())
        );
    }

    #[test]
    fn a_stalled_server_gives_every_node_a_fresh_term() {
        let t0 = Instant::now();
        let mut nodes = BTreeMap::from([(NodeId(1), node(1, t0))]);
        let mut last = t0;
        let stalled = check(&mut nodes, &BTreeMap::new(), &mut last, t0 + TERM * 2, TERM);
        assert_eq!(stalled.stalled_for, Some(TERM * 2));
        assert!(stalled.lost.is_empty());
        assert_eq!(nodes[&NodeId(1)].last_seen, t0 + TERM * 2);
    }

    #[test]
    fn a_held_back_node_is_stable_once_its_wait_is_over() {
        let t0 = Instant::now();
        let mut live = node(1, t0);
        live.held_back_until = Some(t0 + SECOND * 5);
        let mut nodes = BTreeMap::from([(NodeId(1), live)]);
        let mut last = t0;
        let mut stable_at = None;
        for s in 1..=6u32 {
            nodes.get_mut(&NodeId(1)).unwrap().last_seen = t0 + SECOND * s;
            let found = check(
                &mut nodes,
                &BTreeMap::new(),
                &mut last,
                t0 + SECOND * s,
                TERM,
            );
            if found.stable == [NodeId(1)] {
                stable_at.get_or_insert(s);
            }
        }
        assert_eq!(stable_at, Some(5));
        assert!(nodes[&NodeId(1)].schedulable());
    }

    #[test]
    fn a_down_node_that_still_holds_attempts_loses_them_only_after_its_term() {
        // After a server restart, nodes are known but down until their agents register.
        let t0 = Instant::now();
        let mut live = node(1, t0);
        live.online = false;
        live.cancelling.insert(attempt(4));
        let mut nodes = BTreeMap::from([(NodeId(1), live)]);
        let checks = every_second(&mut nodes, t0, 31);
        assert!(checks[..30].iter().all(|c| c.lost.is_empty()));
        assert_eq!(checks[30].lost[0].attempts, [attempt(4)]);
        assert!(!checks[30].lost[0].was_schedulable);
        assert!(
            nodes[&NodeId(1)].losses.is_empty(),
            "a node already down is not lost again"
        );
    }

    #[test]
    fn a_node_a_restarted_server_expects_back_is_lost_only_after_its_term() {
        let t0 = Instant::now();
        let mut live = node(1, t0);
        // As `recover` leaves it: not registered in this life, known to the scheduler
        // with a running attempt.
        live.online = false;
        live.expected = true;
        live.assignments
            .insert(attempt(4), super::super::polls::tests::assignment(4));
        let mut nodes = BTreeMap::from([(NodeId(1), live)]);
        let checks = every_second(&mut nodes, t0, 31);
        assert!(checks[..30].iter().all(|c| c.lost.is_empty()));
        assert_eq!(
            checks[30].lost,
            [LostNode {
                node: NodeId(1),
                name: "n1".into(),
                attempts: vec![attempt(4)],
                was_schedulable: true,
                after_restart: true,
            }]
        );
        assert!(!nodes[&NodeId(1)].expected);
    }
}
