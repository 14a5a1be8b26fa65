//! Who a task runs as on this node. Tasks never run as root:
//!
//! - an agent running as root runs each attempt as the Unix account the operator mapped the
//!   task's user to (`Instruction::unix_user`, looked up on this node), or else as the
//!   unprivileged uid (and gid) the server allocated to that TACC user
//!   (`Assignment::task_uid`): one durable map in the server's database, so a user has
//!   the same uid on every node and two users never share one, whichever agent runs
//!   their tasks;
//! - an agent that is not root cannot switch identities: it runs every task as itself,
//!   and says so once in its log (tasks are then not isolated from each other or from the
//!   agent's files; the agent's own modes still keep them from other local accounts).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::unistd::{Gid, Group, Uid, User};
use tacc_exec::RunAs;

use crate::identity_cache::{IdentityCache, IdentityKey};

/// Where agents before server-allocated uids kept their own (no longer read).
pub(crate) const OLD_UID_TABLE_FILE: &str = "task-uids.json";

/// The identity one attempt runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskIdentity {
    /// `None`: the agent's own identity (an agent that is not root).
    pub run_as: Option<RunAs>,
    /// USER and LOGNAME of the task's processes, when the identity is not the agent's.
    pub name: Option<String>,
    /// The account's own home directory when it has one on this node (a mapped account);
    /// `None` makes the task's home its per-user directory.
    pub home: Option<PathBuf>,
}

impl TaskIdentity {
    /// The agent's own identity.
    pub fn agent() -> TaskIdentity {
        TaskIdentity {
            run_as: None,
            name: None,
            home: None,
        }
    }

    /// HOME, USER and LOGNAME of this identity's processes (`userdir` is the home of an
    /// account without one); empty for the agent's own identity, whose are inherited.
    pub fn vars(&self, userdir: &Path) -> BTreeMap<String, String> {
        let mut vars = BTreeMap::new();
        if self.run_as.is_some() {
            let home = self.home.as_deref().unwrap_or(userdir);
            vars.insert("HOME".to_string(), home.display().to_string());
            if let Some(name) = &self.name {
                vars.insert("USER".to_string(), name.clone());
                vars.insert("LOGNAME".to_string(), name.clone());
            }
        }
        vars
    }

    /// The identity preparation steps for this task run as.
    pub fn step(&self, userdir: &Path) -> StepIdentity {
        StepIdentity {
            run_as: self.run_as,
            vars: self.vars(userdir),
        }
    }
}

/// Who runs a step that prepares an attempt with code or data of the user's (an
/// environment build, a dataset copy), and what it sees as HOME, USER and LOGNAME.
#[derive(Debug, Clone, Default)]
pub(crate) struct StepIdentity {
    pub run_as: Option<RunAs>,
    pub vars: BTreeMap<String, String>,
}

impl StepIdentity {
    /// The agent's own identity.
    #[cfg(test)]
    pub fn agent() -> StepIdentity {
        StepIdentity::default()
    }

    /// A command that runs as this identity, with the agent's environment less the
    /// platform's own `TACC_*` variables, and this identity's HOME/USER/LOGNAME.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(program);
        command.env_clear().envs(
            std::env::vars_os().filter(|(name, _)| !name.to_string_lossy().starts_with("TACC_")),
        );
        command.envs(&self.vars);
        if let Some(run_as) = self.run_as {
            command.uid(run_as.uid).gid(run_as.gid);
        }
        command
    }
}

/// How this agent decides identities.
#[derive(Debug)]
pub(crate) enum Identities {
    /// Root with a runtime that switches identities: every task gets its own account,
    /// resolved through the name service at most once every few seconds per user.
    Switch { node: String, cache: IdentityCache },
    /// Every task runs as the agent itself.
    AsAgent,
}

impl Identities {
    /// Decide once, at start: `runtime_switches` is whether the node's runtime runs
    /// executions as a given identity (the Slurm backend does not).
    pub fn open(data_dir: &Path, node: &str, runtime_switches: bool) -> Identities {
        let me = nix::unistd::geteuid();
        if !me.is_root() {
            tracing::warn!(
                "this agent does not run as root (uid {me}): tasks run as its own user, \
                 not isolated from each other or from the agent's files; run the agent as \
                 root to give every user's tasks their own unprivileged account"
            );
            return Identities::AsAgent;
        }
        if !runtime_switches {
            tracing::warn!(
                "this node's runtime cannot run tasks as another account: tasks run as the \
                 agent's user (root)"
            );
            return Identities::AsAgent;
        }
        let old_table = data_dir.join(OLD_UID_TABLE_FILE);
        if old_table.exists() {
            tracing::warn!(
                "{} is no longer used: task uids now come from the server, the same on every \
                 node; users' directories pass to their new uid at their next task. The file \
                 may be deleted",
                old_table.display()
            );
        }
        tracing::info!(
            "tasks run as unprivileged accounts: the mapped unix_user, else the uid the \
             server allocated to their user"
        );
        Identities::Switch {
            node: node.to_string(),
            cache: IdentityCache::default(),
        }
    }

    /// Whether tasks run as accounts other than the agent's.
    pub fn switches(&self) -> bool {
        matches!(self, Identities::Switch { .. })
    }

