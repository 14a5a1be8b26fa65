//! What becomes of an active attempt placed on a node whose agent registers (again): the
//! agent claims what it still runs or has not delivered the end of; what it does not
//! claim died with its previous life.

/// The verdict on one attempt placed on the registering node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::control) enum Claim {
    /// Claimed by a node the scheduler still counts as up (its agent restarted within
    /// the heartbeat timeout): nothing changes.
    Keep,
    /// Claimed, every node of the attempt is up again: the scheduler gets it back as
    /// running with its placements.
    Restore,
    /// Claimed but cancelled meanwhile: the agent is told to stop it; it ends as
    /// cancelled once the agent confirms.
    StopThenCancel,
    /// Not claimed, or a node of a multi-node attempt is still away: the attempt is
    /// lost (and follows the retry policy).
    Lose,
}

/// `was_online`: the node was up before this registration.
pub(in crate::control) fn judge(
    claimed: bool,
    cancel_requested: bool,
    all_nodes_online: bool,
    was_online: bool,
) -> Claim {
    match (claimed, cancel_requested) {
        (true, true) => Claim::StopThenCancel,
        (true, false) if all_nodes_online && was_online => Claim::Keep,
        (true, false) if all_nodes_online => Claim::Restore,
        _ => Claim::Lose,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_claimed_attempt_survives_a_registration() {
        for cancel in [false, true] {
            for all in [false, true] {
                for was in [false, true] {
                    assert_eq!(judge(false, cancel, all, was), Claim::Lose);
                }
            }
        }
    }

    #[test]
    fn a_claimed_attempt_is_kept_restored_or_stopped() {
        assert_eq!(judge(true, false, true, true), Claim::Keep);
        assert_eq!(judge(true, false, true, false), Claim::Restore);
        assert_eq!(judge(true, true, true, false), Claim::StopThenCancel);
        assert_eq!(judge(true, true, false, true), Claim::StopThenCancel);
    }

    #[test]
    fn a_gang_with_a_node_still_away_is_lost_even_when_claimed() {
        assert_eq!(judge(true, false, false, false), Claim::Lose);
        assert_eq!(judge(true, false, false, true), Claim::Lose);
    }
}
