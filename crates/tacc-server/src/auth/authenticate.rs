//! Turning an `Authorization` header into a [`Caller`]. Lookups are cached for a few
//! seconds so a stream of requests costs one database read per token, not one each; a
//! revocation through the API clears the cache at once, one made directly against the
//! data directory (`taccd admin token revoke`) takes effect within [`CACHE_TTL`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderValue;
use tacc_core::Timestamp;
use tacc_store::{Store, TokenKind, TokenRecord};

use super::policy::{Caller, Refusal, UserCaller};
use super::tokens;

/// How long a looked-up token is trusted without asking the store again.
pub const CACHE_TTL: Duration = Duration::from_secs(5);
/// Entries kept at most; the cache starts over past it (a flood of made-up tokens
/// cannot grow it without bound).
const CACHE_CAPACITY: usize = 10_000;

#[derive(Debug, Clone)]
struct Cached {
    token: Option<TokenRecord>,
    user: Option<UserCaller>,
    at: Instant,
}

#[derive(Debug)]
pub struct Authenticator {
    store: Arc<dyn Store>,
    cache: Mutex<HashMap<String, Cached>>,
    groups: Mutex<HashMap<String, Option<String>>>,
}

impl Authenticator {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Authenticator {
            store,
            cache: Mutex::new(HashMap::new()),
            groups: Mutex::new(HashMap::new()),
        }
    }

    /// Forget every cached lookup (after a revocation).
    pub fn forget(&self) {
        self.cache.lock().unwrap().clear();
    }

    /// Who presented `header` at `now`. No header is [`Caller::Anonymous`]; a header that
    /// names no valid token is refused, saying why.
    pub async fn authenticate(
        &self,
        header: Option<&HeaderValue>,
        now: Timestamp,
    ) -> Result<Caller, Refusal> {
        let Some(header) = header else {
            return Ok(Caller::Anonymous);
        };
        let refuse = |why: &str| Refusal::Unauthenticated(why.to_string());
        let text = header
            .to_str()
            .map_err(|_| refuse("the Authorization header is not text"))?;
        let secret = text
            .strip_prefix("Bearer ")
            .ok_or_else(|| refuse("the Authorization header must be `Bearer <token>`"))?
            .trim();
        if !tokens::well_formed(secret) {
            return Err(refuse(
                "the token is malformed (TACC tokens start with `tacc_`); copy it again or \
                 ask an admin for a new one",
            ));
        }
        let hash = tokens::hash(secret);
        let cached = self.lookup(&hash).await.map_err(|e| {
            tracing::error!("token lookup failed: {e}");
            Refusal::Unavailable
        })?;
        let Some(token) = cached.token else {
            return Err(refuse("the token is not known to this server"));
        };
        if token.revoked_at.is_some() {
            return Err(refuse(&format!(
                "token {} was revoked; ask an admin for a new one",
                token.id
            )));
        }
        if !token.is_valid_at(now) {
            return Err(refuse(&format!(
                "token {} has expired; ask an admin for a new one",
                token.id
            )));
        }
        match token.kind {
            TokenKind::User => cached
                .user
                .map(Caller::User)
                .ok_or_else(|| refuse("the token's user no longer exists")),
            TokenKind::Node => token
                .node
                .map(|node| Caller::Node {
                    node,
                    token: token.id,
                })
                .ok_or_else(|| refuse("the node credential is bound to no node")),
            TokenKind::AgentJoin => Ok(Caller::Joiner { token: token.id }),
            TokenKind::Metrics => Ok(Caller::Scraper { token: token.id }),
        }
    }

    async fn lookup(&self, hash: &str) -> Result<Cached, tacc_store::StoreError> {
        if let Some(hit) = self.cache.lock().unwrap().get(hash) {
            if hit.at.elapsed() < CACHE_TTL {
                return Ok(hit.clone());
            }
        }
        let token = self.store.token_by_hash(hash).await?;
        let user = match token.as_ref() {
            Some(token) if token.kind == TokenKind::User => {
                let name = token.user.clone().unwrap_or_default();
                self.store.get_user(&name).await?.map(|user| UserCaller {
                    name: user.name,
                    group: user.group,
                    role: user.role,
                    token: token.id,
                })
            }
            _ => None,
        };
        let entry = Cached {
            token,
            user,
            at: Instant::now(),
        };
        let mut cache = self.cache.lock().unwrap();
        if cache.len() >= CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(hash.to_string(), entry.clone());
        Ok(entry)
    }

    /// The group of user `name` (cached: a user's group does not change).
    pub async fn group_of(&self, name: &str) -> Result<Option<String>, tacc_store::StoreError> {
        if let Some(group) = self.groups.lock().unwrap().get(name) {
            return Ok(group.clone());
        }
        let group = self.store.get_user(name).await?.and_then(|u| u.group);
        let mut groups = self.groups.lock().unwrap();
        if groups.len() >= CACHE_CAPACITY {
            groups.clear();
        }
        groups.insert(name.to_string(), group.clone());
        Ok(group)
    }
}
