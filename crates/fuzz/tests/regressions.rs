//! Every input a fuzz run saved (tests/data/fuzz/regressions/TARGET/) is
//! replayed through its harness: it must return, without a panic, in well
//! under a second. Inputs of problems not fixed yet are listed in
//! `KNOWN_OPEN` with the reason, and replayed by an ignored test.

use std::time::{Duration, Instant};

/// Saved inputs that still fail, by name prefix, with why
/// (docs/reliability.md).
const KNOWN_OPEN: &[(&str, &str)] = &[];

fn known_open(key: &str) -> bool {
    KNOWN_OPEN.iter().any(|(k, _)| key.starts_with(k))
}

fn inputs() -> Vec<(String, std::path::PathBuf)> {
    let dir = tandem_fuzz::root().join("tests/data/fuzz/regressions");
    let mut out = Vec::new();
    for (name, _) in tandem_fuzz::TARGETS {
        let Ok(rd) = std::fs::read_dir(dir.join(name)) else { continue };
        for e in rd.flatten() {
            let key = format!("{name}/{}", e.file_name().to_string_lossy());
            out.push((key, e.path()));
        }
    }
    out.sort();
    out
}

fn replay(key: &str, path: &std::path::Path) {
    let name = key.split('/').next().unwrap();
    let f = tandem_fuzz::target(name).unwrap();
    let data = std::fs::read(path).unwrap();
    let t = Instant::now();
    f(&data);
    assert!(t.elapsed() < Duration::from_secs(2), "{key}: {:?}", t.elapsed());
}

#[test]
fn saved_inputs_are_handled() {
    for (key, path) in inputs() {
        if known_open(&key) {
            continue;
        }
        replay(&key, &path);
    }
}

#[test]
#[ignore = "known open problems (KNOWN_OPEN)"]
fn known_open_inputs() {
    for (key, path) in inputs().into_iter().filter(|(k, _)| known_open(k)) {
        replay(&key, &path);
    }
}

/// Each harness on its seeds' simplest forms: empty input, one byte.
#[test]
fn harnesses_take_trivial_inputs() {
    for (_, f) in tandem_fuzz::TARGETS {
        f(&[]);
        f(&[0]);
        f(b"{}");
    }
}
