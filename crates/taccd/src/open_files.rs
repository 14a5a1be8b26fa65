//! The open-file limit. Every connection the server holds is a file descriptor, and the
//! common soft limit (1024) is below the connections `--max-connections` allows, so the
//! daemon raises its soft limit to the hard one at start (an unprivileged process may),
//! and says so when even that is below what the listener may need.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Descriptors kept for the database, logs, chunks and outputs beside the connections.
const RESERVED: u64 = 256;

/// Raise the soft open-file limit to the hard limit; warn when it leaves less room than
/// `max_connections` needs.
pub fn raise_for(max_connections: usize) {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!("cannot read the open-file limit: {e}");
            return;
        }
    };
    let mut limit = soft;
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => limit = hard,
            Err(e) => tracing::warn!("cannot raise the open-file limit from {soft} to {hard}: {e}"),
        }
    }
    let needed = max_connections as u64 + RESERVED;
    if limit < needed {
        tracing::warn!(
            "the open-file limit ({limit}) is below what --max-connections {max_connections} \
             needs (about {needed}): past it new connections wait; raise the limit \
             (`ulimit -n`, LimitNOFILE= in a systemd unit) or lower --max-connections"
        );
    }
}
