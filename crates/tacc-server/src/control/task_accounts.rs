//! Who a task's processes run as on the nodes: the Unix account the operator mapped its
//! user to (`[users.NAME] unix_user`), else the user's task uid — allocated once by the
//! server in the store (`Store::task_uid`, from [`ServerConfig::task_uid_base`] upwards)
//! and sent with every assignment, so a user has the same uid on every node and no two
//! users ever share one, whichever agent runs their tasks.
//!
//! [`ServerConfig::task_uid_base`]: super::ServerConfig::task_uid_base

use std::collections::BTreeMap;

use super::Control;

/// The account one user's attempts run as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TaskAccount {
    /// The operator's mapping, which wins.
    pub unix_user: Option<String>,
    /// The user's task uid, when not mapped; `None` also when the store could not
    /// allocate one (the agent then refuses the attempt, saying so).
    pub task_uid: Option<u32>,
}

/// Task uids read or allocated before (they never change), so a placement does not ask
/// the store each time.
#[derive(Debug, Default)]
pub(crate) struct TaskUidCache(std::sync::Mutex<BTreeMap<String, u32>>);

impl Control {
    /// The account `user`'s attempts run as on every node.
    pub(crate) async fn task_account(&self, user: &str) -> TaskAccount {
        if let Some(account) = self.config.unix_users.get(user) {
            return TaskAccount {
                unix_user: Some(account.clone()),
                task_uid: None,
            };
        }
        if let Some(uid) = self.task_uids.0.lock().unwrap().get(user) {
            return TaskAccount {
                unix_user: None,
                task_uid: Some(*uid),
            };
        }
        match self.store.task_uid(user, self.config.task_uid_base).await {
            Ok(uid) => {
                self.task_uids
                    .0
                    .lock()
                    .unwrap()
                    .insert(user.to_string(), uid);
                TaskAccount {
                    unix_user: None,
                    task_uid: Some(uid),
                }
            }
            Err(e) => {
                tracing::error!("cannot allocate a task uid for user {user}: {e}");
                TaskAccount::default()
            }
        }
    }
}
