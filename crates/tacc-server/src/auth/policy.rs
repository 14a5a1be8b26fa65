//! Who may use which route: every route declares one [`Access`] rule, and [`decide`] is the
//! only place that compares a caller with a rule. Object-level rules (whose task is it?)
//! are answered by [`may_act_for`], which the route check and list filters both use.

use tacc_core::{NodeId, Role};

/// The caller of a request, as authenticated from its bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No token: only public routes.
    Anonymous,
    User(UserCaller),
    /// A node agent, with the credential bound to its node.
    Node {
        node: NodeId,
        token: u64,
    },
    /// A join token: may register a new node, nothing else.
    Joiner {
        token: u64,
    },
    /// A scrape token (`taccd admin metrics-token`): may read the metrics, nothing else.
    Scraper {
        token: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserCaller {
    pub name: String,
    pub group: Option<String>,
    pub role: Role,
    pub token: u64,
}

impl Caller {
    /// How the audit trail names the caller.
    pub fn audit_name(&self) -> String {
        match self {
            Caller::Anonymous => "anonymous".into(),
            Caller::User(user) => format!("user:{}", user.name),
            Caller::Node { node, .. } => format!("node:{node}"),
            Caller::Joiner { token } => format!("join-token:{token}"),
            Caller::Scraper { token } => format!("metrics-token:{token}"),
        }
    }

    pub fn user(&self) -> Option<&UserCaller> {
        match self {
            Caller::User(user) => Some(user),
            _ => None,
        }
    }
}

/// What a route requires of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Anyone, without a token.
    Public,
    /// Any user; the handler limits what it shows or changes to the caller's own.
    User,
    /// The `{id}` task's owner, their group's admin, or an admin; others get 404.
    Task,
    /// Entering the `{id}` task (an interactive session): as [`Access::Task`], and a node
    /// credential too is told the task does not exist (a node has no business inside
    /// tasks, and must not learn which exist).
    TaskSession,
    /// The `{id}` task group's owner, their group's admin, or an admin; others get 404.
    Group,
    /// A user who may read a task using the `{id}` snapshot or who committed it, or a node
    /// running an attempt on it; others get 404.
    Snapshot,
    /// A node running an attempt whose snapshot holds the `{hash}` chunk, or an admin.
    Chunk,
    /// Admins only.
    Admin,
    /// A join token, or a node's own credential (re-registration).
    Register,
    /// The node whose credential it is, for its own `{node}` only.
    OwnNode,
    /// A scrape token (what a Prometheus server presents), or an admin.
    Metrics,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 401: no usable credential.
    Unauthenticated(String),
    /// 403: authenticated, not allowed.
    Forbidden(String),
    /// 503: the credential could not be checked (the database is unavailable).
    Unavailable,
}

/// The route-level decision; object checks (`Task`, `Snapshot`, `Chunk`) need the object
/// and happen after it was loaded, through [`may_act_for`] and the node's attempts (an
/// object that is not the caller's then answers 404, so its existence is not revealed).
pub fn decide(caller: &Caller, access: Access) -> Result<(), Refusal> {
    let unauthenticated = || {
        Refusal::Unauthenticated(
            "this request needs a token: run `tcloud login` (or `tcloud up` for the local \
             cluster), or send `Authorization: Bearer <token>`"
                .into(),
        )
    };
    match (access, caller) {
        (Access::Public, _) => Ok(()),
        (_, Caller::Anonymous) => Err(unauthenticated()),
        (
            Access::User | Access::Task | Access::TaskSession | Access::Group | Access::Snapshot,
            Caller::User(_),
        ) => Ok(()),
        (Access::Metrics, Caller::Scraper { .. }) => Ok(()),
        (Access::Admin | Access::Chunk | Access::Metrics, Caller::User(user))
            if user.role == Role::Admin =>
        {
            Ok(())
        }
        (Access::Metrics, Caller::User(user)) => Err(Refusal::Forbidden(format!(
            "user {} is not an admin; the metrics are read with a scrape token \
             (`taccd admin metrics-token`) or an admin's token",
            user.name
        ))),
        (Access::Admin | Access::Chunk, Caller::User(user)) => Err(Refusal::Forbidden(format!(
            "user {} is not an admin; ask an admin to do this",
            user.name
        ))),
        (Access::Register, Caller::Joiner { .. } | Caller::Node { .. }) => Ok(()),
        // The object check hides the task from a node (404).
        (
            Access::OwnNode | Access::Snapshot | Access::Chunk | Access::TaskSession,
            Caller::Node { .. },
        ) => Ok(()),
        (Access::Register | Access::OwnNode, Caller::User(_)) => Err(Refusal::Forbidden(
            "agent routes need a node credential: enrol the node with a join token (`taccd agent --token-file FILE`)".into(),
        )),
        (_, Caller::Node { .. }) => Err(Refusal::Forbidden(
            "a node credential may only be used for the agent protocol".into(),
        )),
        (_, Caller::Joiner { .. }) => Err(Refusal::Forbidden(
            "a join token may only register a node".into(),
        )),
        (_, Caller::Scraper { .. }) => Err(Refusal::Forbidden(
            "a metrics token may only read GET /metrics".into(),
        )),
    }
}

