//! Embeddings from a generative model (`--embeddings`), as llama-server computes them with
//! `--embeddings` on a decoder: each input runs through the model alone, its final hidden
//! states (after the final norm, [`qkv::models::decoder::Decoder::forward_hidden`]) are
//! pooled by `--pooling` (`mean`, `cls`: the first token, `last`: the last token, `none`:
//! every token's), and a pooled vector is normalised (Euclidean by default; the request's
//! `embd_normalize` chooses as llama-server's does). `none` is served only on llama-server's
//! `POST /embeddings`, whose answer lists every token's vector, unnormalised;
//! `POST /v1/embeddings` (OpenAI's shape) needs a pooled vector.
//!
//! Inputs are read as `/completion` reads prompts (strings, token ids, mixed lists,
//! `{"prompt_string": …}`, `{"content": [text parts]}`) and tokenized with the model's
//! special tokens. One request embeds at a time, off the async runtime; generation goes on
//! beside it on the engine thread.

use crate::native::encode;
use crate::{body, counted, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use qkv::weights::FloatType;
use qkv_server::body::Body;
use qkv_server::embedding::{base64_f32, pool, Pooling};
use qkv_server::error::ApiError;
use qkv_server::native_fields::prompts_in;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Scales `v` by llama-server's `embd_normalize` rule: -1 leaves it, 0 scales the largest
/// magnitude to 32760 (int16 range), 1 divides by the sum of magnitudes, 2 by the Euclidean
/// norm, and any larger `p` by the p-norm. A zero vector stays zero.
pub fn normalize(v: &mut [f32], rule: i64) {
    let norm = match rule {
        i64::MIN..=-1 => return,
        0 => v.iter().fold(0f64, |m, x| m.max(f64::from(x.abs()))) / 32760.0,
        1 => v.iter().map(|x| f64::from(x.abs())).sum(),
        2 => v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt(),
        p => {
            let p = p as f64;
            v.iter()
                .map(|x| f64::from(x.abs()).powf(p))
                .sum::<f64>()
                .powf(1.0 / p)
        }
    };
    if norm > 0.0 {
        let inv = (1.0 / norm) as f32;
        v.iter_mut().for_each(|x| *x *= inv);
    }
}

/// One embedding pass at a time: they share the cores with the engine as it is.
static PASS: Mutex<()> = Mutex::new(());

/// The token sequences of `field`, checked: each non-empty and within the context.
fn sequences(state: &AppState, b: &Body, field: &str) -> Result<Vec<Vec<u32>>, ApiError> {
    let tokenizer = state
        .model
        .tokenizer()
        .ok_or_else(|| ApiError::invalid(field, "the model has no tokenizer"))?;
    let vocab = state.model.vocab_size();
    let parts = prompts_in(b, field)?;
    let mut out = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        let ids = encode(tokenizer, p, vocab)?;
        let name = if parts.len() == 1 {
            field.to_owned()
        } else {
            format!("{field}[{i}]")
        };
        if ids.is_empty() {
            return Err(ApiError::invalid(
                &name,
                format!("`{name}` encodes to no tokens"),
            ));
        }
        if ids.len() > state.context {
            let mut e = ApiError::exceeds_context(ids.len(), state.context);
            e.message = format!(
                "`{name}` is {} tokens, too large for the context of {} positions",
                ids.len(),
                state.context
            );
            e.param = Some(name);
            return Err(e);
        }
        out.push(ids);
    }
    Ok(out)
}

