//! One AFL++ target for every tandem harness: `TANDEM_FUZZ_TARGET` picks it
//! (gguf, support, tokenizer, chat_template, request). Run through
//! `scripts/fuzz-afl.sh`, which builds this with `cargo afl build` and starts
//! `cargo afl fuzz` on the same seeds as the structured driver.

#![forbid(unsafe_code)]

fn main() {
    let name = std::env::var("TANDEM_FUZZ_TARGET").unwrap_or_default();
    let Some(harness) = tandem_fuzz::target(&name) else {
        eprintln!("set TANDEM_FUZZ_TARGET to one of {:?}", tandem_fuzz::TARGETS.iter().map(|t| t.0).collect::<Vec<_>>());
        std::process::exit(2);
    };
    // without afl's abort-on-panic hook: a panic the harness itself catches (tandem
    // turns a minijinja panic inside a render into an error) is not a crash;
    // one that escapes still aborts and is reported.
    afl::fuzz_nohook!(|data: &[u8]| {
        harness(data);
    });
}
