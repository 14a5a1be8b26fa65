//! One module per group of commands; each function is one subcommand.

pub mod cluster;
pub mod compiler;
pub mod config_cmd;
pub mod quickstart;
pub mod submit;
pub mod tasks;

use anyhow::Result;
use tacc_client::Client;

use crate::config::{Config, default_user};

/// What every command that talks to a server needs.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// `--server` / `TACC_SERVER`, overriding the current profile's URL.
    pub server: Option<String>,
}

impl Ctx {
    /// The server URL and user name in effect.
    pub fn target(&self) -> Result<(String, String)> {
        let config = Config::load()?;
        // An explicit server needs no valid profile; the user still comes from it if it has one.
        let profile = match &self.server {
            Some(_) => config.current().ok(),
            None => Some(config.current()?),
        };
        let url = match (&self.server, &profile) {
            (Some(url), _) => url.clone(),
            (None, Some(profile)) => profile.url.clone(),
            (None, None) => crate::config::default_url(),
        };
        let user = profile
            .and_then(|p| p.user)
            .filter(|u| !u.is_empty())
            .unwrap_or_else(default_user);
        Ok((url, user))
    }

    pub fn client(&self) -> Result<Client> {
        let (url, user) = self.target()?;
        let _ = user;
        Ok(Client::new(&url))
    }
}
