//! `tandem serve` as a process: greedy output through the server is identical
//! to `tandem -p` (with and without speculation), and SIGTERM shuts it down.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["serve", "--port", "0", "-t", "2", "--ctx", "2048"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tandem serve");
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let addr = loop {
            line.clear();
            assert!(err.read_line(&mut line).unwrap() > 0, "tandem serve exited before listening");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.split_whitespace().next().unwrap().parse().unwrap();
            }
        };
        // keep draining stderr so the server never blocks on a full pipe
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = err.read_to_string(&mut sink);
        });
        Server { child, addr }
    }

    fn post(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let mut s = TcpStream::connect(self.addr).unwrap();
        let b = body.to_string();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{out}");
        serde_json::from_str(body).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cli(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem")).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8(out.stdout).unwrap();
    // the CLI ends its output with a newline
    s.strip_suffix('\n').unwrap_or(&s).to_string()
}

fn check_identical(spec: &[&str]) {
    let prompt = "List the planets of the solar system, one per line.";
    let n = "48";
    let mut args = vec!["-p", prompt, "--temp", "0", "-n", n, "-t", "2"];
    args.extend_from_slice(spec);
    let expected = cli(&args);
    let s = Server::start(spec);
    let v = s.post(
        "/v1/chat/completions",
        &serde_json::json!({"model": "x", "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 48}),
    );
    assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), expected, "server vs CLI with {spec:?}");
    if !spec.is_empty() {
        assert!(v["tandem"]["speculative"]["drafted_tokens"].is_u64(), "{v}");
    }
}

#[test]
fn server_greedy_output_matches_the_cli() {
    check_identical(&[]);
}

#[test]
fn server_greedy_output_matches_the_cli_with_lookup() {
    check_identical(&["--lookup"]);
}

#[test]
fn server_greedy_output_matches_the_cli_with_lookup_before_mtp() {
    let head = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/support/smollm2-135m-instruct-mtp.gguf");
    check_identical(&["--mtp", head, "--lookup", "--spec-require"]);
}

#[test]
fn server_greedy_output_matches_the_cli_with_suffix() {
    check_identical(&["--suffix"]);
}

#[test]
fn server_greedy_output_matches_the_cli_with_suffix_before_mtp() {
    let head = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/support/smollm2-135m-instruct-mtp.gguf");
    check_identical(&["--mtp", head, "--suffix", "--spec-require"]);
}

impl Server {
    fn get(&self, path: &str) -> String {
        let mut s = TcpStream::connect(self.addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// A gauge's value from /metrics.
    fn gauge(&self, name: &str) -> Option<u64> {
        let m = self.get("/metrics");
        m.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    fn chat(&self, text: &str, n: usize) -> serde_json::Value {
        self.post(
            "/v1/chat/completions",
            &serde_json::json!({"model": "x", "messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": n}),
        )
    }

    fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let st = self.child.wait().unwrap();
        assert!(st.success(), "exit status {st}");
    }
}

/// The suffix cache of recent outputs survives a restart only with
/// `--suffix-cache FILE`, never holds more than `--suffix-cache-tokens`,
/// and what it remembers makes a repeated answer draft from the first
/// token on; output stays the plain output.
#[test]
fn suffix_cache_survives_a_restart_only_if_asked_and_stays_bounded() {
    let dir = std::env::temp_dir().join(format!("tandem-serve-suffix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("suffix.bin");
    let f = file.to_str().unwrap();
    let ask = "Write a Python function that returns the squares of a list of numbers.";
    let plain = Server::start(&[]);
    let want = plain.chat(ask, 64);
    plain.stop();

    let s = Server::start(&["--suffix", "--suffix-cache", f, "--suffix-cache-tokens", "100"]);
    assert_eq!(s.gauge("tandem_suffix_cache_tokens"), Some(0));
    assert_eq!(s.gauge("tandem_suffix_cache_capacity_tokens"), Some(100));
    let first = s.chat(ask, 64);
    assert_eq!(first["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"]);
    for other in ["Name three rivers.", "Count from 1 to 40.", "Write a haiku about tea."] {
        s.chat(other, 48);
        let held = s.gauge("tandem_suffix_cache_tokens").unwrap();
        assert!(held <= 100, "{held} tokens held");
    }
    let before = s.gauge("tandem_suffix_cache_tokens").unwrap();
    assert!(before > 0);
    s.stop();
    assert!(file.exists(), "the cache was not saved");

    // asked: the same outputs are back after the restart
    let s = Server::start(&["--suffix", "--suffix-cache", f, "--suffix-cache-tokens", "100"]);
    assert_eq!(s.gauge("tandem_suffix_cache_tokens"), Some(before));
    s.stop();
    // not asked: a fresh cache
    let s = Server::start(&["--suffix"]);
    assert_eq!(s.gauge("tandem_suffix_cache_tokens"), Some(0));
    // a repeated request drafts from what the first answer wrote
    let a = s.chat(ask, 64);
    let b = s.chat(ask, 64);
    assert_eq!(a["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"]);
    assert_eq!(b["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"]);
    let (da, db) = (&a["tandem"]["speculative"], &b["tandem"]["speculative"]);
    assert!(db["accepted_tokens"].as_u64() > da["accepted_tokens"].as_u64(), "first {da}, repeated {db}");
    assert!(db["tokens_per_cycle"].as_f64().unwrap() > 2.0, "repeated {db}");
    s.stop();
    // a cache file for another vocabulary is refused with a clear message
    std::fs::write(&file, b"TNDMSUFX\x01\0\0\0\x10\0\0\0\x01\0\0\0\0\0\0\0\0\0\0\0").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tandem")).args(["serve", "--port", "0", "--suffix", "--suffix-cache", f]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("another vocabulary"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sigterm_shuts_down_cleanly() {
    let mut s = Server::start(&["--shutdown-timeout", "1"]);
    let pid = s.child.id().to_string();
    let t0 = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            assert!(st.success(), "exit status {st}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "still running 10 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}
