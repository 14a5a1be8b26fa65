//! Cluster profiles: `$TACC_HOME/config.toml` (or `<config dir>/tacc/config.toml`).
//!
//! The file is edited line by line rather than re-serialised, so that a user's comments,
//! ordering and spacing survive `tcloud config use`, `config add`, `login` and `up`.
//!
//! A profile holds the cluster's URL and the API token tcloud sends to it
//! (`token = "tacc_…"`, written by `tcloud login` and `tcloud up`). Because of the token
//! the file is private: tcloud writes it with mode 0600 (tightening a looser existing file
//! before it writes) and creates its directory with mode 0700. The `user` key of earlier
//! versions is still read but ignored: the token says who you are.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::errors::CliError;

/// The profile a missing config file stands for.
pub const DEFAULT_PROFILE: &str = "local";
pub const DEFAULT_PORT: u16 = 8383;
/// The environment variable whose token overrides the profile's.
pub const TOKEN_ENV: &str = "TACC_TOKEN";
/// The mode of the configuration file (it holds tokens).
pub const FILE_MODE: u32 = 0o600;
/// The mode of a configuration directory tcloud creates.
pub const DIR_MODE: u32 = 0o700;

pub fn default_url() -> String {
    format!("http://127.0.0.1:{DEFAULT_PORT}")
}

/// The text written when tcloud creates the file itself.
pub fn default_file_text() -> String {
    format!(
        "# tcloud configuration: one [clusters.NAME] section per cluster; `current` picks one.\n\
         # Switch with `tcloud config use NAME`, add with `tcloud config add NAME URL`,\n\
         # store a cluster's token with `tcloud login` (`tcloud up` does it for `local`).\n\
         # This file holds API tokens: keep it private (tcloud writes it with mode 0600).\n\
         current = \"{DEFAULT_PROFILE}\"\n\
         \n\
         [clusters.{DEFAULT_PROFILE}]\n\
         url = \"{}\"\n",
        default_url()
    )
}

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cluster {
    pub url: String,
    /// The API token sent as `Authorization: Bearer` (`tacc_…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Deprecated: the user name of versions before tokens. Read, never sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// SHA-256 fingerprint (hex) of the server's self-signed TLS certificate: the
    /// server is trusted only if it presents exactly that certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// What a plain `tcloud up` starts the local cluster with (`up_*` keys, written by
    /// `tcloud up --save`; only the `local` profile's are read).
    #[serde(flatten)]
    pub up: UpOptions,
}

/// The options of the embedded cluster, as `tcloud up` flags and as `up_*` keys of the
/// `local` profile.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpOptions {
    /// The scheduler configuration file (an absolute path).
    #[serde(default, rename = "up_config", skip_serializing_if = "Option::is_none")]
    pub config: Option<PathBuf>,
    /// GPUs the local node offers (fake ones where the machine has none).
    #[serde(default, rename = "up_gpus", skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// The model of those GPUs, as task files name it in `gpu_type`.
    #[serde(
        default,
        rename = "up_gpu_type",
        skip_serializing_if = "Option::is_none"
    )]
    pub gpu_type: Option<String>,
    /// Registered datasets, `NAME=SOURCE` each.
    #[serde(default, rename = "up_datasets", skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<String>,
    /// The scheduling policy (overrides the configuration file's).
    #[serde(default, rename = "up_policy", skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

impl UpOptions {
    pub fn is_empty(&self) -> bool {
        self == &UpOptions::default()
    }

    /// These options, each one missing taken from `fallback` (the datasets as a whole).
    pub fn or(self, fallback: &UpOptions) -> UpOptions {
        UpOptions {
            config: self.config.or_else(|| fallback.config.clone()),
            gpus: self.gpus.or(fallback.gpus),
            gpu_type: self.gpu_type.or_else(|| fallback.gpu_type.clone()),
            datasets: if self.datasets.is_empty() {
                fallback.datasets.clone()
            } else {
                self.datasets
            },
            policy: self.policy.or_else(|| fallback.policy.clone()),
        }
    }

