#![allow(dead_code)]
//! Helpers for the server tests: the default model, an in-process server on a
//! random port, and a small raw HTTP/1.1 client (so tests control the socket:
//! disconnects, oversized bodies, malformed requests).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use serde_json::Value;
use tandem_engine::fetch::{ensure_model, models_dir, DEFAULT_MODEL};
use tandem_engine::Engine;
use tandem_server::{Running, ServerConfig};

pub const CTX: usize = 1024;

/// Tests that run the model take turns (two cores; timing-sensitive tests).
pub fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn engine() -> Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        let p = ensure_model(&DEFAULT_MODEL, &models_dir(), false).expect("fetch the default model");
        Arc::new(Engine::load(p, 2).expect("load the default model"))
    })
    .clone()
}

pub fn start(f: impl FnOnce(&mut ServerConfig)) -> Running {
    let mut cfg = ServerConfig::new(CTX, "test-model");
    cfg.port = 0;
    f(&mut cfg);
    Running::spawn(engine(), cfg).expect("start the server")
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, k: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(k)).map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    /// The `data:` payloads of an SSE body.
    pub fn sse(&self) -> Vec<String> {
        self.body.lines().filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:"))).map(str::to_string).collect()
    }
    /// The error message of an OpenAI-shaped error body.
    pub fn error_message(&self) -> String {
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].is_string() && e["type"].is_string(), "not an OpenAI error body: {}", self.body);
        e["message"].as_str().unwrap().to_string()
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s
}

pub fn raw_request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    let mut b = r.into_bytes();
    b.extend_from_slice(body);
    b
}

pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut s = connect(addr);
    s.write_all(&raw_request(method, path, headers, body)).expect("send");
    let mut buf = Vec::new();
    // the server may answer (413) before reading the whole body and close: read what came
    let _ = s.read_to_end(&mut buf);
    parse_response(&buf)
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(addr, "POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes())
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"")
}

pub fn parse_response(buf: &[u8]) -> Resp {
    let split =
        buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(buf)));
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    let raw = &buf[split + 4..];
    let chunked = headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked { dechunk(raw) } else { raw.to_vec() };
    Resp { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
}

pub fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(nl) = raw.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(String::from_utf8_lossy(&raw[..nl]).trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        let start = nl + 2;
        let end = (start + n).min(raw.len());
        out.extend_from_slice(&raw[start..end]);
        raw = &raw[(end + 2).min(raw.len())..];
    }
    out
}

pub fn chat_body(user: &str, extra: Value) -> Value {
    let mut v = serde_json::json!({"model": "anything", "messages": [{"role": "user", "content": user}]});
    if let Value::Object(m) = extra {
        for (k, x) in m {
            v[k] = x;
        }
    }
    v
}

/// Concatenated content of a chat SSE stream; panics on a malformed stream.
pub fn stream_text(r: &Resp) -> (String, Vec<Value>) {
    assert_eq!(r.status, 200, "{}", r.body);
    let data = r.sse();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "stream must end with [DONE]: {}", r.body);
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let mut text = String::new();
    for c in &chunks {
        assert!(c.get("error").is_none(), "error in stream: {c}");
        if let Some(ch) = c["choices"].as_array().and_then(|a| a.first()) {
            if let Some(t) = ch["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(t) = ch["text"].as_str() {
                text.push_str(t);
            }
        }
    }
    (text, chunks)
}

/// The value of a Prometheus sample line (`name{labels} value`).
pub fn metric(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
