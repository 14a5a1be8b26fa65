//! Dashboard sessions: signing in with an API token (the only credential there is) gives a
//! random session id in an `HttpOnly`, `SameSite=Strict` cookie (`Secure` over TLS). The
//! server keeps, per session, the token it was opened with, so every request through the
//! cookie is authenticated exactly as that token would be — a revoked or expired token
//! ends its sessions at once — and a CSRF token that every form must send back.
//!
//! Sessions are kept in the store as well as in memory, so a restarted server does not
//! sign everyone out: only the SHA-256 of a session id is kept (as the key), and the token
//! and form token are sealed with the server's secret key (`secrets.rs`), so the database
//! alone opens no session. They expire [`SESSION_TTL`] after sign-in and are bounded in
//! number in memory: past [`MAX_SESSIONS`] the oldest go first (a kept one comes back
//! from the store when used).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::TryRngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tacc_core::Timestamp;
use tacc_store::{DashboardSession, SecretRecord, Store};

use crate::secrets::SecretBox;

/// The cookie that carries the session id.
pub(crate) const COOKIE: &str = "tacc_session";
/// How long a session lasts after sign-in.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept in memory at most; past it the oldest are dropped.
pub(crate) const MAX_SESSIONS: usize = 10_000;
/// The name sessions are sealed under (the sealing binds each to its key).
const SEALED_AS: &str = "dashboard-session";

/// One signed-in browser, as the guard hands it to the dashboard's handlers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// The API token the user signed in with.
    pub(crate) token: String,
    /// What every form of this session must send back in its `csrf` field.
    pub(crate) csrf: String,
    pub(crate) user: String,
    opened: Timestamp,
}

impl Session {
    /// Whether `sent` is this session's CSRF token (compared in constant time).
    pub(crate) fn csrf_matches(&self, sent: &str) -> bool {
        super::csrf::same_secret(&self.csrf, sent)
    }

    fn expired(&self, now: Timestamp) -> bool {
        now.millis_since(self.opened) >= SESSION_TTL.as_millis() as u64
    }
}

/// What is sealed of a kept session.
#[derive(Serialize, Deserialize)]
struct Sealed {
    token: String,
    csrf: String,
}

/// Where sessions are kept beyond this process.
#[derive(Debug, Clone)]
pub(crate) struct Keeping {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) seal: SecretBox,
}

/// The open sessions of this server.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    open: Mutex<HashMap<String, Session>>,
    kept: Option<Keeping>,
}

/// 256 random bits, base64url: session ids and form tokens.
pub(crate) fn random_text() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .expect("the operating system's random source is available");
    URL_SAFE_NO_PAD.encode(bytes)
}

