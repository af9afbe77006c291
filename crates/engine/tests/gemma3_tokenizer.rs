//! Gemma 3 270M's SentencePiece tokenizer (catalogue `gemma-3-270m`, 253 MB)
//! against llama.cpp's on the same file (tests/data/tokenizer_gemma3.jsonl,
//! made with llama.cpp 0c1e570).
//!
//! Only the tokenizer is built from the file, not a whole `Engine`, so these
//! tests do not depend on the model code. `#[ignore]`d because they fetch the
//! model; `cargo test --release -p tandem-engine --test gemma3_tokenizer -- --ignored`.

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tandem_engine::fetch::{ensure_model, find, models_dir};
use tandem_gguf::Gguf;
use tandem_tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};

/// The tokenizer, built once for all tests, and how long building it took.
fn loaded() -> &'static (Tokenizer, Duration) {
    static TOK: OnceLock<(Tokenizer, Duration)> = OnceLock::new();
    TOK.get_or_init(|| {
        let spec = find("gemma-3-270m").expect("gemma-3-270m is in the catalogue");
        let path = ensure_model(spec, &models_dir(), false).expect("fetch gemma-3-270m");
        let g = Gguf::open(&path).expect("open gemma-3-270m");
        let t0 = Instant::now();
        let tok = Tokenizer::from_gguf(&g).expect("build the gemma-3-270m tokenizer");
        let dt = t0.elapsed();
        eprintln!("tokenizer built in {dt:?}");
        (tok, dt)
    })
}

fn tokenizer() -> &'static Tokenizer {
    &loaded().0
}

/// BOS the way the engine adds it to a prompt (`Engine::tokenize_prompt`).
fn prompt_ids(tok: &Tokenizer, text: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    if tok.add_bos() && !text.starts_with(tok.token_str(tok.bos_id().unwrap())) {
        ids.push(tok.bos_id().unwrap());
    }
    ids.extend(tok.encode(text, true));
    ids
}

#[test]
#[ignore = "fetches the 253 MB gemma-3-270m model"]
fn metadata() {
    let (tok, build_time) = loaded();
    assert!(build_time.as_millis() < 1000, "building the tokenizer took {build_time:?}");
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(2), Some(1)));
    assert!(tok.add_bos());
    assert!(tok.chat_template().is_none());
    assert_eq!(tok.token_id("<start_of_turn>"), Some(105));
    assert_eq!(tok.token_id("<end_of_turn>"), Some(106));
    // `▁` is a space; `<0x0A>` is a byte token; `\n` is a user-defined token.
    assert_eq!(tok.token_str(494), "▁t");
    assert_eq!(tok.token_bytes(494), b" t");
    assert_eq!(tok.token_bytes(248), b"\n");
    assert_eq!(tok.token_bytes(0xe9 + 238), [0xe9]);
    assert_eq!(tok.token_bytes(107), b"\n");
    assert_eq!(tok.token_bytes(168), b"<table>");
    // Control tokens have no plain piece, but render with specials shown.
    assert_eq!(tok.token_bytes(105), b"");
    assert_eq!(tok.decode_special(&[2, 105, 106]), "<bos><start_of_turn><end_of_turn>");
    assert_eq!(tok.token_bytes(u32::MAX), b"");
    // llama.cpp's end-of-generation set: <eos>, <end_of_turn> (also found as
    // EOT) and the user-defined `</s>`, which it takes for an end token and
    // turns into a control token.
    let eog: Vec<u32> = (0..tok.vocab_size() as u32).filter(|&i| tok.is_eog(i)).collect();
    assert_eq!(eog, [1, 106, 212]);
    assert_eq!(tok.token_bytes(212), b"");
    assert_eq!(tok.decode_special(&[212]), "</s>");
}

#[test]
#[ignore = "fetches the 253 MB gemma-3-270m model"]
fn tokenizer_matches_llamacpp() {
    let tok = tokenizer();
    let mut n = 0;
    for v in common::read_jsonl(&common::data_dir().join("tokenizer_gemma3.jsonl")) {
        let Some(text) = v.get("text").and_then(|t| t.as_str()) else { continue };
        let want_p = common::ids(&v["ids_parse_special"]);
        let want_n = common::ids(&v["ids_no_parse_special"]);
        assert_eq!(tok.encode(text, true), want_p, "parse_special: {text:?}");
        assert_eq!(tok.encode(text, false), want_n, "no parse_special: {text:?}");
        // No space prefix is added, so, as with llama.cpp, text comes back
        // exactly: without specials always, with them when they are rendered.
        assert_eq!(tok.decode(&want_n), text, "decode: {text:?}");
        assert_eq!(tok.decode_special(&want_p), text, "decode with specials: {text:?}");
        if want_p.iter().all(|&i| !tok.token_bytes(i).is_empty()) {
            assert_eq!(tok.decode(&want_p), text, "decode: {text:?}");
        } else {
            assert!(tok.decode(&want_p).len() < text.len(), "control tokens are hidden: {text:?}");
        }
        n += 1;
    }
    assert_eq!(n, 39);
}

