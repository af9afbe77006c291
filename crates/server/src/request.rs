//! Request parsing and validation.
//!
//! The rule for fields: a request body must be a JSON object whose keys are
//! OpenAI API fields for that endpoint.
//! - *Supported* fields are type- and range-checked (400 naming the field).
//! - *Harmless* fields that do not change the output (`user`, `metadata`,
//!   `store`, `service_tier`, `parallel_tool_calls`, `cache_prompt`, ...) are
//!   accepted and ignored.
//! - *Unsupported* OpenAI fields (`tools`, `logit_bias`, penalties, `echo`,
//!   `suffix`, ...) are accepted only at their default value (or null); any
//!   other value is a 400 saying it is not supported.
//! - Any other key is a 400: `Unrecognized request argument supplied: KEY`.
//!
//! `null` means "default" for every field.

use serde_json::{Map, Value};
use tandem_tokenizer::ChatMessage;

use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Chat messages, rendered with the model's chat template.
    Messages(Vec<ChatMessage>),
    /// Raw text (no template).
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// Sampling defaults when a request leaves a field out (the CLI's defaults,
/// as llama-server does; OpenAI's own defaults suit much larger models).
pub const DEFAULT_TEMPERATURE: f32 = 0.8;
pub const DEFAULT_TOP_K: usize = 40;
pub const DEFAULT_TOP_P: f32 = 0.95;
pub const DEFAULT_MIN_P: f32 = 0.05;
/// Most stop strings per request.
pub const MAX_STOPS: usize = 16;
/// Most alternatives per token for chat `top_logprobs`.
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most alternatives per token for legacy completions `logprobs`.
pub const MAX_COMPLETION_LOGPROBS: usize = 5;

#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub endpoint: Endpoint,
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub max_tokens: Option<usize>,
    /// Which field set `max_tokens` (for error messages).
    pub max_tokens_field: &'static str,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// None: no log-probabilities; Some(n): the chosen token's plus n alternatives.
    pub logprobs: Option<usize>,
}

const COMMON: &[&str] = &["model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "stream", "stream_options"];
const CHAT_ONLY: &[&str] = &["messages", "max_completion_tokens", "logprobs", "top_logprobs"];
const COMPLETION_ONLY: &[&str] = &["prompt", "logprobs", "echo", "suffix", "best_of"];
/// Accepted with any value and ignored: they do not change the output.
const IGNORED: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "cache_prompt",
    "stream_options",
    "safety_identifier",
    "prompt_cache_key",
];
/// OpenAI fields this server does not implement: only their default is accepted.
const DEFAULT_ONLY: &[&str] = &[
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "web_search_options",
];

fn is_default(key: &str, v: &Value) -> bool {
    match (key, v) {
        (_, Value::Null) => true,
        ("frequency_penalty" | "presence_penalty", Value::Number(n)) => n.as_f64() == Some(0.0),
        ("logit_bias", Value::Object(m)) => m.is_empty(),
        ("tools" | "functions", Value::Array(a)) => a.is_empty(),
        ("tool_choice" | "function_call", Value::String(s)) => s == "none" || s == "auto",
        ("response_format", Value::Object(m)) => m.get("type").and_then(Value::as_str) == Some("text"),
        ("modalities", Value::Array(a)) => a.iter().all(|x| x.as_str() == Some("text")),
        _ => false,
    }
}

