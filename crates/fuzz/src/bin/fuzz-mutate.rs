//! Structured mutation fuzzing on stable Rust, for a set time:
//!
//!   fuzz-mutate TARGET SECONDS [SEED_DIR_OR_FILE ...]
//!
//! Seeds are mutated (bit flips, interesting integers over 1/2/4/8-byte
//! fields, byte runs inserted, removed or repeated, splices of two seeds,
//! truncation) and fed to the harness; a panic is caught, its input saved
//! under `tests/data/fuzz/regressions/TARGET/`, and counted. Inputs that
//! take longer than a second are saved as well (a hang is a bug too).
//! Prints one summary line: executions, distinct crashes, slow inputs;
//! exits 1 when an input crashed.

use std::panic;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    3,
    7,
    8,
    15,
    16,
    31,
    32,
    63,
    64,
    127,
    128,
    255,
    256,
    4096,
    65535,
    65536,
    1 << 31,
    u32::MAX as u64,
    1 << 32,
    1 << 62,
    u64::MAX,
];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], input: &mut Vec<u8>) {
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let n = input.len();
        match rng.below(9) {
            0 if n > 0 => {
                let i = rng.below(n);
                input[i] ^= 1 << rng.below(8);
            }
            1 if n > 0 => {
                let i = rng.below(n);
                input[i] = rng.next() as u8;
            }
            2 if n >= 8 => {
                // an interesting value over a field of 1, 2, 4 or 8 bytes
                let w = [1, 2, 4, 8][rng.below(4)];
                let i = rng.below(n - w + 1);
                let v = INTERESTING[rng.below(INTERESTING.len())].wrapping_add(rng.below(3) as u64).wrapping_sub(1);
                input[i..i + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
            3 if n > 0 => {
                let i = rng.below(n);
                let len = 1 + rng.below(64.min(n - i));
                input.drain(i..i + len);
            }
            4 => {
                let i = rng.below(n + 1);
                let len = 1 + rng.below(64);
                let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                input.splice(i..i, bytes);
            }
            5 if n > 0 => {
                // repeat a run (long runs, nesting)
                let i = rng.below(n);
                let len = 1 + rng.below(32.min(n - i));
                let run = input[i..i + len].to_vec();
                let times = 1 + rng.below(64);
                let at = rng.below(n + 1);
                for _ in 0..times {
                    input.splice(at..at, run.iter().copied());
                }
            }
            6 if !seeds.is_empty() => {
                // splice another seed's tail
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let a = rng.below(n + 1);
                    let b = rng.below(other.len());
                    input.truncate(a);
                    input.extend_from_slice(&other[b..]);
                }
            }
            7 if n > 0 => input.truncate(rng.below(n)),
            _ => {
                // copy bytes within the input (moves fields around)
                if n > 2 {
                    let a = rng.below(n);
                    let b = rng.below(n);
                    let len = 1 + rng.below(16.min(n - a).min(n - b));
                    let chunk = input[a..a + len].to_vec();
                    input[b..b + len].copy_from_slice(&chunk);
                }
            }
        }
    }
    input.truncate(1 << 24);
}

fn read_seeds(paths: &[String]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for p in paths {
        let p = Path::new(p);
        if p.is_dir() {
            let mut entries: Vec<PathBuf> =
                std::fs::read_dir(p).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
            entries.sort();
            out.extend(entries.iter().filter_map(|e| std::fs::read(e).ok()));
        } else if let Ok(b) = std::fs::read(p) {
            out.push(b);
        }
    }
    if out.is_empty() {
        out.push(Vec::new());
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!(
            "usage: fuzz-mutate TARGET SECONDS [SEEDS ...]; targets: {:?}",
            tandem_fuzz::TARGETS.iter().map(|t| t.0).collect::<Vec<_>>()
        );
        std::process::exit(2);
    }
    let name = &args[1];
    let Some(harness) = tandem_fuzz::target(name) else {
        eprintln!("no target {name}");
        std::process::exit(2);
    };
    let secs: f64 = args[2].parse().expect("SECONDS");
    let seeds = read_seeds(&args[3..]);
    let out_dir = tandem_fuzz::root().join("tests/data/fuzz/regressions").join(name);
    panic::set_hook(Box::new(|_| {}));
    let seed = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1));
    let mut rng = Rng(seed | 1);
    // FUZZ_TRACE=FILE: write each input there before running it, to recover
    // inputs that abort the process (stack overflows).
    let trace = std::env::var_os("FUZZ_TRACE");
    let t0 = Instant::now();
    let (mut execs, mut crashes, mut slow) = (0u64, 0u64, 0u64);
    let mut seen = std::collections::HashSet::new();
    // every seed as it is first
    let mut queue: Vec<Vec<u8>> = seeds.clone();
    while t0.elapsed().as_secs_f64() < secs {
        let input = match queue.pop() {
            Some(s) => s,
            None => {
                let mut x = seeds[rng.below(seeds.len())].clone();
                mutate(&mut rng, &seeds, &mut x);
                x
            }
        };
        if let Some(path) = &trace {
            // an abort (stack overflow) cannot be caught: the input is on disk
            let _ = std::fs::write(path, &input);
        }
        let t = Instant::now();
        let r = panic::catch_unwind(|| harness(&input));
        let dt = t.elapsed();
        execs += 1;
        let mut save = |kind: &str, msg: String| {
            let h = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
            if seen.insert((kind.to_string(), msg.clone())) {
                let _ = std::fs::create_dir_all(&out_dir);
                let f = out_dir.join(format!("{kind}-{h:016x}"));
                let _ = std::fs::write(&f, &input);
                eprintln!("{kind}: {msg} -> {}", f.display());
            }
        };
        if let Err(e) = r {
            crashes += 1;
            let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            save("crash", msg);
        } else if dt > Duration::from_secs(1) {
            slow += 1;
            save("slow", format!("{:.1} s", dt.as_secs_f64()));
        }
    }
    println!(
        "{name}: {execs} executions in {:.0} s ({:.0}/s), {} seeds, {crashes} crashing inputs ({} distinct), {slow} slow (> 1 s)",
        t0.elapsed().as_secs_f64(),
        execs as f64 / t0.elapsed().as_secs_f64(),
        seeds.len(),
        seen.iter().filter(|(k, _)| k == "crash").count(),
    );
    if crashes > 0 {
        std::process::exit(1);
    }
}
