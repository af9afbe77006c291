//! Routes, handlers, SSE streaming, auth and request accounting.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tandem_engine::{Engine, GenParams, SamplerParams};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::request::{self, Endpoint, GenRequest, PromptInput};
use crate::worker::{Event, Job, Outcome, Shared, TokenLogprob};
use crate::ServerConfig;

pub struct AppState {
    pub engine: Arc<Engine>,
    pub cfg: ServerConfig,
    pub model_id: String,
    pub created: u64,
    pub jobs: SyncSender<Job>,
    pub shared: Arc<Shared>,
    pub shutting_down: AtomicBool,
    pub drafter: Option<String>,
    /// sha256 of the API key (compared in constant time against the sent key's hash).
    pub key_hash: Option<[u8; 32]>,
}

type St = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_one))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/metrics", get(metrics))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth));
    let mut app = Router::new()
        .route("/health", get(health))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // the handlers read the body themselves and answer 413 in OpenAI's shape
        .layer(axum::extract::DefaultBodyLimit::max(state.cfg.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(state.clone(), read_body))
        .layer(axum::middleware::from_fn_with_state(state.clone(), account));
    if state.cfg.cors {
        app = app.layer(tower_http::cors::CorsLayer::permissive());
    }
    app.with_state(state)
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Count every response by route and status (for /metrics).
async fn account(State(st): St, req: Request, next: Next) -> Response {
    let route = match req.uri().path() {
        p @ ("/v1/models" | "/v1/chat/completions" | "/v1/completions" | "/health" | "/metrics") => p.to_string(),
        p if p.starts_with("/v1/models/") => "/v1/models/{id}".to_string(),
        _ => "other".to_string(),
    };
    let r = next.run(req).await;
    st.shared.metrics.record_http(&route, r.status().as_u16());
    r
}

/// Reads a request's body before routing, within `body_timeout` and
/// `max_body_bytes`: a client that stops sending midway gets 408 instead of
/// holding its connection and a task forever, and an oversized body 413
/// before it is buffered.
async fn read_body(State(st): St, req: Request, next: Next) -> Response {
    let max = st.cfg.max_body_bytes;
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return ApiError::too_large(max).into_response();
    }
    let (parts, body) = req.into_parts();
    let mut chunks = body.into_data_stream();
    let read = async {
        let mut buf = Vec::new();
        while let Some(chunk) = futures_util::StreamExt::next(&mut chunks).await {
            let chunk = chunk.map_err(|e| ApiError::bad_request(format!("Could not read the request body: {e}")))?;
            if buf.len() + chunk.len() > max {
                return Err(ApiError::too_large(max));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf)
    };
    match tokio::time::timeout(st.cfg.body_timeout, read).await {
        Ok(Ok(buf)) => next.run(Request::from_parts(parts, axum::body::Body::from(buf))).await,
        Ok(Err(e)) => e.into_response(),
        Err(_) => ApiError::body_timeout(st.cfg.body_timeout).into_response(),
    }
}

async fn auth(State(st): St, req: Request, next: Next) -> Response {
    if let Some(want) = &st.key_hash {
        let sent = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|k| k.trim());
        let ok = match sent {
            Some(k) => {
                let h: [u8; 32] = Sha256::digest(k.as_bytes()).into();
                bool::from(h.ct_eq(want))
            }
            None => false,
        };
        if !ok {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!("Unknown endpoint: {} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

async fn health(State(st): St) -> Response {
    let m = &st.shared.metrics;
    let body = json!({
        "status": if st.shutting_down.load(Ordering::Relaxed) { "shutting_down" } else { "ok" },
        "model": st.model_id,
        "queue_depth": m.queue_depth.load(Ordering::Relaxed),
        "running": m.busy.load(Ordering::Relaxed),
    });
    let code = if st.shutting_down.load(Ordering::Relaxed) { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    (code, Json(body)).into_response()
}

fn model_object(st: &AppState, id: &str) -> Value {
    json!({"id": id, "object": "model", "created": st.created, "owned_by": "tandem",
           "meta": {"context_length": st.cfg.ctx, "speculative": st.drafter}})
}

async fn models(State(st): St) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&st, &st.model_id)]}))
}

/// Any model name is answered by the loaded model.
async fn model_one(State(st): St, Path(_id): Path<String>) -> Json<Value> {
    Json(model_object(&st, &st.model_id))
}

