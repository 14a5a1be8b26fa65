//! Rebuild when a migration is added or changed: `sqlx::migrate!` embeds the files at
//! compile time but does not tell cargo to watch them.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
