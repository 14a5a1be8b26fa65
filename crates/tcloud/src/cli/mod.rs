//! The command line's grammar: every command, argument and option of `tcloud`, and the
//! text `--help` shows for each (clap reads it from these doc comments and `#[command]`
//! attributes). `main` dispatches the parsed [`Cli`] to `commands`. The top-level commands
//! are here; the subcommands of `tcloud admin`, `config`, `secret` and `dataset` are in a
//! file per command family.

mod admin;
mod config;
mod dataset;
mod secret;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tacc_core::{TaskId, TaskState};

pub use admin::{AdminCommand, AdminNodeCommand, AdminTokenCommand, AdminUserCommand};
pub use config::ConfigCommand;
pub use dataset::DatasetCommand;
pub use secret::SecretCommand;

/// Accepts `12` and `#12`.
fn parse_task_id(text: &str) -> Result<TaskId, String> {
    text.parse::<TaskId>().map_err(|e| e.to_string())
}

fn parse_group_id(text: &str) -> Result<tacc_core::GroupId, String> {
    text.parse::<tacc_core::GroupId>()
        .map_err(|e| e.to_string())
}

fn parse_since(text: &str) -> Result<tacc_core::HumanDuration, String> {
    text.parse::<tacc_core::HumanDuration>()
        .map_err(|e| format!("{e}; write how long ago, e.g. `2h` or `7d`"))
}

fn parse_state(text: &str) -> Result<TaskState, String> {
    text.trim().parse::<TaskState>().map_err(|e| e.to_string())
}

