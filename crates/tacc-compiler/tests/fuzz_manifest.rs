//! Fuzzing of the snapshot manifest decoder: JSON → `Manifest` → `validate()`, which the
//! server runs on every upload (`offer` and `commit`) and a node runs before it writes a
//! single file. Bounded so it runs in every CI build.
//!
//! Inputs are arbitrary bytes, arbitrary JSON, valid manifests (generated trees of files,
//! directories and in-tree symlinks), valid manifests with one known breakage (paths with
//! `..`, absolute, NUL or too long; chunk lists that do not add up; duplicates; entries under
//! a file; escaping symlinks; sizes past the total limit), valid manifests mutated at random,
//! and their JSON mutated at a random node. For every input:
//!
//! - nothing panics (debug build: integer overflow panics too), `id`, `total_bytes` and
//!   `chunk_set` included;
//! - what `validate` accepts is safe by an independent check written here (relative plain
//!   paths, listed once, sorted, nothing under a file or symlink, sizes that add up, symlinks
//!   that stay inside the tree) and round-trips through JSON to the same id;
//! - every known breakage is refused, with the error that names it;
//! - materialising an accepted manifest writes nothing outside its destination.
//!
//! Cases come from a pinned seed, so CI replays the same ones; `PROPTEST_RNG_SEED=N` and
//! `PROPTEST_CASES=N` explore more locally. Failures are recorded in
//! `fuzz_manifest.proptest-regressions` (commit it) and replayed first on every run.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{FileFailurePersistence, RngSeed};
use serde_json::Value;
use tacc_compiler::snapshot::limits;
use tacc_compiler::{
    ChunkHash, ChunkRef, ChunkSource, ChunkerParams, CompilerError, Entry, EntryKind,
    MANIFEST_FORMAT_VERSION, Manifest, materialize,
};

const PINNED_SEED: u64 = 0x7acc_f023;

fn pinned(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(PINNED_SEED),
        // Integration tests have no lib.rs or main.rs beside them, which the default
        // `SourceParallel` looks for: keep the regressions next to this file.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// The smallest bounds FastCDC allows, so files of several chunks stay small.
const SMALL: ChunkerParams = ChunkerParams {
    min_size: 64,
    avg_size: 256,
    max_size: 1024,
};

/// The largest chunk FastCDC allows, to reach the total-size limit with few chunks.
const HUGE_CHUNK: u32 = 16 * 1024 * 1024;

// ---------------------------------------------------------------------------------------
// What must hold
// ---------------------------------------------------------------------------------------

/// Why `manifest` is unsafe or malformed, checked independently of `Manifest::validate`:
/// `None` when a receiver may write it out.
fn unsafe_because(manifest: &Manifest) -> Option<String> {
    if manifest.format_version != MANIFEST_FORMAT_VERSION {
        return Some("format version".into());
    }
    // The chunker's bounds are FastCDC's to define.
    let chunker = manifest.chunker;
    if chunker.validate().is_err() {
        return Some("chunker bounds".into());
    }
    if manifest.entries.len() as u64 > limits::MAX_ENTRIES {
        return Some("too many entries".into());
    }
    let kinds: BTreeMap<&str, &EntryKind> = manifest
        .entries
        .iter()
        .map(|entry| (entry.path.as_str(), &entry.kind))
        .collect();
    if kinds.len() != manifest.entries.len() {
        return Some("a path is listed twice".into());
    }
    if manifest
        .entries
        .windows(2)
        .any(|pair| pair[0].path >= pair[1].path)
    {
        return Some("entries are not sorted".into());
    }
    let mut total: u128 = 0;
    for entry in &manifest.entries {
        let path = &entry.path;
        if path.is_empty()
            || path.len() > limits::MAX_PATH_BYTES
            || path.starts_with('/')
            || path.contains(['\0', '\\'])
            || path
                .split('/')
                .any(|component| matches!(component, "" | "." | ".."))
        {
            return Some(format!("unsafe path {path:?}"));
        }
        let components: Vec<&str> = path.split('/').collect();
        for depth in 1..components.len() {
            let ancestor = components[..depth].join("/");
            if let Some(EntryKind::File { .. } | EntryKind::Symlink { .. }) =
                kinds.get(ancestor.as_str())
            {
                return Some(format!(
                    "{path:?} lies under the non-directory {ancestor:?}"
                ));
            }
        }
        match &entry.kind {
            EntryKind::File { size, chunks, .. } => {
                let sum: u128 = chunks.iter().map(|chunk| u128::from(chunk.size)).sum();
                if sum != u128::from(*size) {
                    return Some(format!("{path:?}: chunks add up to {sum}, not {size}"));
                }
                let last = chunks.len().saturating_sub(1);
                let out_of_bounds = chunks.iter().enumerate().any(|(index, chunk)| {
                    let min = if index == last { 1 } else { chunker.min_size };
                    chunk.size < min || chunk.size > chunker.max_size
                });
                if out_of_bounds {
                    return Some(format!("{path:?}: a chunk size is out of bounds"));
                }
                total += u128::from(*size);
            }
            EntryKind::Symlink { target } => {
                if escapes(&components[..components.len() - 1], target) {
                    return Some(format!("symlink {path:?} -> {target:?} escapes"));
                }
            }
            EntryKind::Dir => {}
        }
    }
    if total > u128::from(limits::MAX_TOTAL_BYTES) {
        return Some("over the total size limit".into());
    }
    None
}

/// Whether `target`, read from the directory `link_dir` (components below the root), may
/// lead out of the root. Followed lexically, which is only sound while every `..` comes
/// before the first name: after a name (possibly another symlink) the kernel's `..` climbs
/// from wherever that name leads, so such targets count as escaping.
fn escapes(link_dir: &[&str], target: &str) -> bool {
    if target.is_empty()
        || target.len() > limits::MAX_SYMLINK_TARGET_BYTES
        || target.starts_with('/')
        || target.contains(['\0', '\\'])
    {
        return true;
    }
    let mut depth = link_dir.len();
    let mut seen_name = false;
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." if depth == 0 || seen_name => return true,
            ".." => depth -= 1,
            _ => seen_name = true,
        }
    }
    false
}

