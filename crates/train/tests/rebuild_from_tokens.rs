//! A data file kept as tokens only (`models/support/data/*.tokens.gz`) must
//! rebuild into the very file the target generated: the prefill pass over a
//! sequence gives every row the bits of the decode step that produced it.

use std::sync::Arc;

use tandem_engine::fetch::{ensure_model, models_dir, DEFAULT_MODEL};
use tandem_engine::Engine;
use tandem_train::data::{Dataset, GenConfig, TokenFile};

#[test]
fn rebuilt_data_is_byte_identical_to_generated_data() {
    let path = ensure_model(&DEFAULT_MODEL, &models_dir(), false).expect("fetch the default model");
    let engine = Arc::new(Engine::load(path, 2).expect("load"));
    let mut prompts: Vec<String> =
        ["Name three colours.", "Write a haiku about rain.", "What is 12 times 7?"].iter().map(|s| s.to_string()).collect();
    // one sequence longer than a 256-position prefill chunk
    prompts.push(format!("Summarize: {}", "The river rises in the hills and runs to the sea past farms and towns. ".repeat(20)));
    // greedy and sampled answers, several decoded together
    let cfg = GenConfig { max_new: 40, sampled_share: 0.5, temp: 0.8, seed: 5, parallel: 3 };
    let gen = Dataset::generate(&engine, &prompts, &cfg).unwrap();
    let dir = std::env::temp_dir().join(format!("tandem-rebuild-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (toks, a, b) = (dir.join("d.tokens.gz"), dir.join("gen.bin"), dir.join("rebuilt.bin"));
    assert!(gen.seqs.iter().any(|s| s.tokens.len() > 256));
    gen.save_tokens(&toks).unwrap();
    let tf = TokenFile::load(&toks).unwrap();
    assert_eq!(tf, gen.token_file());
    let rebuilt = Dataset::rebuild(&engine, &tf).unwrap();
    gen.save(&a).unwrap();
    rebuilt.save(&b).unwrap();
    let (x, y) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert!(x == y, "rebuilt data differs from the generated data");
    // target features from the same pass equal those of the feature pass
    let layers = [2, 10, 30];
    let (again, rows) = Dataset::rebuild_with_features(&engine, &tf, &layers).unwrap();
    let want = tandem_train::dspark::Features::compute(&engine, &gen.seqs, &layers).unwrap();
    assert_eq!(rows.len(), want.rows.len());
    for (r, w) in rows.iter().zip(&want.rows) {
        assert!(r.len() == w.len() && r.iter().zip(w).all(|(p, q)| p.to_bits() == q.to_bits()), "features differ");
    }
    again.save(&b).unwrap();
    assert!(std::fs::read(&b).unwrap() == x, "data rebuilt with features differs");
    // the trainer takes the final residual (layer 30's input) from the data's
    // hidden rows and caches only the other layers: the same features
    let layers = [2, 30, 10];
    let want = tandem_train::dspark::Features::compute(&engine, &gen.seqs, &layers).unwrap();
    let part = [tandem_train::dspark::FeatureCache { seqs: gen.seqs.len(), data: Some(a.clone()) }];
    for round in 0..2 {
        let got = tandem_train::dspark::load_features(&engine, &gen, &layers, &part).unwrap();
        assert_eq!(got.width, 3 * gen.d);
        for (r, w) in got.rows.iter().zip(&want.rows) {
            assert!(
                r.len() == w.len() && r.iter().zip(w).all(|(p, q)| p.to_bits() == q.to_bits()),
                "spliced features differ (round {round})"
            );
        }
        // the first round wrote the cache of layers 2 and 10, the second reads it
        assert!(dir.join("gen.dspark-l2-10.feats").exists());
    }
    assert!(Dataset::rebuild_with_features(&engine, &tf, &[31]).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn token_files_round_trip_and_bad_ones_are_refused() {
    let dir = std::env::temp_dir().join(format!("tandem-tokfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // narrow (u16) and wide (u32) token widths
    for big in [7u32, 70_000] {
        let tf = TokenFile { vocab_hash: 0xABCD, seqs: vec![(vec![1, 2, big], 2), (vec![], 0), (vec![5; 300], 10)] };
        let p = dir.join(format!("t{big}.tokens.gz"));
        tf.save(&p).unwrap();
        assert_eq!(TokenFile::load(&p).unwrap(), tf);
        // truncated
        let bytes = std::fs::read(&p).unwrap();
        let q = dir.join("cut.tokens.gz");
        std::fs::write(&q, &bytes[..bytes.len() / 2]).unwrap();
        assert!(TokenFile::load(&q).is_err());
    }
    // not gzip, and gzip of something else
    let p = dir.join("junk.tokens.gz");
    std::fs::write(&p, b"not a token file at all, really not").unwrap();
    let e = TokenFile::load(&p).unwrap_err().to_string();
    assert!(e.contains("token file"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
