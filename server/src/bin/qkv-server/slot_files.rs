//! `POST /slots/{id}?action=save|restore|erase` (with `--slot-save-path DIR`): a slot's
//! tokens and KV cache kept in a file of that directory, and put back into any slot, of
//! this process or of a later one on the same model, in llama-server's shapes (`n_saved`,
//! `n_written`, `n_restored`, `n_read`, `n_erased`, `timings`). The engine waits for a
//! sequence that runs in the slot to end before touching it. The file's format and checks
//! are [`qkv::engine::Engine::save_slot`]'s; here, only names that stay inside the
//! directory are taken, and a file is written whole or not at all (a temporary file, then
//! a rename).

use crate::native::not_supported;
use crate::worker::{SlotDone, SlotOp};
use crate::{body, counted, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use qkv::models::decoder::KvType;
use qkv_server::error::ApiError;
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// `name` as a file of `dir`, when it is a plain file name: not empty, at most 255 bytes,
/// no path separator, drive colon or control character, not only dots, no surrounding
/// spaces. A 400 naming the rule otherwise.
fn file_in(dir: &Path, name: &str) -> Result<PathBuf, ApiError> {
    let bad = |why: &str| {
        Err(ApiError::invalid(
            "filename",
            format!("`filename` {name:?} {why}: give a plain file name inside --slot-save-path"),
        ))
    };
    if name.is_empty() || name.len() > 255 {
        return bad("must have 1 to 255 bytes");
    }
    if name
        .chars()
        .any(|c| matches!(c, '/' | '\\' | ':') || c.is_control())
    {
        return bad("holds a path separator, a colon or a control character");
    }
    if name.chars().all(|c| c == '.') {
        return bad("is only dots");
    }
    if name.trim() != name {
        return bad("starts or ends with a space");
    }
    let path = dir.join(name);
    // A link planted in the directory could point anywhere.
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
        return bad("is a symbolic link");
    }
    Ok(path)
}

/// Writes `bytes` to `path` whole: into a temporary file beside it, then renamed over it.
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.unwrap_or_default(),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        std::fs::remove_file(&tmp).ok();
    })
}

/// More than the longest slot file this server can have written (the header, the
/// context's token ids and cache positions in the widest KV type, the checksum): a larger
/// file is refused before it is read.
fn largest_file(state: &AppState) -> u64 {
    let per_position = state.model.decoder().kv_bytes_per_position(KvType::F32) as u64;
    64 + state.context as u64 * (4 + per_position)
}

/// `POST /slots/{id}?action=…`.
pub async fn post(
    State(state): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
    Query(query): Query<HashMap<String, String>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let Some(dir) = state.options.slot_save_path.clone() else {
        return not_supported(
            "saving and restoring slots is off: start qkv-server with --slot-save-path DIR",
        );
    };
    let r = async {
        let slot: usize = id.parse().map_err(|_| {
            ApiError::invalid("id_slot", format!("slot id {id:?} is not a slot number"))
        })?;
        let action = query.get("action").map(String::as_str).unwrap_or("");
        let file = |state: &AppState| -> Result<(String, PathBuf), ApiError> {
            let b = body(&state.shared, raw)?;
            let name = b
                .str("filename")?
                .ok_or_else(|| ApiError::invalid("filename", "`filename` is required"))?
                .to_owned();
            let path = file_in(&dir, &name)?;
            Ok((name, path))
        };
        let started = Instant::now();
        let ms = || started.elapsed().as_secs_f64() * 1e3;
        match action {
            "save" => {
                let (name, path) = file(&state)?;
                let SlotDone::Saved(saved) = state.worker.slot(slot, SlotOp::Save).await? else {
                    unreachable!("a save answers with its bytes")
                };
                let bytes = saved.bytes;
                let written = bytes.len();
                tokio::task::spawn_blocking(move || write_whole(&path, &bytes))
                    .await
                    .map_err(|e| {
                        ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                    })?
                    .map_err(|e| {
                        ApiError::status(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!("writing slot file {name:?}: {e}"),
                        )
                    })?;
                Ok(Json(json!({
                    "id_slot": slot, "filename": name, "n_saved": saved.tokens,
                    "n_written": written, "timings": {"save_ms": ms()},
                }))
                .into_response())
            }
            "restore" => {
                let (name, path) = file(&state)?;
                let most = largest_file(&state);
                let bytes = tokio::task::spawn_blocking(move || {
                    let len = std::fs::metadata(&path)?.len();
                    if len > most {
                        return Err(std::io::Error::other(format!(
                            "{len} bytes, more than a slot of this server takes ({most})"
                        )));
                    }
                    std::fs::read(&path)
                })
                .await
                .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => ApiError::status(
                        StatusCode::NOT_FOUND,
                        format!("no saved slot named {name:?}"),
                    ),
                    _ => ApiError::invalid("filename", format!("slot file {name:?}: {e}")),
                })?;
                let read = bytes.len();
                let done = state.worker.slot(slot, SlotOp::Restore(bytes)).await;
                let SlotDone::Restored(n) = done.map_err(|e| {
                    ApiError::invalid("filename", format!("slot file {name:?}: {e}"))
                })?
                else {
                    unreachable!("a restore answers with its token count")
                };
                Ok(Json(json!({
                    "id_slot": slot, "filename": name, "n_restored": n, "n_read": read,
                    "timings": {"restore_ms": ms()},
                }))
                .into_response())
            }
            "erase" => {
                let SlotDone::Erased(n) = state.worker.slot(slot, SlotOp::Erase).await? else {
                    unreachable!("an erase answers with its token count")
                };
                Ok(Json(json!({"id_slot": slot, "n_erased": n})).into_response())
            }
            other => Err(ApiError::invalid(
                "action",
                format!("unknown action {other:?}: give save, restore or erase"),
            )),
        }
    }
    .await;
    counted(&state.shared, r)
}
