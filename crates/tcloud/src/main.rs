//! `tcloud`: the user's CLI of TACC. Researchers check and submit task files, watch their
//! tasks (`ps`, `show`, `logs`), cancel them, download their outputs, switch between
//! clusters with config profiles, and start a single-machine cluster with `tcloud up`.
//!
//! It is a thin binary over `tacc-client` (all HTTP), `tacc-schema` (reading task files)
//! and `tacc-compiler` (code snapshots). It must not depend on `tacc-server`,
//! `tacc-store`, `tacc-scheduler` or `tacc-exec`: it talks to a cluster only through the
//! HTTP API, and `tcloud up` runs the separate `taccd` binary.

mod commands;
mod config;
mod errors;
mod format;
mod upload;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tacc_core::{TaskId, TaskState};

/// Accepts `12` and `#12`.
fn parse_task_id(text: &str) -> Result<TaskId, String> {
    text.parse::<TaskId>().map_err(|e| e.to_string())
}

fn parse_state(text: &str) -> Result<TaskState, String> {
    text.trim().parse::<TaskState>().map_err(|e| e.to_string())
}

#[derive(Debug, Parser)]
#[command(
    name = "tcloud",
    version,
    about = "Submit and manage machine-learning tasks on a TACC cluster",
    long_about = "tcloud ships your code to a TACC cluster, runs it as a task, streams its \
logs and fetches its outputs.\n\nA task is described by one task file (task.yaml). Start \
with `tcloud quickstart`, run a cluster on this machine with `tcloud up`, then \
`tcloud submit DIR -f`.",
    after_help = "Examples:\n  tcloud quickstart && tcloud up && tcloud submit tacc-quickstart -f\n  tcloud ps --all\n  tcloud logs -f 12\n\nConfiguration: $TACC_HOME/config.toml (see `tcloud config --help`).",
    after_long_help = concat!(
        "Examples:\n  tcloud quickstart && tcloud up && tcloud submit tacc-quickstart -f\n  tcloud ps --all\n  tcloud logs -f 12\n\n",
        "Environment:\n  TACC_SERVER  server URL, overrides the current profile (same as --server)\n  TACC_HOME    directory holding config.toml and the local cluster's data\n  TACC_TACCD   path of the taccd binary `tcloud up` starts\n\n",
        "Exit codes:\n  0  success\n  1  other failure\n  2  invalid input (bad task file or arguments)\n  3  the server cannot be reached\n  4  not found (unknown task id)\n  5  the task ran but did not succeed (submit -f, logs -f)"
    )
)]
struct Cli {
    /// Server URL; overrides the current cluster profile.
    #[arg(long, global = true, env = "TACC_SERVER", value_name = "URL")]
    server: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a task file and upload its code and run it
    #[command(
        long_about = "Reads the task file (a directory's task.yaml, task.yml, tacc.yaml or legacy \
tuxiv.conf, or the file given), snapshots its code directory, uploads only the chunks the \
server lacks, and queues the task. Nothing is uploaded if the task file is invalid.",
        after_help = "Examples:\n  tcloud submit                 # task.yaml in this directory\n  tcloud submit examples/mnist -f\n  tcloud submit train.yaml --name sweep-3 --json"
    )]
    Submit {
        /// Task file, or the directory holding it
        #[arg(default_value = ".")]
        path: PathBuf,
        /// Stream the logs and exit with the task's outcome (0 succeeded, 5 otherwise)
        #[arg(short, long)]
        follow: bool,
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
        /// Override the task's name
        #[arg(long)]
        name: Option<String>,
    },
    /// Validate a task file without submitting it
    #[command(
        long_about = "Parses and validates a task file exactly as `tcloud submit` would, and \
prints a summary or a diagnostic pointing at the offending line. Needs no server.",
        after_help = "Examples:\n  tcloud check\n  tcloud check examples/mnist/task.yaml --json"
    )]
    Check {
        #[arg(default_value = ".")]
        path: PathBuf,
        /// Print {\"valid\", \"name\", \"warnings\", \"error\"} as JSON
        #[arg(long)]
        json: bool,
    },
    /// List tasks
    #[command(
        long_about = "Lists tasks. By default only unfinished ones (queued, starting, running); \
--all shows every state (the newest 50 unless --limit).",
        after_help = "Examples:\n  tcloud ps\n  tcloud ps -a --user alice\n  tcloud ps --state failed,lost --limit 10 --json"
    )]
    Ps {
        /// Every state, not just unfinished tasks
        #[arg(short, long)]
        all: bool,
        /// Only these states (comma separated): queued, starting, running, succeeded, failed, cancelled, lost
        #[arg(long, value_name = "S[,S]", value_delimiter = ',', value_parser = parse_state)]
        state: Vec<TaskState>,
        /// Only this user's tasks
        #[arg(long)]
        user: Option<String>,
        /// At most N tasks
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Show one task in detail: state, resources, history, outputs
    #[command(
        after_help = "Examples:\n  tcloud show 12\n  tcloud show 12 --json\n  tcloud show 12 --instruction"
    )]
    Show {
        #[arg(value_parser = parse_task_id)]
        id: TaskId,
        /// The task and its events and outputs as one JSON object
        #[arg(long)]
        json: bool,
        /// Print the compiled instruction (what the nodes run) as JSON
        #[arg(long, conflicts_with = "json")]
        instruction: bool,
    },
    /// Explain why a task waits (or ran, or ended) and when it may start
    #[command(
        long_about = "Explains a task's state: the scheduler's pending reason, its place in the \
queue, the estimated start from the reservation timeline (known when the tasks ahead have a \
time limit), the group and limits that apply, and the scheduling policy in force.",
        after_help = "Examples:\n  tcloud why 12\n  tcloud why 12 --json"
    )]
    Why {
        #[arg(value_parser = parse_task_id)]
        id: TaskId,
        /// Print the explanation as one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Print a task's log
    #[command(
        long_about = "Prints a task's log (all nodes). With -f, keeps streaming until the task \
ends, reconnecting if the server restarts, and exits 0 if the task succeeded, 5 otherwise.",
        after_help = "Examples:\n  tcloud logs 12\n  tcloud logs -f 12"
    )]
    Logs {
        #[arg(value_parser = parse_task_id)]
        id: TaskId,
        /// Stream until the task ends
        #[arg(short, long)]
        follow: bool,
    },
    /// Cancel tasks
    #[command(
        long_about = "Asks the server to cancel each task and, unless --no-wait, waits (up to \
30 s) until each has stopped. Unknown ids are reported (exit 4) but the others are still cancelled.",
        after_help = "Examples:\n  tcloud cancel 12\n  tcloud cancel 12 13 14 --no-wait"
    )]
    Cancel {
        #[arg(required = true, value_parser = parse_task_id)]
        ids: Vec<TaskId>,
        /// Return once the request is accepted
        #[arg(long)]
        no_wait: bool,
        #[arg(long)]
        json: bool,
    },
    /// Download a task's outputs
    #[command(
        long_about = "Fetches the files a task kept (its `outputs:`) from the latest attempt, \
or the one given, into DEST (default ./tacc-outputs/ID/).",
        after_help = "Examples:\n  tcloud download 12\n  tcloud download 12 results/ --attempt 1"
    )]
    Download {
        #[arg(value_parser = parse_task_id)]
        id: TaskId,
        dest: Option<PathBuf>,
        /// Which attempt's outputs (default: the latest that has any)
        #[arg(long, value_name = "N")]
        attempt: Option<u32>,
    },
    /// Submit a task again: same code snapshot, environment and datasets, new task id
    #[command(
        long_about = "Submits the task again exactly as it was: the same code snapshot (nothing \
is uploaded), the same environment spec and the same datasets (registered names were resolved \
when the task was first submitted). The new task gets a new id.",
        after_help = "Examples:\n  tcloud rerun 12\n  tcloud rerun 12 -f\n  tcloud rerun 12 --json"
    )]
    Rerun {
        #[arg(value_parser = parse_task_id)]
        id: TaskId,
        /// Stream the new task's log and exit with its outcome (0 succeeded, 5 otherwise)
        #[arg(short, long)]
        follow: bool,
        /// Print {\"task_id\", \"rerun_of\", \"state\"} as JSON
        #[arg(long)]
        json: bool,
    },
    /// Datasets registered on the cluster
    #[command(after_help = "Examples:\n  tcloud dataset ls\n  tcloud dataset ls --json")]
    Dataset {
        #[command(subcommand)]
        command: DatasetCommand,
    },
    /// List the cluster's nodes and what they are running
    #[command(after_help = "Examples:\n  tcloud nodes\n  tcloud nodes --json")]
    Nodes {
        #[arg(long)]
        json: bool,
    },
    /// Start a single-machine cluster in the background
    #[command(
        long_about = "Starts `taccd dev` (control plane and a local agent in one process) in the \
background, keeping its data and log (taccd.log) in $TACC_HOME/local, and waits until it \
answers. Does nothing if it is already running. The binary is found via $TACC_TACCD, next to \
tcloud, or on PATH.",
        after_help = "Examples:\n  tcloud up\n  tcloud up --port 8390"
    )]
    Up {
        #[arg(long, default_value_t = config::DEFAULT_PORT)]
        port: u16,
    },
    /// Stop the cluster started by `tcloud up`
    #[command(after_help = "Examples:\n  tcloud down")]
    Down,
    /// Write a starter project (task.yaml and a small training script)
    #[command(after_help = "Examples:\n  tcloud quickstart\n  tcloud quickstart my-first-task")]
    Quickstart {
        #[arg(default_value = "tacc-quickstart")]
        dir: PathBuf,
    },
    /// Manage cluster profiles
    #[command(
        long_about = "Cluster profiles live in $TACC_HOME/config.toml (or your configuration \
directory's tacc/config.toml):\n\n  current = \"local\"\n  [clusters.local]\n  url = \"http://127.0.0.1:8383\"\n  # user = \"alice\"   (default $USER)\n\n--server / TACC_SERVER overrides the profile's URL for one command.",
        after_help = "Examples:\n  tcloud config add lab https://tacc.lab.example:8383 --user alice\n  tcloud config use lab\n  tcloud config ls"
    )]
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Debug, Subcommand)]
enum DatasetCommand {
    /// List the datasets a task can name as `source: NAME`
    #[command(after_help = "Examples:\n  tcloud dataset ls\n  tcloud dataset ls --json")]
    Ls {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Switch the current cluster
    #[command(after_help = "Examples:\n  tcloud config use lab")]
    Use { name: String },
    /// Add a cluster profile (or update its URL and user)
    #[command(
        after_help = "Examples:\n  tcloud config add lab https://tacc.lab.example:8383 --user alice"
    )]
    Add {
        name: String,
        url: String,
        #[arg(long)]
        user: Option<String>,
    },
    /// List cluster profiles; the current one is marked with *
    #[command(after_help = "Examples:\n  tcloud config ls\n  tcloud config ls --json")]
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show the configuration file's path and the settings in effect
    #[command(after_help = "Examples:\n  tcloud config show")]
    Show,
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let ctx = commands::Ctx {
        server: cli.server.filter(|s| !s.is_empty()),
    };
    use commands::*;
    match cli.command {
        Command::Submit {
            path,
            follow,
            json,
            name,
        } => submit::submit(&ctx, &path, follow, json, name).await,
        Command::Check { path, json } => submit::check(&path, json),
        Command::Ps {
            all,
            state,
            user,
            limit,
            json,
        } => tasks::ps(&ctx, all, state, user, limit, json).await,
        Command::Show {
            id,
            json,
            instruction,
        } => tasks::show(&ctx, id, json, instruction).await,
        Command::Why { id, json } => tasks::why(&ctx, id, json).await,
        Command::Logs { id, follow } => tasks::logs(&ctx, id, follow).await,
        Command::Cancel { ids, no_wait, json } => tasks::cancel(&ctx, &ids, !no_wait, json).await,
        Command::Download { id, dest, attempt } => tasks::download(&ctx, id, dest, attempt).await,
        Command::Nodes { json } => tasks::nodes(&ctx, json).await,
        Command::Rerun { id, follow, json } => compiler::rerun(&ctx, id, follow, json).await,
        Command::Dataset { command } => match command {
            DatasetCommand::Ls { json } => compiler::dataset_ls(&ctx, json).await,
        },
        Command::Up { port } => cluster::up(port).await,
        Command::Down => cluster::down().await,
        Command::Quickstart { dir } => quickstart::quickstart(&dir),
        Command::Config { command } => match command {
            ConfigCommand::Use { name } => config_cmd::use_profile(&name),
            ConfigCommand::Add { name, url, user } => config_cmd::add(&name, &url, user.as_deref()),
            ConfigCommand::Ls { json } => config_cmd::ls(json),
            ConfigCommand::Show => config_cmd::show(&ctx),
        },
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(errors::FAILURE);
        }
    };
    let result = runtime.block_on(run(cli));
    // Blocking readers (stdin, chunk reads) must not keep the process alive.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let (text, code) = errors::render(&error);
            if let Some(text) = text {
                eprintln!("{text}");
            }
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed_and_every_command_has_an_example() {
        Cli::command().debug_assert();
        for sub in Cli::command().get_subcommands() {
            assert!(sub.get_about().is_some(), "{} lacks about", sub.get_name());
            let help = sub
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            let nested_ok = sub.get_subcommands().all(|s| {
                s.get_after_help()
                    .is_some_and(|h| h.to_string().contains("tcloud"))
            });
            assert!(
                help.contains("tcloud") && nested_ok,
                "{} lacks examples",
                sub.get_name()
            );
        }
        let long = Cli::command().render_long_help().to_string();
        assert!(
            long.contains("5  the task ran but did not succeed"),
            "{long}"
        );
        assert!(long.contains("TACC_TACCD"));
    }

    #[test]
    fn task_ids_and_states_parse() {
        assert_eq!(parse_task_id("#12").unwrap(), TaskId(12));
        assert!(parse_task_id("x").is_err());
        let cli = Cli::try_parse_from([
            "tcloud",
            "ps",
            "--state",
            "queued,lost",
            "--state",
            "failed",
        ])
        .unwrap();
        match cli.command {
            Command::Ps { state, .. } => assert_eq!(
                state,
                vec![TaskState::Queued, TaskState::Lost, TaskState::Failed]
            ),
            other => panic!("parsed as {other:?}"),
        }
        assert!(Cli::try_parse_from(["tcloud", "ps", "--state", "done"]).is_err());
    }

    #[test]
    fn bad_arguments_exit_2() {
        let err = Cli::try_parse_from(["tcloud", "show", "abc"]).unwrap_err();
        assert_eq!(err.exit_code(), errors::INVALID as i32);
    }
}