#[test]
#[ignore = "fetches the 253 MB gemma-3-270m model"]
fn special_and_user_defined_tokens() {
    let tok = tokenizer();
    let turn = "<start_of_turn>user\nHi<end_of_turn>\n";
    assert_eq!(tok.encode(turn, true)[..2], [105, 2364]);
    let spelled = tok.encode(turn, false);
    assert!(!spelled.contains(&105) && !spelled.contains(&106));
    assert_eq!(tok.decode(&spelled), turn);
    // User-defined tokens (newline runs, HTML tags) match even without
    // parse_special; control ones (`</s>` here) only with it.
    assert_eq!(tok.encode("\n\n", false), [108]);
    assert_eq!(tok.encode("<table>", false), [168]);
    assert_eq!(tok.encode("</s>", true), [212]);
    assert!(!tok.encode("</s>", false).contains(&212));
    // Adjacent specials, and the engine's BOS handling.
    assert_eq!(tok.encode("<end_of_turn><end_of_turn>", true), [106, 106]);
    let mut hi = vec![2];
    hi.extend(tok.encode("Hi", true));
    assert_eq!(prompt_ids(tok, "Hi"), hi);
    assert_eq!(prompt_ids(tok, "<bos>Hi"), prompt_ids(tok, "Hi"));
    assert_eq!(tok.encode("", true), Vec::<u32>::new());
}

#[test]
#[ignore = "fetches the 253 MB gemma-3-270m model"]
fn stream_decoder_never_splits_characters() {
    let tok = tokenizer();
    let texts = [
        // Outside the vocabulary: each comes out as four `<0xXX>` byte tokens.
        "Hieroglyphs 𓀀𓀁 and 𓀂.",
        "Emoji: 😀 🚀 👍🏽 ❤️ and 👨‍👩‍👧‍👦 family",
        "Chinese 你好，世界 and Japanese こんにちは、世界。한국어도",
        "plain ascii",
    ];
    for text in texts {
        let ids = tok.encode(text, false);
        let mut dec = StreamDecoder::new();
        let mut all = String::new();
        for &id in &ids {
            let piece = dec.push(tok, id);
            assert!(!piece.contains('\u{FFFD}'), "partial character emitted for {text:?}");
            all.push_str(&piece);
        }
        all.push_str(&dec.flush());
        assert_eq!(all, tok.decode(&ids));
        assert_eq!(all, text);
    }
    let ids = tok.encode("𓀀", false);
    assert_eq!(ids, [478, 385, 366, 366], "byte fallback: F0 93 80 80");
    let mut dec = StreamDecoder::new();
    let head: String = ids[..3].iter().map(|&i| dec.push(tok, i)).collect();
    assert_eq!(head, "");
    assert_eq!(dec.push(tok, ids[3]), "𓀀");
    // A dangling partial character comes out once, at flush, as U+FFFD, like decode.
    let mut dec = StreamDecoder::new();
    let head: String = ids[..3].iter().map(|&i| dec.push(tok, i)).collect();
    assert_eq!(head + &dec.flush(), tok.decode(&ids[..3]));
}

#[test]
#[ignore = "fetches the 253 MB gemma-3-270m model"]
fn chat_template() {
    let tok = tokenizer();
    // The file has no template: the fallback is Gemma's turn format.
    let t = ChatTemplate::fallback(tok);
    let msgs = [
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Hello"),
        ChatMessage::new("assistant", "Hi."),
        ChatMessage::new("user", "Name a colour."),
    ];
    let text = t.render(&msgs, true, "<bos>", "<eos>").unwrap();
    assert_eq!(
        text,
        "<start_of_turn>user\nYou are terse.\n\nHello<end_of_turn>\n<start_of_turn>model\nHi.<end_of_turn>\n\
         <start_of_turn>user\nName a colour.<end_of_turn>\n<start_of_turn>model\n"
    );
    let ids = prompt_ids(tok, &text);
    assert_eq!(ids[..4], [2, 105, 2364, 107]);
    assert_eq!(ids.iter().filter(|&&i| i == 105).count(), 4);
    assert_eq!(ids.iter().filter(|&&i| i == 106).count(), 3);
    assert_eq!(ids[ids.len() - 3..], [105, 4368, 107]);
    assert_eq!(tok.decode_special(&ids), format!("<bos>{text}"));
    // One user turn renders exactly the text of the reference vector for it.
    let one = t.render(&[ChatMessage::new("user", "Hello")], true, "<bos>", "<eos>").unwrap();
    assert_eq!(one, "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n");
    assert_eq!(tok.encode(&one, true), [105, 2364, 107, 9259, 106, 107, 105, 4368, 107]);
}

#[test]
#[ignore = "fetches the 253 MB gemma-3-270m model"]
fn encode_is_fast() {
    let tok = tokenizer();
    let lines = common::read_jsonl(&common::data_dir().join("tokenizer_gemma3.jsonl"));
    let mut text = String::new();
    while text.len() < 100_000 {
        for v in &lines {
            if let Some(t) = v.get("text").and_then(|t| t.as_str()) {
                text.push_str(t);
                text.push('\n');
            }
        }
    }
    let t0 = Instant::now();
    let ids = tok.encode(&text, true);
    let dt = t0.elapsed();
    eprintln!("encoded {} bytes -> {} tokens in {dt:?}", text.len(), ids.len());
    assert_eq!(tok.decode_special(&ids), text);
    assert!(dt.as_millis() < 500, "encoding took {dt:?}");
}
