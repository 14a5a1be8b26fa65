//! `tcloud secret …`: the grammar of the commands that manage a user's secrets and their
//! `--help` text.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Store a secret (the value is read from stdin, or typed without echo)
    #[command(
        long_about = "Stores (or replaces) secret NAME. The value is read from stdin; on a \
terminal it is asked for without echo. One trailing newline is removed (as `echo` adds one); \
an empty value is refused. NAME becomes the environment variable's name: upper-case \
letters, digits and `_` (names the platform sets, such as TACC_…, are refused).",
        after_help = "Examples:\n  tcloud secret set HF_TOKEN\n  tcloud secret set WANDB_API_KEY < ~/.wandb-key\n  printf %s \"$KEY\" | tcloud secret set KEY"
    )]
    Set { name: String },
    /// List your secrets: names and when they were set, never values
    #[command(after_help = "Examples:\n  tcloud secret ls\n  tcloud secret ls --json")]
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Delete a secret
    #[command(after_help = "Examples:\n  tcloud secret rm HF_TOKEN")]
    Rm { name: String },
}
