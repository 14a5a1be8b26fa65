//! `tcloud`: the user's CLI of TACC. Researchers check and submit task files, watch their
//! tasks (`ps`, `show`, `logs`), cancel them, download their outputs, switch between
//! clusters with config profiles, and start a single-machine cluster with `tcloud up`.
//! They log in with an API token (`tcloud login`), keep per-user secrets (`tcloud secret`),
//! and administrators manage users and tokens (`tcloud admin`). Text that comes from tasks
//! or other users is made safe for the terminal before it is printed ([`sanitize`]).
//!
//! It is a thin binary over `tacc-client` (all HTTP), `tacc-schema` (reading task files)
//! and `tacc-compiler` (code snapshots). It must not depend on `tacc-server`,
//! `tacc-store`, `tacc-scheduler` or `tacc-exec`: it talks to a cluster only through the
//! HTTP API, and `tcloud up` runs the separate `taccd` binary.

mod cli;
mod commands;
mod config;
mod errors;
mod format;
mod sanitize;
mod upload;

use std::process::ExitCode;

use clap::Parser;
use cli::{
    AdminCommand, AdminNodeCommand, AdminTokenCommand, AdminUserCommand, Cli, Command,
    ConfigCommand, DatasetCommand, SecretCommand, UsageByArg,
};
use tacc_core::TaskId;

