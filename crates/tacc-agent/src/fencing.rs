//! Self-fencing: a node cut off from the server stops its attempts itself before the
//! server may place them elsewhere, so an attempt never runs twice at once.
//!
//! The server declares a node lost after its heartbeat timeout `T` without contact and
//! only then retries the node's attempts. The agent renews its lease on every answer from
//! the server, polls at least every `T/4`, starts stopping its attempts after `T/3`
//! without an answer, and gives them at most `T/3` between SIGTERM and SIGKILL — so they
//! are gone before `T` has passed on the server's side.
//!
//! A server that is stalled (stopped, or stuck behind a long lock) is not a partition: its
//! host still accepts connections, and the server cannot retry anything while stalled (its
//! liveness check needs the lock the agents' polls wait for, and it gives every node a
//! fresh term after a stall). So before fencing the agent opens a fresh connection to the
//! server; when the server's host accepts it, the lease is renewed instead. A partitioned
//! node cannot connect and fences as before, only later by at most [`Lease::probe_limit`].
//! Not with replicated servers: there another replica may take over while this one is
//! stalled, so there the agent fences on silence alone.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The agent's side of the server's heartbeat lease.
#[derive(Debug)]
pub(crate) struct Lease {
    state: Mutex<LeaseState>,
}

#[derive(Debug, Clone, Copy)]
struct LeaseState {
    last_contact: Instant,
    /// The server's heartbeat timeout, once registered.
    term: Option<Duration>,
    /// The server is one of several replicas: its stall is no reason not to fence.
    replicated: bool,
}

impl Lease {
    pub fn new(now: Instant) -> Lease {
        Lease {
            state: Mutex::new(LeaseState {
                last_contact: now,
                term: None,
                replicated: false,
            }),
        }
    }

    /// The server registered this node with heartbeat timeout `term`.
    pub fn granted(&self, term: Duration, now: Instant) {
        let mut state = self.state.lock().unwrap();
        state.term = Some(term);
        state.last_contact = now;
    }

    /// Whether the server is one of several replicas (another may take over while it is
    /// stalled, so its stall is no reason not to fence).
    pub fn set_replicated(&self, replicated: bool) {
        self.state.lock().unwrap().replicated = replicated;
    }

    /// The server's heartbeat timeout, once registered.
    pub fn term(&self) -> Option<Duration> {
        self.state.lock().unwrap().term
    }

    pub fn replicated(&self) -> bool {
        self.state.lock().unwrap().replicated
    }

    /// The server answered.
    pub fn renewed(&self, now: Instant) {
        self.state.lock().unwrap().last_contact = now;
    }

    /// How long the server has been silent, when that is long enough to fence.
    pub fn expired(&self, now: Instant) -> Option<Duration> {
        let state = *self.state.lock().unwrap();
        let silence = now.saturating_duration_since(state.last_contact);
        let term = state.term?;
        (silence > term / 3).then_some(silence)
    }

    /// The longest a poll may wait, so that a healthy node renews well within `T/3`.
    pub fn poll_wait(&self, configured: Duration) -> Duration {
        match self.state.lock().unwrap().term {
            Some(term) => configured.min(term / 4),
            None => configured,
        }
    }

    /// How long the probe of a silent server may take: short enough that fencing after
    /// it still ends before `T` (`T/3 + T/6 + T/3 < T`).
    pub fn probe_limit(&self) -> Duration {
        match self.state.lock().unwrap().term {
            Some(term) => (term / 6).min(Duration::from_secs(1)),
            None => Duration::from_secs(1),
        }
    }

    /// The longest grace between SIGTERM and SIGKILL an attempt may get, so that a fenced
    /// attempt is dead before the server retries it.
    pub fn cap_grace(&self, grace: Duration) -> Duration {
        match self.state.lock().unwrap().term {
            Some(term) => grace.min(term / 3),
            None => grace,
        }
    }
}

/// Whether the server's host accepts a fresh TCP connection within `limit`: the network
/// to the server works, so its silence is the server's own stall.
pub(crate) async fn server_host_accepts(base_url: &str, limit: Duration) -> bool {
    let Ok(url) = reqwest::Url::parse(base_url) else {
        return false;
    };
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    matches!(
        tokio::time::timeout(limit, tokio::net::TcpStream::connect((host, port))).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_expires_after_a_third_of_the_term_without_contact() {
        let start = Instant::now();
        let lease = Lease::new(start);
        // Before registration there is nothing to fence against.
        assert_eq!(lease.expired(start + Duration::from_secs(3600)), None);
        lease.granted(Duration::from_secs(30), start);
        assert_eq!(lease.expired(start + Duration::from_secs(9)), None);
        assert_eq!(
            lease.expired(start + Duration::from_secs(11)),
            Some(Duration::from_secs(11))
        );
        lease.renewed(start + Duration::from_secs(11));
        assert_eq!(lease.expired(start + Duration::from_secs(15)), None);
    }

    #[test]
    fn polls_and_grace_fit_in_the_term() {
        let lease = Lease::new(Instant::now());
        assert_eq!(
            lease.poll_wait(Duration::from_secs(20)),
            Duration::from_secs(20)
        );
        assert_eq!(
            lease.cap_grace(Duration::from_secs(60)),
            Duration::from_secs(60)
        );
        lease.granted(Duration::from_secs(30), Instant::now());
        assert_eq!(
            lease.poll_wait(Duration::from_secs(20)),
            Duration::from_millis(7500)
        );
        assert_eq!(
            lease.cap_grace(Duration::from_secs(60)),
            Duration::from_secs(10)
        );
        assert_eq!(
            lease.cap_grace(Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        // Fencing starts after T/3 and ends T/3 later at the latest: before T.
        let fenced_by = Duration::from_secs(30) / 3
            + lease.probe_limit()
            + lease.cap_grace(Duration::from_secs(600));
        assert!(fenced_by < Duration::from_secs(30));
    }

    #[tokio::test]
    async fn a_listening_host_accepts_and_a_closed_port_does_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let limit = Duration::from_secs(1);
        assert!(server_host_accepts(&format!("http://127.0.0.1:{port}"), limit).await);
        // A port bound but not listening refuses connections, and stays ours: a freed
        // port could be taken at once by another test's listener.
        let closed = tokio::net::TcpSocket::new_v4().unwrap();
        closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        assert!(!server_host_accepts(&format!("http://127.0.0.1:{closed_port}"), limit).await);
        drop(listener);
        assert!(!server_host_accepts("not a url", limit).await);
    }
}
