//! The task uid map: which Unix uid each TACC user's tasks run as, the same on every node.
//! The server allocates a user's uid the first time one of their tasks is placed and keeps
//! it for good; a uid is never given to two users.
//!
//! Allocation is one conditional insert (the next uid above the highest handed out, at
//! least the base) that does nothing on any unique-key conflict, followed by a read of the
//! user's row. Two writers racing for the same user both read the one row that won; two
//! writers racing for the same uid (PostgreSQL replicas) leave one of them without a row,
//! and it tries again with the next uid.

use crate::rows::Columns;
use crate::statement::{Run, Statement};
use crate::{Result, StoreError};

/// How often an allocation that lost a race for a uid tries the next one.
const ATTEMPTS: usize = 16;

/// The highest uid handed out: `(uid_t) -1` is "no change" to `setresuid`, and the one
/// below it is a common overflow uid.
pub(crate) const MAX_TASK_UID: u32 = u32::MAX - 2;

/// The uid of `user`, allocated now when they have none (the lowest uid at least `base`
/// above every uid handed out so far).
pub(crate) async fn task_uid<R: Run>(writer: &R, user: &str, base: u32) -> Result<u32> {
    let greatest = R::GREATEST;
    for _ in 0..ATTEMPTS {
        if let Some(uid) = existing(writer, user).await? {
            return checked(user, uid);
        }
        let allocate = Statement::new(format!(
            "INSERT INTO task_uids (user_name, uid) \
             SELECT ?, {greatest}(?, COALESCE(MAX(uid) + 1, 1), 1) FROM task_uids WHERE 1 = 1 \
             ON CONFLICT DO NOTHING"
        ))
        .bind(user)
        .bind(i64::from(base));
        writer.execute(allocate).await?;
    }
    match existing(writer, user).await? {
        Some(uid) => checked(user, uid),
        None => Err(StoreError::Corrupt(format!(
            "could not allocate a task uid for user `{user}`: {ATTEMPTS} tries lost a race for \
             the next uid"
        ))),
    }
}

/// Every allocation, by user.
pub(crate) async fn list_task_uids(reader: &impl Run) -> Result<Vec<(String, u32)>> {
    let rows = reader
        .fetch_all(Statement::new(
            "SELECT user_name, uid FROM task_uids ORDER BY user_name",
        ))
        .await?;
    rows.iter()
        .map(|row| {
            let user = row.text("user_name")?;
            let uid = checked(&user, row.int("uid")?)?;
            Ok((user, uid))
        })
        .collect()
}

async fn existing(writer: &impl Run, user: &str) -> Result<Option<i64>> {
    let row = writer
        .fetch_optional(Statement::new("SELECT uid FROM task_uids WHERE user_name = ?").bind(user))
        .await?;
    row.as_ref().map(|row| row.int("uid")).transpose()
}

/// The stored uid, when it is one a task may run as.
fn checked(user: &str, uid: i64) -> Result<u32> {
    u32::try_from(uid)
        .ok()
        .filter(|uid| (1..=MAX_TASK_UID).contains(uid))
        .ok_or_else(|| {
            StoreError::Corrupt(format!(
                "task uid {uid} of user `{user}` is out of range: the uids above the task uid \
                 base are used up (lower --task-uid-base, or map the user to an account with \
                 `[users.{user}] unix_user`)"
            ))
        })
}
