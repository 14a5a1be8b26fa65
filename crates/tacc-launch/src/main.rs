//! `tacc-launch launch …`: the launcher alone (see the crate `tacc_launch`), installed
//! beside `taccd`. The agent starts each execution of a root agent through it: a small
//! program starts in a fraction of the time `taccd` (tens of MiB to map and relocate)
//! takes, and every trivial task pays that start once. Where it is missing the agent
//! uses `taccd launch …`, the same code.

fn main() {
    if !tacc_launch::requested() {
        eprintln!(
            "tacc-launch is started by the TACC agent, not by people: \
             tacc-launch launch [--join] [--direct] [--tmp T --shm S [--keep K]] \
             [--uid U --gid G] --chdir DIR -- PROGRAM ARGS…"
        );
        std::process::exit(2);
    }
    tacc_launch::main()
}