async fn run(cli: Cli) -> anyhow::Result<()> {
    let ctx = commands::Ctx {
        server: cli.server.filter(|s| !s.is_empty()),
        timeouts: commands::timeouts(cli.connect_timeout, cli.timeout)?,
    };
    use commands::*;
    match cli.command {
        Command::Submit {
            path,
            follow,
            json,
            name,
            array,
            wait_for_capacity,
        } => {
            let options = submit::SubmitOptions {
                follow,
                as_json: json,
                name,
                array,
                wait_for_capacity,
            };
            submit::submit(&ctx, &path, options).await
        }
        Command::Check { path, json } => submit::check(&path, json),
        Command::Ps {
            all,
            state,
            user,
            limit,
            group,
            expand,
            json,
        } => tasks::ps(&ctx, all, state, user, limit, group, expand, json).await,
        Command::Show {
            id,
            json,
            instruction,
        } => tasks::show(&ctx, id, json, instruction).await,
        Command::Why { id, json } => tasks::why(&ctx, id, json).await,
        Command::Logs { id, follow, raw } => tasks::logs(&ctx, id, follow, raw).await,
        Command::Cancel { ids, no_wait, json } => {
            use commands::groups::Target;
            let groups: Vec<_> = ids
                .iter()
                .filter_map(|t| match t {
                    Target::Group(g) => Some(*g),
                    Target::Task(_) => None,
                })
                .collect();
            let tasks_only: Vec<TaskId> = ids
                .iter()
                .filter_map(|t| match t {
                    Target::Task(id) => Some(*id),
                    Target::Group(_) => None,
                })
                .collect();
            if !groups.is_empty() {
                groups::cancel_groups(&ctx, &groups, !no_wait, json).await?;
            }
            if tasks_only.is_empty() {
                return Ok(());
            }
            tasks::cancel(&ctx, &tasks_only, !no_wait, json).await
        }
        Command::Download {
            id,
            path,
            rank,
            attempt,
            dest,
        } => files::download(&ctx, id, path, rank, attempt, dest).await,
        Command::Ls {
            id,
            path,
            rank,
            attempt,
            json,
        } => files::ls(&ctx, id, path, rank, attempt, json).await,
        Command::Exec { id, rank, command } => interactive::exec(&ctx, id, rank, command).await,
        Command::Shell { id, rank } => interactive::shell(&ctx, id, rank).await,
        Command::Dev {
            path,
            gpus,
            cpus,
            memory,
            idle_timeout,
            name,
            detach,
        } => {
            let options = dev::DevOptions {
                gpus,
                cpus,
                memory,
                idle_timeout,
                name,
                detach,
            };
            dev::dev(&ctx, &path, options).await
        }
        Command::PortForward {
            id,
            ports: (local, remote),
            rank,
        } => interactive::port_forward(&ctx, id, rank, local, remote).await,
        Command::Nodes { json } => tasks::nodes(&ctx, json).await,
        Command::Usage {
            fairshare: true,
            json,
            ..
        } => usage::fairshare(&ctx, json).await,
        Command::Usage {
            user,
            group,
            since,
            until,
            by,
            plot,
            metric,
            json,
            ..
        } => {
            let query = tacc_proto::UsageQuery {
                since,
                until,
                user,
                group,
                by: Some(match by {
                    UsageByArg::User => tacc_proto::UsageBy::User,
                    UsageByArg::Group => tacc_proto::UsageBy::Group,
                }),
            };
            let options = usage::UsageOptions {
                query,
                json,
                plot,
                metric,
            };
            usage::usage(&ctx, options).await
        }
        Command::Top {
            ids,
            once,
            interval,
            json,
        } => {
            let interval = std::time::Duration::try_from_secs_f64(interval)
                .ok()
                .filter(|i| *i >= std::time::Duration::from_millis(100))
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--interval {interval} is not a number of seconds of at least 0.1"
                    )
                })?;
            top::top(&ctx, ids, json, once, interval).await
        }
        Command::Rerun {
            id,
            failed,
            follow,
            json,
        } => match id {
            groups::Target::Group(group) if failed => {
                groups::rerun_failed(&ctx, group, follow, json).await
            }
            groups::Target::Group(group) => Err(errors::CliError::invalid(format!(
                "a group is rerun by its failed elements: `tcloud rerun {group} --failed`"
            ))
            .into()),
            groups::Target::Task(task) => compiler::rerun(&ctx, task, follow, json).await,
        },
        Command::Sweep {
            group,
            json,
            best_outputs,
        } => sweeps::sweep(&ctx, group, json, best_outputs).await,
        Command::History {
            name,
            state,
            since,
            user,
            limit,
            before,
            json,
        } => groups::history(&ctx, name, state, since, user, limit, before, json).await,
        Command::Dataset { command } => match command {
            DatasetCommand::Ls { json } => compiler::dataset_ls(&ctx, json).await,
        },
        Command::Up { port, options } => cluster::up(port, options).await,
        Command::Down { args } => cluster::down(args).await,
        Command::Quickstart { dir } => quickstart::quickstart(&dir),
        Command::Config { command } => match command {
            ConfigCommand::Use { name } => config_cmd::use_profile(&name),
            ConfigCommand::Add {
                name,
                url,
                fingerprint,
                user,
            } => config_cmd::add(&name, &url, fingerprint.as_deref(), user.as_deref()),
            ConfigCommand::Ls { json } => config_cmd::ls(json),
            ConfigCommand::Show => config_cmd::show(&ctx),
        },
        Command::Login {
            token_stdin,
            profile,
        } => auth::login(&ctx, token_stdin, profile).await,
        Command::Whoami { json } => auth::whoami(&ctx, json).await,
        Command::Logout { profile } => auth::logout(&ctx, profile),
        Command::Secret { command } => match command {
            SecretCommand::Set { name } => secret::set(&ctx, &name).await,
            SecretCommand::Ls { json } => secret::ls(&ctx, json).await,
            SecretCommand::Rm { name } => secret::rm(&ctx, &name).await,
        },
        Command::Completion { shell } => docs::completion(shell),
        Command::Man { dir } => docs::man(&dir),
        Command::Admin { command } => match command {
            AdminCommand::User { command } => match command {
                AdminUserCommand::Add {
                    name,
                    group,
                    role,
                    ttl,
                    json,
                } => admin::user_add(&ctx, &name, group, role, ttl, json).await,
                AdminUserCommand::Ls { json } => admin::user_ls(&ctx, json).await,
            },
            AdminCommand::Token { command } => match command {
                AdminTokenCommand::Ls { json } => admin::token_ls(&ctx, json).await,
                AdminTokenCommand::Revoke { id } => admin::token_revoke(&ctx, id).await,
            },
            AdminCommand::AgentToken {
                ttl,
                node,
                nodes,
                json,
            } => admin::agent_token(&ctx, ttl, node.as_deref(), nodes, json).await,
            AdminCommand::Audit { limit, json } => admin::audit(&ctx, limit, json).await,
            AdminCommand::Node { command } => match command {
                AdminNodeCommand::Drain { name } => admin::node_drain(&ctx, &name, false).await,
                AdminNodeCommand::Resume { name } => admin::node_drain(&ctx, &name, true).await,
                AdminNodeCommand::Approve { name } => admin::node_approve(&ctx, &name).await,
                AdminNodeCommand::Remove { name } => admin::node_remove(&ctx, &name).await,
            },
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
