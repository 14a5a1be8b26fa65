//! Who a task's processes run as on the nodes: the Unix account the operator mapped its
//! user to (`[users.NAME] unix_user`), else the user's task uid — allocated once by the
//! server in the store (`Store::task_uid`, from [`ServerConfig::task_uid_base`] upwards)
//! and sent with every assignment, so a user has the same uid on every node and no two
//! users ever share one, whichever agent runs their tasks.
//!
//! [`ServerConfig::task_uid_base`]: super::ServerConfig::task_uid_base

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tacc_store::Store;

/// The account one user's attempts run as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TaskAccount {
    /// The operator's mapping, which wins.
    pub unix_user: Option<String>,
    /// The user's task uid, when not mapped; `None` also when the store could not
    /// allocate one (the agent then refuses the attempt, saying so).
    pub task_uid: Option<u32>,
}

/// Who each user's attempts run as: the operator's mapping, else the user's task uid,
/// read or allocated once in the store and then kept here (it never changes), so a
/// placement does not ask the store each time.
#[derive(Debug)]
pub(crate) struct TaskAccounts {
    store: Arc<dyn Store>,
    /// `[users.NAME] unix_user`: the operator's mapping, which wins.
    unix_users: BTreeMap<String, String>,
    /// The first uid the store allocates from.
    uid_base: u32,
    uids: Mutex<BTreeMap<String, u32>>,
}

impl TaskAccounts {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        unix_users: BTreeMap<String, String>,
        uid_base: u32,
    ) -> TaskAccounts {
        TaskAccounts {
            store,
            unix_users,
            uid_base,
            uids: Mutex::default(),
        }
    }

    /// The account `user`'s attempts run as on every node.
    pub(crate) async fn of(&self, user: &str) -> TaskAccount {
        if let Some(account) = self.unix_users.get(user) {
            return TaskAccount {
                unix_user: Some(account.clone()),
                task_uid: None,
            };
        }
        if let Some(uid) = self.uids.lock().unwrap().get(user) {
            return TaskAccount {
                unix_user: None,
                task_uid: Some(*uid),
            };
        }
        match self.store.task_uid(user, self.uid_base).await {
            Ok(uid) => {
                self.uids.lock().unwrap().insert(user.to_string(), uid);
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