    /// The `taccd dev` (and `tcloud up`) arguments that give these options.
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(config) = &self.config {
            args.extend(["--config".to_string(), config.display().to_string()]);
        }
        if let Some(gpus) = self.gpus {
            args.extend(["--gpus".to_string(), gpus.to_string()]);
        }
        if let Some(kind) = &self.gpu_type {
            args.extend(["--gpu-type".to_string(), kind.clone()]);
        }
        for dataset in &self.datasets {
            args.extend(["--dataset".to_string(), dataset.clone()]);
        }
        if let Some(policy) = &self.policy {
            args.extend(["--policy".to_string(), policy.clone()]);
        }
        args
    }

    /// The `up_*` keys of a profile section, each with its TOML value (`None`: no key).
    fn keys(&self) -> [(&'static str, Option<toml::Value>); 5] {
        let string = |s: &str| toml::Value::String(s.to_string());
        [
            (
                "up_config",
                self.config
                    .as_ref()
                    .map(|p| string(&p.display().to_string())),
            ),
            ("up_gpus", self.gpus.map(|n| toml::Value::Integer(n.into()))),
            ("up_gpu_type", self.gpu_type.as_deref().map(string)),
            (
                "up_datasets",
                (!self.datasets.is_empty())
                    .then(|| toml::Value::Array(self.datasets.iter().map(|d| string(d)).collect())),
            ),
            ("up_policy", self.policy.as_deref().map(string)),
        ]
    }
}

impl Cluster {
    pub fn new(url: impl Into<String>) -> Self {
        Cluster {
            url: url.into(),
            token: None,
            user: None,
            fingerprint: None,
            up: UpOptions::default(),
        }
    }

    /// The stored token, when there is a non-empty one.
    pub fn token(&self) -> Option<&str> {
        self.token
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
    }
}

/// Never prints the token itself.
impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("user", &self.user)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ConfigFile {
    #[serde(default)]
    pub current: Option<String>,
    #[serde(default)]
    pub clusters: BTreeMap<String, Cluster>,
}

/// The configuration as read, with where it lives.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    /// The file's text; `None` when the file does not exist.
    pub text: Option<String>,
    pub file: ConfigFile,
}

