//! Bad input, limits and auth: every case answers in OpenAI's error shape with
//! the right status, and the server keeps working afterwards.

mod common;

use std::io::Write;

use common::*;
use serde_json::json;

fn post_raw(addr: std::net::SocketAddr, path: &str, body: &str) -> Resp {
    request(addr, "POST", path, &[("Content-Type", "application/json")], body.as_bytes())
}

fn expect(r: &Resp, status: u16, needle: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    let m = r.error_message();
    assert!(m.contains(needle), "message {m:?} lacks {needle:?}");
}

#[test]
fn bad_requests_get_400_with_a_clear_message() {
    let _g = serial();
    let s = start(|_| {});
    let a = s.addr;
    let c = "/v1/chat/completions";
    expect(&post_raw(a, c, "{\"messages\": [}"), 400, "Invalid JSON body");
    expect(&post_raw(a, c, ""), 400, "Invalid JSON body");
    expect(&post_raw(a, c, "[1, 2]"), 400, "must be a JSON object");
    let r = post(a, c, &chat_body("hi", json!({"frobnicate": true})));
    expect(&r, 400, "Unrecognized request argument supplied: frobnicate");
    assert_eq!(r.json()["error"]["param"], "frobnicate");
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    expect(&post(a, c, &chat_body("hi", json!({"temperature": "warm"}))), 400, "'temperature' must be a number");
    expect(&post(a, c, &chat_body("hi", json!({"temperature": 7}))), 400, "'temperature' must be between 0 and 2");
    expect(&post(a, c, &chat_body("hi", json!({"max_tokens": -3}))), 400, "'max_tokens' must be a positive integer");
    expect(&post(a, c, &chat_body("hi", json!({"max_tokens": 0}))), 400, "'max_tokens' must be a positive integer");
    expect(&post(a, c, &chat_body("hi", json!({"stream": "yes"}))), 400, "'stream' must be a boolean");
    expect(&post(a, c, &chat_body("hi", json!({"stop": [1]}))), 400, "'stop' must be a string or an array of strings");
    expect(&post(a, c, &chat_body("hi", json!({"n": 3}))), 400, "'n' must be 1");
    expect(&post(a, c, &chat_body("hi", json!({"presence_penalty": 1.5}))), 400, "not supported");
    expect(&post(a, c, &chat_body("hi", json!({"top_logprobs": 2}))), 400, "requires 'logprobs'");
    expect(&post(a, c, &chat_body("hi", json!({"logprobs": true, "top_logprobs": 50}))), 400, "'top_logprobs' must be between 0 and 20");
    expect(&post(a, c, &json!({"messages": []})), 400, "'messages' must not be empty");
    expect(&post(a, c, &json!({"model": "m"})), 400, "'messages' is required");
    expect(&post(a, c, &json!({"messages": "hi"})), 400, "'messages' must be an array");
    expect(&post(a, c, &json!({"messages": [{"role": "wizard", "content": "hi"}]})), 400, "'messages[0].role' must be one of");
    expect(&post(a, c, &json!({"messages": [{"role": "user"}]})), 400, "'messages[0].content' is required");
    expect(&post(a, c, &json!({"messages": [{"role": "user", "content": 5}]})), 400, "'messages[0].content' must be a string");
    expect(&post(a, c, &json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})), 400, "text part");
    expect(&post(a, "/v1/completions", &json!({"prompt": 12})), 400, "'prompt' must be a string");
    expect(&post(a, "/v1/completions", &json!({"prompt": [99999999]})), 400, "outside the vocabulary");
    expect(&post(a, "/v1/completions", &json!({"prompt": ["a", "b"]})), 400, "Only one prompt");
    expect(&post(a, "/v1/completions", &json!({"prompt": "x", "echo": true})), 400, "'echo' is not supported");
    expect(&post(a, "/v1/completions", &json!({"prompt": "x", "messages": []})), 400, "Unrecognized request argument supplied: messages");
    // harmless fields real clients send are accepted
    let r =
        post(a, c, &chat_body("hi", json!({"user": "u1", "presence_penalty": 0, "frequency_penalty": 0, "max_tokens": 1, "metadata": {}})));
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn context_limits_name_the_sizes() {
    let _g = serial();
    let s = start(|c| c.ctx = 64);
    let long = "word ".repeat(200);
    let r = post(s.addr, "/v1/chat/completions", &chat_body(&long, json!({})));
    expect(&r, 400, "maximum context length is 64 tokens");
    let m = r.error_message();
    assert!(m.contains("prompt has"), "{m}");
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    let r = post(s.addr, "/v1/chat/completions", &chat_body("hi", json!({"max_tokens": 1000})));
    expect(&r, 400, "maximum context length is 64 tokens");
    assert!(r.error_message().contains("1000 for the completion"), "{}", r.body);
    let r = post(s.addr, "/v1/chat/completions", &chat_body("hi", json!({"max_completion_tokens": 100000})));
    assert_eq!(r.json()["error"]["param"], "max_completion_tokens");
    // no max_tokens: generation stops at the context edge with finish_reason length
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "count: 1 2 3", "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(v["usage"]["total_tokens"].as_u64().unwrap() <= 64);
}

