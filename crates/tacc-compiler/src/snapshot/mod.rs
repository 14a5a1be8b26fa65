//! Content-addressed code snapshots.
//!
//! A snapshot is a [`Manifest`]: the sorted list of files, symlinks and empty directories
//! under a code directory, each file cut into content-defined chunks (FastCDC) named by
//! their BLAKE3 hash. Because chunk boundaries follow the content, editing a few lines of a
//! large file changes only the chunks around the edit, so re-submitting uploads only those
//! (the delta-upload property). The manifest's own hash is the [`SnapshotId`].
//!
//! The pieces: [`scan`] reads a directory into a [`ScannedTree`]; a [`ChunkSource`] hands
//! out chunk bytes ([`ScannedTree`] from the user's files, [`DirChunkStore`] from disk);
//! [`materialize`] and [`materialize_cached`] turn a manifest back into a directory.

mod manifest;
mod materialize;
mod scan;
mod store;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub(crate) use manifest::validate_relative_path;
pub use manifest::{ChunkRef, Entry, EntryKind, MANIFEST_FORMAT_VERSION, Manifest, limits};
pub use materialize::{MaterializeStats, materialize, materialize_cached};
pub use scan::{ScannedTree, TACC_IGNORE_FILE_NAME, scan};
pub use store::{DirChunkStore, GcStats};

use crate::CompilerError;

/// The BLAKE3 hash of one chunk's bytes; written as 64 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ChunkHash([u8; 32]);

impl ChunkHash {
    /// Length of the hash written as hex.
    pub const HEX_LEN: usize = 64;

    /// Hashes `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        ChunkHash(*blake3::hash(bytes).as_bytes())
    }

    /// The raw 32-byte digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The hash as 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.to_string()
    }
}

impl FromStr for ChunkHash {
    type Err = CompilerError;
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let invalid = |why: &str| CompilerError::InvalidChunkHash {
            input: input.to_string(),
            why: why.to_string(),
        };
        if input.len() != Self::HEX_LEN {
            return Err(invalid(&format!("it has {} characters", input.len())));
        }
        let mut digest = [0u8; 32];
        for (byte, pair) in digest.iter_mut().zip(input.as_bytes().chunks_exact(2)) {
            let high = lower_hex_value(pair[0]);
            let low = lower_hex_value(pair[1]);
            match (high, low) {
                (Some(high), Some(low)) => *byte = (high << 4) | low,
                // Upper case is refused so that one hash has exactly one spelling.
                _ => return Err(invalid("it contains a character other than 0-9 and a-f")),
            }
        }
        Ok(ChunkHash(digest))
    }
}

fn lower_hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

impl TryFrom<String> for ChunkHash {
    type Error = CompilerError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<ChunkHash> for String {
    fn from(value: ChunkHash) -> Self {
        value.to_string()
    }
}

impl fmt::Display for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in &self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkHash({self})")
    }
}

/// FastCDC (2020 variant, normalisation level 1) chunk-size bounds, in bytes.
///
/// They are recorded in every manifest: chunk boundaries depend on them, so a later build
/// with different defaults still re-chunks an old tree the same way when asked to, and a
/// receiver can check chunk sizes against the bounds the sender used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkerParams {
    pub min_size: u32,
    pub avg_size: u32,
    pub max_size: u32,
}

impl Default for ChunkerParams {
    fn default() -> Self {
        ChunkerParams {
            min_size: 16 * 1024,
            avg_size: 64 * 1024,
            max_size: 256 * 1024,
        }
    }
}

