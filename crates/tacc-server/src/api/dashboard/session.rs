//! Dashboard sessions: signing in with an API token (the only credential there is) gives a
//! random session id in an `HttpOnly`, `SameSite=Strict` cookie (`Secure` over TLS). The
//! server keeps, per session, the token it was opened with, so every request through the
//! cookie is authenticated exactly as that token would be — a revoked or expired token
//! ends its sessions at once — and a CSRF token that every form must send back.
//!
//! Sessions live in memory (a restarted server asks people to sign in again), expire
//! [`SESSION_TTL`] after sign-in, and are bounded in number: past [`MAX_SESSIONS`] the
//! oldest go first. Only the SHA-256 of a session id is kept, as the map's key.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::TryRngCore;
use sha2::{Digest, Sha256};

/// The cookie that carries the session id.
pub(crate) const COOKIE: &str = "tacc_session";
/// How long a session lasts after sign-in.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most; past it the oldest are dropped.
pub(crate) const MAX_SESSIONS: usize = 10_000;

/// One signed-in browser, as the guard hands it to the dashboard's handlers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// The API token the user signed in with.
    pub(crate) token: String,
    /// What every form of this session must send back in its `csrf` field.
    pub(crate) csrf: String,
    pub(crate) user: String,
    opened: Instant,
}

impl Session {
    /// Whether `sent` is this session's CSRF token (compared in constant time).
    pub(crate) fn csrf_matches(&self, sent: &str) -> bool {
        super::csrf::same_secret(&self.csrf, sent)
    }
}

/// The open sessions of this server.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    open: Mutex<HashMap<String, Session>>,
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
    /// Open a session for `user`, who proved themselves with `token`; its id (for the
    /// cookie) and the session.
    pub(crate) fn open(&self, user: &str, token: &str, now: Instant) -> (String, Session) {
        let id = random_text();
        let session = Session {
            token: token.to_string(),
            csrf: random_text(),
            user: user.to_string(),
            opened: now,
        };
        let mut open = self.open.lock().unwrap();
        open.retain(|_, s| now.saturating_duration_since(s.opened) < SESSION_TTL);
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
        open.insert(key_of(&id), session.clone());
        (id, session)
    }

    /// The live session whose id is `id`, if any (an expired one is forgotten).
    pub(crate) fn get(&self, id: &str, now: Instant) -> Option<Session> {
        let key = key_of(id);
        let mut open = self.open.lock().unwrap();
        let session = open.get(&key)?;
        if now.saturating_duration_since(session.opened) >= SESSION_TTL {
            open.remove(&key);
            return None;
        }
        Some(session.clone())
    }

    /// Sign out: the session `id` is forgotten.
    pub(crate) fn close(&self, id: &str) {
        self.open.lock().unwrap().remove(&key_of(id));
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

    #[test]
    fn a_session_maps_its_id_to_the_token_and_user_until_it_expires() {
        let sessions = Sessions::default();
        let start = Instant::now();
        let (id, session) = sessions.open("alice", "tacc_secret", start);
        assert_ne!(id, session.csrf);
        assert_eq!(id.len(), 43, "256 random bits, base64url");
        let found = sessions.get(&id, start + Duration::from_secs(60)).unwrap();
        assert_eq!(
            (found.user.as_str(), found.token.as_str()),
            ("alice", "tacc_secret")
        );
        assert!(sessions.get("not-a-session", start).is_none());
        assert!(sessions.get(&id, start + SESSION_TTL).is_none(), "expired");
        assert!(
            sessions.get(&id, start).is_none(),
            "an expired session is forgotten"
        );
    }

    #[test]
    fn signing_out_closes_only_that_session_and_ids_are_unique() {
        let sessions = Sessions::default();
        let now = Instant::now();
        let (a, _) = sessions.open("alice", "t1", now);
        let (b, _) = sessions.open("alice", "t1", now);
        assert_ne!(a, b);
        sessions.close(&a);
        assert!(sessions.get(&a, now).is_none());
        assert!(sessions.get(&b, now).is_some());
        // Only the hash of an id is kept.
        assert!(!sessions.open.lock().unwrap().contains_key(&b));
    }

    #[test]
    fn the_csrf_token_must_match_exactly() {
        let sessions = Sessions::default();
        let (_, session) = sessions.open("alice", "t", Instant::now());
        assert!(session.csrf_matches(&session.csrf.clone()));
        assert!(!session.csrf_matches(""));
        assert!(!session.csrf_matches(&session.csrf[1..]));
        assert!(!session.csrf_matches(&format!("{}x", session.csrf)));
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

    #[test]
    fn the_oldest_sessions_go_first_past_the_bound() {
        let sessions = Sessions::default();
        let start = Instant::now();
        let (first, _) = sessions.open("a", "t", start);
        for i in 1..MAX_SESSIONS {
            sessions.open("a", "t", start + Duration::from_millis(i as u64));
        }
        assert!(sessions.get(&first, start).is_some());
        sessions.open("a", "t", start + Duration::from_secs(20));
        assert!(sessions.get(&first, start).is_none());
        assert_eq!(sessions.open.lock().unwrap().len(), MAX_SESSIONS);
    }
}