/// Everything the server and a node call on a decoded manifest: none of it may panic, and
/// what `validate` accepts must be safe and keep its id through JSON.
fn check_decoded(manifest: &Manifest) -> Result<(), TestCaseError> {
    let id = manifest.id();
    let total = manifest.total_bytes();
    let chunks = manifest.chunk_set();
    let verdict = manifest.validate();
    let _ = verdict.as_ref().map_err(ToString::to_string);
    if verdict.is_err() {
        return Ok(());
    }
    if let Some(why) = unsafe_because(manifest) {
        return Err(TestCaseError::fail(format!(
            "validate accepted an unsafe manifest ({why}): {manifest:?}"
        )));
    }
    prop_assert!(total.as_bytes() <= limits::MAX_TOTAL_BYTES);
    prop_assert!(chunks.len() <= manifest.entries.iter().map(chunk_count).sum::<usize>());

    // The JSON the client sends and the server stores, as text and as a `Value`.
    let text = serde_json::to_string(manifest).expect("a manifest serialises");
    let back: Manifest = serde_json::from_str(&text)
        .map_err(|e| TestCaseError::fail(format!("{e} reading back {text}")))?;
    prop_assert_eq!(&back, manifest);
    prop_assert_eq!(back.id(), id.clone());
    let value = serde_json::to_value(manifest).expect("a manifest serialises");
    let back: Manifest = serde_json::from_value(value).expect("and reads back");
    prop_assert!(back.validate().is_ok());
    prop_assert_eq!(back.id(), id.clone());

    // The id names the content, not the order it was listed in.
    let mut reversed = manifest.entries.clone();
    reversed.reverse();
    prop_assert_eq!(Manifest::new(manifest.chunker, reversed).id(), id);
    Ok(())
}

fn chunk_count(entry: &Entry) -> usize {
    match &entry.kind {
        EntryKind::File { chunks, .. } => chunks.len(),
        _ => 0,
    }
}

fn check_json_text(text: &[u8]) -> Result<(), TestCaseError> {
    match serde_json::from_slice::<Manifest>(text) {
        Ok(manifest) => check_decoded(&manifest),
        Err(_) => Ok(()),
    }
}