impl ChunkerParams {
    /// Checks the bounds before they reach `fastcdc`, which panics on out-of-range values.
    pub fn validate(&self) -> Result<(), CompilerError> {
        use fastcdc::v2020::{
            AVERAGE_MAX, AVERAGE_MIN, MAXIMUM_MAX, MAXIMUM_MIN, MINIMUM_MAX, MINIMUM_MIN,
        };
        let invalid = |why: String| CompilerError::InvalidChunkerParams {
            min_size: self.min_size,
            avg_size: self.avg_size,
            max_size: self.max_size,
            why,
        };
        if !(MINIMUM_MIN..=MINIMUM_MAX).contains(&self.min_size) {
            return Err(invalid(format!(
                "min_size must be within {MINIMUM_MIN}..={MINIMUM_MAX}"
            )));
        }
        if !(AVERAGE_MIN..=AVERAGE_MAX).contains(&self.avg_size) {
            return Err(invalid(format!(
                "avg_size must be within {AVERAGE_MIN}..={AVERAGE_MAX}"
            )));
        }
        if !(MAXIMUM_MIN..=MAXIMUM_MAX).contains(&self.max_size) {
            return Err(invalid(format!(
                "max_size must be within {MAXIMUM_MIN}..={MAXIMUM_MAX}"
            )));
        }
        if !(self.min_size <= self.avg_size && self.avg_size <= self.max_size) {
            return Err(invalid(
                "sizes must satisfy min_size <= avg_size <= max_size".into(),
            ));
        }
        // FastCDC starts looking for a cut at `2 * (min_size / 2)`; with an odd minimum it
        // could cut one byte short of it, which `Manifest::validate` would then reject.
        if self.min_size % 2 != 0 {
            return Err(invalid("min_size must be even".into()));
        }
        Ok(())
    }
}

/// Anything that can hand out a chunk's bytes by hash.
///
/// Implementations must return exactly the bytes that hash to `hash`, or an error; callers
/// verify anyway, because a source may be a disk or a network they do not trust.
pub trait ChunkSource {
    fn read_chunk(&self, hash: &ChunkHash) -> Result<Vec<u8>, CompilerError>;
}

/// Checks that `bytes` hash to `expected`; `context` says where the bytes came from.
pub(crate) fn verify_chunk(
    expected: &ChunkHash,
    bytes: &[u8],
    context: impl FnOnce() -> String,
) -> Result<(), CompilerError> {
    let actual = ChunkHash::of(bytes);
    if &actual == expected {
        Ok(())
    } else {
        Err(CompilerError::ChunkHashMismatch {
            expected: *expected,
            actual,
            context: context(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_hash_round_trips_through_hex_and_json() {
        let hash = ChunkHash::of(b"hello");
        assert_eq!(hash.to_hex(), blake3::hash(b"hello").to_hex().as_str());
        assert_eq!(hash.to_hex().parse::<ChunkHash>().unwrap(), hash);
        let json = serde_json::to_string(&hash).unwrap();
        assert_eq!(json, format!("\"{hash}\""));
        assert_eq!(serde_json::from_str::<ChunkHash>(&json).unwrap(), hash);
    }

    #[test]
    fn chunk_hash_rejects_upper_case_wrong_length_and_non_hex() {
        let upper = ChunkHash::of(b"x").to_hex().to_uppercase();
        assert!(upper.parse::<ChunkHash>().is_err());
        assert!("abc".parse::<ChunkHash>().is_err());
        assert!("g".repeat(64).parse::<ChunkHash>().is_err());
        assert!(serde_json::from_str::<ChunkHash>("\"zz\"").is_err());
    }

    #[test]
    fn chunker_params_reject_values_fastcdc_would_panic_on() {
        assert!(ChunkerParams::default().validate().is_ok());
        let bad = [
            ChunkerParams {
                min_size: 10,
                ..Default::default()
            },
            ChunkerParams {
                max_size: u32::MAX,
                ..Default::default()
            },
            ChunkerParams {
                min_size: 128 * 1024,
                ..Default::default()
            },
            ChunkerParams {
                min_size: 16 * 1024 + 1,
                ..Default::default()
            },
        ];
        for params in bad {
            assert!(params.validate().is_err(), "{params:?} should be rejected");
        }
    }
}
