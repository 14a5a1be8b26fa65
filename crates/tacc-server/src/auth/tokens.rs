//! Bearer tokens: 256 bits from the operating system's random source, shown once, and
//! kept by the server only as a SHA-256 hash (a stolen database holds no usable token).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::TryRngCore;
use sha2::{Digest, Sha256};

use tacc_proto::TOKEN_PREFIX;

/// Bytes of randomness in every token.
const TOKEN_BYTES: usize = 32;

/// A freshly generated token: the secret to hand out once, and the hash to store.
#[derive(Debug, Clone)]
pub struct FreshToken {
    pub secret: String,
    pub hash: String,
}

/// A new random token.
pub fn generate() -> FreshToken {
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .expect("the operating system's random source is available");
    let secret = format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes));
    let hash = hash(&secret);
    FreshToken { secret, hash }
}

/// The stored form of a token: lower-case hex of its SHA-256.
pub fn hash(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `text` has the shape of a TACC token (prefix, then URL-safe base64 of 32 bytes).
/// Malformed tokens are refused before any lookup.
pub fn well_formed(text: &str) -> bool {
    let Some(body) = text.strip_prefix(TOKEN_PREFIX) else {
        return false;
    };
    URL_SAFE_NO_PAD
        .decode(body)
        .is_ok_and(|bytes| bytes.len() == TOKEN_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_well_formed_and_hashed() {
        let a = generate();
        let b = generate();
        assert_ne!(a.secret, b.secret);
        assert!(well_formed(&a.secret), "{}", a.secret);
        assert_eq!(a.hash, hash(&a.secret));
        assert_eq!(a.hash.len(), 64);
        assert!(!a.hash.contains(&a.secret));
    }

    #[test]
    fn malformed_tokens_are_recognised() {
        assert!(!well_formed(""));
        assert!(!well_formed("tacc_"));
        assert!(!well_formed("tacc_short"));
        assert!(!well_formed("Bearer tacc_xyz"));
        let good = generate().secret;
        assert!(!well_formed(&good[1..]));
        assert!(!well_formed(&format!("{good}A")));
    }
}
