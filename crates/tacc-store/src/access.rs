//! Records of who may use the cluster: users, API and node tokens (kept only as hashes),
//! per-user secrets (kept only encrypted), who committed which snapshot, and the audit
//! trail of security-relevant actions.

use tacc_core::{NodeId, Role, SnapshotId, Timestamp};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    pub name: String,
    pub group: Option<String>,
    pub role: Role,
    pub created_at: Timestamp,
}

/// What a token lets its bearer be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// A user's API token: the bearer acts as that user.
    User,
    /// An agent join token: lets a new node register once it is presented.
    AgentJoin,
    /// A node's credential, issued at registration and bound to that node.
    Node,
    /// A scrape token: reads the server's metrics (`GET /metrics`), nothing else.
    Metrics,
}

impl TokenKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::User => "user",
            TokenKind::AgentJoin => "agent_join",
            TokenKind::Node => "node",
            TokenKind::Metrics => "metrics",
        }
    }

    pub fn parse(text: &str) -> Option<TokenKind> {
        match text {
            "user" => Some(TokenKind::User),
            "agent_join" => Some(TokenKind::AgentJoin),
            "node" => Some(TokenKind::Node),
            "metrics" => Some(TokenKind::Metrics),
            _ => None,
        }
    }
}

/// A token to record. Only the hash of its secret is ever stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    pub kind: TokenKind,
    /// Lower-case hex of the SHA-256 of the token's secret.
    pub hash: String,
    /// The user it acts as (`User` tokens) or who issued it (`AgentJoin`, `Metrics`).
    pub user: Option<String>,
    /// The node it is bound to (`Node` tokens).
    pub node: Option<NodeId>,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    /// Free text shown in listings, e.g. "laptop" or "join token for rack 3".
    pub label: String,
    /// What an `AgentJoin` token may enrol (`None` for other kinds).
    pub join: Option<JoinScope>,
}

/// What a join token may enrol: at most `max_nodes` nodes (one by default: a stolen used
/// token enrols nothing), and only the node named `bound_node` when it is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinScope {
    pub bound_node: Option<String>,
    pub max_nodes: u32,
}

impl JoinScope {
    /// One node, any name: the default.
    pub fn single_use() -> JoinScope {
        JoinScope {
            bound_node: None,
            max_nodes: 1,
        }
    }
}

/// The answer to an enrolment with a join token ([`Store::enrol_node`](crate::Store::enrol_node)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enrolment {
    /// The use is recorded: the node may register.
    Admitted,
    /// The token is bound to another node name.
    BoundToOther { bound: String },
    /// The token already enrolled as many nodes as it may (these, oldest first).
    UsedUp {
        max_nodes: u32,
        enrolled: Vec<String>,
    },
    /// No join token has this id.
    NotJoinToken,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: u64,
    pub kind: TokenKind,
    pub hash: String,
    pub user: Option<String>,
    pub node: Option<NodeId>,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
    pub label: String,
    /// What an `AgentJoin` token may enrol (`None` for other kinds).
    pub join: Option<JoinScope>,
    /// How many nodes a join token has enrolled.
    pub enrolled: u32,
}

impl TokenRecord {
    /// Neither revoked nor expired at `now`.
    pub fn is_valid_at(&self, now: Timestamp) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|end| now < end)
    }
}

/// One line of the audit trail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAuditEntry {
    pub at: Timestamp,
    /// Who acted: `user:alice`, `node:3`, `anonymous`, `operator` (the data directory).
    pub actor: String,
    /// What was attempted, e.g. `user.add`, `token.revoke`, `auth.failed`, `report.rejected`.
    pub action: String,
    /// What it was done to, e.g. `user:bob`, `task:17`, `node:n2`.
    pub target: String,
    /// `ok` or `denied`.
    pub outcome: String,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub id: u64,
    pub at: Timestamp,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub outcome: String,
    pub detail: String,
}

/// A secret as stored: sealed with the server's key; the store never sees the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRecord {
    pub user: String,
    pub name: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
    pub updated_at: Timestamp,
}

/// Who committed (or offered) a snapshot: they may read it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotOwner {
    pub snapshot: SnapshotId,
    pub user: String,
}
