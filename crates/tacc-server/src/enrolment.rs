//! Enrolment: who may register a node, and as what. A new node enrols with a join token,
//! which enrols a bounded number of nodes (one by default) and, when bound, one name
//! only; the use is recorded in the store before the node exists, so a stolen used token
//! enrols nothing. A node restarting with its own credential keeps its name and may offer
//! at most the capacity it enrolled with: a node that wants to change either enrols again
//! with a new join token bound to its name. Where the operator requires approval, a node
//! that enrols waits, with no work (so no task and no secret reaches it), until an admin
//! approves it.

use std::sync::Arc;

use tacc_core::Resources;
use tacc_proto::RegisterAgent;
use tacc_store::{Enrolment, NodeEnrolment, NodeRecord, Store, TokenKind};

use crate::auth::{AuditTrail, Authenticator, Caller};
use crate::{Control, ServerError};

/// How a registration was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// A node restarting with its own credential: nothing about its enrolment changes.
    Restart,
    /// A node enrolling with a join token: it is issued a credential (any earlier
    /// credential of the same name is revoked).
    Enrol(NodeEnrolment),
}

/// What of `offered` goes beyond `enrolled`, in words; `None` when nothing does.
pub(crate) fn grown_beyond(enrolled: &Resources, offered: &Resources) -> Option<String> {
    let mut grown = Vec::new();
    if offered.cpu_millis > enrolled.cpu_millis {
        grown.push(format!(
            "{} CPUs (enrolled with {})",
            offered.cpu_millis as f64 / 1000.0,
            enrolled.cpu_millis as f64 / 1000.0
        ));
    }
    if offered.memory_bytes > enrolled.memory_bytes {
        grown.push(format!(
            "{} of memory (enrolled with {})",
            tacc_core::ByteSize::from_bytes(offered.memory_bytes),
            tacc_core::ByteSize::from_bytes(enrolled.memory_bytes)
        ));
    }
    if offered.gpus > enrolled.gpus {
        grown.push(format!(
            "{} GPUs (enrolled with {})",
            offered.gpus, enrolled.gpus
        ));
    }
    (!grown.is_empty()).then(|| grown.join(", "))
}

/// How to enrol a node again under `name`.
fn reenrol_hint(name: &str) -> String {
    format!(
        "enrol it again: an admin issues `taccd admin agent-token --node {name}` (or `tcloud \
         admin agent-token --node {name}`), and the agent is started with that token \
         (`--token-file FILE`, `--token-file -` for stdin, or TACC_JOIN_TOKEN)"
    )
}

/// Who may register a node, and the credentials of enrolled nodes.
#[derive(Debug, Clone)]
pub(crate) struct Enrolments {
    store: Arc<dyn Store>,
    audit: Arc<AuditTrail>,
    /// Forgets revoked credentials at once.
    auth: Arc<Authenticator>,
    /// Enrolled nodes wait for an admin's approval (`--require-node-approval`).
    require_approval: bool,
}

impl Enrolments {
    /// The enrolment of `control`'s store, audit trail and authenticator, as configured.
    pub(crate) fn of(control: &Control) -> Enrolments {
        Enrolments {
            store: control.store.clone(),
            audit: control.audit.clone(),
            auth: control.auth.clone(),
            require_approval: control.config.require_node_approval,
        }
    }