fn key_of(id: &str) -> String {
    Sha256::digest(id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Sessions {
    /// Sessions also kept in `keeping`'s store.
    pub(crate) fn kept(keeping: Keeping) -> Sessions {
        Sessions {
            open: Mutex::default(),
            kept: Some(keeping),
        }
    }

    /// Open a session for `user`, who proved themselves with `token`; its id (for the
    /// cookie) and the session. A store that cannot keep it leaves it in memory only.
    pub(crate) async fn open(&self, user: &str, token: &str, now: Timestamp) -> (String, Session) {
        let id = random_text();
        let session = Session {
            token: token.to_string(),
            csrf: random_text(),
            user: user.to_string(),
            opened: now,
        };
        let key = key_of(&id);
        self.remember(key.clone(), session.clone(), now);
        if let Some(kept) = &self.kept {
            let expired_before = Timestamp(now.0.saturating_sub(SESSION_TTL.as_millis() as u64));
            let stored = async {
                let sealed = serde_json::to_vec(&Sealed {
                    token: session.token.clone(),
                    csrf: session.csrf.clone(),
                })
                .map_err(|e| crate::ServerError::Internal(e.to_string()))?;
                let record = kept.seal.seal(SEALED_AS, &key, &sealed, now)?;
                kept.store
                    .put_dashboard_session(DashboardSession {
                        key: key.clone(),
                        user: user.to_string(),
                        nonce: record.nonce,
                        sealed: record.ciphertext,
                        opened_at: now,
                    })
                    .await?;
                kept.store.prune_dashboard_sessions(expired_before).await?;
                Ok::<(), crate::ServerError>(())
            };
            if let Err(e) = stored.await {
                tracing::warn!(
                    "cannot keep a dashboard session (it lasts until this server stops): {e}"
                );
            }
        }
        (id, session)
    }

    fn remember(&self, key: String, session: Session, now: Timestamp) {
        let mut open = self.open.lock().unwrap();
        open.retain(|_, s| !s.expired(now));
        while open.len() >= MAX_SESSIONS {
            let oldest = open
                .iter()
                .min_by_key(|(_, s)| s.opened)
                .map(|(key, _)| key.clone());
            match oldest {
                Some(key) => open.remove(&key),
                None => break,
            };
        }
        open.insert(key, session);
    }

    /// The live session whose id is `id`, if any (an expired one is forgotten); one this
    /// server kept in an earlier life comes back from the store.
    pub(crate) async fn get(&self, id: &str, now: Timestamp) -> Option<Session> {
        let key = key_of(id);
        let found = self.open.lock().unwrap().get(&key).cloned();
        let session = match found {
            Some(session) => session,
            None => {
                let session = self.recall(&key).await?;
                self.remember(key.clone(), session.clone(), now);
                session
            }
        };
        if session.expired(now) {
            self.close_key(&key).await;
            return None;
        }
        Some(session)
    }

    async fn recall(&self, key: &str) -> Option<Session> {
        let kept = self.kept.as_ref()?;
        let stored = match kept.store.dashboard_session(key).await {
            Ok(stored) => stored?,
            Err(e) => {
                tracing::warn!("cannot read a kept dashboard session: {e}");
                return None;
            }
        };
        let record = SecretRecord {
            user: SEALED_AS.to_string(),
            name: key.to_string(),
            nonce: stored.nonce,
            ciphertext: stored.sealed,
            updated_at: stored.opened_at,
        };
        let opened = kept.seal.open_value(&record).ok()?;
        let sealed: Sealed = serde_json::from_str(&opened).ok()?;
        Some(Session {
            token: sealed.token,
            csrf: sealed.csrf,
            user: stored.user,
            opened: stored.opened_at,
        })
    }

    /// Sign out: the session `id` is forgotten, here and in the store.
    pub(crate) async fn close(&self, id: &str) {
        self.close_key(&key_of(id)).await;
    }

    async fn close_key(&self, key: &str) {
        self.open.lock().unwrap().remove(key);
        if let Some(kept) = &self.kept
            && let Err(e) = kept.store.delete_dashboard_session(key).await
        {
            tracing::warn!("cannot forget a kept dashboard session: {e}");
        }
    }
}

/// The session id a request's `Cookie` headers carry, if any.
pub(crate) fn session_id(headers: &axum::http::HeaderMap) -> Option<String> {
    super::csrf::cookie(headers, COOKIE)
}

/// The `Set-Cookie` value that stores `id` in the browser (or, with `None`, removes it).
pub(crate) fn set_cookie(id: Option<&str>, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    match id {
        Some(id) => format!(
            "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            SESSION_TTL.as_secs()
        ),
        None => format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue, header};

    fn after(start: Timestamp, by: Duration) -> Timestamp {
        Timestamp(start.0 + by.as_millis() as u64)
    }

    #[tokio::test]
    async fn a_session_maps_its_id_to_the_token_and_user_until_it_expires() {
        let sessions = Sessions::default();
        let start = Timestamp(1_000);
        let (id, session) = sessions.open("alice", "tacc_secret", start).await;
        assert_ne!(id, session.csrf);
        assert_eq!(id.len(), 43, "256 random bits, base64url");
        let found = sessions
            .get(&id, after(start, Duration::from_secs(60)))
            .await
            .unwrap();
        assert_eq!(
            (found.user.as_str(), found.token.as_str()),
            ("alice", "tacc_secret")
        );
        assert!(sessions.get("not-a-session", start).await.is_none());
        assert!(
            sessions.get(&id, after(start, SESSION_TTL)).await.is_none(),
            "expired"
        );
        assert!(
            sessions.get(&id, start).await.is_none(),
            "an expired session is forgotten"
        );
    }

    #[tokio::test]
    async fn signing_out_closes_only_that_session_and_ids_are_unique() {
        let sessions = Sessions::default();
        let now = Timestamp(1_000);
        let (a, _) = sessions.open("alice", "t1", now).await;
        let (b, _) = sessions.open("alice", "t1", now).await;
        assert_ne!(a, b);
        sessions.close(&a).await;
        assert!(sessions.get(&a, now).await.is_none());
        assert!(sessions.get(&b, now).await.is_some());
        // Only the hash of an id is kept.
        assert!(!sessions.open.lock().unwrap().contains_key(&b));
    }

    #[tokio::test]
    async fn the_csrf_token_must_match_exactly() {
        let sessions = Sessions::default();
        let (_, session) = sessions.open("alice", "t", Timestamp(5)).await;
        assert!(session.csrf_matches(&session.csrf.clone()));
        assert!(!session.csrf_matches(""));
        assert!(!session.csrf_matches(&session.csrf[1..]));
        assert!(!session.csrf_matches(&format!("{}x", session.csrf)));
    }

    #[tokio::test]
    async fn a_kept_session_outlives_the_server_and_the_store_sees_no_token() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(tacc_store::MemoryStore::new());
        let keeping = || Keeping {
            store: store.clone(),
            seal: SecretBox::open(&dir.path().join("secret.key")).unwrap(),
        };
        let now = Timestamp(1_000);
        let (id, opened) = Sessions::kept(keeping())
            .open("alice", "tacc_secret_token", now)
            .await;
        // A new server process: nothing in memory, the same store and key.
        let restarted = Sessions::kept(keeping());
        let found = restarted.get(&id, now).await.expect("the session is back");
        assert_eq!(found, opened);
        let kept = store
            .dashboard_session(&key_of(&id))
            .await
            .unwrap()
            .unwrap();
        let sealed = String::from_utf8_lossy(&kept.sealed).to_string();
        assert!(!sealed.contains("tacc_secret_token"), "{sealed}");
        assert!(!kept.key.contains(&id));
        // Signing out forgets it for good.
        restarted.close(&id).await;
        assert!(Sessions::kept(keeping()).get(&id, now).await.is_none());
        // Another key opens nothing.
        let other = tempfile::tempdir().unwrap();
        let (id, _) = Sessions::kept(keeping()).open("alice", "t", now).await;
        let stranger = Sessions::kept(Keeping {
            store: store.clone(),
            seal: SecretBox::open(&other.path().join("secret.key")).unwrap(),
        });
        assert!(stranger.get(&id, now).await.is_none());
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_over_tls() {
        let set = set_cookie(Some("abc"), true);
        for part in [
            "tacc_session=abc",
            "HttpOnly",
            "SameSite=Strict",
            "Secure",
            "Path=/",
        ] {
            assert!(set.contains(part), "{set}");
        }
        assert!(!set_cookie(Some("abc"), false).contains("Secure"));
        assert!(set_cookie(None, false).contains("Max-Age=0"));
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; tacc_session=xyz"),
        );
        assert_eq!(session_id(&headers).as_deref(), Some("xyz"));
        headers.clear();
        headers.append(header::COOKIE, HeaderValue::from_static("tacc_session="));
        assert_eq!(session_id(&headers), None);
    }

    #[tokio::test]
    async fn the_oldest_sessions_go_first_past_the_bound() {
        let sessions = Sessions::default();
        let start = Timestamp(1_000);
        let (first, _) = sessions.open("a", "t", start).await;
        for i in 1..MAX_SESSIONS {
            sessions
                .open("a", "t", after(start, Duration::from_millis(i as u64)))
                .await;
        }
        assert!(sessions.get(&first, start).await.is_some());
        sessions
            .open("a", "t", after(start, Duration::from_secs(20)))
            .await;
        assert!(sessions.get(&first, start).await.is_none());
        assert_eq!(sessions.open.lock().unwrap().len(), MAX_SESSIONS);
    }
}
