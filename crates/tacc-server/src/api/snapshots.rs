//! Snapshot and chunk routes: the delta upload (offer, chunks, commit) and reads.

use super::prelude::*;

fn manifest_of(value: serde_json::Value) -> ApiResult<Manifest> {
    let manifest: Manifest = serde_json::from_value(value)
        .map_err(|e| ServerError::BadRequest(format!("malformed manifest: {e}")))?;
    manifest
        .validate()
        .map_err(|e| ServerError::BadRequest(format!("rejected manifest: {e}")))?;
    Ok(manifest)
}

pub(super) async fn offer_snapshot(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(offer): Json<SnapshotOffer>,
) -> ApiResult<Json<SnapshotOfferReply>> {
    let user = user_of(&caller)?;
    let manifest = manifest_of(offer.manifest)?;
    let chunks = manifest.chunk_set();
    let store = app.control.chunk_store();
    let names: Vec<String> = chunks.iter().map(|h| h.to_string()).collect();
    // A chunk counts as present for this user only if they uploaded it themselves:
    // knowing a hash must not let anyone claim code they never had.
    let owned = app.control.query().owned_chunks(&user.name, &names).await?;
    // Touching what is present restarts its retention: the client will not send it, so
    // garbage collection must leave it for the commit that follows.
    let missing: Vec<String> = chunks
        .iter()
        .filter(|h| !store.touch(h) || !owned.contains(&h.to_string()))
        .map(|h| h.to_string())
        .collect();
    Ok(Json(SnapshotOfferReply {
        snapshot: manifest.id(),
        missing,
        chunks_total: chunks.len() as u64,
        total_bytes: manifest.total_bytes().as_bytes(),
    }))
}

/// Make a snapshot visible, only once every chunk it names is stored and verified.
pub(super) async fn commit_snapshot(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(offer): Json<SnapshotOffer>,
) -> ApiResult<Json<SnapshotCommitted>> {
    let user = user_of(&caller)?;
    let manifest = manifest_of(offer.manifest)?;
    let _no_gc_meanwhile = crate::artifacts::COMMIT_OR_COLLECT.read().await;
    check_chunks_stored(&app.control, &manifest)?;
    let names: Vec<String> = manifest.chunk_set().iter().map(|h| h.to_string()).collect();
    let owned = app.control.query().owned_chunks(&user.name, &names).await?;
    let unproven = names.iter().filter(|n| !owned.contains(*n)).count();
    if unproven > 0 {
        return Err(ServerError::BadRequest(format!(
            "{unproven} chunk(s) of the snapshot were not uploaded by you; offer the snapshot \
             again, upload the chunks it lists as missing, and commit again"
        )));
    }
    let id = manifest.id();
    // Resubmitting unchanged code commits again: a read, not another durable write.
    if !app
        .control
        .query()
        .is_snapshot_owner(&id, &user.name)
        .await?
    {
        app.control
            .store
            .add_snapshot_owner(tacc_store::SnapshotOwner {
                snapshot: id.clone(),
                user: user.name.clone(),
            })
            .await?;
    }
    // A resubmission of unchanged code commits a snapshot the server already has.
    if app.control.query().snapshot(&id).await?.is_some() {
        return Ok(Json(SnapshotCommitted { snapshot: id }));
    }
    let value =
        serde_json::to_value(&manifest).map_err(|e| ServerError::Internal(e.to_string()))?;
    app.control
        .store
        .put_snapshot(&id, &value, manifest.total_bytes().as_bytes(), crate::now())
        .await?;
    Ok(Json(SnapshotCommitted { snapshot: id }))
}

/// Every chunk the manifest names is stored (and so was verified against its hash when it
/// was written) and has the size the manifest claims for it.
fn check_chunks_stored(control: &Control, manifest: &Manifest) -> ApiResult<()> {
    let store = control.chunk_store();
    let mut missing = 0usize;
    for entry in &manifest.entries {
        let tacc_compiler::EntryKind::File { chunks, .. } = &entry.kind else {
            continue;
        };
        for chunk in chunks {
            match store.stored_size(&chunk.hash) {
                None => missing += 1,
                Some(size) if size != u64::from(chunk.size) => {
                    return Err(ServerError::BadRequest(format!(
                        "rejected manifest: file `{}` lists chunk {} as {} bytes, but that \
                         chunk is {size} bytes; the manifest is corrupt, scan the code again",
                        entry.path, chunk.hash, chunk.size
                    )));
                }
                Some(_) => {}
            }
        }
    }
    if missing > 0 {
        return Err(ServerError::BadRequest(format!(
            "{missing} chunk(s) of the snapshot have not been uploaded; offer the snapshot \
             again, upload the chunks it lists as missing, and commit again"
        )));
    }
    Ok(())
}

pub(super) async fn get_snapshot(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let id: SnapshotId = id
        .parse()
        .map_err(|e: tacc_core::CoreError| ServerError::BadRequest(e.to_string()))?;
    let manifest = app.control.query().snapshot(&id).await?;
    manifest
        .map(Json)
        .ok_or_else(|| ServerError::NotFound(format!("snapshot {id} does not exist")))
}

fn chunk_hash(text: &str) -> ApiResult<ChunkHash> {
    text.parse()
        .map_err(|e| ServerError::BadRequest(format!("{e}")))
}

/// Store one chunk. A body sent with `Content-Encoding: zstd` is decompressed first; the
/// bytes must hash to the name, or nothing is stored.
pub(super) async fn put_chunk(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(hash): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let user = user_of(&caller)?.name.clone();
    let hash = chunk_hash(&hash)?;
    let compressed = headers
        .get(axum::http::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"zstd"));
    let bytes = if compressed {
        zstd::bulk::decompress(&body, super::MAX_CHUNK_BYTES)
            .map_err(|e| ServerError::BadRequest(format!("chunk {hash}: bad zstd data: {e}")))?
    } else {
        body.to_vec()
    };
    let control = app.control.clone();
    let name = hash.to_string();
    let stored = tokio::task::spawn_blocking(move || control.chunk_store().put(&hash, &bytes))
        .await
        .map_err(|e| ServerError::Internal(e.to_string()))?;
    stored.map_err(|e| match e {
        // The server's disk, not the upload, is at fault.
        tacc_compiler::CompilerError::ChunkStoreIo { source, .. } => {
            ServerError::io(format!("cannot store chunk {name}"), source)
        }
        e => ServerError::BadRequest(e.to_string()),
    })?;
    app.control
        .store
        .add_chunk_owners(&user, std::slice::from_ref(&name))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn get_chunk(
    State(app): State<AppState>,
    Path(hash): Path<String>,
) -> ApiResult<Response> {
    let hash = chunk_hash(&hash)?;
    let path = app.control.chunk_store().path_of(&hash);
    let bytes = tokio::fs::read(&path)
        .await
        .map_err(|_| ServerError::NotFound(format!("chunk {hash} does not exist")))?;
    // A user's file content: saved, never rendered.
    let mut response = bytes.into_response();
    super::headers::as_download(&mut response, &hash.to_string());
    Ok(response)
}
