//! The token files committed under `models/support/data/` (the data behind the
//! committed support models, see `models/support/README.md`) load, belong to
//! their model's vocabulary and hold the sequences the README reports.

use std::path::PathBuf;

use tandem_engine::fetch::{ensure_model, models_dir, ModelSpec, DEFAULT_MODEL, QWEN25_CODER_05B};
use tandem_train::data::TokenFile;

/// File, sequences, positions (the figures in `models/support/README.md`).
const FILES: &[(&str, usize, usize)] = &[
    ("mtp-p448", 448, 71_987),
    ("mtp-x1500", 1_500, 380_754),
    ("mtp-p1500-t1500", 3_000, 550_751),
    ("mtp-t2000-s7", 2_000, 463_368),
    ("mtp-to2000-s11", 2_000, 405_882),
];

/// The coder's (Qwen2.5-Coder-0.5B-Instruct) data files.
const CODER_FILES: &[(&str, usize, usize)] = &[("coder-c1", 440, 136_224)];

#[test]
fn committed_token_files_fit_the_default_model() {
    check(&DEFAULT_MODEL, FILES);
}

#[test]
#[ignore = "fetches the 491 MB coder model; .ci/run runs it"]
fn committed_token_files_fit_the_coder() {
    check(&QWEN25_CODER_05B, CODER_FILES);
}

fn check(model: &ModelSpec, files: &[(&str, usize, usize)]) {
    let path = ensure_model(model, &models_dir(), false).expect("fetch the model");
    let g = tandem_gguf::Gguf::open(&path).expect("open the model");
    let tok = tandem_tokenizer::Tokenizer::from_gguf(&g).expect("tokenizer");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/support/data");
    for &(name, seqs, positions) in files {
        let p = dir.join(format!("{name}.tokens.gz"));
        let tf = TokenFile::load(&p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
        assert_eq!(tf.vocab_hash, tok.vocab_hash(), "{name}: another vocabulary");
        assert_eq!(tf.seqs.len(), seqs, "{name}: sequences");
        assert_eq!(tf.seqs.iter().map(|(t, _)| t.len()).sum::<usize>(), positions, "{name}: positions");
        let vocab = tok.vocab_size() as u32;
        for (i, (t, prompt_len)) in tf.seqs.iter().enumerate() {
            assert!(*prompt_len > 0 && *prompt_len <= t.len(), "{name}: sequence {i} prompt length");
            assert!(t.iter().all(|&x| x < vocab), "{name}: sequence {i} has a token outside the vocabulary");
        }
    }
}