async fn metrics(State(st): St) -> Response {
    let body = st.shared.metrics.render(st.drafter.is_some());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

async fn chat(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    handle(st, Endpoint::Chat, body).await.unwrap_or_else(|e| e.into_response())
}

async fn completions(State(st): St, body: Result<Bytes, BytesRejection>) -> Response {
    handle(st, Endpoint::Completion, body).await.unwrap_or_else(|e| e.into_response())
}

/// Sets the job's cancel flag when dropped: the response (or the stream) went
/// away, normally or because the client disconnected.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

async fn handle(st: Arc<AppState>, ep: Endpoint, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(st.cfg.max_body_bytes)
        } else {
            ApiError::bad_request(format!("Could not read the request body: {e}"))
        }
    })?;
    if st.shutting_down.load(Ordering::Relaxed) {
        return Err(ApiError::shutting_down());
    }
    let req = request::parse(ep, &body)?;
    // rendering and tokenizing can take a while on big prompts: off the async threads
    let engine = st.engine.clone();
    let prompt = req.prompt.clone();
    let ids = tokio::task::spawn_blocking(move || -> Result<Vec<u32>, ApiError> {
        let text = match prompt {
            PromptInput::Messages(m) => engine
                .render_chat(&m)
                .map_err(|e| ApiError::invalid("messages", format!("The chat template failed on these messages: {e}")))?,
            PromptInput::Text(t) => t,
            PromptInput::Tokens(ids) => {
                let vocab = engine.tokenizer.vocab_size();
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(ApiError::invalid("prompt", format!("token id {bad} is outside the vocabulary of {vocab} tokens.")));
                }
                return Ok(ids);
            }
        };
        Ok(engine.tokenize_prompt(&text))
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))??;

    let ctx = st.cfg.ctx;
    let param = if ep == Endpoint::Chat { "messages" } else { "prompt" };
    if ids.is_empty() {
        return Err(ApiError::invalid(param, "The prompt is empty (it has no tokens)."));
    }
    if ids.len() >= ctx {
        return Err(ApiError::context_length(
            format!(
                "This model's maximum context length is {ctx} tokens, but the prompt has {} tokens (at least one must be left to generate).",
                ids.len()
            ),
            param,
        ));
    }
    let room = ctx - ids.len();
    let max_tokens = match req.max_tokens {
        Some(m) if m > room => {
            let p = if ep == Endpoint::Chat && req.max_tokens_field == "max_completion_tokens" {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            return Err(ApiError::context_length(
                format!(
                    "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({} in the prompt, {m} for the completion).",
                    ids.len() as u128 + m as u128,
                    ids.len()
                ),
                p,
            ));
        }
        Some(m) => m,
        None => st.cfg.default_max_tokens.min(room),
    };
    let seed = req.seed.unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0));
    let params = GenParams {
        max_tokens,
        sampler: SamplerParams { temperature: req.temperature, top_k: req.top_k, top_p: req.top_p, min_p: req.min_p, seed },
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        prompt: ids,
        params,
        stops: req.stop.clone(),
        logprobs: req.logprobs,
        cancel: cancel.clone(),
        events: tx,
        enqueued: Instant::now(),
    };
    let m = &st.shared.metrics;
    m.queue_depth.fetch_add(1, Ordering::Relaxed);
    match st.jobs.try_send(job) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            m.queue_depth.fetch_sub(1, Ordering::Relaxed);
            m.rejected_queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::queue_full(st.cfg.max_queue));
        }
        Err(TrySendError::Disconnected(_)) => {
            m.queue_depth.fetch_sub(1, Ordering::Relaxed);
            return Err(ApiError::shutting_down());
        }
    }
    let guard = CancelOnDrop(cancel);
    let meta = Meta {
        id: format!("{}-{:x}{:08x}", if ep == Endpoint::Chat { "chatcmpl" } else { "cmpl" }, now_secs(), rand32()),
        created: now_secs(),
        model: st.model_id.clone(),
        ep,
    };
    if req.stream {
        Ok(stream_response(st, meta, req, rx, guard))
    } else {
        collect_response(meta, req, rx, guard).await
    }
}

fn rand32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish() as u32
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    ep: Endpoint,
}

fn usage(o: &Outcome) -> Value {
    json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
    })
}

/// The `tandem` extension field: timings, prefix reuse and speculative figures.
fn extension(o: &Outcome) -> Value {
    json!({
        "cached_prompt_tokens": o.cached_tokens,
        "evaluated_prompt_tokens": o.prompt_tokens - o.cached_tokens,
        "queue_ms": o.queue_time.as_secs_f64() * 1e3,
        "prefill_ms": o.prefill_time.as_secs_f64() * 1e3,
        "decode_ms": o.decode_time.as_secs_f64() * 1e3,
        "decode_tokens_per_second": o.decode_tps,
        "speculative": o.spec,
    })
}