fn check_json_value(value: Value) -> Result<(), TestCaseError> {
    // The server's path (`serde_json::from_value` on the request's `manifest` field) and
    // the text path must agree on what decodes.
    let text = serde_json::to_vec(&value).expect("a JSON value serialises");
    let from_value = serde_json::from_value::<Manifest>(value);
    let from_text = serde_json::from_slice::<Manifest>(&text);
    prop_assert_eq!(from_value.is_ok(), from_text.is_ok());
    match from_value {
        Ok(manifest) => check_decoded(&manifest),
        Err(_) => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------
// Valid manifests
// ---------------------------------------------------------------------------------------

/// Chunk bytes by hash, for materialising the manifests generated here.
#[derive(Debug, Clone, Default)]
struct Chunks(BTreeMap<ChunkHash, Vec<u8>>);

impl ChunkSource for Chunks {
    fn read_chunk(&self, hash: &ChunkHash) -> Result<Vec<u8>, CompilerError> {
        self.0
            .get(hash)
            .cloned()
            .ok_or(CompilerError::ChunkNotFound { hash: *hash })
    }
}

fn chunk_bytes(seed: u8, size: u32) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[derive(Debug, Clone)]
enum Shape {
    /// (content seed, size) per chunk.
    File {
        executable: bool,
        chunks: Vec<(u8, u32)>,
    },
    /// `parents` leading `..` (capped at the link's depth), then `rest`.
    Symlink {
        parents: usize,
        rest: Vec<&'static str>,
    },
    Dir,
}

const NAMES: &[&str] = &[
    "a",
    "b",
    "src",
    "lib.rs",
    ".hidden",
    "ü",
    "a b",
    "x.py",
    "...",
    "-",
    "tab\there",
    "ℵ",
];

fn shape() -> impl Strategy<Value = Shape> {
    let chunks = (
        prop::collection::vec((any::<u8>(), SMALL.min_size..=SMALL.max_size), 0..4),
        1..=SMALL.max_size,
    )
        .prop_map(|(mut chunks, last)| {
            if let Some(chunk) = chunks.last_mut() {
                chunk.1 = last;
            }
            chunks
        });
    prop_oneof![
        3 => (any::<bool>(), chunks).prop_map(|(executable, chunks)| Shape::File { executable, chunks }),
        1 => (0usize..4, prop::collection::vec(prop::sample::select(NAMES), 0..3))
            .prop_map(|(parents, rest)| Shape::Symlink { parents, rest }),
        1 => Just(Shape::Dir),
    ]
}

/// A valid manifest over [`SMALL`] chunks, and the bytes of its chunks.
fn valid_manifest() -> impl Strategy<Value = (Manifest, Chunks)> {
    let path = prop::collection::vec(prop::sample::select(NAMES), 1..=4);
    prop::collection::vec((path, shape()), 0..16).prop_map(|items| {
        let mut chunks = Chunks::default();
        let mut by_path: BTreeMap<String, EntryKind> = BTreeMap::new();
        for (components, shape) in items {
            let kind = match shape {
                Shape::File {
                    executable,
                    chunks: parts,
                } => {
                    let refs: Vec<ChunkRef> = parts
                        .iter()
                        .map(|&(seed, size)| {
                            let bytes = chunk_bytes(seed, size);
                            let hash = ChunkHash::of(&bytes);
                            chunks.0.insert(hash, bytes);
                            ChunkRef { hash, size }
                        })
                        .collect();
                    EntryKind::File {
                        executable,
                        size: refs.iter().map(|chunk| u64::from(chunk.size)).sum(),
                        chunks: refs,
                    }
                }
                Shape::Symlink { parents, rest } => {
                    let mut target: Vec<&str> = vec![".."; parents.min(components.len() - 1)];
                    target.extend(rest);
                    let target = if target.is_empty() {
                        ".".to_string()
                    } else {
                        target.join("/")
                    };
                    EntryKind::Symlink { target }
                }
                Shape::Dir => EntryKind::Dir,
            };
            by_path.insert(components.join("/"), kind);
        }
        // Only directories may have entries under them.
        let blocked: BTreeSet<String> = by_path
            .iter()
            .filter(|(_, kind)| !matches!(kind, EntryKind::Dir))
            .map(|(path, _)| format!("{path}/"))
            .collect();
        let entries = by_path
            .into_iter()
            .filter(|(path, _)| {
                !blocked
                    .iter()
                    .any(|prefix| path.starts_with(prefix.as_str()))
            })
            .map(|(path, kind)| Entry { path, kind })
            .collect();
        (Manifest::new(SMALL, entries), chunks)
    })
}

// ---------------------------------------------------------------------------------------
// Known breakages: each must be refused with its own error
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Breakage {
    UnsafePath(Index, String),
    SymlinkTarget(Index, String),
    EscapingSymlink(Index, usize),
    SizeMismatch(Index, u64),
    ChunkSize(Index, u32),
    Duplicate(Index),
    Unsorted,
    UnderNonDirectory(Index, bool),
    FormatVersion(u32),
    Chunker(ChunkerParams),
    TooLarge,
}

fn unsafe_path() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(
            &[
                "",
                "/",
                "/etc/passwd",
                "..",
                "../x",
                "a/..",
                "a/../b",
                ".",
                "./a",
                "a/.",
                "a//b",
                "a/",
                "//a",
                "a\\b",
                "..\\x",
                "a\0b",
                "\0",
            ][..]
        )
        .prop_map(str::to_string),
        (1usize..8).prop_map(|n| "../".repeat(n) + "etc/cron.d/x"),
        (limits::MAX_PATH_BYTES + 1..limits::MAX_PATH_BYTES + 64).prop_map(|n| "a".repeat(n)),
        (limits::MAX_PATH_BYTES / 2 + 1..limits::MAX_PATH_BYTES).prop_map(|n| "ab/".repeat(n / 2)),
    ]
}

fn bad_target() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(
            &[
                "",
                "/",
                "/etc/passwd",
                "a/../..",
                "a/../b",
                "x/y/../../..",
                "a\0b",
                "a\\b",
                "..\\.."
            ][..]
        )
        .prop_map(str::to_string),
        (limits::MAX_SYMLINK_TARGET_BYTES + 1..limits::MAX_SYMLINK_TARGET_BYTES + 64)
            .prop_map(|n| "a".repeat(n)),
    ]
}

fn bad_chunker() -> impl Strategy<Value = ChunkerParams> {
    let edge = prop::sample::select(
        &[
            0u32,
            1,
            63,
            64,
            65,
            255,
            256,
            1023,
            1024,
            1_048_577,
            4_194_305,
            16_777_217,
            u32::MAX,
        ][..],
    );
    (edge.clone(), edge.clone(), edge)
        .prop_map(|(min_size, avg_size, max_size)| ChunkerParams {
            min_size,
            avg_size,
            max_size,
        })
        .prop_filter("must be invalid", |params| params.validate().is_err())
}

