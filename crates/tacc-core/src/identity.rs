//! Who may do what: the roles an authenticated user holds.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::CoreError;

/// A user's role. Each role includes the rights of the ones before it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Sees and acts on their own tasks, snapshots and secrets.
    User,
    /// Also sees and acts on the tasks of every member of their group.
    GroupAdmin,
    /// Sees and acts on everything, manages users, tokens and nodes.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::User, Role::GroupAdmin, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::GroupAdmin => "group_admin",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.replace('-', "_").as_str() {
            "user" => Ok(Role::User),
            "group_admin" => Ok(Role::GroupAdmin),
            "admin" => Ok(Role::Admin),
            _ => Err(CoreError::UnknownName {
                kind: "role",
                input: s.to_string(),
                expected: "user, group_admin, admin",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_and_order() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
        }
        assert_eq!("group-admin".parse::<Role>().unwrap(), Role::GroupAdmin);
        assert!(Role::Admin > Role::GroupAdmin && Role::GroupAdmin > Role::User);
        assert!(
            "root"
                .parse::<Role>()
                .unwrap_err()
                .to_string()
                .contains("expected one of")
        );
    }
}