/// Runs each sequence and pools its hidden states; counts the tokens in the metrics.
async fn embed(
    state: &Arc<AppState>,
    seqs: Vec<Vec<u32>>,
    pooling: Pooling,
) -> Result<Vec<Vec<Vec<f32>>>, ApiError> {
    let st = state.clone();
    let tokens: usize = seqs.iter().map(Vec::len).sum();
    let passes = seqs.len();
    let out = tokio::task::spawn_blocking(move || -> qkv::Result<Vec<Vec<Vec<f32>>>> {
        let _one = PASS.lock().unwrap_or_else(|p| p.into_inner());
        let decoder = st.model.decoder();
        let dim = decoder.config().dim;
        let longest = seqs.iter().map(Vec::len).max().unwrap_or(1);
        let mut run = decoder.new_state(longest, FloatType::F32, longest.min(512))?;
        let mut hidden = Vec::new();
        seqs.iter()
            .map(|ids| {
                hidden.resize(ids.len() * dim, 0.0);
                decoder.forward_hidden(&mut run, ids, &mut hidden)?;
                Ok(pool(&hidden, dim, pooling))
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let m = &state.shared.metrics;
    // Each sequence is a pass of the model (`n_decode_total`), its tokens prompt tokens.
    m.prompt_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    m.steps.fetch_add(passes as u64, Ordering::Relaxed);
    Ok(out)
}

/// The pooling in force, or the 400 of a server started without `--embeddings`.
fn pooling_of(state: &AppState) -> Result<Pooling, ApiError> {
    state.options.pooling.ok_or_else(|| ApiError {
        code: Some("model_not_supported"),
        ..ApiError::invalid(
            "model",
            format!(
                "`{}` is a text generation model served without --embeddings: start \
                 qkv-server with --embeddings (and --pooling) to embed with it",
                state.model_name
            ),
        )
    })
}

/// `embd_normalize` (default 2: Euclidean).
fn rule(b: &Body) -> Result<i64, ApiError> {
    match b.field("embd_normalize") {
        None | Some(Value::Null) => Ok(2),
        Some(v) => v.as_i64().ok_or_else(|| {
            ApiError::invalid(
                "embd_normalize",
                format!("`embd_normalize` must be an integer, got {v}"),
            )
        }),
    }
}

/// `POST /v1/embeddings` on a decoder: OpenAI's shape, one pooled vector per input.
pub async fn openai(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let b = body(&state.shared, raw)?;
        let pooling = pooling_of(&state)?;
        if pooling == Pooling::None {
            return Err(ApiError::invalid(
                "input",
                "the server pools with `none` (--pooling none), which gives one vector per \
                 token: /v1/embeddings answers one per input; use POST /embeddings",
            ));
        }
        let f = qkv_server::embedding::format(&b)?;
        let rule = rule(&b)?;
        b.str("model")?;
        let seqs = sequences(&state, &b, "input")?;
        let tokens: usize = seqs.iter().map(Vec::len).sum();
        let vectors = embed(&state, seqs, pooling).await?;
        let data: Vec<Value> = vectors
            .into_iter()
            .enumerate()
            .map(|(i, mut v)| {
                let mut v = v.pop().unwrap_or_default();
                normalize(&mut v, rule);
                let embedding = match f {
                    qkv_server::embedding::Format::Float => json!(v),
                    qkv_server::embedding::Format::Base64 => json!(base64_f32(&v)),
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        Ok(Json(json!({
            "object": "list",
            "data": data,
            "model": state.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
        .into_response())
    }
    .await;
    counted(&state.shared, r)
}

/// `POST /embeddings` (llama-server's own): `[{"index": i, "embedding": [vectors]}]`, the
/// vectors every token's (pooling `none`, unnormalised) or the one pooled (normalised).
/// The input is `input` or, as llama-server also reads it, `content`.
pub async fn native(
    State(state): State<Arc<AppState>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let b = body(&state.shared, raw)?;
        let pooling = pooling_of(&state)?;
        let rule = rule(&b)?;
        let field = if b.field("input").is_none() && b.field("content").is_some() {
            "content"
        } else {
            "input"
        };
        let seqs = sequences(&state, &b, field)?;
        let vectors = embed(&state, seqs, pooling).await?;
        let data: Vec<Value> = vectors
            .into_iter()
            .enumerate()
            .map(|(i, mut vs)| {
                if pooling != Pooling::None {
                    vs.iter_mut().for_each(|v| normalize(v, rule));
                }
                json!({"index": i, "embedding": vs})
            })
            .collect();
        Ok(Json(Value::Array(data)).into_response())
    }
    .await;
    counted(&state.shared, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_takes_the_rows_it_names() {
        let h = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(pool(&h, 2, Pooling::Cls), [vec![1.0, 2.0]]);
        assert_eq!(pool(&h, 2, Pooling::Last), [vec![5.0, 6.0]]);
        assert_eq!(pool(&h, 2, Pooling::Mean), [vec![3.0, 4.0]]);
        assert_eq!(pool(&h, 2, Pooling::None).len(), 3);
        assert!(Pooling::parse("rank").is_err());
        assert_eq!(Pooling::parse("last"), Ok(Pooling::Last));
    }

    #[test]
    fn normalize_follows_each_rule() {
        let mut v = [3.0f32, -4.0];
        normalize(&mut v, 2);
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] + 0.8).abs() < 1e-6);
        let mut v = [3.0f32, -4.0];
        normalize(&mut v, 1);
        assert!((v[0] - 3.0 / 7.0).abs() < 1e-6);
        let mut v = [3.0f32, -4.0];
        normalize(&mut v, -1);
        assert_eq!(v, [3.0, -4.0]);
        let mut v = [1.0f32, -2.0];
        normalize(&mut v, 0);
        assert!((v[1] + 32760.0).abs() < 1e-2);
        let mut z = [0.0f32; 3];
        normalize(&mut z, 2);
        assert_eq!(z, [0.0; 3]);
    }
}