fn breakage() -> impl Strategy<Value = Breakage> {
    prop_oneof![
        3 => (any::<Index>(), unsafe_path()).prop_map(|(at, path)| Breakage::UnsafePath(at, path)),
        2 => (any::<Index>(), bad_target()).prop_map(|(at, t)| Breakage::SymlinkTarget(at, t)),
        2 => (any::<Index>(), 1usize..4).prop_map(|(at, extra)| Breakage::EscapingSymlink(at, extra)),
        2 => (any::<Index>(), prop_oneof![Just(1u64), Just(u64::MAX), any::<u64>().prop_filter("nonzero", |d| *d != 0)])
            .prop_map(|(at, delta)| Breakage::SizeMismatch(at, delta)),
        2 => (any::<Index>(), prop_oneof![Just(0u32), Just(SMALL.min_size - 1), Just(SMALL.max_size + 1), Just(u32::MAX)])
            .prop_map(|(at, size)| Breakage::ChunkSize(at, size)),
        1 => any::<Index>().prop_map(Breakage::Duplicate),
        1 => Just(Breakage::Unsorted),
        1 => (any::<Index>(), any::<bool>()).prop_map(|(at, deep)| Breakage::UnderNonDirectory(at, deep)),
        1 => any::<u32>().prop_filter("not the current version", |v| *v != MANIFEST_FORMAT_VERSION)
            .prop_map(Breakage::FormatVersion),
        1 => bad_chunker().prop_map(Breakage::Chunker),
        1 => Just(Breakage::TooLarge),
    ]
}

/// Index of an entry of `manifest` matching `want`, adding `make` when there is none.
fn pick(manifest: &mut Manifest, at: &Index, want: fn(&EntryKind) -> bool, make: Entry) -> usize {
    let candidates: Vec<usize> = (0..manifest.entries.len())
        .filter(|&i| want(&manifest.entries[i].kind))
        .collect();
    if candidates.is_empty() {
        // Named `zz-…`, which no generated path is.
        let path = make.path.clone();
        manifest.entries.push(make);
        sort(manifest);
        manifest
            .entries
            .iter()
            .position(|entry| entry.path == path)
            .expect("just added")
    } else {
        candidates[at.index(candidates.len())]
    }
}

fn one_chunk_file(path: &str) -> Entry {
    let bytes = chunk_bytes(7, 100);
    Entry {
        path: path.to_string(),
        kind: EntryKind::File {
            executable: false,
            size: 100,
            chunks: vec![ChunkRef {
                hash: ChunkHash::of(&bytes),
                size: 100,
            }],
        },
    }
}

fn is_file(kind: &EntryKind) -> bool {
    matches!(kind, EntryKind::File { .. })
}

fn is_symlink(kind: &EntryKind) -> bool {
    matches!(kind, EntryKind::Symlink { .. })
}

fn is_not_dir(kind: &EntryKind) -> bool {
    !matches!(kind, EntryKind::Dir)
}

fn sort(manifest: &mut Manifest) {
    manifest.entries.sort_by(|a, b| a.path.cmp(&b.path));
}