/// Parse a request body for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<GenRequest, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("Invalid JSON body: {e}")))?;
    let Value::Object(obj) = v else {
        return Err(ApiError::bad_request("The request body must be a JSON object."));
    };
    let own = match endpoint {
        Endpoint::Chat => CHAT_ONLY,
        Endpoint::Completion => COMPLETION_ONLY,
    };
    for (k, v) in &obj {
        let k = k.as_str();
        if COMMON.contains(&k) || own.contains(&k) || IGNORED.contains(&k) {
            continue;
        }
        if DEFAULT_ONLY.contains(&k) {
            if !is_default(k, v) {
                return Err(ApiError::invalid(k, format!("'{k}' is not supported by this server (only its default value is accepted).")));
            }
            continue;
        }
        return Err(ApiError::invalid(k, format!("Unrecognized request argument supplied: {k}")));
    }
    let f = Fields(&obj);

    let model = f.string("model")?;
    if let Some(n) = f.uint("n")? {
        if n != 1 {
            return Err(ApiError::invalid("n", format!("'n' must be 1 (got {n}): this server generates one choice per request.")));
        }
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ApiError::invalid("stream_options", "'stream_options.include_usage' must be a boolean.")),
        },
        Some(_) => return Err(ApiError::invalid("stream_options", "'stream_options' must be an object.")),
    };
    let temperature = f.number("temperature", 0.0, 2.0)?.map(|x| x as f32).unwrap_or(DEFAULT_TEMPERATURE);
    let top_p = f.number("top_p", 0.0, 1.0)?.map(|x| x as f32).unwrap_or(DEFAULT_TOP_P);
    let min_p = f.number("min_p", 0.0, 1.0)?.map(|x| x as f32).unwrap_or(DEFAULT_MIN_P);
    let top_k = f.uint("top_k")?.map(|k| k as usize).unwrap_or(DEFAULT_TOP_K);
    let seed = match obj.get("seed") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) if n.is_u64() => n.as_u64(),
        Some(Value::Number(n)) if n.is_i64() => n.as_i64().map(|x| x as u64),
        Some(_) => return Err(ApiError::invalid("seed", "'seed' must be an integer.")),
    };
    let stop = match obj.get("stop") {
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            let mut out = Vec::new();
            for x in a {
                match x {
                    Value::String(s) => out.push(s.clone()),
                    _ => return Err(ApiError::invalid("stop", "'stop' must be a string or an array of strings.")),
                }
            }
            out
        }
        Some(_) => return Err(ApiError::invalid("stop", "'stop' must be a string or an array of strings.")),
    };
    if stop.len() > MAX_STOPS {
        return Err(ApiError::invalid("stop", format!("'stop' has {} strings; at most {MAX_STOPS} are allowed.", stop.len())));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty."));
    }

    let mut max_tokens = f.positive("max_tokens")?;
    let mut max_tokens_field = "max_tokens";
    let (prompt, logprobs) = match endpoint {
        Endpoint::Chat => {
            if let Some(m) = f.positive("max_completion_tokens")? {
                max_tokens = Some(m);
                max_tokens_field = "max_completion_tokens";
            }
            let want = f.bool("logprobs")?.unwrap_or(false);
            let top = f.uint("top_logprobs")?;
            if let Some(t) = top {
                if t as usize > MAX_TOP_LOGPROBS {
                    return Err(ApiError::invalid(
                        "top_logprobs",
                        format!("'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS} (got {t})."),
                    ));
                }
                if !want {
                    return Err(ApiError::invalid("top_logprobs", "'top_logprobs' requires 'logprobs' to be true."));
                }
            }
            (PromptInput::Messages(parse_messages(obj.get("messages"))?), want.then(|| top.unwrap_or(0) as usize))
        }
        Endpoint::Completion => {
            if let Some(true) = f.bool("echo")? {
                return Err(ApiError::invalid("echo", "'echo' is not supported by this server."));
            }
            if !matches!(obj.get("suffix"), None | Some(Value::Null)) {
                return Err(ApiError::invalid("suffix", "'suffix' is not supported by this server."));
            }
            if let Some(b) = f.uint("best_of")? {
                if b != 1 {
                    return Err(ApiError::invalid("best_of", "'best_of' must be 1."));
                }
            }
            let lp = f.uint("logprobs")?;
            if let Some(n) = lp {
                if n as usize > MAX_COMPLETION_LOGPROBS {
                    return Err(ApiError::invalid(
                        "logprobs",
                        format!("'logprobs' must be between 0 and {MAX_COMPLETION_LOGPROBS} (got {n})."),
                    ));
                }
            }
            (parse_prompt(obj.get("prompt"))?, lp.map(|n| n as usize))
        }
    };
    Ok(GenRequest {
        endpoint,
        model,
        prompt,
        max_tokens,
        max_tokens_field,
        temperature,
        top_p,
        top_k,
        min_p,
        seed,
        stop,
        stream,
        include_usage,
        logprobs,
    })
}

struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    fn string(&self, k: &str) -> Result<Option<String>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::invalid(k, format!("'{k}' must be a string."))),
        }
    }
    fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::invalid(k, format!("'{k}' must be a boolean."))),
        }
    }
    fn number(&self, k: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                if !(lo..=hi).contains(&x) {
                    return Err(ApiError::invalid(k, format!("'{k}' must be between {lo} and {hi} (got {x}).")));
                }
                Ok(Some(x))
            }
            Some(_) => Err(ApiError::invalid(k, format!("'{k}' must be a number."))),
        }
    }
    fn uint(&self, k: &str) -> Result<Option<u64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) if n.is_u64() => Ok(n.as_u64()),
            Some(_) => Err(ApiError::invalid(k, format!("'{k}' must be a non-negative integer."))),
        }
    }
    fn positive(&self, k: &str) -> Result<Option<usize>, ApiError> {
        match self.uint(k) {
            Ok(Some(0)) | Err(_) => Err(ApiError::invalid(k, format!("'{k}' must be a positive integer."))),
            Ok(x) => Ok(x.map(|x| x.min(usize::MAX as u64) as usize)),
        }
    }
}

fn parse_messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let arr = match v {
        None | Some(Value::Null) => return Err(ApiError::invalid("messages", "'messages' is required.")),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::invalid("messages", "'messages' must be an array of message objects.")),
    };
    if arr.is_empty() {
        return Err(ApiError::invalid("messages", "'messages' must not be empty."));
    }
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let p = format!("messages[{i}]");
        let Value::Object(o) = m else {
            return Err(ApiError::invalid(&p, format!("'{p}' must be an object with 'role' and 'content'.")));
        };
        for k in o.keys() {
            if !matches!(k.as_str(), "role" | "content" | "name" | "refusal") {
                return Err(ApiError::invalid(&format!("{p}.{k}"), format!("Unrecognized argument in '{p}': {k}")));
            }
        }
        let role = match o.get("role") {
            Some(Value::String(r)) => r.as_str(),
            None | Some(Value::Null) => return Err(ApiError::invalid(&format!("{p}.role"), format!("'{p}.role' is required."))),
            Some(_) => return Err(ApiError::invalid(&format!("{p}.role"), format!("'{p}.role' must be a string."))),
        };
        let role = match role {
            "system" | "user" | "assistant" => role,
            "developer" => "system",
            other => {
                return Err(ApiError::invalid(
                    &format!("{p}.role"),
                    format!("'{p}.role' must be one of system, developer, user, assistant (got '{other}')."),
                ))
            }
        };
        let content = match o.get("content") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) if role == "assistant" => String::new(),
            None | Some(Value::Null) => return Err(ApiError::invalid(&format!("{p}.content"), format!("'{p}.content' is required."))),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for (j, part) in parts.iter().enumerate() {
                    let pp = format!("{p}.content[{j}]");
                    match (part.get("type").and_then(Value::as_str), part.get("text")) {
                        (Some("text"), Some(Value::String(t))) => s.push_str(t),
                        _ => {
                            let msg = format!(
                                "'{pp}' must be a text part {{\"type\": \"text\", \"text\": ...}}; other content types are not supported."
                            );
                            return Err(ApiError::invalid(&pp, msg));
                        }
                    }
                }
                s
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    &format!("{p}.content"),
                    format!("'{p}.content' must be a string or an array of text parts."),
                ))
            }
        };
        out.push(ChatMessage::new(role, content));
    }
    Ok(out)
}

fn token_ids(a: &[Value]) -> Option<Vec<u32>> {
    a.iter().map(|x| x.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32)).collect()
}