/// `tcloud usage --by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UsageByArg {
    User,
    Group,
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
        "Examples:\n  tcloud quickstart && tcloud up && tcloud submit tacc-quickstart -f\n  tcloud ps --all\n  tcloud logs -f 12\n  tcloud config add lab https://tacc.lab.example:8383 && tcloud login --profile lab\n\n",
        "Environment:\n  TACC_SERVER  server URL, overrides the current profile (same as --server)\n  TACC_TOKEN   API token, overrides the profile's stored token\n  TACC_HOME    directory holding config.toml and the local cluster's data\n  TACC_TACCD   path of the taccd binary `tcloud up` starts\n\n",
        "Exit codes:\n  0  success\n  1  other failure\n  2  invalid input (bad task file or arguments)\n  3  the server cannot be reached\n  4  not found (unknown task id)\n  5  the task ran but did not succeed (submit -f, logs -f)\n  6  not logged in, or the token expired or was revoked (run `tcloud login`; `tcloud up` for the local cluster)\n  7  not allowed: the server knows you, and this is not yours to do"
    )
)]
pub struct Cli {
    /// Server URL; overrides the current cluster profile.
    #[arg(long, global = true, env = "TACC_SERVER", value_name = "URL")]
    pub server: Option<String>,
    /// Seconds to wait for a connection to the server
    #[arg(
        long,
        global = true,
        env = "TACC_CONNECT_TIMEOUT",
        value_name = "SECS",
        default_value_t = 5.0
    )]
    pub connect_timeout: f64,
    /// Seconds to wait for the server's answer to a request (log follow and waits are not
    /// cut); 0: no limit
    #[arg(
        long,
        global = true,
        env = "TACC_TIMEOUT",
        value_name = "SECS",
        default_value_t = 30.0
    )]
    pub timeout: f64,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
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
        /// Run it as an array: `0-999`, `0-999:2` or `1,3,7` (overrides `array:` of the file)
        #[arg(long, value_name = "INDICES")]
        array: Option<String>,
        /// Accept a request no node of the cluster can hold today (it is refused otherwise),
        /// for a cluster that will grow: it waits, holding up nothing, until such a node joins
        #[arg(long)]
        wait_for_capacity: bool,
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
        /// Print {\"valid\", \"name\", \"warnings\", \"error\", \"errors\"} as JSON (`errors`: each mistake's file, line, column, message and help)
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
        /// One task group (e.g. `g12`), element by element
        #[arg(value_name = "GROUP", value_parser = parse_group_id)]
        group: Option<tacc_core::GroupId>,
        /// List the elements of every group shown, not just its counts
        #[arg(long)]
        expand: bool,
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
ends, reconnecting if the server restarts, and exits 0 if the task succeeded, 5 otherwise.\n\n\
Control characters in the log are shown, not executed: an escape sequence prints as `^[[2J` \
instead of clearing your screen, a carriage return as `^M`, a C1 control as `<U+009B>`, a byte \
that is not UTF-8 as `<0x9B>`. A task's output cannot retitle your window, write your \
clipboard or overwrite earlier lines. --raw prints the bytes as they are (e.g. to keep \
progress bars, or to save the log to a file).",
        after_help = "Examples:\n  tcloud logs 12\n  tcloud logs -f 12\n  tcloud logs 12 --raw > task-12.log"
    )]
    Logs {
        #[arg(value_parser = parse_task_id)]
        id: TaskId,
        /// Stream until the task ends
        #[arg(short, long)]
        follow: bool,
        /// Print the log's bytes unchanged, escape sequences included (trust the task first)
        #[arg(long)]
        raw: bool,
    },
    /// Cancel tasks
    #[command(
        long_about = "Asks the server to cancel each task and, unless --no-wait, waits (up to \
30 s) until each has stopped. Unknown ids are reported (exit 4) but the others are still cancelled.",
        after_help = "Examples:\n  tcloud cancel 12\n  tcloud cancel 12 13 14 --no-wait"
    )]
    Cancel {
        /// Task ids, or task groups (`g12`: every unfinished element)
        #[arg(required = true, value_parser = crate::commands::groups::parse_target)]
        ids: Vec<crate::commands::groups::Target>,
        /// Return once the request is accepted
        #[arg(long)]
        no_wait: bool,
        #[arg(long)]
        json: bool,
    },
    /// Download a task's outputs, or one file of a running task
    #[command(
        long_about = "Fetches the files a task kept (its `outputs:`, from every rank) from the \
latest attempt, or the one given, into DEST (default ./tacc-outputs/ID/); PATH limits it to \
one file or directory. A path that several ranks wrote is saved as rank-R/PATH; --rank R \
takes one rank's files under their own paths. On a running task, `download ID PATH` fetches \
that file from the live working directory now (rank 0's node, or --rank R's; at most 32MiB: \
declare bigger files in `outputs:` to get them when the task ends).",
        after_help = "Examples:\n  tcloud download 12\n  tcloud download 12 results/ --attempt 1 --dest ./r\n  tcloud download 12 out/same.txt --rank 1\n  tcloud download 12 logs/train.csv     # while it runs"
    )]
    Download {
        #[arg(value_parser = parse_task_id)]
        id: TaskId,
        /// Only this file or directory (relative to the working directory)
        path: Option<String>,
        /// Only this node rank's files, under their own paths
        #[arg(long, value_name = "R")]
        rank: Option<u32>,
        /// Which attempt's outputs (default: the latest that has any)
        #[arg(long, value_name = "N")]
        attempt: Option<u32>,
        /// Where to put them (default ./tacc-outputs/ID/)
        #[arg(short = 'o', long, value_name = "DIR")]
        dest: Option<PathBuf>,
    },
    /// Run a command inside a running task (its uid, cgroup, directory and environment)
    #[command(
        long_about = "Runs CMD inside the running task ID, on the node of rank 0 or of --rank R: \
as the task's own user, in its cgroup (its limits apply), its private /tmp, its working \
directory and its environment (secrets included). stdout and stderr are streamed, stdin is \
forwarded, and tcloud exits with CMD's exit status. Only the task's owner, their group admin \
and admins may; every session is audited. The command ends when tcloud does or the task ends.",
        after_help = "Examples:\n  tcloud exec 12 -- nvidia-smi\n  tcloud exec 12 --rank 1 -- py-spy dump --pid 1234\n  tcloud exec 12 -- sh -c 'tail -n 20 train.log'"
    )]
    Exec {
        #[arg(value_parser = parse_task_id)]
        id: TaskId,
        /// The node rank to run it on (default 0)
        #[arg(long, value_name = "R", default_value_t = 0)]
        rank: u32,
        /// The command and its arguments, after `--`
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// A dev session: queue DIR's code as a task that holds its allocation, then a shell in it
    #[command(
        long_about = "Queues a dev session (a `kind: interactive` task) for DIR's code, like any \
task (quotas and fair share count it), and once it runs opens `tcloud shell` in it. It keeps its \
allocation after the shell exits (`tcloud shell ID` returns to it) until it has been idle for its \
idle timeout — no session in use and no CPU or GPU used by its processes; you are warned in your \
open shells before the end — or until `tcloud cancel ID`. A task file in DIR gives its \
environment, resources and setup (its `run` is not started); the flags override them.",
        after_help = "Examples:\n  tcloud dev\n  tcloud dev ~/proj --gpus 1 --idle-timeout 30m\n  tcloud dev . --detach    # queue it; `tcloud shell ID` later"
    )]
    Dev {
        /// The code directory (or a task file)
        #[arg(default_value = ".")]
        path: PathBuf,
        /// GPUs per node (overrides the task file's): whole GPUs, or a share of one, e.g. 0.5
        #[arg(long, value_name = "N", value_parser = parse_gpu_count)]
        gpus: Option<tacc_core::GpuCount>,
        /// CPUs per node, e.g. 4 or 0.5
        #[arg(long, value_name = "N")]
        cpus: Option<f64>,
        /// Memory per node, e.g. 16GiB
        #[arg(long, value_name = "SIZE")]
        memory: Option<tacc_core::ByteSize>,
        /// End it after this long idle, e.g. 30m (default 2h; the cluster may cap it)
        #[arg(long, value_name = "DURATION")]
        idle_timeout: Option<tacc_core::HumanDuration>,
        /// The task's name (default: the directory's)
        #[arg(long)]
        name: Option<String>,
        /// Queue it and return, without waiting for it to start or opening a shell
        #[arg(long)]
        detach: bool,
    },
    /// An interactive shell inside a running task, on a terminal
    #[command(
        long_about = "Opens an interactive bash inside the running task ID (rank 0's node, or \
--rank R's), exactly as `tcloud exec` runs commands, on a terminal: window-size changes follow, \
Ctrl-C and Ctrl-Z reach the remote side, and `exit N` ends tcloud with status N. The local \
terminal is restored however tcloud ends.",
        after_help = "Examples:\n  tcloud shell 12\n  tcloud shell 12 --rank 1"
    )]
    Shell {
        #[arg(value_parser = parse_task_id)]
        id: TaskId,
        /// The node rank to enter (default 0)
        #[arg(long, value_name = "R", default_value_t = 0)]
        rank: u32,
    },
    /// Forward a local TCP port to a port inside a running task, until Ctrl-C
    #[command(
        name = "port-forward",
        long_about = "Listens on 127.0.0.1:LOCAL and carries each connection to port REMOTE on \
the loopback of the running task's node (rank 0's, or --rank R's), through the server: \
TensorBoard, Jupyter, a debugger. Many connections at once; LOCAL 0 picks a free port (printed). \
PORT alone forwards the same number.",
        after_help = "Examples:\n  tcloud port-forward 12 6006\n  tcloud port-forward 12 8888:8888 --rank 1\n  tcloud port-forward 12 0:8000"
    )]
    PortForward {
        #[arg(value_parser = parse_task_id)]
        id: TaskId,
        /// LOCAL:REMOTE, or PORT for both
        #[arg(value_name = "LOCAL:REMOTE", value_parser = crate::commands::interactive::parse_ports)]
        ports: (u16, u16),
        /// The node rank whose port to reach (default 0)
        #[arg(long, value_name = "R", default_value_t = 0)]
        rank: u32,
    },
    /// List a task's files: a running task's live working directory, or what it kept
    #[command(
        long_about = "Lists a directory of a running task's live working directory (name, \
size, modification time, type) on the node of rank 0, or of --rank R; links are shown, never \
followed, and paths must stay inside the working directory. For a task that has ended (or \
with --attempt N) it lists the outputs that attempt kept, every rank's, with paths several \
ranks wrote shown as rank-R/PATH (or one rank's with --rank R). At most 10000 entries.",
        after_help = "Examples:\n  tcloud ls 12\n  tcloud ls 12 out/ --rank 1\n  tcloud ls 12 --attempt 1 --json"
    )]
    Ls {
        #[arg(value_parser = parse_task_id)]
        id: TaskId,
        /// A directory (or file), relative to the working directory
        path: Option<String>,
        /// The node rank whose files to list (default 0)
        #[arg(long, value_name = "R")]
        rank: Option<u32>,
        /// An earlier attempt's kept outputs
        #[arg(long, value_name = "N")]
        attempt: Option<u32>,
        /// Print the listing as one JSON object
        #[arg(long)]
        json: bool,
    },
    /// A sweep's leaderboard, best trial first; or fetch the best trial's outputs
    #[command(
        long_about = "Shows a sweep's trials best first: trial number, task, state, parameters, \
the best and the last reported value of the sweep's metric and its step, and why a trial ended \
early (`early_stopped: rung K (...)`). --best-outputs DIR downloads the outputs of the \
succeeded trial with the best final value into DIR.",
        after_help = "Examples:\n  tcloud sweep g12\n  tcloud sweep g12 --json\n  tcloud sweep g12 --best-outputs ./best"
    )]
    Sweep {
        #[arg(value_parser = parse_group_id)]
        group: tacc_core::GroupId,
        #[arg(long)]
        json: bool,
        /// Download the best trial's outputs into DIR
        #[arg(long, value_name = "DIR")]
        best_outputs: Option<PathBuf>,
    },
    /// Ended tasks, newest first, with filters
    #[command(
        long_about = "Lists tasks that have ended (succeeded, failed, cancelled, lost), newest \
end first, 50 per page; the last line says how to get the next page.",
        after_help = "Examples:\n  tcloud history\n  tcloud history --name train --state failed --since 7d\n  tcloud history --json"
    )]
    History {
        /// Only tasks of this name
        #[arg(long)]
        name: Option<String>,
        /// Only these end states (comma separated): succeeded, failed, cancelled, lost
        #[arg(long, value_name = "S[,S]", value_delimiter = ',', value_parser = parse_state)]
        state: Vec<TaskState>,
        /// Only tasks that ended within this long, e.g. `2h`, `7d`
        #[arg(long, value_name = "AGO", value_parser = parse_since)]
        since: Option<tacc_core::HumanDuration>,
        /// Only this user's tasks (group admins and admins)
        #[arg(long)]
        user: Option<String>,
        /// Tasks per page (at most 500)
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        /// The page after this one (as the previous page printed)
        #[arg(long, value_name = "CURSOR")]
        before: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Submit a task again: same code snapshot, environment and datasets, new task id
    #[command(
        long_about = "Submits the task again exactly as it was: the same code snapshot (nothing \
is uploaded), the same environment spec and the same datasets (registered names were resolved \
when the task was first submitted). The new task gets a new id.",
        after_help = "Examples:\n  tcloud rerun 12\n  tcloud rerun 12 -f\n  tcloud rerun 12 --json"
    )]
    Rerun {
        /// A task id, or a task group (`g12`) with --failed
        #[arg(value_parser = crate::commands::groups::parse_target)]
        id: crate::commands::groups::Target,
        /// Of a group: only the elements that failed, were cancelled or were lost, as a
        /// new group with the same indices
        #[arg(long)]
        failed: bool,
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
    /// What running tasks use, per rank, refreshed like `top`
    #[command(
        long_about = "Shows what running tasks use, per task and per rank: CPU cores used \
against the cores allocated, memory used against the limit, each GPU's utilisation and \
memory, the node, and when the rank last wrote output. Below the table: the first rank that \
failed, and ranks silent (no output, no CPU use) for longer than the server's threshold. \
Without IDs: every starting or running task you may see. Refreshes until Ctrl-C; --once \
prints one table and exits.",
        after_help = "Examples:\n  tcloud top\n  tcloud top 12 13\n  tcloud top --once --json"
    )]
    Top {
        #[arg(value_parser = parse_task_id)]
        ids: Vec<TaskId>,
        /// One table (or JSON document), then exit
        #[arg(long)]
        once: bool,
        /// Seconds between refreshes
        #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
        interval: f64,
        /// JSON: a pretty array with --once, else one array a line per refresh
        #[arg(long)]
        json: bool,
    },
    /// Resource-hours allocated to users and groups, and the fair-share standing
    #[command(
        long_about = "Reports the CPU-, GPU- and memory-GiB-hours allocated to each user (or \
group, --by group) in a window, with the tasks and attempts counted, like Slurm's sreport. An \
attempt holds its task's per-node resources on each of its nodes from the moment it is \
placed until it ends or goes back to the queue; each retry and preemption counts on its \
own, and a running attempt counts up to now. You see your own usage; a group admin their \
group's; an admin everyone's.\n\nTimes (--since, --until): RFC 3339 \
(2025-05-01T12:00:00Z), a date (2025-05-01, midnight UTC), `now`, or a duration ago (90m, \
24h, 7d, 2w). The window is [since, until), by default the last 7 days.\n\n--plot FILE \
draws --metric per hour (windows up to 2 days), day or week as stacked bars, one stack per \
row, as SVG or PNG by the file's extension.\n\n--fairshare shows instead the scheduler's \
fair-share standing, like sshare: each group's share, normalised share, decayed and \
effective usage and fair-share factor (1 = no recent usage, 0.5 = usage equal to its \
share), with the limits of each user and group and what they hold now.",
        after_help = "Examples:\n  tcloud usage\n  tcloud usage --since 30d --by group\n  tcloud usage --user alice --since 2025-05-01 --until 2025-06-01 --json\n  tcloud usage --since 14d --plot gpu-hours.svg\n  tcloud usage --fairshare"
    )]
    Usage {
        /// Only this user's usage
        #[arg(long)]
        user: Option<String>,
        /// Only this group's usage (its group admin, or an admin)
        #[arg(long)]
        group: Option<String>,
        /// Start of the window (inclusive): RFC 3339, a date, `now`, or 90m/24h/7d/2w ago
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// End of the window (exclusive); now by default
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
        /// Rows per user or per group
        #[arg(long, value_enum, default_value = "user")]
        by: UsageByArg,
        /// Draw the usage per hour/day/week as stacked bars to FILE (.svg or .png)
        #[arg(long, value_name = "FILE")]
        plot: Option<PathBuf>,
        /// What --plot draws
        #[arg(long, value_enum, default_value = "gpu-hours", requires = "plot")]
        metric: crate::commands::usage::Metric,
        /// Show the fair-share standing (like sshare) instead
        #[arg(long, conflicts_with_all = ["user", "group", "since", "until", "plot"])]
        fairshare: bool,
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
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
answers. Does nothing if it is already running (and says so when it runs with other options \
than asked for: restart it with `tcloud down && tcloud up ...`). The cluster's options \
(--config, --gpus, --gpu-type, --dataset, --policy) are passed on to `taccd dev`; those not \
given are taken from the `up_*` keys of the `local` profile, which --save writes. The binary \
is found via $TACC_TACCD, next to tcloud, or on PATH.",
        after_help = "Examples:\n  tcloud up\n  tcloud up --port 8390\n  tcloud up --gpus 2 --gpu-type A100 --save\n  tcloud up --config tacc.toml --dataset mnist=/data/mnist"
    )]
    Up {
        #[arg(long, default_value_t = crate::config::DEFAULT_PORT)]
        port: u16,
        #[command(flatten)]
        options: crate::commands::cluster::UpArgs,
    },
    /// Stop the cluster started by `tcloud up` (refused while tasks are queued or running,
    /// unless --force or --drain says what to do with them)
    #[command(
        long_about = "Stops the cluster started by `tcloud up`: its server, its agent and \
everything they run. While tasks are queued or running it stops nothing, names them and exits \
with code 9: --drain takes no new tasks, lets those finish (showing how many are left), then \
stops; --force stops them now (they end `cancelled`, reason `cluster stopped by tcloud down`). \
To restart the server alone (an upgrade) with the tasks running on, send it SIGTERM and run \
`tcloud up` again within 30 seconds (the heartbeat timeout).",
        after_help = "Examples:\n  tcloud down\n  tcloud down --drain\n  tcloud down --force"
    )]
    Down {
        #[command(flatten)]
        args: crate::commands::cluster::DownArgs,
    },
    /// Write a starter project (task.yaml and a small training script)
    #[command(after_help = "Examples:\n  tcloud quickstart\n  tcloud quickstart my-first-task")]
    Quickstart {
        #[arg(default_value = "tacc-quickstart")]
        dir: PathBuf,
    },
    /// Manage cluster profiles
    #[command(
        long_about = "Cluster profiles live in $TACC_HOME/config.toml (or your configuration \
directory's tacc/config.toml), written with mode 0600 because they hold API tokens:\n\n  current = \"local\"\n  [clusters.local]\n  url = \"http://127.0.0.1:8383\"\n  token = \"tacc_…\"   (written by `tcloud login`, or `tcloud up`)\n\n--server / TACC_SERVER overrides the profile's URL for one command (the token of a \
profile is only sent to that profile's URL); TACC_TOKEN overrides the token.",
        after_help = "Examples:\n  tcloud config add lab https://tacc.lab.example:8383\n  tcloud login --profile lab\n  tcloud config use lab\n  tcloud config ls"
    )]
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Log in to a cluster: check an API token and store it in the profile
    #[command(
        long_about = "Reads an API token (from its administrator, who created it with `tcloud \
admin user add` or `taccd admin user add`), checks it with the server, and stores it in the \
profile (the current one unless --profile; the configuration file is written with mode \
0600). The token is asked for without echo when stdin is a terminal, else read from stdin; it \
is never an argument, where `ps` and your shell history would keep it. A token the server \
refuses is not stored (exit 6).\n\nThe local cluster needs no login: `tcloud up` stores its \
admin token.",
        after_help = "Examples:\n  tcloud login                                   # paste the token at the prompt\n  tcloud login --profile lab < ~/lab-token.txt\n  pass show tacc/lab | tcloud login --token-stdin --profile lab\n  tcloud --server https://tacc.new.example:8383 login --profile new"
    )]
    Login {
        /// Read the token from stdin even when it is a terminal (no prompt)
        #[arg(long)]
        token_stdin: bool,
        /// Store the token in this profile (default: the current one). With --server, the
        /// profile is created or pointed at that URL.
        #[arg(long, value_name = "NAME")]
        profile: Option<String>,
    },
    /// Show who the server takes you for
    #[command(
        long_about = "Asks the server whom the token in effect belongs to: your user name, \
role (user, group_admin or admin) and group.",
        after_help = "Examples:\n  tcloud whoami\n  tcloud whoami --json"
    )]
    Whoami {
        /// Print {\"name\", \"group\", \"role\", \"server\", \"profile\"} as JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove the stored token of a profile
    #[command(
        long_about = "Removes the token from the profile (the current one unless --profile). \
The token itself stays valid on the server until it expires or an administrator revokes it.",
        after_help = "Examples:\n  tcloud logout\n  tcloud logout --profile lab"
    )]
    Logout {
        #[arg(long, value_name = "NAME")]
        profile: Option<String>,
    },
    /// Your secrets: values a task gets in its environment, never shown again
    #[command(
        long_about = "A secret is a value (an API key, a password) kept encrypted by the server \
for you alone. A task that lists it in its task file gets it as an environment variable:\n\n  \
environment:\n    secrets: [HF_TOKEN]\n\nValues are read from stdin (or typed without \
echo), never from an argument, and never printed by any command. Unlike secrets, \
`environment.vars` are not secret: anyone who may read the task sees them.",
        after_help = "Examples:\n  tcloud secret set HF_TOKEN               # type it (not shown)\n  printf %s \"$WANDB_API_KEY\" | tcloud secret set WANDB_API_KEY\n  tcloud secret ls\n  tcloud secret rm HF_TOKEN"
    )]
    Secret {
        #[command(subcommand)]
        command: SecretCommand,
    },
    /// Administer the cluster: users, tokens, agent join tokens, audit log (admin token)
    #[command(
        long_about = "Administration through the API; the token in effect must be an admin's \
(the local cluster's, after `tcloud up`, is). Otherwise the server answers `not allowed` \
(exit 7). On the server machine `taccd admin …` does the same against the data directory.",
        after_help = "Examples:\n  tcloud admin user add alice --group vision\n  tcloud admin user ls\n  tcloud admin token revoke 7\n  tcloud admin agent-token --ttl 1h\n  tcloud admin audit --limit 20"
    )]
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Print a shell completion script for bash, zsh or fish
    #[command(
        long_about = "Prints the completion script of a shell, generated from tcloud's own \
grammar (every command, subcommand and option), on stdout. Load it in the running shell \
or install it where the shell looks for completions.",
        after_help = "Examples:\n  source <(tcloud completion bash)\n  tcloud completion bash > /etc/bash_completion.d/tcloud\n  tcloud completion zsh > \"${fpath[1]}/_tcloud\"\n  tcloud completion fish > ~/.config/fish/completions/tcloud.fish"
    )]
    Completion {
        /// The shell to complete in
        shell: CompletionShell,
    },
    /// Write the man pages, one per command, into a directory
    #[command(
        long_about = "Writes one man page per command (tcloud.1, tcloud-submit.1, \
tcloud-admin-user-add.1, …) into DIR, generated from the same grammar as --help. Read one \
with `man -l DIR/tcloud-submit.1`, or put DIR on MANPATH.",
        after_help = "Examples:\n  tcloud man ~/.local/share/man/man1 && man tcloud-submit\n  tcloud man /tmp/pages && man -l /tmp/pages/tcloud.1"
    )]
    Man {
        /// Where to write the pages (created if missing)
        dir: PathBuf,
    },
}