/// Whether `user` may see and act on what belongs to `owner` (whose group is
/// `owner_group`): their own, their group's as its admin, everything as an admin.
pub fn may_act_for(user: &UserCaller, owner: &str, owner_group: Option<&str>) -> bool {
    match user.role {
        Role::Admin => true,
        Role::GroupAdmin => {
            user.name == owner || (user.group.is_some() && user.group.as_deref() == owner_group)
        }
        Role::User => user.name == owner,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, group: Option<&str>, role: Role) -> Caller {
        Caller::User(UserCaller {
            name: name.into(),
            group: group.map(Into::into),
            role,
            token: 1,
        })
    }

    #[test]
    fn anonymous_callers_reach_only_public_routes() {
        assert_eq!(decide(&Caller::Anonymous, Access::Public), Ok(()));
        for access in [
            Access::User,
            Access::Task,
            Access::TaskSession,
            Access::Group,
            Access::Snapshot,
            Access::Chunk,
            Access::Admin,
            Access::Register,
            Access::OwnNode,
            Access::Metrics,
        ] {
            assert!(matches!(
                decide(&Caller::Anonymous, access),
                Err(Refusal::Unauthenticated(_))
            ));
        }
    }

    #[test]
    fn users_are_kept_off_admin_and_agent_routes() {
        let alice = user("alice", None, Role::User);
        assert_eq!(decide(&alice, Access::User), Ok(()));
        assert!(matches!(
            decide(&alice, Access::Admin),
            Err(Refusal::Forbidden(_))
        ));
        assert!(matches!(
            decide(&alice, Access::Register),
            Err(Refusal::Forbidden(_))
        ));
        assert!(matches!(
            decide(&alice, Access::OwnNode),
            Err(Refusal::Forbidden(_))
        ));
        let root = user("root", None, Role::Admin);
        assert_eq!(decide(&root, Access::Admin), Ok(()));
        assert!(matches!(
            decide(&root, Access::OwnNode),
            Err(Refusal::Forbidden(_))
        ));
    }

    #[test]
    fn node_and_join_credentials_stay_in_the_agent_protocol() {
        let node = Caller::Node {
            node: NodeId(1),
            token: 2,
        };
        assert_eq!(decide(&node, Access::OwnNode), Ok(()));
        assert_eq!(decide(&node, Access::Register), Ok(()));
        assert!(matches!(
            decide(&node, Access::User),
            Err(Refusal::Forbidden(_))
        ));
        assert!(matches!(
            decide(&node, Access::Admin),
            Err(Refusal::Forbidden(_))
        ));
        // A task route answers a node 403; a session route lets it through to the object
        // check, which tells it the task does not exist (404), as it tells another user.
        assert!(matches!(
            decide(&node, Access::Task),
            Err(Refusal::Forbidden(_))
        ));
        assert_eq!(decide(&node, Access::TaskSession), Ok(()));
        let joiner = Caller::Joiner { token: 3 };
        assert_eq!(decide(&joiner, Access::Register), Ok(()));
        assert!(matches!(
            decide(&joiner, Access::OwnNode),
            Err(Refusal::Forbidden(_))
        ));
        assert!(matches!(
            decide(&joiner, Access::User),
            Err(Refusal::Forbidden(_))
        ));
    }

    #[test]
    fn metrics_are_for_scrape_tokens_and_admins_and_scrape_tokens_for_metrics_only() {
        let scraper = Caller::Scraper { token: 4 };
        assert_eq!(decide(&scraper, Access::Metrics), Ok(()));
        for access in [
            Access::Public,
            Access::User,
            Access::Task,
            Access::TaskSession,
            Access::Snapshot,
            Access::Chunk,
            Access::Admin,
            Access::Register,
            Access::OwnNode,
        ] {
            let decided = decide(&scraper, access);
            if access == Access::Public {
                assert_eq!(decided, Ok(()));
            } else {
                assert!(matches!(decided, Err(Refusal::Forbidden(_))), "{access:?}");
            }
        }
        assert_eq!(
            decide(&user("root", None, Role::Admin), Access::Metrics),
            Ok(())
        );
        for role in [Role::User, Role::GroupAdmin] {
            assert!(matches!(
                decide(&user("alice", Some("vision"), role), Access::Metrics),
                Err(Refusal::Forbidden(_))
            ));
        }
        let node = Caller::Node {
            node: NodeId(1),
            token: 2,
        };
        assert!(matches!(
            decide(&node, Access::Metrics),
            Err(Refusal::Forbidden(_))
        ));
        assert!(matches!(
            decide(&Caller::Joiner { token: 3 }, Access::Metrics),
            Err(Refusal::Forbidden(_))
        ));
    }

    #[test]
    fn ownership_follows_roles_and_groups() {
        let Caller::User(alice) = user("alice", Some("vision"), Role::User) else {
            unreachable!()
        };
        let Caller::User(lead) = user("lead", Some("vision"), Role::GroupAdmin) else {
            unreachable!()
        };
        let Caller::User(admin) = user("root", None, Role::Admin) else {
            unreachable!()
        };
        assert!(may_act_for(&alice, "alice", Some("vision")));
        assert!(!may_act_for(&alice, "bob", Some("vision")));
        assert!(may_act_for(&lead, "bob", Some("vision")));
        assert!(!may_act_for(&lead, "carol", Some("nlp")));
        assert!(!may_act_for(&lead, "dave", None));
        assert!(may_act_for(&admin, "carol", Some("nlp")));
    }
}
