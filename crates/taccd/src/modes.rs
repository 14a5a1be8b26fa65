//! File modes of the daemon's own state. `taccd` runs with umask 077, so everything it
//! creates (the database and its WAL, logs, chunks, outputs, credentials, the endpoint
//! file) is 0600/0700: readable by the daemon's user alone, never by tasks (which run as
//! other accounts) or other local users. The agent's directory sets its own modes
//! (`tacc-agent`'s `layout`), opening only what tasks must reach.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, Result};

/// Everything created from now on is private to this process's user.
pub fn private_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// Entries of the server's data directory that are the server's alone.
const SERVER_PRIVATE: &[&str] = &[
    "tacc.db",
    "tacc.db-wal",
    "tacc.db-shm",
    "logs",
    "chunks",
    "outputs",
    "secret.key",
    "admin.token",
    "tls",
    "agent.log",
];

/// Creates the server's data directory, and makes it and what an earlier version left
/// in it private. `hosts_agent`: the embedded cluster's agent lives in `DATA/agent`,
/// so tasks must be able to pass through `DATA` (0711: search, no listing) to reach
/// their working directories; a server alone keeps `DATA` at 0700.
pub fn secure_server_dir(data_dir: &Path, hosts_agent: bool) -> Result<()> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let mode = if hosts_agent { 0o711 } else { 0o700 };
    set_mode(data_dir, mode)?;
    for name in SERVER_PRIVATE {
        let path = data_dir.join(name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            set_mode(&path, 0o700)?;
        } else if meta.is_file() {
            set_mode(&path, 0o600)?;
        }
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {} to {mode:o}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_server_s_state_is_private_and_the_embedded_one_is_traversable() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("d");
        std::fs::create_dir_all(data.join("logs")).unwrap();
        std::fs::write(data.join("tacc.db"), "").unwrap();
        set_mode(&data.join("tacc.db"), 0o644).unwrap();
        set_mode(&data.join("logs"), 0o755).unwrap();
        secure_server_dir(&data, false).unwrap();
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(&data.join("tacc.db")), 0o600);
        assert_eq!(mode(&data.join("logs")), 0o700);
        secure_server_dir(&data, true).unwrap();
        assert_eq!(mode(&data), 0o711);
    }
}