/// Breaks `manifest` and returns the name of the error that must refuse it.
fn apply(breakage: &Breakage, manifest: &mut Manifest) -> &'static str {
    match breakage {
        Breakage::UnsafePath(at, path) => {
            let i = pick(manifest, at, |_| true, one_chunk_file("zz-file"));
            manifest.entries[i].path = path.clone();
            sort(manifest);
            "UnsafePath"
        }
        Breakage::SymlinkTarget(at, target) => {
            let link = Entry {
                path: "zz-link".into(),
                kind: EntryKind::Symlink {
                    target: String::new(),
                },
            };
            let i = pick(manifest, at, is_symlink, link);
            manifest.entries[i].kind = EntryKind::Symlink {
                target: target.clone(),
            };
            "UnsafeSymlink"
        }
        Breakage::EscapingSymlink(at, extra) => {
            let link = Entry {
                path: "zz-link".into(),
                kind: EntryKind::Symlink { target: ".".into() },
            };
            let i = pick(manifest, at, is_symlink, link);
            let depth = manifest.entries[i].path.matches('/').count();
            manifest.entries[i].kind = EntryKind::Symlink {
                target: "../".repeat(depth + extra) + "etc/passwd",
            };
            "UnsafeSymlink"
        }
        Breakage::SizeMismatch(at, delta) => {
            let i = pick(manifest, at, is_file, one_chunk_file("zz-file"));
            if let EntryKind::File { size, .. } = &mut manifest.entries[i].kind {
                *size = size.wrapping_add(*delta);
            }
            "FileSizeMismatch"
        }
        Breakage::ChunkSize(at, new_size) => {
            let i = pick(manifest, at, is_file, one_chunk_file("zz-file"));
            let EntryKind::File { size, chunks, .. } = &mut manifest.entries[i].kind else {
                unreachable!("picked a file")
            };
            if chunks.is_empty() {
                chunks.push(ChunkRef {
                    hash: ChunkHash::of(b"x"),
                    size: 1,
                });
            }
            // `min_size - 1` is too small only for a chunk that is not the last.
            let last = chunks.len() - 1;
            let (index, new_size) = match *new_size {
                short if short == SMALL.min_size - 1 && last > 0 => (0, short),
                short if short == SMALL.min_size - 1 => (last, 0),
                other => (last, other),
            };
            chunks[index].size = new_size;
            // Keep the declared size honest, so only the chunk's bounds are wrong.
            *size = chunks.iter().map(|chunk| u64::from(chunk.size)).sum();
            "ChunkSizeOutOfBounds"
        }
        Breakage::Duplicate(at) => {
            let i = pick(manifest, at, |_| true, one_chunk_file("zz-file"));
            let copy = manifest.entries[i].clone();
            manifest.entries.insert(i, copy);
            "DuplicatePath"
        }
        Breakage::Unsorted => {
            for name in ["zz-a", "zz-b"] {
                manifest.entries.push(Entry {
                    path: name.into(),
                    kind: EntryKind::Dir,
                });
            }
            sort(manifest);
            let last = manifest.entries.len() - 1;
            manifest.entries.swap(0, last);
            "UnsortedEntries"
        }
        Breakage::UnderNonDirectory(at, deep) => {
            let i = pick(manifest, at, is_not_dir, one_chunk_file("zz-file"));
            let parent = manifest.entries[i].path.clone();
            let child = if *deep { "d/e/child" } else { "child" };
            manifest.entries.push(Entry {
                path: format!("{parent}/{child}"),
                kind: EntryKind::Dir,
            });
            sort(manifest);
            "EntryUnderNonDirectory"
        }
        Breakage::FormatVersion(version) => {
            manifest.format_version = *version;
            "UnsupportedFormatVersion"
        }
        Breakage::Chunker(params) => {
            manifest.chunker = *params;
            "InvalidChunkerParams"
        }
        Breakage::TooLarge => {
            manifest.chunker.max_size = HUGE_CHUNK;
            let count = limits::MAX_TOTAL_BYTES / u64::from(HUGE_CHUNK) + 1;
            manifest.entries.push(Entry {
                path: "zz-huge".into(),
                kind: EntryKind::File {
                    executable: false,
                    size: count * u64::from(HUGE_CHUNK),
                    chunks: vec![
                        ChunkRef {
                            hash: ChunkHash::of(b"huge"),
                            size: HUGE_CHUNK,
                        };
                        count as usize
                    ],
                },
            });
            sort(manifest);
            "SnapshotTooLarge"
        }
    }
}

fn error_name(error: &CompilerError) -> &'static str {
    match error {
        CompilerError::UnsafePath { .. } => "UnsafePath",
        CompilerError::UnsafeSymlink { .. } => "UnsafeSymlink",
        CompilerError::FileSizeMismatch { .. } => "FileSizeMismatch",
        CompilerError::ChunkSizeOutOfBounds { .. } => "ChunkSizeOutOfBounds",
        CompilerError::DuplicatePath { .. } => "DuplicatePath",
        CompilerError::UnsortedEntries { .. } => "UnsortedEntries",
        CompilerError::EntryUnderNonDirectory { .. } => "EntryUnderNonDirectory",
        CompilerError::UnsupportedFormatVersion { .. } => "UnsupportedFormatVersion",
        CompilerError::InvalidChunkerParams { .. } => "InvalidChunkerParams",
        CompilerError::SnapshotTooLarge { .. } => "SnapshotTooLarge",
        _ => "another error",
    }
}

// ---------------------------------------------------------------------------------------
// Random mutations (validity unknown) and JSON-level mutations
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Mutation {
    Path(Index, String),
    Target(Index, String),
    Size(Index, u64),
    ChunkSize(Index, Index, u32),
    Kind(Index, Shape),
    Remove(Index),
    Swap(Index, Index),
    Chunker(u32, u32, u32),
    Version(u32),
}

fn path_noise() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ab./\\\\\u{0}]{0,10}",
        prop::collection::vec(
            prop::sample::select(&["a", "b", "..", ".", "", "ü"][..]),
            0..5
        )
        .prop_map(|parts| parts.join("/")),
        any::<String>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<Index>(), path_noise()).prop_map(|(at, p)| Mutation::Path(at, p)),
        3 => (any::<Index>(), path_noise()).prop_map(|(at, t)| Mutation::Target(at, t)),
        2 => (any::<Index>(), prop_oneof![any::<u64>(), 0u64..4096]).prop_map(|(at, s)| Mutation::Size(at, s)),
        2 => (any::<Index>(), any::<Index>(), prop_oneof![any::<u32>(), 0u32..2048])
            .prop_map(|(at, chunk, s)| Mutation::ChunkSize(at, chunk, s)),
        1 => (any::<Index>(), shape()).prop_map(|(at, s)| Mutation::Kind(at, s)),
        1 => any::<Index>().prop_map(Mutation::Remove),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::Swap(a, b)),
        1 => (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(a, b, c)| Mutation::Chunker(a, b, c)),
        1 => prop_oneof![Just(0u32), Just(2), any::<u32>()].prop_map(Mutation::Version),
    ]
}