#[test]
fn oversized_body_gets_413() {
    let _g = serial();
    let s = start(|c| c.max_body_bytes = 1000);
    let big = chat_body(&"x".repeat(5000), json!({}));
    let r = post(s.addr, "/v1/chat/completions", &big);
    expect(&r, 413, "Request body too large: the limit is 1000 bytes");
    // a body without Content-Length (chunked) is cut at the limit too
    let mut sock = connect(s.addr);
    let payload = big.to_string();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n";
    sock.write_all(head.as_bytes()).unwrap();
    let _ = sock.write_all(format!("{:x}\r\n{payload}\r\n0\r\n\r\n", payload.len()).as_bytes());
    let mut buf = Vec::new();
    let _ = std::io::Read::read_to_end(&mut sock, &mut buf);
    expect(&parse_response(&buf), 413, "too large");
    // and normal requests still work
    assert_eq!(post(s.addr, "/v1/chat/completions", &chat_body("hi", json!({"max_tokens": 1}))).status, 200);
}

#[test]
fn unknown_routes_and_methods() {
    let _g = serial();
    let s = start(|_| {});
    expect(&get(s.addr, "/v1/nope"), 404, "Unknown endpoint: GET /v1/nope");
    expect(&get(s.addr, "/v1/chat/completions"), 405, "Method not allowed");
}

#[test]
fn api_key_is_required_when_set() {
    let _g = serial();
    let s = start(|c| c.api_key = Some("sekrit-key".into()));
    let body = chat_body("hi", json!({"max_tokens": 1})).to_string();
    let c = "/v1/chat/completions";
    let r = request(s.addr, "POST", c, &[], body.as_bytes());
    expect(&r, 401, "API key");
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    expect(&request(s.addr, "POST", c, &[("Authorization", "Bearer wrong")], body.as_bytes()), 401, "API key");
    expect(&request(s.addr, "POST", c, &[("Authorization", "Bearer sekrit-ke")], body.as_bytes()), 401, "API key");
    expect(&request(s.addr, "POST", c, &[("Authorization", "sekrit-key")], body.as_bytes()), 401, "API key");
    expect(&request(s.addr, "GET", "/v1/models", &[], b""), 401, "API key");
    expect(&request(s.addr, "GET", "/metrics", &[], b""), 401, "API key");
    let r = request(s.addr, "POST", c, &[("Authorization", "Bearer sekrit-key")], body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(request(s.addr, "GET", "/v1/models", &[("Authorization", "Bearer sekrit-key")], b"").status, 200);
    // health stays open for load balancers
    assert_eq!(get(s.addr, "/health").status, 200);
}

#[test]
fn cors_preflight_when_enabled() {
    let _g = serial();
    let s = start(|c| {
        c.cors = true;
        c.api_key = Some("k".into());
    });
    let r = request(
        s.addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", "http://example.com"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization,content-type"),
        ],
        b"",
    );
    assert!(r.status == 200 || r.status == 204, "{r:?}");
    assert!(r.header("access-control-allow-origin").is_some(), "{r:?}");
}

#[test]
fn full_queue_gets_503_with_retry_after() {
    let _g = serial();
    let s = start(|c| c.max_queue = 0);
    // occupy the worker with a stream, wait for its first token
    let mut sock = connect(s.addr);
    let long = chat_body("Tell me a long story about a lighthouse keeper.", json!({"temperature": 0, "max_tokens": 200, "stream": true}));
    sock.write_all(&raw_request("POST", "/v1/chat/completions", &[], long.to_string().as_bytes())).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"content\":\"") || String::from_utf8_lossy(&seen).matches("data:").count() < 3 {
        let n = std::io::Read::read(&mut sock, &mut buf).unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&buf[..n]);
    }
    let r = post(s.addr, "/v1/chat/completions", &chat_body("hi", json!({"max_tokens": 1})));
    expect(&r, 503, "busy");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["code"], "queue_full");
    let sb = chat_body("hi", json!({"max_tokens": 1, "stream": true}));
    expect(&post(s.addr, "/v1/chat/completions", &sb), 503, "busy");
    drop(sock);
    // the worker is free again soon (the dropped stream was cancelled)
    let t0 = std::time::Instant::now();
    let mut rejected = 2.0;
    loop {
        let r = post(s.addr, "/v1/chat/completions", &chat_body("hi", json!({"max_tokens": 1})));
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503);
        rejected += 1.0;
        assert!(t0.elapsed().as_secs() < 10, "still busy: {}", r.body);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let m = get(s.addr, "/metrics").body;
    assert_eq!(metric(&m, "tandem_requests_rejected_total"), rejected);
    assert_eq!(metric(&m, "tandem_http_requests_total{route=\"/v1/chat/completions\",code=\"503\"}"), rejected);
}
