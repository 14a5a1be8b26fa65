//! Who a task runs as on this node. Tasks never run as root:
//!
//! - an agent running as root runs each attempt as the Unix account the operator mapped the
//!   task's user to (`Instruction::unix_user`, looked up on this node), or else as an
//!   unprivileged uid/gid of its own for that TACC user, allocated from `--task-uid-base`
//!   upwards and kept in `DATA/task-uids.json`, so a user keeps their uid across agent
//!   restarts and two users never share one;
//! - an agent that is not root cannot switch identities: it runs every task as itself,
//!   and says so once in its log (tasks are then not isolated from each other or from the
//!   agent's files; the agent's own modes still keep them from other local accounts).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::unistd::{Gid, Group, Uid, User};
use serde::{Deserialize, Serialize};
use tacc_exec::RunAs;

/// The default first uid (and gid) of the accounts the agent allocates for tasks.
pub const DEFAULT_TASK_UID_BASE: u32 = 200_000;

/// The file under the agent's data directory that keeps the allocated uids.
pub(crate) const UID_TABLE_FILE: &str = "task-uids.json";

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
    /// Root with a runtime that switches identities: every task gets its own account.
    Switch { table: UidTable, node: String },
    /// Every task runs as the agent itself.
    AsAgent,
}

impl Identities {
    /// Decide once, at start: `runtime_switches` is whether the node's runtime runs
    /// executions as a given identity (the Slurm backend does not).
    pub fn open(
        data_dir: &Path,
        uid_base: u32,
        node: &str,
        runtime_switches: bool,
    ) -> std::io::Result<Identities> {
        let me = nix::unistd::geteuid();
        if !me.is_root() {
            tracing::warn!(
                "this agent does not run as root (uid {me}): tasks run as its own user, \
                 not isolated from each other or from the agent's files; run the agent as \
                 root to give every user's tasks their own unprivileged account"
            );
            return Ok(Identities::AsAgent);
        }
        if !runtime_switches {
            tracing::warn!(
                "this node's runtime cannot run tasks as another account: tasks run as the \
                 agent's user (root)"
            );
            return Ok(Identities::AsAgent);
        }
        if uid_base == 0 {
            return Err(std::io::Error::other(
                "--task-uid-base must not be 0: tasks never run as root",
            ));
        }
        let table = UidTable::open(data_dir.join(UID_TABLE_FILE), uid_base)?;
        tracing::info!(
            "tasks run as unprivileged accounts: the mapped unix_user, else a uid of their \
             own from {uid_base} upwards"
        );
        Ok(Identities::Switch {
            table,
            node: node.to_string(),
        })
    }

    /// Whether tasks run as accounts other than the agent's.
    pub fn switches(&self) -> bool {
        matches!(self, Identities::Switch { .. })
    }

    /// The identity an attempt of `user`'s runs as; `Err` is the message the attempt
    /// fails with (`launch_failed`).
    pub fn for_task(&self, user: &str, unix_user: Option<&str>) -> Result<TaskIdentity, String> {
        let Identities::Switch { table, node } = self else {
            return Ok(TaskIdentity::agent());
        };
        match unix_user {
            Some(account) => mapped_account(account, node),
            None => {
                let uid = table
                    .uid_of(user)
                    .map_err(|e| format!("cannot allocate a task account for `{user}`: {e}"))?;
                Ok(TaskIdentity {
                    run_as: Some(RunAs { uid, gid: uid }),
                    name: Some(user.to_string()),
                    home: None,
                })
            }
        }
    }
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

/// The uids allocated to TACC users on this node, persisted (0600, replaced atomically)
/// before one is handed out.
#[derive(Debug)]
pub(crate) struct UidTable {
    path: PathBuf,
    base: u32,
    users: Mutex<BTreeMap<String, u32>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct UidFile {
    /// The base the table was started with (for the operator; allocations keep their uid
    /// if the base changes).
    base: u32,
    users: BTreeMap<String, u32>,
}

impl UidTable {
    /// Reads the table; a missing file is an empty table, an unreadable one an error (it
    /// is never silently replaced: users would change uids and lose their files).
    pub fn open(path: PathBuf, base: u32) -> std::io::Result<UidTable> {
        let users = match std::fs::read(&path) {
            Ok(bytes) => {
                let file: UidFile = serde_json::from_slice(&bytes).map_err(|e| {
                    std::io::Error::other(format!(
                        "{} is not a task uid table ({e}); fix or remove it",
                        path.display()
                    ))
                })?;
                file.users
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e),
        };
        Ok(UidTable {
            path,
            base,
            users: Mutex::new(users),
        })
    }

    /// The uid of `user`, allocated now (the lowest free one from the base that no
    /// account or group on this node has) if the user has none yet.
    pub fn uid_of(&self, user: &str) -> std::io::Result<u32> {
        let mut users = self.users.lock().unwrap();
        if let Some(uid) = users.get(user) {
            return Ok(*uid);
        }
        let taken: std::collections::BTreeSet<u32> = users.values().copied().collect();
        let mut candidate = self.base;
        loop {
            let free = !taken.contains(&candidate)
                && User::from_uid(Uid::from_raw(candidate))
                    .ok()
                    .flatten()
                    .is_none()
                && Group::from_gid(Gid::from_raw(candidate))
                    .ok()
                    .flatten()
                    .is_none();
            if free {
                break;
            }
            candidate = candidate
                .checked_add(1)
                .filter(|c| *c < u32::MAX)
                .ok_or_else(|| std::io::Error::other("no free uid above the task uid base"))?;
        }
        users.insert(user.to_string(), candidate);
        if let Err(e) = self.save(&users) {
            users.remove(user);
            return Err(e);
        }
        tracing::info!("user {user} runs tasks as uid {candidate} on this node");
        Ok(candidate)
    }

    fn save(&self, users: &BTreeMap<String, u32>) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(&UidFile {
            base: self.base,
            users: users.clone(),
        })
        .map_err(std::io::Error::other)?;
        crate::write_private(&self.path, &text)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn users_get_distinct_uids_that_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(UID_TABLE_FILE);
        // A base far from any real account.
        let base = 3_000_000_000;
        let table = UidTable::open(path.clone(), base).unwrap();
        let alice = table.uid_of("alice").unwrap();
        let bob = table.uid_of("bob").unwrap();
        assert_eq!(alice, base);
        assert_eq!(bob, base + 1);
        assert_eq!(table.uid_of("alice").unwrap(), alice);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        // A new life of the agent, even with another base, keeps what was handed out.
        let again = UidTable::open(path.clone(), base + 100).unwrap();
        assert_eq!(again.uid_of("bob").unwrap(), bob);
        assert_eq!(again.uid_of("alice").unwrap(), alice);
        assert_eq!(again.uid_of("carol").unwrap(), base + 100);

        // A damaged table is an error, never a fresh start.
        std::fs::write(&path, "{not json").unwrap();
        let error = UidTable::open(path, base).unwrap_err();
        assert!(
            error.to_string().contains("not a task uid table"),
            "{error}"
        );
    }

    #[test]
    fn allocation_skips_uids_of_existing_accounts() {
        let dir = tempfile::tempdir().unwrap();
        // uid 0 (root) exists on every machine: the base itself is skipped.
        let table = UidTable::open(dir.path().join(UID_TABLE_FILE), 0).unwrap();
        let uid = table.uid_of("alice").unwrap();
        assert_ne!(uid, 0);
        assert!(User::from_uid(Uid::from_raw(uid)).unwrap().is_none());
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