fn mutate(manifest: &mut Manifest, mutation: &Mutation) {
    let entries = &mut manifest.entries;
    let len = entries.len();
    match mutation {
        Mutation::Path(at, path) if len > 0 => entries[at.index(len)].path = path.clone(),
        Mutation::Target(at, target) if len > 0 => {
            entries[at.index(len)].kind = EntryKind::Symlink {
                target: target.clone(),
            }
        }
        Mutation::Size(at, new_size) if len > 0 => {
            if let EntryKind::File { size, .. } = &mut entries[at.index(len)].kind {
                *size = *new_size;
            }
        }
        Mutation::ChunkSize(at, chunk, new_size) if len > 0 => {
            if let EntryKind::File { chunks, .. } = &mut entries[at.index(len)].kind
                && !chunks.is_empty()
            {
                let index = chunk.index(chunks.len());
                chunks[index].size = *new_size;
            }
        }
        Mutation::Kind(at, shape) if len > 0 => {
            entries[at.index(len)].kind = match shape {
                Shape::Dir => EntryKind::Dir,
                Shape::Symlink { parents, .. } => EntryKind::Symlink {
                    target: "../".repeat(*parents) + "x",
                },
                Shape::File { executable, .. } => EntryKind::File {
                    executable: *executable,
                    size: 0,
                    chunks: Vec::new(),
                },
            }
        }
        Mutation::Remove(at) if len > 0 => {
            entries.remove(at.index(len));
        }
        Mutation::Swap(a, b) if len > 0 => entries.swap(a.index(len), b.index(len)),
        Mutation::Chunker(min_size, avg_size, max_size) => {
            manifest.chunker = ChunkerParams {
                min_size: *min_size,
                avg_size: *avg_size,
                max_size: *max_size,
            }
        }
        Mutation::Version(version) => manifest.format_version = *version,
        _ => {}
    }
}

/// Field names of the manifest format, to make random JSON look like one.
const FIELD_NAMES: &[&str] = &[
    "format_version",
    "chunker",
    "min_size",
    "avg_size",
    "max_size",
    "entries",
    "path",
    "kind",
    "type",
    "executable",
    "size",
    "chunks",
    "hash",
    "target",
    "extra",
];

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u32>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(
            &[
                "18446744073709551616",
                "-1",
                "1e400",
                "1.0",
                "4294967296",
                "1e2",
                "-0",
            ][..]
        )
        .prop_map(|n| serde_json::from_str::<Value>(n).unwrap_or(Value::Null)),
        prop::sample::select(&["file", "symlink", "dir", "File", "", "a", "../x", "/etc"][..])
            .prop_map(Value::from),
        any::<[u8; 32]>().prop_map(|bytes| Value::from(ChunkHash::of(&bytes).to_hex())),
        "[0-9a-fA-F]{62,66}".prop_map(Value::from),
        path_noise().prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(FIELD_NAMES), inner), 0..8).prop_map(
                |fields| {
                    Value::Object(
                        fields
                            .into_iter()
                            .map(|(key, value)| (key.to_string(), value))
                            .collect(),
                    )
                }
            ),
        ]
    })
}

