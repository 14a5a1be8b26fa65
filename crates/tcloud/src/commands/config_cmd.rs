//! `tcloud config use|add|ls|show`.

use anyhow::Result;
use serde_json::json;

use super::Ctx;
use crate::config::{Config, default_user};
use crate::format::{out, out_json, print_table, table};

pub fn use_profile(name: &str) -> Result<()> {
    let mut config = Config::load()?;
    config.use_profile(name)?;
    let cluster = config.current()?;
    out(format!("Now using cluster `{name}` ({})", cluster.url))?;
    Ok(())
}

pub fn add(name: &str, url: &str, user: Option<&str>) -> Result<()> {
    let mut config = Config::load()?;
    let existed = config.file.clusters.contains_key(name);
    config.set_cluster(name, url, user)?;
    let verb = if existed { "Updated" } else { "Added" };
    out(format!(
        "{verb} cluster `{name}` ({url}) in {}",
        config.path.display()
    ))?;
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
                    "user": c.user.clone().unwrap_or_else(default_user),
                    "current": *name == current,
                })
            })
            .collect();
        return out_json(&list);
    }
    let mut t = table(["", "NAME", "URL", "USER"]);
    for (name, c) in &clusters {
        let mark = if *name == current { "*" } else { "" };
        let user = c
            .user
            .clone()
            .unwrap_or_else(|| format!("{} (default)", default_user()));
        t.add_row([mark, name.as_str(), c.url.as_str(), user.as_str()]);
    }
    print_table(&t)?;
    Ok(())
}

pub fn show(ctx: &Ctx) -> Result<()> {
    let config = Config::load()?;
    let (url, user) = ctx.target()?;
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
    out(format!("server:      {url}{overridden}"))?;
    out(format!("user:        {user}"))?;
    out(format!(
        "local data:  {}",
        crate::config::local_data_dir()?.display()
    ))?;
    Ok(())
}