    /// May `caller` register `registration`, and as what?
    pub(crate) async fn admit_registration(
        &self,
        caller: &Caller,
        registration: &RegisterAgent,
    ) -> Result<Admission, ServerError> {
        let existing: Option<NodeRecord> = self
            .store
            .list_nodes()
            .await?
            .into_iter()
            .find(|n| n.name == registration.name);
        let refuse = |why: String| {
            self.audit.record(
                caller,
                "node.register",
                format!("node:{}", registration.name),
                false,
                why,
            );
        };
        match caller {
            Caller::Node { node, .. } => match existing {
                Some(record) if record.id == *node => {
                    if let Some(grown) =
                        grown_beyond(&record.enrolled_capacity, &registration.capacity)
                    {
                        refuse(format!("capacity grew without a new enrolment: {grown}"));
                        return Err(ServerError::ReenrolRequired(format!(
                            "node `{}` now offers {grown}: a node's capacity may not grow \
                             without a new enrolment; {}",
                            registration.name,
                            reenrol_hint(&registration.name)
                        )));
                    }
                    Ok(Admission::Restart)
                }
                _ => {
                    let enrolled_as = self
                        .store
                        .list_nodes()
                        .await?
                        .into_iter()
                        .find(|n| n.id == *node)
                        .map_or_else(|| format!("node {node}"), |n| format!("node `{}`", n.name));
                    refuse("a node credential tried to register another node's name".into());
                    Err(ServerError::ReenrolRequired(format!(
                        "this credential belongs to {enrolled_as}, not to `{}`: a node's name \
                         does not change without a new enrolment; {}",
                        registration.name,
                        reenrol_hint(&registration.name)
                    )))
                }
            },
            Caller::Joiner { token } => {
                let scope = self
                    .store
                    .get_token(*token)
                    .await?
                    .and_then(|t| t.join)
                    .unwrap_or_else(tacc_store::JoinScope::single_use);
                let bound_here = scope.bound_node.as_deref() == Some(registration.name.as_str());
                if let Some(record) = &existing
                    && !bound_here
                    && self.holds_valid_credential(record).await?
                {
                    refuse("a join token tried to take over a registered node's name".into());
                    return Err(ServerError::Conflict(format!(
                        "node `{}` is already registered with its own credential; a \
                         restarted agent keeps using that credential (its data \
                         directory's node.token). To enrol the machine again (new hardware, \
                         a replaced machine), use a join token bound to its name: `taccd \
                         admin agent-token --node {}`",
                        registration.name, registration.name
                    )));
                }
                match self
                    .store
                    .enrol_node(*token, &registration.name, crate::now())
                    .await?
                {
                    Enrolment::Admitted => Ok(Admission::Enrol(NodeEnrolment {
                        pending: self.require_approval,
                    })),
                    Enrolment::BoundToOther { bound } => {
                        refuse(format!("the join token is bound to node {bound}"));
                        Err(ServerError::Forbidden(format!(
                            "this join token enrols node `{bound}` only, not `{}`: ask an \
                             admin for a token for this node (`taccd admin agent-token \
                             --node {}`)",
                            registration.name, registration.name
                        )))
                    }
                    Enrolment::UsedUp {
                        max_nodes,
                        enrolled,
                    } => {
                        refuse(format!(
                            "the join token was already used (it enrolled {})",
                            enrolled.join(", ")
                        ));
                        Err(ServerError::Forbidden(format!(
                            "this join token was already used: it enrols at most {max_nodes} \
                             node(s) and enrolled {}. Ask an admin for a new one (`taccd \
                             admin agent-token`); a node that enrolled keeps its own \
                             credential in its data directory's node.token",
                            enrolled.join(", ")
                        )))
                    }
                    Enrolment::NotJoinToken => Err(ServerError::Unauthenticated(
                        "the join token is not known to this server; ask an admin for a new \
                         one (`taccd admin agent-token`)"
                            .into(),
                    )),
                }
            }
            _ => Err(ServerError::Forbidden(
                "registering a node needs a join token (`taccd admin agent-token`)".into(),
            )),
        }
    }

    async fn holds_valid_credential(&self, record: &NodeRecord) -> Result<bool, ServerError> {
        let now = crate::now();
        Ok(self
            .store
            .list_tokens(None)
            .await?
            .into_iter()
            .any(|t| t.kind == TokenKind::Node && t.node == Some(record.id) && t.is_valid_at(now)))
    }

    /// Issue the credential of a node that enrolled with a join token; an earlier
    /// credential of the node (a re-enrolment) stops working.
    pub(crate) async fn issue_node_credential(
        &self,
        caller: &Caller,
        record: &NodeRecord,
    ) -> Result<String, ServerError> {
        let now = crate::now();
        let mut revoked = 0;
        for token in self.store.list_tokens(None).await? {
            if token.kind == TokenKind::Node
                && token.node == Some(record.id)
                && token.revoked_at.is_none()
            {
                self.store.revoke_token(token.id, now).await?;
                revoked += 1;
            }
        }
        if revoked > 0 {
            self.auth.forget();
        }
        let issued =
            crate::accounts::issue_node_token(self.store.as_ref(), record.id, &record.name, now)
                .await?;
        // Recorded after, to name the credential: if the record cannot be written, the
        // credential is revoked (its secret is only in the answer, which is then an error).
        let recorded = self
            .audit
            .commit(
                caller,
                "node.register",
                format!("node:{}", record.name),
                format!(
                    "node {} enrolled{}, issued credential {}{}",
                    record.id,
                    if record.pending {
                        " (pending approval)"
                    } else {
                        ""
                    },
                    issued.record.id,
                    if revoked > 0 {
                        format!("; its {revoked} earlier credential(s) revoked")
                    } else {
                        String::new()
                    }
                ),
            )
            .await;
        if let Err(error) = recorded {
            if let Err(e) = self.store.revoke_token(issued.record.id, now).await {
                tracing::error!(
                    "cannot revoke node credential {}, whose issue was not audited: {e}",
                    issued.record.id
                );
            }
            return Err(error);
        }
        Ok(issued.secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_named_per_measure_and_shrinking_is_not_growth() {
        let enrolled = Resources::new(4000, 8 << 30, 0);
        assert_eq!(grown_beyond(&enrolled, &enrolled), None);
        assert_eq!(
            grown_beyond(&enrolled, &Resources::new(2000, 4 << 30, 0)),
            None
        );
        let grown = grown_beyond(&enrolled, &Resources::new(16_000, 64 << 30, 1)).unwrap();
        assert!(grown.contains("16 CPUs (enrolled with 4)"), "{grown}");
        assert!(grown.contains("memory"), "{grown}");
        assert!(grown.contains("1 GPUs (enrolled with 0)"), "{grown}");
    }
}