#[derive(Debug, Clone)]
enum JsonEdit {
    /// Keeps the node's type: a number becomes `number`, a string `text`, a bool flips, a
    /// list repeats its first item.
    Tweak(u64, String),
    Replace(Value),
    Remove,
    AddField(&'static str, Value),
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    let number = prop_oneof![
        any::<u64>(),
        0u64..2048,
        prop::sample::select(vec![
            0,
            1,
            63,
            64,
            1024,
            1025,
            u64::from(u32::MAX),
            u64::MAX
        ]),
    ];
    prop_oneof![
        6 => (number, path_noise()).prop_map(|(n, text)| JsonEdit::Tweak(n, text)),
        2 => json_value().prop_map(JsonEdit::Replace),
        1 => Just(JsonEdit::Remove),
        1 => (prop::sample::select(FIELD_NAMES), json_leaf()).prop_map(|(k, v)| JsonEdit::AddField(k, v)),
    ]
}

/// Applies `edit` at the `at`-th node of `value` in pre-order.
fn edit_json(value: &mut Value, at: &Index, edit: &JsonEdit) {
    fn count(value: &Value) -> usize {
        1 + match value {
            Value::Array(items) => items.iter().map(count).sum(),
            Value::Object(fields) => fields.values().map(count).sum(),
            _ => 0,
        }
    }
    /// Returns true when the node was reached (and edited).
    fn visit(value: &mut Value, target: &mut usize, edit: &JsonEdit) -> bool {
        if *target == 0 {
            match edit {
                JsonEdit::Tweak(number, text) => match value {
                    Value::Number(_) => *value = Value::from(*number),
                    Value::String(_) => *value = Value::from(text.clone()),
                    Value::Bool(flag) => *flag = !*flag,
                    Value::Array(items) if !items.is_empty() => items.push(items[0].clone()),
                    _ => {}
                },
                JsonEdit::Replace(new) => *value = new.clone(),
                JsonEdit::AddField(key, new) => {
                    if let Value::Object(fields) = value {
                        fields.insert(key.to_string(), new.clone());
                    } else {
                        *value = new.clone();
                    }
                }
                JsonEdit::Remove => *value = Value::Null,
            }
            return true;
        }
        *target -= 1;
        match value {
            Value::Array(items) => {
                for index in 0..items.len() {
                    if *target == 0 && matches!(edit, JsonEdit::Remove) {
                        items.remove(index);
                        return true;
                    }
                    if visit(&mut items[index], target, edit) {
                        return true;
                    }
                }
            }
            Value::Object(fields) => {
                let keys: Vec<String> = fields.keys().cloned().collect();
                for key in keys {
                    if *target == 0 && matches!(edit, JsonEdit::Remove) {
                        fields.remove(&key);
                        return true;
                    }
                    if visit(fields.get_mut(&key).expect("listed"), target, edit) {
                        return true;
                    }
                }
            }
            _ => {}
        }
        false
    }
    let mut target = at.index(count(value));
    visit(value, &mut target, edit);
}

// ---------------------------------------------------------------------------------------
// Materialising: nothing lands outside the destination
// ---------------------------------------------------------------------------------------

fn check_materialize(manifest: &Manifest, chunks: &Chunks) -> Result<(), TestCaseError> {
    let sandbox = tempfile::tempdir().expect("a temporary directory");
    let dest = sandbox.path().join("root");
    let outside = sandbox.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let result = materialize(manifest, chunks, &dest);
    if manifest.validate().is_err() {
        prop_assert!(result.is_err(), "materialised a manifest validate refuses");
    }
    let mut around: Vec<String> = fs::read_dir(sandbox.path())
        .unwrap()
        .map(|item| item.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    around.sort();
    prop_assert!(
        around == ["outside", "root"] || around == ["outside"],
        "written beside the destination: {around:?}"
    );
    prop_assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    if result.is_ok() {
        let root = fs::canonicalize(&dest).unwrap();
        check_links_stay_inside(&root, &dest)?;
    }
    Ok(())
}

fn check_links_stay_inside(root: &Path, dir: &Path) -> Result<(), TestCaseError> {
    for item in fs::read_dir(dir).unwrap() {
        let path = item.unwrap().path();
        let metadata = fs::symlink_metadata(&path).unwrap();
        if metadata.file_type().is_symlink() {
            if let Ok(resolved) = fs::canonicalize(&path) {
                prop_assert!(
                    resolved.starts_with(root),
                    "{} resolves to {} outside {}",
                    path.display(),
                    resolved.display(),
                    root.display()
                );
            }
        } else if metadata.is_dir() {
            check_links_stay_inside(root, &path)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The fuzz runs
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(pinned(1024))]

    #[test]
    fn decoder_survives_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_json_text(&bytes)?;
    }

    #[test]
    fn decoder_survives_arbitrary_json(value in json_value()) {
        check_json_value(value)?;
    }

    #[test]
    fn valid_manifests_are_accepted_and_keep_their_id((manifest, _) in valid_manifest()) {
        if let Err(error) = manifest.validate() {
            return Err(TestCaseError::fail(format!("refused a valid manifest: {error}\n{manifest:?}")));
        }
        check_decoded(&manifest)?;
    }

    #[test]
    fn every_known_breakage_is_refused(
        (manifest, _) in valid_manifest(),
        breakage in breakage(),
    ) {
        let mut broken = manifest;
        let expected = apply(&breakage, &mut broken);
        match broken.validate() {
            Ok(()) => return Err(TestCaseError::fail(format!("accepted {breakage:?}: {broken:?}"))),
            Err(error) => prop_assert_eq!(error_name(&error), expected, "{}", error),
        }
        prop_assert!(unsafe_because(&broken).is_some(), "the independent check missed {:?}", breakage);
        check_decoded(&broken)?;
        // Through JSON, as an upload arrives: refused either by the decoder or by validate.
        let text = serde_json::to_vec(&broken).unwrap();
        if let Ok(decoded) = serde_json::from_slice::<Manifest>(&text) {
            prop_assert!(decoded.validate().is_err());
        }
    }

    #[test]
    fn randomly_mutated_manifests_are_refused_or_safe(
        (manifest, _) in valid_manifest(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let mut mutated = manifest;
        for mutation in &mutations {
            mutate(&mut mutated, mutation);
        }
        check_decoded(&mutated)?;
    }

    #[test]
    fn mutated_manifest_json_is_refused_or_safe(
        (manifest, _) in valid_manifest(),
        edits in prop::collection::vec((any::<Index>(), json_edit()), 1..4),
    ) {
        let mut value = serde_json::to_value(&manifest).unwrap();
        for (at, edit) in &edits {
            edit_json(&mut value, at, edit);
        }
        check_json_value(value)?;
    }
}

proptest! {
    // Each case writes a directory tree: fewer cases.
    #![proptest_config(pinned(128))]

    #[test]
    fn materialising_writes_nothing_outside_the_destination(
        (manifest, chunks) in valid_manifest(),
        mutations in prop::collection::vec(mutation(), 0..3),
    ) {
        let mut mutated = manifest;
        for mutation in &mutations {
            mutate(&mut mutated, mutation);
        }
        check_materialize(&mutated, &chunks)?;
    }
}

// ---------------------------------------------------------------------------------------
// Fixed inputs
// ---------------------------------------------------------------------------------------

fn assert_holds(result: Result<(), TestCaseError>) {
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

fn manifest_json(entries: &str) -> String {
    format!(
        r#"{{"format_version":1,"chunker":{{"min_size":64,"avg_size":256,"max_size":1024}},"entries":[{entries}]}}"#
    )
}

#[test]
fn numbers_past_their_type_are_refused_by_the_decoder() {
    let hash = ChunkHash::of(b"x").to_hex();
    for size in [
        "18446744073709551616",
        "-1",
        "1e400",
        "1.5",
        "\"1\"",
        "null",
    ] {
        let file = format!(
            r#"{{"path":"a","kind":{{"type":"file","executable":false,"size":{size},"chunks":[]}}}}"#
        );
        assert!(
            serde_json::from_str::<Manifest>(&manifest_json(&file)).is_err(),
            "{size}"
        );
    }
    for size in ["4294967296", "-1", "1e10"] {
        let file = format!(
            r#"{{"path":"a","kind":{{"type":"file","executable":false,"size":1,"chunks":[{{"hash":"{hash}","size":{size}}}]}}}}"#
        );
        assert!(
            serde_json::from_str::<Manifest>(&manifest_json(&file)).is_err(),
            "{size}"
        );
    }
    let deep = "[".repeat(100_000);
    assert!(serde_json::from_str::<Manifest>(&deep).is_err());
    assert_holds(check_json_text(deep.as_bytes()));
}

/// File sizes cannot overflow the total: each must equal its chunks' sum, and the sum is
/// kept saturating where it is only reported.
#[test]
fn sizes_that_would_overflow_when_summed_are_refused_without_overflowing() {
    let huge = |path: &str| Entry {
        path: path.into(),
        kind: EntryKind::File {
            executable: false,
            size: u64::MAX,
            chunks: vec![ChunkRef {
                hash: ChunkHash::of(b"x"),
                size: 1,
            }],
        },
    };
    let manifest = Manifest::new(SMALL, vec![huge("a"), huge("b"), huge("c")]);
    assert_eq!(manifest.total_bytes().as_bytes(), u64::MAX);
    assert!(matches!(
        manifest.validate(),
        Err(CompilerError::FileSizeMismatch { .. })
    ));
    assert_holds(check_decoded(&manifest));

    // Consistent files whose sizes add up past the limit.
    let chunks_per_file = 1024u64;
    let files = limits::MAX_TOTAL_BYTES / (chunks_per_file * u64::from(HUGE_CHUNK)) + 1;
    let entries = (0..files)
        .map(|i| Entry {
            path: format!("f{i:02}"),
            kind: EntryKind::File {
                executable: false,
                size: chunks_per_file * u64::from(HUGE_CHUNK),
                chunks: vec![
                    ChunkRef {
                        hash: ChunkHash::of(b"x"),
                        size: HUGE_CHUNK,
                    };
                    chunks_per_file as usize
                ],
            },
        })
        .collect();
    let chunker = ChunkerParams {
        max_size: HUGE_CHUNK,
        ..SMALL
    };
    let manifest = Manifest::new(chunker, entries);
    assert!(matches!(
        manifest.validate(),
        Err(CompilerError::SnapshotTooLarge { .. })
    ));
    assert_holds(check_decoded(&manifest));
}

#[test]
fn the_escaping_symlinks_an_attacker_would_try_are_refused() {
    for (path, target) in [
        ("link", ".."),
        ("link", "../etc"),
        ("a/link", "../.."),
        ("a/link", "../../x"),
        ("a/link", "b/../../.."),
        ("a/link", "./../../x"),
        ("link", "/etc/passwd"),
        ("link", "//etc"),
        ("a/link", "..//..//x"),
    ] {
        let mut entries = vec![Entry {
            path: path.into(),
            kind: EntryKind::Symlink {
                target: target.into(),
            },
        }];
        if path.contains('/') {
            entries.push(Entry {
                path: "a".into(),
                kind: EntryKind::Dir,
            });
        }
        let manifest = Manifest::new(SMALL, entries);
        assert!(
            matches!(
                manifest.validate(),
                Err(CompilerError::UnsafeSymlink { .. })
            ),
            "{path} -> {target}"
        );
        assert_holds(check_materialize(&manifest, &Chunks::default()));
    }
}
