//! One module per group of commands; each function is one subcommand.

pub mod adaptive;
pub mod admin;
pub mod auth;
pub mod cluster;
pub mod compiler;
pub mod config_cmd;
pub mod dev;
pub mod docs;
mod estimate;
pub mod files;
pub mod groups;
pub mod interactive;
pub mod pipelines;
pub mod quickstart;
pub mod secret;
pub mod submit;
pub mod sweeps;
pub mod tasks;
pub mod top;
pub mod usage;

use anyhow::Result;
use tacc_client::Client;

use crate::config::{self, Cluster, Config};
use crate::errors::{AuthContext, TokenSource, set_auth_context};

/// What every command that talks to a server needs.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// `--server` / `TACC_SERVER`, overriding the current profile's URL.
    pub server: Option<String>,
    /// `--connect-timeout` / `--timeout` (or their environment variables).
    pub timeouts: tacc_client::Timeouts,
}

/// The client's timeouts from `--connect-timeout` and `--timeout` seconds (a request
/// timeout of 0: none).
pub fn timeouts(connect: f64, request: f64) -> Result<tacc_client::Timeouts> {
    let seconds = |value: f64, flag: &str| {
        std::time::Duration::try_from_secs_f64(value).map_err(|_| {
            crate::errors::CliError::invalid(format!(
                "{flag} must be a number of seconds, 0 or more (got {value})"
            ))
        })
    };
    let connect = seconds(connect, "--connect-timeout")?;
    if connect.is_zero() {
        return Err(crate::errors::CliError::invalid(
            "--connect-timeout must be more than 0 seconds",
        )
        .into());
    }
    let request = seconds(request, "--timeout")?;
    Ok(tacc_client::Timeouts {
        connect,
        request: (!request.is_zero()).then_some(request),
        ..Default::default()
    })
}

/// The server a command talks to and the token it sends.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    /// The profile the URL belongs to: the current one, or with `--server` one whose URL
    /// is that server's (none when no profile has it).
    pub profile: Option<String>,
    pub token: Option<String>,
    pub source: TokenSource,
    /// The pinned certificate fingerprint of the profile, if any.
    pub fingerprint: Option<String>,
}

/// Never prints the token itself.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("url", &self.url)
            .field("profile", &self.profile)
            .field("source", &self.source)
            .finish()
    }
}

pub(crate) fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// The profile for an explicit server URL: the current profile when it points there,
/// else the first (by name) that does. A profile's token is only ever sent to its URL.
pub fn profile_for_url(config: &Config, url: &str) -> Option<(String, Cluster)> {
    let current = config.current_name();
    if let Some(cluster) = config.file.clusters.get(current) {
        if same_url(&cluster.url, url) {
            return Some((current.to_string(), cluster.clone()));
        }
    }
    config
        .file
        .clusters
        .iter()
        .find(|(_, cluster)| same_url(&cluster.url, url))
        .map(|(name, cluster)| (name.clone(), cluster.clone()))
}

impl Ctx {
    /// The server URL, its profile and the token in effect: `TACC_TOKEN` first, else the
    /// profile's stored token.
    pub fn target(&self) -> Result<Target> {
        let config = Config::load()?;
        if let Some(warning) = config.exposure_warning() {
            eprintln!("{warning}");
        }
        resolve_target(&config, self.server.as_deref(), config::env_token())
    }

    /// A client for the server in effect, carrying the token in effect.
    pub fn client(&self) -> Result<Client> {
        let target = self.target()?;
        Ok(client_for(&target)?.with_timeouts(self.timeouts))
    }
}

/// [`Ctx::target`] given the configuration, `--server` and `TACC_TOKEN`.
pub fn resolve_target(
    config: &Config,
    server: Option<&str>,
    env_token: Option<String>,
) -> Result<Target> {
    let (url, profile) = match server {
        Some(url) => (url.to_string(), profile_for_url(config, url)),
        None => {
            let cluster = config.current()?;
            (
                cluster.url.clone(),
                Some((config.current_name().to_string(), cluster)),
            )
        }
    };
    let (token, source) = match (env_token, &profile) {
        (Some(token), _) => (Some(token), TokenSource::Env),
        (None, Some((name, cluster))) => match cluster.token() {
            Some(token) => (Some(token.to_string()), TokenSource::Profile(name.clone())),
            None => (None, TokenSource::None),
        },
        (None, None) => (None, TokenSource::None),
    };
    let fingerprint = profile.as_ref().and_then(|(_, c)| c.fingerprint.clone());
    Ok(Target {
        url,
        profile: profile.map(|(name, _)| name),
        token,
        source,
        fingerprint,
    })
}

/// A client for `target`; records the target so that a 401 can say what to do.
pub fn client_for(target: &Target) -> Result<Client> {
    set_auth_context(AuthContext {
        url: target.url.clone(),
        profile: target.profile.clone(),
        source: target.source.clone(),
    });
    let client = pinned_client(&target.url, target.fingerprint.as_deref())?;
    Ok(match &target.token {
        Some(token) => client.with_token(token.clone()),
        None => client,
    })
}

/// A client for `url`, trusting only the certificate with `fingerprint` when one is given.
pub fn pinned_client(url: &str, fingerprint: Option<&str>) -> Result<Client> {
    let client = Client::new(url);
    Ok(match fingerprint {
        Some(fingerprint) => client.with_pinned_fingerprint(fingerprint)?,
        None => client,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> (tempfile::TempDir, Config) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, text).unwrap();
        let config = Config::load_from(&path).unwrap();
        (dir, config)
    }

    const TEXT: &str = "current = \"lab\"\n[clusters.local]\nurl = \"http://127.0.0.1:8383\"\ntoken = \"tacc_local\"\n[clusters.lab]\nurl = \"https://lab:8383/\"\ntoken = \"tacc_lab\"\n[clusters.old]\nurl = \"https://old:1\"\nuser = \"alice\"\n";

    #[test]
    fn the_current_profiles_token_goes_to_its_url() {
        let (_dir, config) = config(TEXT);
        let target = resolve_target(&config, None, None).unwrap();
        assert_eq!(target.url, "https://lab:8383/");
        assert_eq!(target.token.as_deref(), Some("tacc_lab"));
        assert_eq!(target.source, TokenSource::Profile("lab".into()));
        assert!(
            !format!("{target:?}").contains("tacc_lab"),
            "Debug hides it"
        );
    }

    #[test]
    fn with_server_only_a_profile_of_that_url_lends_its_token() {
        let (_dir, config) = config(TEXT);
        let target = resolve_target(&config, Some("http://127.0.0.1:8383/"), None).unwrap();
        assert_eq!(target.token.as_deref(), Some("tacc_local"));
        assert_eq!(target.profile.as_deref(), Some("local"));
        let target = resolve_target(&config, Some("http://evil.example"), None).unwrap();
        assert_eq!(
            target.token, None,
            "no profile's token goes to another server"
        );
        assert_eq!(target.source, TokenSource::None);
        assert_eq!(target.profile, None);
    }

    #[test]
    fn tacc_token_overrides_and_a_user_key_sends_nothing() {
        let (_dir, config) = config(TEXT);
        let target = resolve_target(&config, None, Some("tacc_env".into())).unwrap();
        assert_eq!(target.token.as_deref(), Some("tacc_env"));
        assert_eq!(target.source, TokenSource::Env);
        let target = resolve_target(&config, Some("https://old:1"), None).unwrap();
        assert_eq!(target.profile.as_deref(), Some("old"));
        assert_eq!(target.token, None);
    }
}
