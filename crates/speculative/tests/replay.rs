//! Recorded cycles replayed through the scheduler: every plan it makes from
//! the recorded inputs (the proposals, the measured costs, the outcomes of
//! earlier cycles) is the plan the live run made, bit for bit.
//!
//! The records in `tests/data/cycles/` are `--spec-log` files of real runs
//! (see the README there). A change to the cost model, the calibration or
//! the policy that changes a decision fails here; one that is meant to must
//! regenerate the files with the commands in that README.

use tandem_speculative::cycle::read_records;
use tandem_speculative::{CycleRecord, Scheduler, SchedulerConfig};

/// Replay `records` (one generation) through a fresh scheduler; returns how
/// many cycles drafted and how many verified a free proposal.
fn replay(name: &str, fixed_draft: bool) -> (usize, usize) {
    let path = format!("{}/tests/data/cycles/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let records = read_records(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(records.len() >= 50, "{name}: {} cycles", records.len());
    // the speculator's scheduler covers forwards up to its widest profiled one
    let widest = records[0].profile.iter().map(|p| p.0).max().expect("the first cycle profiles");
    let mut s = Scheduler::new(SchedulerConfig::default(), widest);
    s.set_fixed_draft_cost(fixed_draft);
    let (mut drafted, mut free) = (0, 0);
    for (i, rec) in records.iter().enumerate() {
        let at = format!("{name} cycle {} (line {})", rec.cycle, i + 1);
        replay_cycle(&mut s, rec, &at);
        drafted += usize::from(rec.plan.ask.budget.tokens > 0);
        free += usize::from(rec.plan.ask.free);
    }
    (drafted, free)
}

/// What the speculator does with the scheduler in one cycle, from the record.
fn replay_cycle(s: &mut Scheduler, rec: &CycleRecord, at: &str) {
    for &(w, secs) in &rec.profile {
        s.observe_verify(w, secs);
    }
    s.set_load(rec.load);
    let free = rec.free_offer.as_ref().map(|f| (f.tokens, &f.confidence[..]));
    let ask = s.ask(rec.plan.ask.offered, free);
    assert_eq!(ask, rec.plan.ask, "{at}: what to ask for");
    let budget = ask.budget;
    if budget.tokens > 0 {
        let conf = rec.drafted_confidence();
        // a drafter that stops where truncation would cut was told to go on
        // for every slot it drafted
        if s.cost.fixed_draft() {
            for j in 2..=conf.len() {
                assert!(s.extends(&budget, &conf[..j]), "{at}: slot {j} drafted although the plan would cut it");
            }
        }
        if rec.draft_priced {
            s.observe_draft(rec.drafted.len(), rec.draft_secs);
        }
    }
    let plan = s.plan(ask, rec.drafted.len(), rec.drafted_confidence());
    assert_eq!(plan, rec.plan, "{at}: how much to verify");
    s.observe_cycle(rec);
}

#[test]
fn dspark_cycles_replay_to_the_same_plans() {
    let (drafted, _) = replay("dspark.jsonl", true);
    assert!(drafted > 20, "{drafted}");
}

#[test]
fn mtp_cycles_replay_to_the_same_plans() {
    let (drafted, _) = replay("mtp.jsonl", false);
    assert!(drafted > 20, "{drafted}");
}

#[test]
fn lookup_in_front_of_dspark_replays_to_the_same_plans() {
    let (_, free) = replay("lookup-dspark.jsonl", true);
    assert!(free > 20, "{free}");
}

/// The replay sees a changed decision: the same records with one
/// confidence changed make some plan differ.
#[test]
fn a_changed_input_changes_a_plan() {
    let path = format!("{}/tests/data/cycles/dspark.jsonl", env!("CARGO_MANIFEST_DIR"));
    let mut records = read_records(&std::fs::read_to_string(path).unwrap()).unwrap();
    let widest = records[0].profile.iter().map(|p| p.0).max().unwrap();
    // make a confident slot of a verified proposal look hopeless
    let i = records.iter().position(|r| r.plan.verify >= 2 && r.drafted_confidence().len() >= 2).expect("a cycle that verified two drafts");
    records[i].confidence[1] = 0.0;
    let mut s = Scheduler::new(SchedulerConfig::default(), widest);
    s.set_fixed_draft_cost(true);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for r in &records {
            replay_cycle(&mut s, r, "changed");
        }
    }));
    assert!(caught.is_err(), "a hopeless second slot was still verified");
}
