//! `taccd server --replicated`: one of several servers on one PostgreSQL database, of
//! which the holder of the leadership lease leads and the others follow and forward (see
//! `tacc_server::serve_replicated`). The data directory (logs, chunks, outputs, the secret
//! key) must be one shared directory for all replicas.

use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::ServerArgs;

#[derive(Debug, Args)]
pub(crate) struct ReplicaArgs {
    /// Run as one replica of several on one PostgreSQL database (--database): the one
    /// holding the leadership lease leads, the others answer reads and forward the rest
    /// to it, and take over when its lease lapses. All replicas share one --data-dir.
    #[arg(long)]
    pub(crate) replicated: bool,
    /// The URL the other replicas reach this one at, while it leads. Left out: http:// and
    /// the address it listens on.
    #[arg(long, value_name = "URL", requires = "replicated")]
    advertise_url: Option<String>,
    /// How long the leadership lease lasts unless renewed (renewed five times as often):
    /// the longest a failed leader keeps the others waiting.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(500..), requires = "replicated")]
    lease_ms: u64,
}

/// Serve as a replica until `shutdown` is cancelled.
pub(crate) async fn run(args: &ServerArgs, shutdown: CancellationToken) -> Result<()> {
    let database = crate::database::Database::choose(args.database.as_deref(), &args.data_dir)
        .map_err(anyhow::Error::msg)?;
    if !matches!(database, crate::database::Database::Postgres(_)) {
        bail!(
            "--replicated needs a shared PostgreSQL database: give --database \
             postgres://USER:PASSWORD@HOST:PORT/DATABASE (an SQLite file has one server, \
             which always leads: leave out --replicated)"
        );
    }
    if args.tls.load()?.is_some() {
        bail!(
            "--replicated serves plain HTTP between replicas for now: leave out --tls-cert and \
             --tls-key and terminate TLS in a proxy in front of the replicas"
        );
    }
    args.tls.check_exposure(args.listen, &args.data_dir)?;
    crate::modes::secure_server_dir(&args.data_dir, false)?;
    let store = database.open().await?;
    let config = crate::server_config(args)?;
    crate::open_files::raise_for(config.connections.max_connections);
    let listener = TcpListener::bind(args.listen).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot listen on {}: {e}; is another taccd running there? Pick another address with --listen",
            args.listen
        )
    })?;
    let url = format!("http://{}", listener.local_addr()?);
    let advertise_url = args
        .replica
        .advertise_url
        .clone()
        .unwrap_or_else(|| url.clone());
    let lease = Duration::from_millis(args.replica.lease_ms);
    let replica = tacc_server::ReplicaConfig {
        holder: format!(
            "{}-{}-{}",
            crate::host_name(),
            std::process::id(),
            tacc_server::now().as_millis()
        ),
        advertise_url,
        lease,
        renew_every: lease / 5,
    };
    tracing::info!(
        "replica {} listening on {url} (advertised as {}), state in {database}, lease {} ms",
        replica.holder,
        replica.advertise_url,
        args.replica.lease_ms
    );
    crate::write_endpoint(&args.data_dir, &url)?;
    tacc_server::serve_replicated(store, config, replica, listener, shutdown).await?;
    Ok(())
}