fn parse_prompt(v: Option<&Value>) -> Result<PromptInput, ApiError> {
    const MSG: &str = "'prompt' must be a string, an array with one string, or an array of token ids.";
    match v {
        None | Some(Value::Null) => Err(ApiError::invalid("prompt", "'prompt' is required.")),
        Some(Value::String(s)) => Ok(PromptInput::Text(s.clone())),
        Some(Value::Array(a)) => {
            if a.is_empty() {
                return Err(ApiError::invalid("prompt", "'prompt' must not be empty."));
            }
            if a.len() == 1 {
                match &a[0] {
                    Value::String(s) => return Ok(PromptInput::Text(s.clone())),
                    Value::Array(inner) => {
                        return token_ids(inner).map(PromptInput::Tokens).ok_or_else(|| ApiError::invalid("prompt", MSG))
                    }
                    _ => {}
                }
            }
            if a.iter().all(|x| x.is_string() || x.is_array()) {
                return Err(ApiError::invalid("prompt", "Only one prompt per request is supported (n = 1)."));
            }
            token_ids(a).map(PromptInput::Tokens).ok_or_else(|| ApiError::invalid("prompt", MSG))
        }
        Some(_) => Err(ApiError::invalid("prompt", MSG)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<GenRequest, ApiError> {
        parse(Endpoint::Chat, body.as_bytes())
    }

    #[test]
    fn minimal_chat_gets_defaults() {
        let r = chat(r#"{"model":"x","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert_eq!(r.prompt, PromptInput::Messages(vec![ChatMessage::new("user", "hi")]));
        assert_eq!((r.temperature, r.top_k, r.stream, r.logprobs), (DEFAULT_TEMPERATURE, DEFAULT_TOP_K, false, None));
    }

    #[test]
    fn field_errors_name_the_field() {
        let e = chat(r#"{"messages":[{"role":"user","content":"hi"}],"bogus":1}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("bogus"));
        assert!(e.message.contains("Unrecognized request argument supplied: bogus"));
        let e = chat(r#"{"messages":[{"role":"user","content":"hi"}],"temperature":"hot"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = chat(r#"{"messages":[]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = chat(r#"{"messages":[{"role":"user","content":"hi"}],"n":2}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        let e = chat(r#"{"messages":[{"role":"user","content":"hi"}],"presence_penalty":0.5}"#).unwrap_err();
        assert!(e.message.contains("not supported"));
        assert!(chat(r#"{"messages":[{"role":"user","content":"hi"}],"presence_penalty":0,"user":"u","tools":[]}"#).is_ok());
        assert!(chat("{not json").unwrap_err().message.starts_with("Invalid JSON body"));
        assert!(chat("[1]").is_err());
    }

    #[test]
    fn logprobs_and_stops() {
        let r = chat(r#"{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":3,"stop":["a","b"]}"#).unwrap();
        assert_eq!(r.logprobs, Some(3));
        assert_eq!(r.stop, vec!["a", "b"]);
        assert!(chat(r#"{"messages":[{"role":"user","content":"hi"}],"top_logprobs":3}"#).is_err());
        let r = parse(Endpoint::Completion, br#"{"prompt":"x","logprobs":2,"stop":"\n"}"#).unwrap();
        assert_eq!((r.logprobs, r.stop), (Some(2), vec!["\n".to_string()]));
    }

    #[test]
    fn completion_prompt_shapes() {
        let p = |b: &str| parse(Endpoint::Completion, b.as_bytes()).map(|r| r.prompt);
        assert_eq!(p(r#"{"prompt":["hi"]}"#).unwrap(), PromptInput::Text("hi".into()));
        assert_eq!(p(r#"{"prompt":[1,2,3]}"#).unwrap(), PromptInput::Tokens(vec![1, 2, 3]));
        assert_eq!(p(r#"{"prompt":[[4,5]]}"#).unwrap(), PromptInput::Tokens(vec![4, 5]));
        assert!(p(r#"{"prompt":["a","b"]}"#).is_err());
        assert!(p(r#"{"prompt":[-1]}"#).is_err());
        assert!(p(r#"{"prompt":5}"#).is_err());
        assert!(p(r#"{"messages":[]}"#).is_err());
    }
}