fn chat_logprobs(lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|t| {
            json!({
                "token": t.chosen.token, "logprob": t.chosen.logprob, "bytes": t.chosen.bytes,
                "top_logprobs": t.top.iter().map(|a| json!({"token": a.token, "logprob": a.logprob, "bytes": a.bytes})).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Legacy completions format; `base` is the byte offset of this batch's text.
fn completion_logprobs(lps: &[TokenLogprob]) -> Value {
    json!({
        "tokens": lps.iter().map(|t| t.chosen.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|t| t.chosen.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|t| {
            let mut m = serde_json::Map::new();
            for a in &t.top { m.entry(a.token.clone()).or_insert(json!(a.logprob)); }
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": lps.iter().map(|t| t.offset).collect::<Vec<_>>(),
    })
}

async fn collect_response(
    meta: Meta,
    req: GenRequest,
    mut rx: UnboundedReceiver<Event>,
    _guard: CancelOnDrop,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut lps: Vec<TokenLogprob> = Vec::new();
    let outcome = loop {
        match rx.recv().await {
            Some(Event::Chunk { text: t, logprobs }) => {
                text.push_str(&t);
                lps.extend(logprobs);
            }
            Some(Event::Done(o)) => break o,
            Some(Event::Error(e)) => return Err(e),
            None => return Err(ApiError::internal("the engine worker stopped")),
        }
    };
    let want_lp = req.logprobs.is_some();
    let choice = match meta.ep {
        Endpoint::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": null},
            "logprobs": if want_lp { chat_logprobs(&lps) } else { Value::Null },
            "finish_reason": outcome.finish.as_str(),
        }),
        Endpoint::Completion => json!({
            "index": 0,
            "text": text,
            "logprobs": if want_lp { completion_logprobs(&lps) } else { Value::Null },
            "finish_reason": outcome.finish.as_str(),
        }),
    };
    let body = json!({
        "id": meta.id,
        "object": if meta.ep == Endpoint::Chat { "chat.completion" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": format!("tandem-{}", env!("CARGO_PKG_VERSION")),
        "choices": [choice],
        "usage": usage(&outcome),
        "tandem": extension(&outcome),
    });
    Ok(Json(body).into_response())
}

struct StreamState {
    rx: UnboundedReceiver<Event>,
    _guard: CancelOnDrop,
    meta: Meta,
    include_usage: bool,
    want_lp: bool,
    out: VecDeque<SseEvent>,
    done: bool,
}

impl StreamState {
    fn chunk(&self, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        let choice = match self.meta.ep {
            Endpoint::Chat => json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
            Endpoint::Completion => json!({"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish}),
        };
        let mut v = json!({
            "id": self.meta.id,
            "object": if self.meta.ep == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": format!("tandem-{}", env!("CARGO_PKG_VERSION")),
            "choices": [choice],
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn push(&mut self, v: Value) {
        self.out.push_back(SseEvent::default().data(v.to_string()));
    }

    fn on_event(&mut self, ev: Option<Event>) {
        match ev {
            Some(Event::Chunk { text, logprobs }) => {
                let lp = match (self.want_lp, self.meta.ep) {
                    (false, _) => Value::Null,
                    (true, Endpoint::Chat) => chat_logprobs(&logprobs),
                    (true, Endpoint::Completion) => completion_logprobs(&logprobs),
                };
                let delta = match self.meta.ep {
                    Endpoint::Chat => json!({"content": text}),
                    Endpoint::Completion => json!(text),
                };
                let c = self.chunk(delta, lp, None);
                self.push(c);
            }
            Some(Event::Done(o)) => {
                let delta = if self.meta.ep == Endpoint::Chat { json!({}) } else { json!("") };
                let mut c = self.chunk(delta, Value::Null, Some(o.finish.as_str()));
                c["tandem"] = extension(&o);
                self.push(c);
                if self.include_usage {
                    let mut u = self.chunk(Value::Null, Value::Null, None);
                    u["choices"] = json!([]);
                    u["usage"] = usage(&o);
                    u["tandem"] = extension(&o);
                    self.push(u);
                }
                self.out.push_back(SseEvent::default().data("[DONE]"));
                self.done = true;
            }
            Some(Event::Error(e)) => {
                self.push(e.body());
                self.out.push_back(SseEvent::default().data("[DONE]"));
                self.done = true;
            }
            None => {
                self.push(ApiError::internal("the engine worker stopped").body());
                self.out.push_back(SseEvent::default().data("[DONE]"));
                self.done = true;
            }
        }
    }
}

fn stream_response(st: Arc<AppState>, meta: Meta, req: GenRequest, rx: UnboundedReceiver<Event>, guard: CancelOnDrop) -> Response {
    let mut s = StreamState {
        rx,
        _guard: guard,
        meta,
        include_usage: req.include_usage,
        want_lp: req.logprobs.is_some(),
        out: VecDeque::new(),
        done: false,
    };
    // the role arrives at once, before the prefill
    let first = match s.meta.ep {
        Endpoint::Chat => s.chunk(json!({"role": "assistant", "content": ""}), Value::Null, None),
        Endpoint::Completion => s.chunk(json!(""), Value::Null, None),
    };
    s.push(first);
    let stream = futures_util::stream::unfold(s, |mut s| async move {
        loop {
            if let Some(ev) = s.out.pop_front() {
                return Some((Ok::<_, std::convert::Infallible>(ev), s));
            }
            if s.done {
                return None;
            }
            let ev = s.rx.recv().await;
            s.on_event(ev);
        }
    });
    let keep = KeepAlive::new().interval(st.cfg.keepalive).text("keep-alive");
    let mut r = Sse::new(stream).keep_alive(keep).into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
