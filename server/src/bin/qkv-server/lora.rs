//! LoRA adapters, as llama-server serves them: loaded at start from `--lora FILE` (scale 1)
//! and `--lora-scaled FILE SCALE` (ids from 0 in command-line order; every scale 0 under
//! `--lora-init-without-apply`), listed by `GET /lora-adapters` (`id`, `path`, `scale`),
//! their server-wide scales set by `POST /lora-adapters` (a list of `{id, scale}`: those
//! not listed go to 0), and chosen per request by its `lora` field (the same list; those
//! not listed are at 0 for that request). Requests with different adapters share the
//! engine's batched passes; each applies its own, unmerged.

use crate::{counted, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use qkv::load::Model;
use qkv::models::decoder::{LoraAdapter, ScaledLora};
use qkv_server::error::ApiError;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

/// One adapter the server loaded.
struct Loaded {
    adapter: Arc<LoraAdapter>,
    path: String,
    /// `adapter.lora.task_name` and `adapter.lora.prompt_prefix`, which llama-server lists.
    task_name: String,
    prompt_prefix: String,
}

/// The server's adapters and their server-wide scales.
pub struct Adapters {
    list: Vec<Loaded>,
    scales: RwLock<Vec<f32>>,
}

impl Adapters {
    /// Loads each `(file, scale)` for `model`; an error names the file and what is wrong.
    pub fn load(model: &Model, files: &[(PathBuf, f32)]) -> Result<Adapters, String> {
        let mut list = Vec::with_capacity(files.len());
        for (path, _) in files {
            let adapter = model
                .decoder()
                .load_lora(path)
                .map_err(|e| format!("--lora {}: {e}", path.display()))?;
            let meta = qkv::weights::gguf::GgufFile::open(path)
                .map_err(|e| format!("--lora {}: {e}", path.display()))?;
            let text = |k: &str| {
                meta.metadata(k)
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_owned()
            };
            list.push(Loaded {
                adapter: Arc::new(adapter),
                path: path.display().to_string(),
                task_name: text("adapter.lora.task_name"),
                prompt_prefix: text("adapter.lora.prompt_prefix"),
            });
        }
        Ok(Adapters {
            list,
            scales: RwLock::new(files.iter().map(|f| f.1).collect()),
        })
    }

    /// How many adapters the server has.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    fn scales(&self) -> Vec<f32> {
        self.scales
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The scales `(id, scale)` of a list give, every other adapter at 0; a 400 naming
    /// `param` for an id the server does not have.
    fn scales_of(&self, list: &[(usize, f32)], param: &str) -> Result<Vec<f32>, ApiError> {
        let mut scales = vec![0.0; self.list.len()];
        for &(id, scale) in list {
            let slot = scales.get_mut(id).ok_or_else(|| {
                ApiError::invalid(
                    param,
                    format!(
                        "`{param}`: no LoRA adapter has id {id} (the server has {})",
                        self.list.len()
                    ),
                )
            })?;
            *slot = scale;
        }
        Ok(scales)
    }

    /// The adapters a request runs with: its own `lora` list, or the server's scales; only
    /// those at a non-zero scale, so that a request without any shares cached prefixes
    /// with the base model's.
    pub fn for_request(&self, asked: Option<&[(usize, f32)]>) -> Result<Vec<ScaledLora>, ApiError> {
        let scales = match asked {
            Some(list) => self.scales_of(list, "lora")?,
            None => self.scales(),
        };
        Ok(self
            .list
            .iter()
            .zip(scales)
            .filter(|(_, s)| *s != 0.0)
            .map(|(l, scale)| ScaledLora {
                adapter: l.adapter.clone(),
                scale,
            })
            .collect())
    }
}

/// `GET /lora-adapters`: each adapter's id, path and server-wide scale.
pub async fn list(State(state): State<Arc<AppState>>) -> Response {
    let a = &state.lora;
    let scales = a.scales();
    let out: Vec<Value> = a
        .list
        .iter()
        .zip(scales)
        .enumerate()
        .map(|(id, (l, scale))| {
            json!({
                "id": id,
                "path": l.path,
                "scale": scale,
                "task_name": l.task_name,
                "prompt_prefix": l.prompt_prefix,
            })
        })
        .collect();
    Json(out).into_response()
}

/// `POST /lora-adapters`: sets the server-wide scales from a list of `{id, scale}` (the
/// adapters not listed go to 0); requests already running keep theirs.
pub async fn set(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let shared = &state.shared;
        shared.metrics.requests.fetch_add(1, Ordering::Relaxed);
        if shared.draining.load(Ordering::SeqCst) {
            return Err(ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
            ));
        }
        // The body is a list, where every other route takes an object.
        let bytes = raw.map_err(|e| ApiError::status(e.status(), e.body_text()))?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::status(
                StatusCode::BAD_REQUEST,
                format!("the body is not valid JSON: {e}"),
            )
        })?;
        let list = qkv_server::request::lora_list(&value, "body")?;
        let scales = state.lora.scales_of(&list, "body")?;
        *state.lora.scales.write().unwrap_or_else(|e| e.into_inner()) = scales;
        Ok(Json(json!({"success": true})).into_response())
    })();
    counted(&state.shared, r)
}
