//! The launcher alone (`tacc-launch launch …`, see `tacc_exec::launcher`): what this
//! crate's tests start executions through. On a node the agent's own binary is the
//! launcher (`taccd launch …`).

fn main() {
    if !tacc_exec::launcher::requested() {
        eprintln!("usage: tacc-launch launch [--join] [--direct] [--tmp T --shm S [--keep K]] [--uid U --gid G] --chdir DIR -- PROGRAM ARGS…");
        std::process::exit(2);
    }
    tacc_exec::launcher::main()
}