/// `$TACC_HOME` when set, else `<config dir>/tacc`.
pub fn tacc_home() -> Option<PathBuf> {
    std::env::var_os("TACC_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

pub fn config_path() -> Result<PathBuf> {
    if let Some(home) = tacc_home() {
        return Ok(home.join("config.toml"));
    }
    let dir = dirs::config_dir()
        .context("cannot find your configuration directory; set TACC_HOME to a directory")?;
    Ok(dir.join("tacc").join("config.toml"))
}

/// Where `tcloud up` keeps the local cluster: `$TACC_HOME/local` or `<data dir>/tacc/local`.
pub fn local_data_dir() -> Result<PathBuf> {
    if let Some(home) = tacc_home() {
        return Ok(home.join("local"));
    }
    let dir = dirs::data_dir()
        .context("cannot find your data directory; set TACC_HOME to a directory")?;
    Ok(dir.join("tacc").join("local"))
}

/// `TACC_TOKEN`, when set to something.
pub fn env_token() -> Option<String> {
    std::env::var(TOKEN_ENV)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// Writes `text` to `path`, private to this user: a new file is created 0600 and an
/// existing one is tightened to 0600 before anything is written into it.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)?;
    file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    file.set_len(0)?;
    file.write_all(text.as_bytes())?;
    file.flush()
}

impl Config {
    pub fn load() -> Result<Config> {
        Config::load_from(&config_path()?)
    }

    pub fn load_from(path: &Path) -> Result<Config> {
        let text = match fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let file = match &text {
            Some(text) => parse(text).map_err(|e| {
                CliError::invalid(format!(
                    "{} is not valid: {e}; fix it or delete it to start from the defaults",
                    path.display()
                ))
            })?,
            None => default_file(),
        };
        Ok(Config {
            path: path.to_path_buf(),
            text,
            file,
        })
    }

    /// The name of the current profile.
    pub fn current_name(&self) -> &str {
        self.file.current.as_deref().unwrap_or(DEFAULT_PROFILE)
    }

    /// The current profile; the built-in `local` one if the file does not define it.
    pub fn current(&self) -> Result<Cluster> {
        let name = self.current_name();
        if let Some(cluster) = self.file.clusters.get(name) {
            return Ok(cluster.clone());
        }
        if name == DEFAULT_PROFILE {
            return Ok(Cluster::new(default_url()));
        }
        Err(CliError::invalid(format!(
            "the current cluster `{name}` is not defined in {}; add it with `tcloud config add {name} URL` or switch with `tcloud config use NAME` (known: {})",
            self.path.display(),
            self.known().join(", ")
        ))
        .into())
    }

    pub fn known(&self) -> Vec<String> {
        self.file.clusters.keys().cloned().collect()
    }

    fn text_or_default(&self) -> String {
        self.text.clone().unwrap_or_else(default_file_text)
    }

    fn write(&mut self, text: String) -> Result<()> {
        // Refuse to write something we could not read back.
        let file = parse(&text).context("internal error: edited configuration does not parse")?;
        if let Some(parent) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
            DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        write_private(&self.path, &text)
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        self.text = Some(text);
        self.file = file;
        Ok(())
    }

    /// A warning when the file holds a token but other accounts may read it.
    pub fn exposure_warning(&self) -> Option<String> {
        if !self.file.clusters.values().any(|c| c.token().is_some()) {
            return None;
        }
        let mode = fs::metadata(&self.path).ok()?.permissions().mode() & 0o777;
        (mode & 0o077 != 0).then(|| {
            format!(
                "warning: {} holds API tokens but its mode is {mode:04o}; make it private with `chmod 600 {}`",
                self.path.display(),
                self.path.display()
            )
        })
    }

    /// `tcloud config use NAME`.
    pub fn use_profile(&mut self, name: &str) -> Result<()> {
        if !self.file.clusters.contains_key(name) {
            bail!(CliError::invalid(format!(
                "no cluster named `{name}` in {}; known clusters: {} (add one with `tcloud config add {name} URL`)",
                self.path.display(),
                if self.known().is_empty() {
                    "none".to_string()
                } else {
                    self.known().join(", ")
                }
            )));
        }
        let text = set_current(&self.text_or_default(), name);
        self.write(text)
    }

    /// `tcloud config add NAME URL`: adds the profile, or updates its URL.
    pub fn set_cluster(&mut self, name: &str, url: &str) -> Result<()> {
        check_profile_name(name)?;
        let text = set_in_section(&self.text_or_default(), name, "url", url);
        self.write(text)
    }

    /// Pins profile `name` to the certificate with this SHA-256 `fingerprint`.
    pub fn set_fingerprint(&mut self, name: &str, fingerprint: &str) -> Result<()> {
        check_profile_name(name)?;
        let text = set_in_section(&self.text_or_default(), name, "fingerprint", fingerprint);
        self.write(text)
    }

    /// Stores `token` in profile `name` (which is created with `url` when missing). A
    /// deprecated `user = ...` line of that profile becomes a comment saying so.
    pub fn set_token(&mut self, name: &str, url: &str, token: &str) -> Result<()> {
        check_profile_name(name)?;
        let mut text = self.text_or_default();
        if !self.file.clusters.contains_key(name) {
            text = set_in_section(&text, name, "url", url);
        }
        let text = set_in_section(&text, name, "token", token);
        let text = edit_key_in_section(&text, name, "user", |line| {
            Some(format!(
                "# {}   (ignored: the token says who you are)",
                line.trim()
            ))
        });
        self.write(text)
    }

    /// Stores `options` as profile `name`'s `up_*` keys: each key set is written, each
    /// unset one removed. The profile must exist.
    pub fn set_up_options(&mut self, name: &str, options: &UpOptions) -> Result<()> {
        check_profile_name(name)?;
        let mut text = self.text_or_default();
        for (key, value) in options.keys() {
            text = match value {
                Some(value) => set_raw_in_section(&text, name, key, &value.to_string()),
                None => edit_key_in_section(&text, name, key, |_| None),
            };
        }
        self.write(text)
    }

    /// Removes profile `name`'s token; false when it had none.
    pub fn remove_token(&mut self, name: &str) -> Result<bool> {
        let had = self
            .file
            .clusters
            .get(name)
            .is_some_and(|c| c.token.is_some());
        if !had {
            return Ok(false);
        }
        let text = edit_key_in_section(&self.text_or_default(), name, "token", |_| None);
        self.write(text)?;
        Ok(true)
    }
}

fn check_profile_name(name: &str) -> Result<()> {
    if !valid_profile_name(name) {
        bail!(CliError::invalid(format!(
            "`{name}` is not a valid cluster name; use letters, digits, `-` and `_`"
        )));
    }
    Ok(())
}

pub fn valid_profile_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn default_file() -> ConfigFile {
    parse(&default_file_text()).expect("the default configuration parses")
}

pub fn parse(text: &str) -> Result<ConfigFile, toml::de::Error> {
    toml::from_str(text)
}

fn toml_string(value: &str) -> String {
    toml::Value::String(value.to_string()).to_string()
}

/// Is this line the top-level `current = ...` key (before any table header)?
fn is_key_line(line: &str, key: &str) -> bool {
    let trimmed = line.trim_start();
    trimmed
        .strip_prefix(key)
        .map(|rest| rest.trim_start().starts_with('='))
        .unwrap_or(false)
}

fn is_header(line: &str) -> bool {
    line.trim_start().starts_with('[')
}

/// The section name of a `[clusters.NAME]` header line.
fn cluster_header_name(line: &str) -> Option<String> {
    let trimmed = line.trim();
    let inner = trimmed.strip_prefix('[')?.split(']').next()?.trim();
    let name = inner
        .strip_prefix("clusters")?
        .trim_start()
        .strip_prefix('.')?;
    Some(name.trim().trim_matches('"').trim_matches('\'').to_string())
}

/// Rewrites exactly the one top-level `current = ...` line, keeping every other byte; adds
/// the line at the top when there is none.
pub fn set_current(text: &str, name: &str) -> String {
    let new_line = format!("current = {}", toml_string(name));
    let mut out = String::with_capacity(text.len() + new_line.len());
    let mut replaced = false;
    for line in text.split_inclusive('\n') {
        if is_header(line) {
            // Keys after the first table header belong to that table.
            if !replaced {
                out.push_str(&new_line);
                out.push('\n');
                replaced = true;
            }
            out.push_str(line);
            continue;
        }
        if !replaced && is_key_line(line, "current") {
            out.push_str(&new_line);
            if line.ends_with("\r\n") {
                out.push_str("\r\n");
            } else if line.ends_with('\n') {
                out.push('\n');
            }
            replaced = true;
            continue;
        }
        out.push_str(line);
    }
    if !replaced {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&new_line);
        out.push('\n');
    }
    out
}

/// The line range of `[clusters.NAME]`: its header's index and the index past its end.
fn section_range(lines: &[&str], name: &str) -> Option<(usize, usize)> {
    let start = lines
        .iter()
        .position(|line| cluster_header_name(line).as_deref() == Some(name))?;
    let end = lines[start + 1..]
        .iter()
        .position(|line| is_header(line))
        .map(|offset| start + 1 + offset)
        .unwrap_or(lines.len());
    Some((start, end))
}

/// Replaces the `key = ...` line inside `[clusters.NAME]` by what `edit` makes of it
/// (`None` removes it), keeping every other byte. Unchanged when there is no such line.
pub fn edit_key_in_section(
    text: &str,
    name: &str,
    key: &str,
    edit: impl Fn(&str) -> Option<String>,
) -> String {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let Some((start, end)) = section_range(&lines, name) else {
        return text.to_string();
    };
    let mut out = String::with_capacity(text.len());
    for (i, line) in lines.iter().enumerate() {
        if i > start && i < end && is_key_line(line, key) {
            if let Some(new_line) = edit(line.trim_end_matches(['\r', '\n'])) {
                out.push_str(&new_line);
                out.push('\n');
            }
            continue;
        }
        out.push_str(line);
    }
    out
}

/// Sets `key = "value"` inside `[clusters.NAME]`, replacing the key's line when present,
/// else inserting it after the header; appends the section when it does not exist.
pub fn set_in_section(text: &str, name: &str, key: &str, value: &str) -> String {
    set_raw_in_section(text, name, key, &toml_string(value))
}

/// [`set_in_section`] with a value already written as TOML (a number, an array).
fn set_raw_in_section(text: &str, name: &str, key: &str, value: &str) -> String {
    let new_line = format!("{key} = {value}");
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let Some((start, end)) = section_range(&lines, name) else {
        let mut out = text.to_string();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        if !out.is_empty() && !out.ends_with("\n\n") {
            out.push('\n');
        }
        out.push_str(&format!("[clusters.{name}]\n{new_line}\n"));
        return out;
    };
    let mut out = String::with_capacity(text.len() + new_line.len());
    let existing = (start + 1..end).find(|&i| is_key_line(lines[i], key));
    // A new key goes after the section's last key, else right after its header.
    let insert_after = (start + 1..end)
        .rev()
        .find(|&i| {
            let trimmed = lines[i].trim_start();
            !trimmed.is_empty() && !trimmed.starts_with('#') && trimmed.contains('=')
        })
        .unwrap_or(start);
    for (i, line) in lines.iter().enumerate() {
        if Some(i) == existing {
            out.push_str(&new_line);
            out.push('\n');
            continue;
        }
        out.push_str(line);
        if i == insert_after && existing.is_none() {
            if !line.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&new_line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# my clusters\ncurrent = \"local\"   \n\n[clusters.local]\nurl = \"http://127.0.0.1:8383\"\n# a comment\n\n[clusters.lab]\nurl = \"https://tacc.lab:8383\" # the lab\nuser = \"alice\"\n";

    #[test]
    fn use_rewrites_exactly_one_line_and_keeps_comments() {
        let out = set_current(SAMPLE, "lab");
        let before: Vec<&str> = SAMPLE.lines().collect();
        let after: Vec<&str> = out.lines().collect();
        assert_eq!(before.len(), after.len());
        let changed: Vec<usize> = (0..before.len())
            .filter(|&i| before[i] != after[i])
            .collect();
        assert_eq!(changed, vec![1]);
        assert_eq!(after[1], "current = \"lab\"");
        assert_eq!(parse(&out).unwrap().current.as_deref(), Some("lab"));
    }

    #[test]
    fn use_ignores_keys_named_current_inside_tables_and_adds_missing_line() {
        let text = "[clusters.local]\nurl = \"http://x\"\ncurrent = \"nope\"\n";
        let out = set_current(text, "local");
        assert_eq!(out, format!("current = \"local\"\n{text}"));
    }

    #[test]
    fn set_url_replaces_only_that_sections_url() {
        let out = set_in_section(SAMPLE, "local", "url", "http://127.0.0.1:9000");
        assert!(out.contains("[clusters.local]\nurl = \"http://127.0.0.1:9000\"\n# a comment\n"));
        assert!(out.contains("url = \"https://tacc.lab:8383\" # the lab"));
        assert_eq!(out.lines().count(), SAMPLE.lines().count());
    }

    #[test]
    fn set_in_section_appends_new_section_and_inserts_missing_key() {
        let out = set_in_section(SAMPLE, "gpu", "url", "https://gpu:1");
        let parsed = parse(&out).unwrap();
        assert_eq!(parsed.clusters["gpu"].url, "https://gpu:1");
        assert!(out.starts_with(SAMPLE));
        let out = set_in_section(&out, "local", "user", "bob");
        let parsed = parse(&out).unwrap();
        assert_eq!(parsed.clusters["local"].user.as_deref(), Some("bob"));
        assert_eq!(parsed.clusters["lab"].user.as_deref(), Some("alice"));
        let out = set_in_section("[clusters.a]\nurl = \"u\"\n", "a", "user", "bob");
        assert_eq!(out, "[clusters.a]\nurl = \"u\"\nuser = \"bob\"\n");
    }

    #[test]
    fn missing_file_means_local_profile_and_unknown_use_lists_known() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let mut config = Config::load_from(&path).unwrap();
        assert_eq!(config.current_name(), "local");
        assert_eq!(config.current().unwrap().url, default_url());
        let err = config.use_profile("nope").unwrap_err().to_string();
        assert!(err.contains("known clusters: local"), "{err}");
        assert!(!path.exists());
        config.set_cluster("lab", "https://lab:8383").unwrap();
        config.use_profile("lab").unwrap();
        let config = Config::load_from(&path).unwrap();
        assert_eq!(config.current_name(), "lab");
        assert_eq!(config.current().unwrap().url, "https://lab:8383");
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn up_options_round_trip_as_up_keys_and_flags_win_over_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::write(&path, SAMPLE).unwrap();
        let mut config = Config::load_from(&path).unwrap();
        let saved = UpOptions {
            config: Some(PathBuf::from("/etc/tacc.toml")),
            gpus: Some(2),
            gpu_type: Some("A100".into()),
            datasets: vec!["mnist=/data/mnist".into(), "c=https://h/c.tgz".into()],
            policy: Some("fifo".into()),
        };
        config.set_up_options("local", &saved).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("up_gpus = 2\n"), "{text}");
        assert!(text.contains("# a comment"), "{text}");
        let config = Config::load_from(&path).unwrap();
        assert_eq!(config.file.clusters["local"].up, saved);
        assert!(config.file.clusters["lab"].up.is_empty());

        let flags = UpOptions {
            gpus: Some(4),
            ..UpOptions::default()
        };
        let merged = flags.clone().or(&saved);
        assert_eq!(merged.gpus, Some(4));
        assert_eq!(merged.gpu_type.as_deref(), Some("A100"));
        assert_eq!(
            merged.args()[..4],
            ["--config", "/etc/tacc.toml", "--gpus", "4"]
        );

        // Saving fewer options removes the others' keys.
        let mut config = Config::load_from(&path).unwrap();
        config.set_up_options("local", &flags).unwrap();
        let config = Config::load_from(&path).unwrap();
        assert_eq!(config.file.clusters["local"].up, flags);
    }

    #[test]
    fn a_pinned_fingerprint_round_trips_beside_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::write(&path, SAMPLE).unwrap();
        let mut config = Config::load_from(&path).unwrap();
        config.set_fingerprint("lab", &"ab".repeat(32)).unwrap();
        config
            .set_token("lab", "https://ignored:1", "tacc_abc")
            .unwrap();
        let config = Config::load_from(&path).unwrap();
        let lab = &config.file.clusters["lab"];
        assert_eq!(lab.fingerprint.as_deref(), Some("ab".repeat(32).as_str()));
        assert_eq!(lab.token(), Some("tacc_abc"));
        assert_eq!(config.file.clusters["local"].fingerprint, None);
    }

    #[test]
    fn tokens_round_trip_and_keep_every_other_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::write(&path, SAMPLE).unwrap();
        let mut config = Config::load_from(&path).unwrap();
        config
            .set_token("lab", "https://ignored:1", "tacc_abc-DEF_123")
            .unwrap();
        let text = fs::read_to_string(&path).unwrap();
        let config = Config::load_from(&path).unwrap();
        let lab = &config.file.clusters["lab"];
        assert_eq!(lab.token(), Some("tacc_abc-DEF_123"));
        assert_eq!(lab.url, "https://tacc.lab:8383", "an existing URL is kept");
        assert_eq!(lab.user, None, "the deprecated user line is now a comment");
        assert!(text.contains("# user = \"alice\"   (ignored: the token says who you are)"));
        for kept in [
            "# my clusters",
            "# a comment",
            "url = \"https://tacc.lab:8383\" # the lab",
        ] {
            assert!(text.contains(kept), "{kept} lost: {text}");
        }
        assert_eq!(config.file.clusters["local"].token(), None);

        // Replacing a token rewrites its one line; removing it removes only that line.
        let mut config = config;
        config.set_token("lab", "", "tacc_new").unwrap();
        let replaced = fs::read_to_string(&path).unwrap();
        assert_eq!(replaced.lines().count(), text.lines().count());
        assert!(config.remove_token("lab").unwrap());
        assert!(!config.remove_token("lab").unwrap());
        let removed = fs::read_to_string(&path).unwrap();
        assert_eq!(removed.lines().count(), text.lines().count() - 1);
        assert!(!removed.contains("tacc_"), "{removed}");
        assert!(removed.contains("# a comment"));
    }

    #[test]
    fn a_token_for_a_new_profile_creates_it_with_its_url() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("config.toml");
        let mut config = Config::load_from(&path).unwrap();
        config
            .set_token("gpu", "https://gpu:8383", "tacc_x")
            .unwrap();
        let config = Config::load_from(&path).unwrap();
        assert_eq!(config.file.clusters["gpu"].url, "https://gpu:8383");
        assert_eq!(config.file.clusters["gpu"].token(), Some("tacc_x"));
        // The default profile came along with the file's default text.
        assert_eq!(config.file.clusters["local"].url, default_url());
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
    }

    #[test]
    fn the_file_is_written_0600_and_a_looser_one_is_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let mut config = Config::load_from(&path).unwrap();
        config.set_cluster("lab", "https://lab:1").unwrap();
        assert_eq!(mode(&path), 0o600, "created private");

        fs::set_permissions(&path, Permissions::from_mode(0o644)).unwrap();
        let mut config = Config::load_from(&path).unwrap();
        config
            .set_token("lab", "https://lab:1", "tacc_secret")
            .unwrap();
        assert_eq!(mode(&path), 0o600, "tightened when written");
        assert!(config.exposure_warning().is_none());
        fs::set_permissions(&path, Permissions::from_mode(0o640)).unwrap();
        let config = Config::load_from(&path).unwrap();
        let warning = config.exposure_warning().unwrap();
        assert!(
            warning.contains("0640") && warning.contains("chmod 600"),
            "{warning}"
        );
    }

    #[test]
    fn old_files_with_user_still_parse_and_debug_hides_tokens() {
        let parsed = parse(SAMPLE).unwrap();
        assert_eq!(parsed.clusters["lab"].user.as_deref(), Some("alice"));
        let mut cluster = Cluster::new("http://x");
        cluster.token = Some("tacc_very_secret".into());
        let debug = format!("{cluster:?}");
        assert!(!debug.contains("very_secret"), "{debug}");
        cluster.token = Some("  ".into());
        assert_eq!(cluster.token(), None, "a blank token is no token");
    }

    #[test]
    fn edit_key_only_touches_that_section() {
        let text = "[clusters.a]\ntoken = \"t1\"\n\n[clusters.b]\ntoken = \"t2\"\n";
        let out = edit_key_in_section(text, "b", "token", |_| None);
        assert_eq!(out, "[clusters.a]\ntoken = \"t1\"\n\n[clusters.b]\n");
        assert_eq!(edit_key_in_section(text, "c", "token", |_| None), text);
    }
}
