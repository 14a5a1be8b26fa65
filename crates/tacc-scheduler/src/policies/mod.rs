//! Built-in policies, one file each. To add one: write `policies/my_policy.rs` with a
//! `pub const ENTRY: PolicyEntry`, and add `my_policy,` to the list below.

use crate::policy::PolicyEntry;

macro_rules! register_policies {
    ($($module:ident),* $(,)?) => {
        $(pub mod $module;)*
        /// Every registered policy, in the order `--policy` help lists them.
        pub const POLICIES: &[PolicyEntry] = &[$($module::ENTRY),*];
    };
}

register_policies! {
    fifo,
    fifo_backfill,
    fairshare,
    drf,
    sjf,
    las2d,
}

/// Weight that makes the priority class dominate every other factor of a rank.
pub(crate) const CLASS_STEP: i64 = 1 << 48;