    /// The identity an attempt of `user`'s runs as: the operator's `unix_user`, else the
    /// `task_uid` the server allocated to the user. `Err` is the message the attempt fails
    /// with (`launch_failed`).
    pub fn for_task(
        &self,
        user: &str,
        unix_user: Option<&str>,
        task_uid: Option<u32>,
    ) -> Result<TaskIdentity, String> {
        let Identities::Switch { node, cache } = self else {
            return Ok(TaskIdentity::agent());
        };
        let key = IdentityKey {
            user: user.to_string(),
            unix_user: unix_user.map(str::to_string),
            task_uid,
        };
        cache.get_or_resolve(&key, Instant::now(), || {
            resolve(user, unix_user, task_uid, node)
        })
    }
}

/// The identity of an attempt of `user`'s, asked of the name service.
fn resolve(
    user: &str,
    unix_user: Option<&str>,
    task_uid: Option<u32>,
    node: &str,
) -> Result<TaskIdentity, String> {
    match (unix_user, task_uid) {
        (Some(account), _) => mapped_account(account, node),
        (None, Some(uid)) => allocated_uid(user, uid, node),
        (None, None) => Err(format!(
            "the server sent no task uid for user `{user}` (a server older than this \
             agent, or its database failed to allocate one: see the server's log); \
             tasks never run as root"
        )),
    }
}

/// The uid the server allocated to `user`, unless it is root or an account or group of
/// this node's own (the task would get that account's or group's files).
fn allocated_uid(user: &str, uid: u32, node: &str) -> Result<TaskIdentity, String> {
    if uid == 0 {
        return Err(format!(
            "the server allocated uid 0 to user `{user}`; tasks never run as root"
        ));
    }
    let account = User::from_uid(Uid::from_raw(uid)).ok().flatten();
    let group = Group::from_gid(Gid::from_raw(uid)).ok().flatten();
    if account.is_some() || group.is_some() {
        let what = match (account, group) {
            (Some(account), _) => format!("account {}", account.name),
            (None, Some(group)) => format!("group {}", group.name),
            (None, None) => unreachable!("checked above"),
        };
        return Err(format!(
            "task uid {uid} of user `{user}` belongs to the {what} on node {node}: start the \
             server with a --task-uid-base above this node's accounts, or map the user to an \
             account with `[users.{user}] unix_user`"
        ));
    }
    Ok(TaskIdentity {
        run_as: Some(RunAs { uid, gid: uid }),
        name: Some(user.to_string()),
        home: None,
    })
}

/// The account the operator mapped a user to, as this node knows it.
fn mapped_account(account: &str, node: &str) -> Result<TaskIdentity, String> {
    let found = User::from_name(account)
        .map_err(|e| format!("cannot look up unix account {account} on node {node}: {e}"))?;
    let Some(found) = found else {
        return Err(format!(
            "unix account {account} does not exist on node {node}"
        ));
    };
    if found.uid.is_root() || found.gid.as_raw() == 0 {
        return Err(format!(
            "unix account {account} on node {node} is root (uid {}, gid {}); tasks never run \
             as root: map the user to an unprivileged account",
            found.uid, found.gid
        ));
    }
    Ok(TaskIdentity {
        run_as: Some(RunAs {
            uid: found.uid.as_raw(),
            gid: found.gid.as_raw(),
        }),
        name: Some(account.to_string()),
        home: found.dir.is_dir().then_some(found.dir),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocated_uid_must_not_be_root_nor_a_local_account_or_group() {
        let root = allocated_uid("alice", 0, "node-a").unwrap_err();
        assert!(root.contains("never run as root"), "{root}");
        // uid/gid 1 is `daemon` on Debian-like systems.
        if User::from_uid(Uid::from_raw(1)).unwrap().is_some() {
            let taken = allocated_uid("alice", 1, "node-a").unwrap_err();
            assert!(taken.contains("--task-uid-base"), "{taken}");
        }
        let identity = allocated_uid("alice", 3_000_000_000, "node-a").unwrap();
        assert_eq!(
            identity.run_as,
            Some(RunAs {
                uid: 3_000_000_000,
                gid: 3_000_000_000
            })
        );
        assert_eq!(identity.name.as_deref(), Some("alice"));
    }

    #[test]
    fn a_mapped_account_must_exist_and_must_not_be_root() {
        let missing = mapped_account("tacc-no-such-account-7f3e", "node-a").unwrap_err();
        assert_eq!(
            missing,
            "unix account tacc-no-such-account-7f3e does not exist on node node-a"
        );
        let root = mapped_account("root", "node-a").unwrap_err();
        assert!(root.contains("never run as root"), "{root}");
        // An unprivileged system account every Debian-like system has.
        if let Ok(Some(nobody)) = User::from_name("nobody") {
            let identity = mapped_account("nobody", "node-a").unwrap();
            assert_eq!(
                identity.run_as,
                Some(RunAs {
                    uid: nobody.uid.as_raw(),
                    gid: nobody.gid.as_raw()
                })
            );
            assert_eq!(identity.name.as_deref(), Some("nobody"));
        }
    }
}
