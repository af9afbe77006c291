//! Concurrency: a bounded load test, disconnects cancelling generations,
//! keep-alive comments while queued, graceful shutdown.

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

const C: &str = "/v1/chat/completions";

fn wait_for_metric(addr: std::net::SocketAddr, name: &str, want: f64, secs: u64) -> String {
    let t0 = Instant::now();
    loop {
        let m = get(addr, "/metrics").body;
        if metric(&m, name) == want {
            return m;
        }
        assert!(t0.elapsed().as_secs() < secs, "{name} never reached {want}:\n{m}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Read from a stream socket until `n` data events arrived.
fn read_events(sock: &mut std::net::TcpStream, n: usize) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&seen).matches("data:").count() < n {
        let k = sock.read(&mut buf).unwrap();
        assert!(k > 0, "stream closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..k]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[test]
fn sixteen_clients_eight_requests_each() {
    let _g = serial();
    let s = start(|c| c.max_queue = 4);
    let addr = s.addr;
    let (ok, busy, tokens) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (ok, busy, tokens) = (ok.clone(), busy.clone(), tokens.clone());
            std::thread::spawn(move || {
                for i in 0..8 {
                    let stream = (t + i) % 2 == 0;
                    let b = chat_body(
                        &format!("Say a word about the number {}.", t * 8 + i),
                        json!({"temperature": 0.7, "seed": t * 8 + i, "max_tokens": 3, "stream": stream,
                               "stream_options": if stream { json!({"include_usage": true}) } else { json!(null) }}),
                    );
                    let r = post(addr, C, &b);
                    match r.status {
                        200 => {
                            let usage = if stream {
                                let (_, chunks) = stream_text(&r);
                                chunks.last().unwrap()["usage"].clone()
                            } else {
                                r.json()["usage"].clone()
                            };
                            let n = usage["completion_tokens"].as_u64().unwrap_or_else(|| panic!("no usage: {}", r.body));
                            assert!((1..=3).contains(&n));
                            tokens.fetch_add(n, Ordering::Relaxed);
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        503 => {
                            assert_eq!(r.json()["error"]["code"], "queue_full", "{}", r.body);
                            assert!(r.header("retry-after").is_some());
                            busy.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("unexpected status {other}: {}", r.body),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let (ok, busy, tokens) = (ok.load(Ordering::Relaxed), busy.load(Ordering::Relaxed), tokens.load(Ordering::Relaxed));
    println!("load: {ok} succeeded, {busy} got 503, {tokens} tokens");
    assert_eq!(ok + busy, 128);
    // the first 1 + max_queue requests always find room
    assert!(ok >= 5, "too few requests got through: {ok}");
    let m = get(addr, "/metrics").body;
    assert_eq!(metric(&m, "tandem_http_requests_total{route=\"/v1/chat/completions\",code=\"200\"}") as u64, ok, "{m}");
    assert_eq!(metric(&m, "tandem_http_requests_total{route=\"/v1/chat/completions\",code=\"503\"}") as u64, busy);
    assert_eq!(metric(&m, "tandem_requests_rejected_total") as u64, busy);
    assert_eq!(metric(&m, "tandem_generations_total{outcome=\"completed\"}") as u64, ok);
    assert_eq!(metric(&m, "tandem_generations_total{outcome=\"failed\"}"), 0.0);
    assert_eq!(metric(&m, "tandem_generated_tokens_total") as u64, tokens);
    assert_eq!(metric(&m, "tandem_queue_depth"), 0.0);
    assert_eq!(metric(&m, "tandem_requests_running"), 0.0);
    assert!(metric(&m, "tandem_decode_tokens_per_second") > 0.0);
}

#[test]
fn disconnect_mid_stream_cancels_the_generation() {
    let _g = serial();
    let s = start(|_| {});
    let mut sock = connect(s.addr);
    let b = chat_body("Tell me a long story about a lighthouse keeper.", json!({"temperature": 0, "max_tokens": 900, "stream": true}));
    sock.write_all(&raw_request("POST", C, &[], b.to_string().as_bytes())).unwrap();
    read_events(&mut sock, 4);
    let t0 = Instant::now();
    drop(sock);
    let m = wait_for_metric(s.addr, "tandem_generations_total{outcome=\"cancelled\"}", 1.0, 5);
    println!("cancelled {:.0} ms after the disconnect", t0.elapsed().as_secs_f64() * 1e3);
    let generated = metric(&m, "tandem_generated_tokens_total");
    assert!(generated < 200.0, "generated {generated} tokens of 900 before the cancel");
    assert_eq!(metric(&m, "tandem_requests_running"), 0.0);
    // the engine is free
    let r = post(s.addr, C, &chat_body("hi", json!({"max_tokens": 2})));
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn disconnect_while_waiting_for_a_whole_response_cancels_too() {
    let _g = serial();
    let s = start(|_| {});
    let mut sock = connect(s.addr);
    let b = chat_body("Tell me a long story about a lighthouse keeper.", json!({"temperature": 0, "max_tokens": 900}));
    sock.write_all(&raw_request("POST", C, &[], b.to_string().as_bytes())).unwrap();
    wait_for_metric(s.addr, "tandem_requests_running", 1.0, 10);
    std::thread::sleep(Duration::from_millis(200));
    drop(sock);
    let m = wait_for_metric(s.addr, "tandem_generations_total{outcome=\"cancelled\"}", 1.0, 10);
    assert!(metric(&m, "tandem_generated_tokens_total") < 600.0);
}

#[test]
fn queued_stream_gets_keepalive_comments() {
    let _g = serial();
    let s = start(|c| c.keepalive = Duration::from_millis(50));
    let addr = s.addr;
    let busy = std::thread::spawn(move || post(addr, C, &chat_body("Tell me a story.", json!({"temperature": 0, "max_tokens": 60}))));
    wait_for_metric(addr, "tandem_requests_running", 1.0, 10);
    let r = post(addr, C, &chat_body("hi", json!({"max_tokens": 2, "stream": true})));
    let (text, _) = stream_text(&r);
    assert!(!text.is_empty());
    let comments = r.body.lines().filter(|l| l.starts_with(':')).count();
    assert!(comments >= 2, "expected keep-alive comments while queued:\n{}", r.body);
    assert_eq!(busy.join().unwrap().status, 200);
}

#[test]
fn shutdown_cancels_what_outlives_the_grace_period() {
    let _g = serial();
    let s = start(|c| c.shutdown_grace = Duration::from_millis(1500));
    let addr = s.addr;
    // a long stream that cannot finish within the grace period
    let mut sock = connect(addr);
    let b = chat_body("Tell me a long story about a lighthouse keeper.", json!({"temperature": 0, "max_tokens": 900, "stream": true}));
    sock.write_all(&raw_request("POST", C, &[], b.to_string().as_bytes())).unwrap();
    read_events(&mut sock, 3);
    // a short request queued behind it
    let short = std::thread::spawn(move || post(addr, C, &chat_body("hi", json!({"max_tokens": 2}))));
    wait_for_metric(addr, "tandem_queue_depth", 1.0, 10);
    let reader = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = sock.read_to_end(&mut rest);
        String::from_utf8_lossy(&rest).into_owned()
    });
    let t0 = Instant::now();
    s.stop().expect("clean shutdown");
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(6), "shutdown took {took:?}");
    let tail = reader.join().unwrap();
    assert!(tail.contains("shutting down") && tail.contains("[DONE]"), "the long stream should end with a shutdown error: {tail}");
    let r = short.join().unwrap();
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(std::net::TcpStream::connect(addr).is_err(), "still accepting after shutdown");
}

#[test]
fn shutdown_lets_in_flight_requests_finish() {
    let _g = serial();
    let s = start(|c| c.shutdown_grace = Duration::from_secs(20));
    let addr = s.addr;
    let req = std::thread::spawn(move || post(addr, C, &chat_body("Tell me a story.", json!({"temperature": 0, "max_tokens": 24}))));
    wait_for_metric(addr, "tandem_requests_running", 1.0, 10);
    let t0 = Instant::now();
    s.stop().expect("clean shutdown");
    assert!(t0.elapsed() < Duration::from_secs(15), "shutdown waited for the whole grace period");
    let r = req.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["usage"]["completion_tokens"].as_u64().unwrap() > 0);
}
