//! Who waits for a group's elements to end: a follower of an array (`tcloud submit --array
//! … -f`) is answered the moment its last element ends, not at its next poll. Each group
//! with a follower has a watch channel, bumped once a commit that ends some of its
//! elements is applied; the follower then looks (one probe of the store) whether any
//! element is still open. A group nobody follows costs nothing.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tacc_core::GroupId;
use tokio::sync::watch;

#[derive(Debug, Default)]
pub(crate) struct GroupEnds {
    followed: Mutex<BTreeMap<GroupId, watch::Sender<u64>>>,
}

impl GroupEnds {
    /// Follow `group`: the receiver sees a change after every commit that ends one of its
    /// elements from now on.
    pub(crate) fn follow(&self, group: GroupId) -> watch::Receiver<u64> {
        let mut followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        followed
            .entry(group)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// A commit that ended elements of `groups` was applied: their followers look again.
    /// A group whose followers have all gone is forgotten.
    pub(crate) fn ended(&self, groups: impl IntoIterator<Item = GroupId>) {
        let mut followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        for group in groups {
            let Some(sender) = followed.get(&group) else {
                continue;
            };
            if sender.receiver_count() == 0 {
                followed.remove(&group);
                continue;
            }
            sender.send_modify(|n| *n += 1);
        }
    }

    /// A commit ended elements of groups not known: every follower looks again.
    pub(crate) fn ended_all(&self) {
        let groups: Vec<GroupId> = self
            .followed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect();
        self.ended(groups);
    }

    #[cfg(test)]
    fn followed(&self) -> usize {
        self.followed.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_sees_its_groups_ends_and_no_other_and_a_left_group_is_forgotten() {
        let ends = GroupEnds::default();
        let (a, b) = (GroupId(1), GroupId(2));
        let mut follower = ends.follow(a);
        ends.ended([b]);
        assert!(!follower.has_changed().unwrap(), "another group's end");
        ends.ended([a]);
        assert!(follower.has_changed().unwrap());
        follower.borrow_and_update();
        drop(follower);
        ends.ended([a]);
        assert_eq!(ends.followed(), 0, "nobody follows it any more");
    }
}
