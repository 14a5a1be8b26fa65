//! `Idempotency-Key` on the mutating user routes (submit, pipeline submit, cancel, rerun):
//! the same key with the same request gets the first reply again and does no new work;
//! the same key with another request is a 409. The key is committed with the work it
//! acknowledges (see `tacc_store::Keyed`), so a retry after a lost reply finds it. Keys
//! are per user and kept 24 hours (`tacc_store::KEY_LIFETIME_MS`).

use sha2::{Digest, Sha256};
use tacc_store::{IdempotencyKey, KeptReply, Keyed, RenderReply, StoreError, StoredReply};

use super::prelude::*;
use crate::control::now;

/// The request header a client names its key in.
pub(crate) const HEADER: &str = "idempotency-key";
/// Longest key accepted (a UUID is 36).
pub(crate) const MAX_KEY_LEN: usize = 255;

/// A key a request carried, with what identifies the request.
#[derive(Debug, Clone)]
pub(super) struct RequestKey {
    key: IdempotencyKey,
}

impl RequestKey {
    /// The request's key, if it sent one: at most [`MAX_KEY_LEN`] printable ASCII
    /// characters, else 400. `route` is the route as declared (`POST /v1/tasks`),
    /// `request` what identifies the request (body, path parameters).
    pub(super) fn from_request(
        headers: &HeaderMap,
        user: &str,
        route: &str,
        request: &[u8],
    ) -> ApiResult<Option<Self>> {
        let Some(value) = headers.get(HEADER) else {
            return Ok(None);
        };
        let key = value
            .to_str()
            .ok()
            .filter(|k| {
                !k.is_empty()
                    && k.len() <= MAX_KEY_LEN
                    && k.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
            })
            .ok_or_else(|| {
                ServerError::BadRequest(format!(
                    "the Idempotency-Key header must be 1 to {MAX_KEY_LEN} printable ASCII \
                     characters; use a fresh UUID per request (tcloud does this for you)"
                ))
            })?;
        let mut hash = Sha256::new();
        hash.update(route.as_bytes());
        hash.update([0]);
        hash.update(request);
        Ok(Some(Self {
            key: IdempotencyKey {
                user: user.to_string(),
                key: key.to_string(),
                route: route.to_string(),
                request_hash: hash.finalize().iter().map(|b| format!("{b:02x}")).collect(),
                created_at: now(),
            },
        }))
    }

    /// The kept reply to send again, or a 409 when the key was used for another request;
    /// `None` when the key is new (or expired).
    pub(super) async fn replay(&self, control: &Control) -> ApiResult<Option<Response>> {
        let kept = control
            .store
            .kept_reply(&self.key.user, &self.key.key, now())
            .await?;
        kept.map(|kept| self.reply_from(kept)).transpose()
    }

    fn reply_from(&self, kept: KeptReply) -> ApiResult<Response> {
        if kept.key.route != self.key.route || kept.key.request_hash != self.key.request_hash {
            return Err(ServerError::Conflict(format!(
                "the Idempotency-Key `{}` was already used for another request ({}); use a \
                 new key for a new request",
                self.key.key, kept.key.route
            )));
        }
        let status = StatusCode::from_u16(kept.reply.status)
            .map_err(|e| ServerError::Internal(format!("kept reply status: {e}")))?;
        let mut response = (status, Json(kept.reply.body)).into_response();
        response
            .headers_mut()
            .insert("idempotent-replay", HeaderValue::from_static("true"));
        Ok(response)
    }

    /// The key to commit with the work, its reply rendered by `render`.
    pub(super) fn keyed(&self, render: RenderReply) -> Keyed {
        Keyed {
            key: self.key.clone(),
            render,
        }
    }

    /// Keep `reply` on its own (work idempotent by itself, such as a cancel).
    pub(super) async fn keep(&self, control: &Control, reply: StoredReply) -> ApiResult<()> {
        match control
            .store
            .keep_reply(KeptReply {
                key: self.key.clone(),
                reply,
            })
            .await
        {
            Err(StoreError::AlreadyExists { .. }) => Ok(()),
            other => Ok(other?),
        }
    }

    /// What to answer when the keyed work failed: a concurrent request with the same key
    /// won the race (its reply, or a 409), else the error itself.
    pub(super) async fn after_failure(
        &self,
        control: &Control,
        error: ServerError,
    ) -> ApiResult<Response> {
        if matches!(
            error,
            ServerError::Store(StoreError::AlreadyExists {
                what: "idempotency key",
                ..
            })
        ) && let Some(reply) = self.replay(control).await?
        {
            return Ok(reply);
        }
        Err(error)
    }
}

/// A JSON reply to keep: status and serialised body.
pub(super) fn stored<T: serde::Serialize>(status: StatusCode, body: &T) -> StoredReply {
    StoredReply {
        status: status.as_u16(),
        body: serde_json::to_value(body).unwrap_or(serde_json::Value::Null),
    }
}
