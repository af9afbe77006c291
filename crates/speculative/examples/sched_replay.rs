//! Replay the cycles of full-block spec logs through the scheduler, with a
//! fixed cost table instead of a clock: a noise-free look at what a
//! truncation policy would commit and what it would cost.
//!
//! The input is `--spec-log FILE` output of a run with full blocks
//! (`--spec-fixed`): each cycle record gives the confidences of every slot
//! and how many drafts greedy verification accepted. A policy that
//! verifies k of them commits `min(accepted, k) + 1` and pays the draft (when
//! it asked for one) plus a forward of k + 1 rows. The replay keeps the
//! logged walk (a real decoder that verified fewer would start its next cycle
//! elsewhere), so it ranks policies; it does not replace `tandem bench`.
//!
//! cargo run --release -p tandem-speculative --example sched_replay -- \
//!     [--costs 1,1.07,1.2,1.4,1.75] [--draft 0.14] [--policy adaptive|fixed:K] \
//!     [--fresh] [--profile-all] [--noise SIGMA] [--drift SIGMA] LOG...
//!
//! Costs are per forward of 1, 2, … rows and per proposal, in any unit (a
//! plain token's forward is the natural one). One scheduler runs through all
//! logs in order, as `tandem bench` keeps one speculator for a round's
//! prompts; `--fresh` starts a new one per log (one-shot generations). The
//! profile the scheduler starts with measures widths 1, 2, 4 and the
//! widest, as the speculator's does; `--profile-all` measures every width.
//! `--drift` lets the machine's speed wander (a random walk of its log, this
//! step per cycle) and `--noise` puts a log-normal error on every measured
//! time; what a cycle is charged is then what it measured, and the speedup
//! is against plain decoding at the same moments. `REPLAY_DEBUG=1` prints the
//! scheduler's estimates after each log.
use tandem_speculative::cycle::read_records;
use tandem_speculative::{Budget, Scheduler, SchedulerConfig};

struct Cycle {
    conf: Vec<f32>,
    accepted: usize,
}

/// The full-block cycles of a `--spec-log` file (JSON lines of cycle records).
fn parse(path: &str) -> Vec<Cycle> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let records = read_records(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    records
        .into_iter()
        .filter(|r| !r.plan.ask.free && r.plan.verify == r.drafted.len())
        .map(|r| Cycle { conf: r.drafted_confidence().to_vec(), accepted: r.verification.accepted })
        .collect()
}

fn main() {
    let mut costs = vec![1.0, 1.07, 1.2, 1.4, 1.75];
    let mut draft = 0.14;
    let mut policy = "adaptive".to_string();
    let mut profile_all = false;
    let mut persist = true;
    let (mut noise, mut drift) = (0.0f64, 0.0f64);
    let mut logs = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--costs" => costs = args.next().expect("--costs LIST").split(',').map(|c| c.parse().expect("a cost")).collect(),
            "--draft" => draft = args.next().expect("--draft SECS").parse().expect("a cost"),
            "--policy" => policy = args.next().expect("--policy NAME"),
            "--profile-all" => profile_all = true,
            "--fresh" => persist = false,
            "--noise" => noise = args.next().expect("--noise SIGMA").parse().expect("a number"),
            "--drift" => drift = args.next().expect("--drift SIGMA").parse().expect("a number"),
            _ => logs.push(a),
        }
    }
    let block = costs.len() - 1;
    let (mut tokens, mut time, mut cycles) = (0.0f64, 0.0f64, 0usize);
    // what plain decoding would have cost per cycle at the same moments
    let mut plain_time = 0.0f64;
    let mut lengths = vec![0usize; block + 1];
    let mut budgets = vec![0usize; block + 1];
    // the machine's speed: a random walk of log-factor (per cycle step
    // `drift`), each measurement off by a log-normal `noise` (what is
    // charged is the measurement: the time the cycle really took)
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut gauss = move || {
        let mut u = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            ((rng >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let (a, b) = (u(), u());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    };
    let mut speed = 0.0f64;
    let mut kept: Option<Scheduler> = None;
    for path in &logs {
        // a new scheduler starts with the profile, as the speculator's does
        let mut s = kept.take().unwrap_or_else(|| {
            let mut s = Scheduler::new(SchedulerConfig::default(), block + 1);
            s.set_fixed_draft_cost(true);
            let mut widths: Vec<usize> = if profile_all {
                (1..=block + 1).collect()
            } else {
                [1, 2, 4, block + 1].into_iter().filter(|&w| w <= block + 1).collect()
            };
            widths.dedup();
            for &w in &widths {
                s.observe_verify(w, costs[w - 1] * (speed + noise * gauss()).exp());
            }
            s
        });
        for c in parse(path).into_iter().filter(|c| c.conf.len() == block) {
            speed += drift * gauss();
            let f = (speed + noise * gauss()).exp();
            let plan = match policy.strip_prefix("fixed:") {
                Some(k) => Budget { tokens: k.parse().expect("fixed:K"), ..Budget::default() },
                None => s.budget(block),
            };
            s.commit_budget(&plan);
            let budget = plan.tokens;
            budgets[budget] += 1;
            let k = if budget == 0 {
                0
            } else {
                // the drafter stops where the scheduler says truncation would cut
                let stop = (1..=budget).take_while(|&j| s.extends(&plan, &c.conf[..j])).last().unwrap_or(0);
                let conf = &c.conf[..stop];
                s.observe_proposal(conf, budget);
                s.observe_draft(budget, draft * f);
                let k = if policy.starts_with("fixed:") { budget } else { s.truncate(&plan, stop, conf) };
                if k < stop {
                    s.observe_unverified(k, conf);
                }
                k
            };
            let cost = (if budget > 0 { draft } else { 0.0 } + costs[k]) * f;
            s.observe_verify(k + 1, costs[k] * f);
            plain_time += costs[0] * f;
            if k > 0 {
                s.observe_acceptance(k, c.accepted.min(k));
                s.observe_confidence(&c.conf[..k], c.accepted.min(k));
            }
            s.end_cycle(k > 0);
            tokens += (c.accepted.min(k) + 1) as f64;
            time += cost;
            cycles += 1;
            lengths[k] += 1;
        }
        if std::env::var("REPLAY_DEBUG").is_ok() {
            eprintln!(
                "{path}: alpha {:?} verify {:?} cal(1, 0.5..0.9) {:?}",
                s.alpha(),
                (1..=block + 1).map(|w| s.verify_cost(w)).collect::<Vec<_>>(),
                [0.5f32, 0.6, 0.7, 0.8, 0.9].map(|c| s.calibrated(1, c))
            );
        }
        if persist {
            kept = Some(s);
        }
    }
    println!(
        "policy {policy}: {cycles} cycles, committed/cycle {:.3}, speedup {:.3}x (cost of a plain token {}), verified lengths {:?}, budgets {:?}",
        tokens / cycles as f64,
        tokens / time * plain_time / cycles as f64,
        costs[0],
        lengths,
        budgets
    );
}
