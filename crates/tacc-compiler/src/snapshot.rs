//! TEMPORARY stand-in (one chunk per file) with the agreed API.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tacc_core::SnapshotId;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ChunkHash(pub String);
impl std::str::FromStr for ChunkHash {
    type Err = CompilerError;
    fn from_str(s: &str) -> Result<Self, CompilerError> {
        if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(ChunkHash(s.into()))
        } else {
            Err(CompilerError::Invalid(format!("bad chunk hash {s}")))
        }
    }
}
impl std::fmt::Display for ChunkHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub hash: ChunkHash,
    pub size: u32,
}
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    File {
        executable: bool,
        size: u64,
        chunks: Vec<ChunkRef>,
    },
    Symlink {
        target: String,
    },
    Dir,
}
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: String,
    pub kind: EntryKind,
}
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub entries: Vec<Entry>,
}
impl Manifest {
    pub fn id(&self) -> SnapshotId {
        blake3::hash(&serde_json::to_vec(self).unwrap())
            .to_hex()
            .to_string()
            .parse()
            .unwrap()
    }
    pub fn validate(&self) -> Result<(), CompilerError> {
        for e in &self.entries {
            if e.path.starts_with('/') || e.path.split('/').any(|c| c == ".." || c.is_empty()) {
                return Err(CompilerError::Invalid(format!("bad path {}", e.path)));
            }
        }
        Ok(())
    }
    pub fn total_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match &e.kind {
                EntryKind::File { size, .. } => *size,
                _ => 0,
            })
            .sum()
    }
    pub fn chunk_set(&self) -> BTreeSet<ChunkHash> {
        self.entries
            .iter()
            .flat_map(|e| match &e.kind {
                EntryKind::File { chunks, .. } => chunks.iter().map(|c| c.hash.clone()).collect(),
                _ => vec![],
            })
            .collect()
    }
}
#[derive(Debug, thiserror::Error)]
pub enum CompilerError {
    #[error("{0}")]
    Invalid(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CompilerError + '_ {
    move |source| CompilerError::Io {
        path: path.display().to_string(),
        source,
    }
}
pub trait ChunkSource {
    fn read_chunk(&self, hash: &ChunkHash) -> Result<Vec<u8>, CompilerError>;
}
#[derive(Debug)]
pub struct ScannedTree {
    pub manifest: Manifest,
    root: PathBuf,
}
impl ScannedTree {
    pub fn total_bytes(&self) -> u64 {
        self.manifest.total_bytes()
    }
}
impl ChunkSource for ScannedTree {
    fn read_chunk(&self, hash: &ChunkHash) -> Result<Vec<u8>, CompilerError> {
        for e in &self.manifest.entries {
            if let EntryKind::File { chunks, .. } = &e.kind {
                if chunks.iter().any(|c| &c.hash == hash) {
                    let p = self.root.join(&e.path);
                    return std::fs::read(&p).map_err(io(&p));
                }
            }
        }
        Err(CompilerError::Invalid(format!("no chunk {hash}")))
    }
}
pub fn scan(root: &Path, _exclude: &[String]) -> Result<ScannedTree, CompilerError> {
    fn walk(root: &Path, rel: &str, out: &mut Vec<Entry>) -> Result<(), CompilerError> {
        let dir = root.join(rel);
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .map_err(io(&dir))?
            .filter_map(|e| e.ok())
            .collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == ".git" {
                continue;
            }
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let full = root.join(&path);
            let meta = std::fs::symlink_metadata(&full).map_err(io(&full))?;
            if meta.is_dir() {
                out.push(Entry {
                    path: path.clone(),
                    kind: EntryKind::Dir,
                });
                walk(root, &path, out)?;
            } else if meta.is_file() {
                use std::os::unix::fs::PermissionsExt;
                let bytes = std::fs::read(&full).map_err(io(&full))?;
                let hash = ChunkHash(blake3::hash(&bytes).to_hex().to_string());
                out.push(Entry {
                    path,
                    kind: EntryKind::File {
                        executable: meta.permissions().mode() & 0o111 != 0,
                        size: bytes.len() as u64,
                        chunks: vec![ChunkRef {
                            hash,
                            size: bytes.len() as u32,
                        }],
                    },
                });
            }
        }
        Ok(())
    }
    let mut entries = vec![];
    walk(root, "", &mut entries)?;
    Ok(ScannedTree {
        manifest: Manifest {
            format_version: 0,
            entries,
        },
        root: root.to_path_buf(),
    })
}
#[derive(Debug)]
pub struct DirChunkStore {
    dir: PathBuf,
}
impl DirChunkStore {
    pub fn open(dir: &Path) -> Result<Self, CompilerError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        Ok(DirChunkStore {
            dir: dir.to_path_buf(),
        })
    }
    pub fn path_of(&self, hash: &ChunkHash) -> PathBuf {
        self.dir.join(&hash.0)
    }
    pub fn has(&self, hash: &ChunkHash) -> bool {
        self.path_of(hash).exists()
    }
    pub fn put(&self, hash: &ChunkHash, bytes: &[u8]) -> Result<bool, CompilerError> {
        if blake3::hash(bytes).to_hex().as_str() != hash.0 {
            return Err(CompilerError::Invalid(format!(
                "chunk {hash} does not match its bytes"
            )));
        }
        if self.has(hash) {
            return Ok(false);
        }
        let tmp = self.dir.join(format!("{}.tmp", hash.0));
        std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
        std::fs::rename(&tmp, self.path_of(hash)).map_err(io(&tmp))?;
        Ok(true)
    }
}
impl ChunkSource for DirChunkStore {
    fn read_chunk(&self, hash: &ChunkHash) -> Result<Vec<u8>, CompilerError> {
        let p = self.path_of(hash);
        std::fs::read(&p).map_err(io(&p))
    }
}
#[derive(Debug, Default)]
pub struct MaterializeStats;
pub fn materialize(
    manifest: &Manifest,
    source: &dyn ChunkSource,
    dest: &Path,
) -> Result<MaterializeStats, CompilerError> {
    manifest.validate()?;
    std::fs::create_dir_all(dest).map_err(io(dest))?;
    for e in &manifest.entries {
        let p = dest.join(&e.path);
        match &e.kind {
            EntryKind::Dir => std::fs::create_dir_all(&p).map_err(io(&p))?,
            EntryKind::File {
                executable, chunks, ..
            } => {
                let mut bytes = vec![];
                for c in chunks {
                    bytes.extend(source.read_chunk(&c.hash)?);
                }
                std::fs::write(&p, bytes).map_err(io(&p))?;
                if *executable {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
                        .map_err(io(&p))?;
                }
            }
            EntryKind::Symlink { target } => {
                std::os::unix::fs::symlink(target, &p).map_err(io(&p))?
            }
        }
    }
    Ok(MaterializeStats)
}
pub fn materialize_cached(
    manifest: &Manifest,
    source: &dyn ChunkSource,
    _cache: &Path,
    dest: &Path,
) -> Result<MaterializeStats, CompilerError> {
    materialize(manifest, source, dest)
}
