//! Per-user secrets, sealed at rest with XChaCha20-Poly1305 under the server's key
//! (`DATA/secret.key`, 32 random bytes, mode 0600). The associated data binds each
//! ciphertext to its owner and name, so a row copied to another user or name does not
//! open. Values leave the server only inside the assignment sent to the node running the
//! task that names them.

use std::collections::BTreeMap;
use std::path::Path;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::TryRngCore;
use tacc_schema::TaskSpec;
use tacc_store::{SecretRecord, Store, TaskRecord};

use crate::ServerError;
use crate::logs::LogBook;

/// Longest secret value accepted.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;
const KEY_BYTES: usize = 32;
const NONCE_BYTES: usize = 24;

#[derive(Clone)]
pub struct SecretBox {
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretBox(..)")
    }
}

fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .expect("the operating system's random source is available");
    bytes
}

fn associated_data(user: &str, name: &str) -> Vec<u8> {
    format!("tacc-secret\0{user}\0{name}").into_bytes()
}

/// A secret's name: what it is called in the task's environment.
pub fn check_secret_name(name: &str) -> Result<(), ServerError> {
    let mut chars = name.chars();
    let shape_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 128;
    if !shape_ok {
        return Err(ServerError::BadRequest(format!(
            "`{name}` is not a valid secret name: use upper-case letters, digits and `_` \
             (it becomes an environment variable), e.g. WANDB_API_KEY"
        )));
    }
    if name.starts_with("TACC_") || tacc_schema::is_platform_variable(name) {
        return Err(ServerError::BadRequest(format!(
            "`{name}` is set by the platform; name the secret differently"
        )));
    }
    Ok(())
}

impl SecretBox {
    /// Open the key file, creating it (0600) on first use.
    pub fn open(key_file: &Path) -> Result<Self, ServerError> {
        let internal =
            |e: std::io::Error| ServerError::io(format!("secret key {}", key_file.display()), e);
        let key = match std::fs::read(key_file) {
            Ok(bytes) if bytes.len() == KEY_BYTES => bytes,
            Ok(bytes) => {
                return Err(ServerError::Config(format!(
                    "the secret key {} holds {} bytes, not {KEY_BYTES}: restore it from a \
                     backup (secrets cannot be read without it)",
                    key_file.display(),
                    bytes.len()
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = random::<KEY_BYTES>().to_vec();
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(key_file)
                    .map_err(internal)?;
                file.write_all(&key).map_err(internal)?;
                file.sync_all().map_err(internal)?;
                key
            }
            Err(e) => return Err(internal(e)),
        };
        let cipher = XChaCha20Poly1305::new_from_slice(&key)
            .map_err(|e| ServerError::Internal(format!("secret key: {e}")))?;
        Ok(SecretBox { cipher })
    }

    pub fn seal(
        &self,
        user: &str,
        name: &str,
        value: &[u8],
        at: tacc_core::Timestamp,
    ) -> Result<SecretRecord, ServerError> {
        let nonce = random::<NONCE_BYTES>();
        let aad = associated_data(user, name);
        let ciphertext = self
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: value,
                    aad: &aad,
                },
            )
            .map_err(|_| ServerError::Internal("cannot encrypt the secret".into()))?;
        Ok(SecretRecord {
            user: user.to_string(),
            name: name.to_string(),
            nonce: nonce.to_vec(),
            ciphertext,
            updated_at: at,
        })
    }

    pub fn open_value(&self, record: &SecretRecord) -> Result<String, ServerError> {
        if record.nonce.len() != NONCE_BYTES {
            return Err(ServerError::Internal(format!(
                "secret {} of {} is corrupt",
                record.name, record.user
            )));
        }
        let aad = associated_data(&record.user, &record.name);
        let plain = self
            .cipher
            .decrypt(
                XNonce::from_slice(&record.nonce),
                Payload {
                    msg: &record.ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| {
                ServerError::Internal(format!(
                    "secret {} of {} does not open with this server's key (was secret.key replaced?)",
                    record.name, record.user
                ))
            })?;
        String::from_utf8(plain).map_err(|_| {
            ServerError::Internal(format!(
                "secret {} of {} is not text",
                record.name, record.user
            ))
        })
    }
}

impl SecretBox {
    /// The values of the secrets a task names, for its assignments. A secret deleted
    /// since the submission is left out, and the task's log (in `logs`) says so.
    pub(crate) async fn task_secrets(
        &self,
        store: &dyn Store,
        logs: &LogBook,
        record: &TaskRecord,
        spec: &TaskSpec,
    ) -> BTreeMap<String, String> {
        let mut values = BTreeMap::new();
        for name in &spec.environment.secrets {
            let opened = match store.get_secret(&record.user, name).await {
                Ok(Some(sealed)) => self.open_value(&sealed),
                Ok(None) => Err(ServerError::NotFound(format!(
                    "secret {name} no longer exists (set it again with `tcloud secret set {name}`)"
                ))),
                Err(e) => Err(e.into()),
            };
            match opened {
                Ok(value) => {
                    values.insert(name.clone(), value);
                }
                Err(e) => {
                    let line =
                        format!("[tacc] secret {name} is not available to this attempt: {e}\n");
                    if let Err(io) = logs.append(record.id, &line) {
                        tracing::error!("cannot write the log of task {}: {io}", record.id);
                    }
                }
            }
        }
        values
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tacc_core::Timestamp;

    #[test]
    fn sealed_secrets_open_only_for_their_owner_and_name() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("secret.key");
        let sealed = SecretBox::open(&key).unwrap();
        let record = sealed
            .seal("alice", "API_KEY", b"s3cr3t-value", Timestamp(1))
            .unwrap();
        assert!(!record.ciphertext.windows(6).any(|w| w == b"s3cr3t"));
        let reopened = SecretBox::open(&key).unwrap();
        assert_eq!(reopened.open_value(&record).unwrap(), "s3cr3t-value");
        let stolen = SecretRecord {
            user: "bob".into(),
            ..record.clone()
        };
        assert!(reopened.open_value(&stolen).is_err());
        let renamed = SecretRecord {
            name: "OTHER".into(),
            ..record
        };
        assert!(reopened.open_value(&renamed).is_err());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn secret_names_are_environment_names_the_platform_does_not_own() {
        check_secret_name("WANDB_API_KEY").unwrap();
        for bad in ["", "lower", "1X", "A-B", "TACC_TOKEN", "PATH"] {
            assert!(check_secret_name(bad).is_err(), "{bad}");
        }
    }
}