/// The shells `tcloud completion` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// `--gpus` of `tcloud dev`: whole GPUs or a share of one, as task files write it.
fn parse_gpu_count(text: &str) -> Result<tacc_core::GpuCount, String> {
    tacc_core::GpuCount::parse(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors;
    use clap::CommandFactory;
    use tacc_core::{HumanDuration, Role};

    /// Every command at every depth has an about line and an example.
    fn check_examples(command: &clap::Command, path: &str) {
        for sub in command.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            assert!(sub.get_about().is_some(), "`{path}` lacks about");
            let help = sub
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            assert!(help.contains("tcloud"), "`{path}` lacks examples");
            check_examples(sub, &path);
        }
    }

    #[test]
    fn cli_is_well_formed_and_every_command_has_an_example() {
        Cli::command().debug_assert();
        check_examples(&Cli::command(), "tcloud");
        let long = Cli::command().render_long_help().to_string();
        assert!(
            long.contains("5  the task ran but did not succeed"),
            "{long}"
        );
        assert!(long.contains("6  not logged in"), "{long}");
        assert!(long.contains("7  not allowed"), "{long}");
        assert!(long.contains("TACC_TACCD") && long.contains("TACC_TOKEN"));
    }

    #[test]
    fn new_commands_parse() {
        let cli =
            Cli::try_parse_from(["tcloud", "login", "--token-stdin", "--profile", "lab"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Login { token_stdin: true, profile: Some(ref p) } if p == "lab"
        ));
        let cli = Cli::try_parse_from([
            "tcloud",
            "admin",
            "user",
            "add",
            "bob",
            "--group",
            "g",
            "--role",
            "group-admin",
        ])
        .unwrap();
        match cli.command {
            Command::Admin {
                command:
                    AdminCommand::User {
                        command:
                            AdminUserCommand::Add {
                                name, group, role, ..
                            },
                    },
            } => {
                assert_eq!(name, "bob");
                assert_eq!(group.as_deref(), Some("g"));
                assert_eq!(role, Role::GroupAdmin);
            }
            other => panic!("parsed as {other:?}"),
        }
        assert!(
            Cli::try_parse_from(["tcloud", "admin", "user", "add", "x", "--role", "root"]).is_err()
        );
        let cli = Cli::try_parse_from(["tcloud", "admin", "agent-token", "--ttl", "1h"]).unwrap();
        match cli.command {
            Command::Admin {
                command: AdminCommand::AgentToken { ttl, .. },
            } => assert_eq!(ttl.map(HumanDuration::as_secs), Some(3600)),
            other => panic!("parsed as {other:?}"),
        }
        // A secret's value is never an argument.
        assert!(Cli::try_parse_from(["tcloud", "secret", "set", "K", "value"]).is_err());
        let cli = Cli::try_parse_from(["tcloud", "logs", "3", "--raw"]).unwrap();
        assert!(matches!(cli.command, Command::Logs { raw: true, .. }));
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
