//! Snapshot upload: offer the manifest, send only the chunks the server lacks (zstd level 3,
//! a bounded number at a time), then commit.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use futures::{StreamExt, TryStreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tacc_client::Client;
use tacc_compiler::{ChunkHash, EntryKind, ScannedTree};
use tacc_core::SnapshotId;

/// Chunks in flight at once.
pub const PARALLEL_UPLOADS: usize = 8;
/// zstd level used on the wire.
pub const ZSTD_LEVEL: i32 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadReport {
    pub snapshot: SnapshotId,
    /// Uncompressed bytes of the chunks that were sent.
    pub uploaded_bytes: u64,
    /// Size of every file in the snapshot.
    pub total_bytes: u64,
    pub chunks_uploaded: u64,
    pub chunks_total: u64,
}

/// A byte progress bar on stderr, or a hidden one when stderr is not a terminal.
pub fn byte_bar(total: u64, visible: bool, message: &str) -> ProgressBar {
    if !visible || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
    )
    .map(|style| style.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(message.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

pub async fn upload_snapshot(
    client: &Client,
    tree: ScannedTree,
    show_progress: bool,
) -> Result<UploadReport> {
    let manifest_json =
        serde_json::to_value(&tree.manifest).context("cannot encode the snapshot manifest")?;
    let offer = client.offer_snapshot(manifest_json.clone()).await?;
    let sizes: BTreeMap<ChunkHash, u64> = tree
        .manifest
        .entries
        .iter()
        .flat_map(|entry| match &entry.kind {
            EntryKind::File { chunks, .. } => chunks.as_slice(),
            _ => &[],
        })
        .map(|chunk| (chunk.hash, chunk.size as u64))
        .collect();
    let missing: Vec<ChunkHash> = offer
        .missing
        .iter()
        .map(|hash| {
            hash.parse::<ChunkHash>()
                .map_err(|e| anyhow!("the server asked for an invalid chunk: {e}"))
        })
        .collect::<Result<_>>()?;
    let uploaded_bytes: u64 = missing
        .iter()
        .map(|hash| sizes.get(hash).copied().unwrap_or(0))
        .sum();
    let bar = byte_bar(uploaded_bytes, show_progress, "uploading");
    let tree = Arc::new(tree);
    futures::stream::iter(missing.iter().copied())
        .map(|hash| {
            let tree = Arc::clone(&tree);
            let bar = bar.clone();
            async move {
                let (raw, compressed) = tokio::task::spawn_blocking(move || -> Result<_> {
                    let bytes = tree.read_chunk(&hash)?;
                    let compressed = zstd::encode_all(bytes.as_slice(), ZSTD_LEVEL)
                        .context("cannot compress a chunk")?;
                    Ok((bytes.len() as u64, compressed))
                })
                .await
                .context("chunk reader failed")??;
                client.put_chunk(&hash.to_hex(), compressed).await?;
                bar.inc(raw);
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(PARALLEL_UPLOADS)
        .try_collect::<()>()
        .await?;
    bar.finish_and_clear();
    let committed = client.commit_snapshot(manifest_json).await?;
    let chunks_total = if offer.chunks_total > 0 {
        offer.chunks_total
    } else {
        sizes.len() as u64
    };
    Ok(UploadReport {
        snapshot: committed.snapshot,
        uploaded_bytes,
        total_bytes: tree.total_bytes().as_bytes(),
        chunks_uploaded: missing.len() as u64,
        chunks_total,
    })
}
