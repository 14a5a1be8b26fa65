//! `tcloud config use|add|ls|show`.

use anyhow::Result;
use serde_json::json;

use super::Ctx;
use crate::config::{Config, TOKEN_ENV};
use crate::errors::{CliError, TokenSource};
use crate::format::{out, out_json, print_table, table};

pub fn use_profile(name: &str) -> Result<()> {
    let mut config = Config::load()?;
    config.use_profile(name)?;
    let cluster = config.current()?;
    out(format!("Now using cluster `{name}` ({})", cluster.url))?;
    if cluster.token().is_none() {
        out(format!(
            "  it has no token yet: log in with `tcloud login --profile {name}`"
        ))?;
    }
    Ok(())
}

pub fn add(name: &str, url: &str, fingerprint: Option<&str>, user: Option<&str>) -> Result<()> {
    if user.is_some() {
        eprintln!(
            "warning: --user is ignored: the server knows you by your token (`tcloud login --profile {name}`)"
        );
    }
    let mut config = Config::load()?;
    let existed = config.file.clusters.contains_key(name);
    config.set_cluster(name, url)?;
    if let Some(fingerprint) = fingerprint {
        tacc_client::tls::parse_fingerprint(fingerprint)
            .map_err(|why| CliError::invalid(format!("--fingerprint: {why}")))?;
        if !url.starts_with("https://") {
            return Err(CliError::invalid(format!(
                "--fingerprint pins a TLS certificate, so the URL must be https://, not {url}"
            ))
            .into());
        }
        config.set_fingerprint(name, fingerprint)?;
    }
    let verb = if existed { "Updated" } else { "Added" };
    out(format!(
        "{verb} cluster `{name}` ({url}) in {}",
        config.path.display()
    ))?;
    if config.file.clusters[name].token().is_none() {
        out(format!(
            "Log in to it with `tcloud login --profile {name}` (the token comes from its administrator)"
        ))?;
    }
    if config.current_name() != name {
        out(format!("Switch to it with `tcloud config use {name}`"))?;
    }
    Ok(())
}

pub fn ls(as_json: bool) -> Result<()> {
    let config = Config::load()?;
    let current = config.current_name().to_string();
    let mut clusters = config.file.clusters.clone();
    if clusters.is_empty() && config.text.is_none() {
        clusters.insert(current.clone(), config.current()?);
    }
    if as_json {
        let list: Vec<_> = clusters
            .iter()
            .map(|(name, c)| {
                json!({
                    "name": name,
                    "url": c.url,
                    "logged_in": c.token().is_some(),
                    "current": *name == current,
                })
            })
            .collect();
        return out_json(&list);
    }
    let mut t = table(["", "NAME", "URL", "TOKEN"]);
    for (name, c) in &clusters {
        let mark = if *name == current { "*" } else { "" };
        let token = if c.token().is_some() {
            "stored"
        } else {
            "- (tcloud login)"
        };
        t.add_row([mark, name.as_str(), c.url.as_str(), token]);
    }
    print_table(&t)?;
    if crate::config::env_token().is_some() {
        eprintln!("note: {TOKEN_ENV} is set and overrides the stored tokens");
    }
    Ok(())
}

pub fn show(ctx: &Ctx) -> Result<()> {
    let config = Config::load()?;
    let target = ctx.target()?;
    let exists = if config.text.is_some() {
        ""
    } else {
        " (does not exist yet; defaults in effect)"
    };
    out(format!("config file: {}{exists}", config.path.display()))?;
    out(format!("cluster:     {}", config.current_name()))?;
    let overridden = if ctx.server.is_some() {
        " (from --server / TACC_SERVER)"
    } else {
        ""
    };
    out(format!("server:      {}{overridden}", target.url))?;
    let token = match &target.source {
        TokenSource::Env => format!("from {TOKEN_ENV}"),
        TokenSource::Profile(name) => format!("stored in profile `{name}`"),
        TokenSource::None => {
            "none (log in with `tcloud login`, or `tcloud up` for the local cluster)".to_string()
        }
    };
    out(format!("token:       {token}"))?;
    out("identity:    `tcloud whoami` asks the server")?;
    if target
        .profile
        .as_ref()
        .and_then(|p| config.file.clusters.get(p))
        .is_some_and(|c| c.user.is_some())
    {
        out("note:        the profile's `user` key is ignored: the token says who you are")?;
    }
    out(format!(
        "local data:  {}",
        crate::config::local_data_dir()?.display()
    ))?;
    Ok(())
}
