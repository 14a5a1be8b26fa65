//! `tcloud dataset …`: the grammar of the commands about registered datasets and their
//! `--help` text.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum DatasetCommand {
    /// List the datasets a task can name as `source: NAME`
    #[command(after_help = "Examples:\n  tcloud dataset ls\n  tcloud dataset ls --json")]
    Ls {
        #[arg(long)]
        json: bool,
    },
}
