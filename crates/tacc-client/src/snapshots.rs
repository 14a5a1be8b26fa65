//! Code snapshots: offer a manifest (the server answers which chunks it lacks), upload
//! those chunks, commit the manifest, and read a snapshot and its chunks back. Offers,
//! chunk uploads and commits change nothing when repeated, so they are retried while the
//! failure is transient.

use bytes::Bytes;
use reqwest::Method;
use tacc_core::SnapshotId;
use tacc_proto::{SnapshotCommitted, SnapshotOffer, SnapshotOfferReply};

use crate::{Client, Result};

impl Client {
    pub async fn offer_snapshot(&self, manifest: serde_json::Value) -> Result<SnapshotOfferReply> {
        // Only asks which chunks the server lacks: safe to repeat.
        let offer = SnapshotOffer { manifest };
        self.retried(|| {
            self.json(
                self.request(Method::POST, "/v1/snapshots/offer")
                    .json(&offer),
            )
        })
        .await
    }

    /// Upload one chunk, zstd-compressed on the wire. A chunk is named by its hash, so
    /// sending it again stores nothing twice: it is retried like a keyed request.
    pub async fn put_chunk(&self, hash: &str, compressed: Vec<u8>) -> Result<()> {
        let compressed = Bytes::from(compressed);
        self.retried(|| {
            self.send(
                self.request(Method::PUT, &format!("/v1/chunks/{hash}"))
                    .header(reqwest::header::CONTENT_ENCODING, "zstd")
                    .body(compressed.clone()),
            )
        })
        .await?;
        Ok(())
    }

    pub async fn commit_snapshot(&self, manifest: serde_json::Value) -> Result<SnapshotCommitted> {
        // Recording a snapshot's manifest again changes nothing: safe to repeat.
        let offer = SnapshotOffer { manifest };
        self.retried(|| {
            self.json(
                self.request(Method::POST, "/v1/snapshots/commit")
                    .json(&offer),
            )
        })
        .await
    }

    pub async fn get_snapshot(&self, id: &SnapshotId) -> Result<serde_json::Value> {
        self.json(self.request(Method::GET, &format!("/v1/snapshots/{id}")))
            .await
    }

    pub async fn get_chunk(&self, hash: &str) -> Result<Bytes> {
        let response = self
            .send(self.request(Method::GET, &format!("/v1/chunks/{hash}")))
            .await?;
        response.bytes().await.map_err(|e| self.unreachable(e))
    }
}
