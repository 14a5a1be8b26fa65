//! `taccd private-tmp --tmp T --shm S [--keep K] -- PROGRAM ARGS…`: the program the process
//! runtime starts each task execution through on a root agent (see
//! `tacc_exec::PrivateTmp`): a mount namespace of its own with `T` on `/tmp` and `S` on
//! `/dev/shm`, then `exec` of PROGRAM (the identity switch, then the task's shell). Run
//! before anything else of `main`, so the task keeps the umask and everything else the
//! agent gave it. Not for people: hidden from `--help`.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "taccd private-tmp")]
struct Args {
    #[arg(long)]
    tmp: PathBuf,
    #[arg(long)]
    shm: PathBuf,
    #[arg(long)]
    keep: Option<PathBuf>,
    #[arg(last = true, required = true)]
    command: Vec<OsString>,
}

/// Whether this process was started as the helper.
pub fn requested() -> bool {
    std::env::args_os().nth(1).as_deref()
        == Some(std::ffi::OsStr::new(tacc_exec::PRIVATE_TMP_SUBCOMMAND))
}

/// Mount, then become PROGRAM; on failure say why (into the task's log) and exit 125, as
/// the cgroup join does, before anything of the task ran.
pub fn run() -> ! {
    let args = Args::parse_from(std::env::args_os().skip(1));
    let error =
        tacc_exec::enter_private_tmp(&args.tmp, &args.shm, args.keep.as_deref(), &args.command);
    eprintln!("tacc: cannot give the task a private /tmp and /dev/shm: {error}");
    std::process::exit(125);
}
