//! The OpenAI-compatible API on the default model: chat and text completions,
//! streaming, stop strings, usage, logprobs, prefix reuse, speculation.

mod common;

use common::*;
use serde_json::json;

const Q: &str = "Name three colors.";

#[test]
fn models_and_health() {
    let _g = serial();
    let s = start(|_| {});
    let r = get(s.addr, "/v1/models");
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "test-model");
    let r = get(s.addr, "/v1/models/gpt-4o");
    assert_eq!(r.json()["id"], "test-model", "any model name is answered by the loaded one");
    let r = get(s.addr, "/health");
    assert_eq!((r.status, r.json()["status"].as_str()), (200, Some("ok")));
}

#[test]
fn chat_nonstreaming_and_streaming_agree_and_report_usage() {
    let _g = serial();
    let s = start(|_| {});
    let body = chat_body(Q, json!({"temperature": 0, "max_tokens": 40}));
    let r = post(s.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "test-model");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(!text.is_empty());
    let fin = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(fin == "stop" || fin == "length");
    let u = &v["usage"];
    let (p, c) = (u["prompt_tokens"].as_u64().unwrap(), u["completion_tokens"].as_u64().unwrap());
    assert!(p > 5 && c > 0 && c <= 40);
    assert_eq!(u["total_tokens"].as_u64().unwrap(), p + c);
    assert!(v["tandem"]["decode_tokens_per_second"].is_number());

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let r = post(s.addr, "/v1/chat/completions", &sb);
    assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
    let (stext, chunks) = stream_text(&r);
    assert_eq!(stext, text, "greedy streaming output differs from non-streaming");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    let fin_chunk = chunks.iter().find(|c| c["choices"][0]["finish_reason"].is_string()).expect("a finish chunk");
    assert_eq!(fin_chunk["choices"][0]["finish_reason"], fin);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0, "the usage chunk has no choices");
    assert_eq!(last["usage"]["completion_tokens"].as_u64().unwrap(), c);
    // the whole conversation was cached by the first request
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), p - 1);

    // without include_usage there is no usage chunk
    sb["stream_options"] = json!(null);
    let (_, chunks) = stream_text(&post(s.addr, "/v1/chat/completions", &sb));
    assert!(chunks.iter().all(|c| c.get("usage").is_none() || c["usage"].is_null()));
}

#[test]
fn text_completion_with_string_and_token_prompts() {
    let _g = serial();
    let s = start(|_| {});
    let body = json!({"model": "m", "prompt": "The capital of France is", "temperature": 0, "max_tokens": 8});
    let r = post(s.addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 8);

    let ids = engine().tokenize_prompt("The capital of France is");
    let r = post(s.addr, "/v1/completions", &json!({"prompt": ids, "temperature": 0, "max_tokens": 8}));
    assert_eq!(r.json()["choices"][0]["text"].as_str().unwrap(), text, "token-id prompt gives the same text");

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (stext, chunks) = stream_text(&post(s.addr, "/v1/completions", &sb));
    assert_eq!(stext, text);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
}

#[test]
fn stop_strings_cut_the_output_and_never_leak() {
    let _g = serial();
    let s = start(|_| {});
    let base = chat_body(Q, json!({"temperature": 0, "max_tokens": 40}));
    let full = post(s.addr, "/v1/chat/completions", &base).json()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    // a stop string from the middle of the output that spans a token boundary
    let mid = full.len() / 2;
    let start_at = (mid..full.len()).find(|&i| full.is_char_boundary(i) && full.is_char_boundary(i + 3)).unwrap();
    let stop = &full[start_at..start_at + 3];
    let cut = &full[..full.find(stop).unwrap()];
    for stream in [false, true] {
        let mut b = base.clone();
        b["stop"] = json!(["NEVER-THERE", stop]);
        b["stream"] = json!(stream);
        let r = post(s.addr, "/v1/chat/completions", &b);
        let (text, fin) = if stream {
            let (t, chunks) = stream_text(&r);
            let f = chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_string)).unwrap();
            (t, f)
        } else {
            let v = r.json();
            (
                v["choices"][0]["message"]["content"].as_str().unwrap().to_string(),
                v["choices"][0]["finish_reason"].as_str().unwrap().to_string(),
            )
        };
        assert_eq!(text, cut, "stop {stop:?} (stream {stream}) in {full:?}");
        assert!(!text.contains(stop));
        assert_eq!(fin, "stop");
    }
    // a stop string that never occurs changes nothing
    let mut b = base.clone();
    b["stop"] = json!("zzzz-not-here");
    assert_eq!(post(s.addr, "/v1/chat/completions", &b).json()["choices"][0]["message"]["content"].as_str().unwrap(), full);
}

#[test]
fn logprobs_chat_and_completions() {
    let _g = serial();
    let s = start(|_| {});
    let b = chat_body(Q, json!({"temperature": 0, "max_tokens": 6, "logprobs": true, "top_logprobs": 3}));
    let v = post(s.addr, "/v1/chat/completions", &b).json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 6);
    let mut joined = String::new();
    for t in content {
        let lp = t["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // greedy: the chosen token is the most likely one
        assert_eq!(top[0]["token"], t["token"]);
        assert!((top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-6);
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        joined.push_str(t["token"].as_str().unwrap());
    }
    assert_eq!(joined, v["choices"][0]["message"]["content"].as_str().unwrap());

    // streaming carries the same entries
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let (_, chunks) = stream_text(&post(s.addr, "/v1/chat/completions", &sb));
    let streamed: Vec<_> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .map(|t| t["token"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, content.iter().map(|t| t["token"].as_str().unwrap().to_string()).collect::<Vec<_>>());

    let v = post(s.addr, "/v1/completions", &json!({"prompt": "One, two,", "temperature": 0, "max_tokens": 4, "logprobs": 2})).json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(lp["text_offset"][0], 0);

    // without logprobs the field is null
    let v = post(s.addr, "/v1/chat/completions", &chat_body(Q, json!({"max_tokens": 2}))).json();
    assert!(v["choices"][0]["logprobs"].is_null());
}

#[test]
fn conversation_prefix_is_reused() {
    let _g = serial();
    let s = start(|_| {});
    let first = chat_body("Tell me about the sea.", json!({"temperature": 0, "max_tokens": 12}));
    let v = post(s.addr, "/v1/chat/completions", &first).json();
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let answer = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let p1 = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let next = json!({"messages": [
        {"role": "user", "content": "Tell me about the sea."},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And the sky?"}],
        "temperature": 0, "max_tokens": 4});
    let v = post(s.addr, "/v1/chat/completions", &next).json();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= p1, "cached {cached} < first prompt {p1}: {v}");
    assert_eq!(v["tandem"]["cached_prompt_tokens"].as_u64().unwrap(), cached);
    assert_eq!(v["tandem"]["evaluated_prompt_tokens"].as_u64().unwrap() + cached, v["usage"]["prompt_tokens"].as_u64().unwrap());
}

#[test]
fn seeded_sampling_is_reproducible() {
    let _g = serial();
    let s = start(|_| {});
    let b = chat_body("Write one sentence about cats.", json!({"temperature": 1.0, "seed": 7, "max_tokens": 16}));
    let a = post(s.addr, "/v1/chat/completions", &b).json()["choices"][0]["message"]["content"].clone();
    let c = post(s.addr, "/v1/chat/completions", &b).json()["choices"][0]["message"]["content"].clone();
    assert_eq!(a, c);
}

#[test]
fn speculative_greedy_output_is_identical_and_reports_acceptance() {
    let _g = serial();
    let prompt = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog.";
    let b = chat_body(prompt, json!({"temperature": 0, "max_tokens": 48, "logprobs": true, "top_logprobs": 1}));
    let plain = {
        let s = start(|_| {});
        post(s.addr, "/v1/chat/completions", &b).json()
    };
    // fixed-length drafting: the adaptive scheduler decides from measured
    // timings, and on a busy machine it may (rightly) draft nothing
    let s = start(|c| {
        c.spec.lookup = Some((1, 4));
        c.spec.fixed_length = true;
    });
    let spec = post(s.addr, "/v1/chat/completions", &b).json();
    assert_eq!(spec["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"]);
    assert_eq!(
        spec["choices"][0]["logprobs"]["content"].as_array().unwrap().len(),
        plain["choices"][0]["logprobs"]["content"].as_array().unwrap().len()
    );
    for (a, p) in spec["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .zip(plain["choices"][0]["logprobs"]["content"].as_array().unwrap())
    {
        assert_eq!(a["token"], p["token"]);
        assert!((a["logprob"].as_f64().unwrap() - p["logprob"].as_f64().unwrap()).abs() < 1e-5, "{a} vs {p}");
    }
    let x = &spec["tandem"]["speculative"];
    assert!(x["drafter"].is_string(), "{spec}");
    let (d, a) = (x["drafted_tokens"].as_u64().unwrap(), x["accepted_tokens"].as_u64().unwrap());
    assert!(d > 0 && a > 0 && a <= d, "{x}");
    let m = get(s.addr, "/metrics").body;
    assert_eq!(metric(&m, "tandem_spec_drafted_tokens_total") as u64, d);
    assert_eq!(metric(&m, "tandem_spec_accepted_tokens_total") as u64, a);
    assert_eq!(metric(&m, "tandem_speculative_enabled"), 1.0);
    assert!(plain["tandem"]["speculative"].is_null());
}

#[test]
fn mtp_greedy_output_is_identical_and_reports_acceptance() {
    let _g = serial();
    let head = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/support/smollm2-135m-instruct-mtp.gguf");
    let b = chat_body("Name three colors and say one thing about each.", json!({"temperature": 0, "max_tokens": 40}));
    let plain = {
        let s = start(|_| {});
        post(s.addr, "/v1/chat/completions", &b).json()
    };
    let s = start(|c| {
        c.spec.mtp = Some(head);
        c.spec.fixed_length = true;
        c.spec.require = true;
    });
    let spec = post(s.addr, "/v1/chat/completions", &b).json();
    assert_eq!(spec["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"]);
    let x = &spec["tandem"]["speculative"];
    assert!(x["drafter"].as_str().unwrap_or("").starts_with("mtp"), "{spec}");
    assert!(x["drafted_tokens"].as_u64().unwrap() > 0, "{x}");
}

#[test]
fn dspark_greedy_output_is_identical_and_reports_acceptance() {
    let _g = serial();
    let file = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/support/smollm2-135m-instruct-dspark.gguf");
    let b = chat_body("Name three colors and say one thing about each.", json!({"temperature": 0, "max_tokens": 40}));
    let plain = {
        let s = start(|_| {});
        post(s.addr, "/v1/chat/completions", &b).json()
    };
    let s = start(|c| {
        c.spec.mtp = Some(file);
        c.spec.dspark = true;
        c.spec.fixed_length = true;
        c.spec.require = true;
    });
    let spec = post(s.addr, "/v1/chat/completions", &b).json();
    assert_eq!(spec["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"]);
    let x = &spec["tandem"]["speculative"];
    assert!(x["drafter"].as_str().unwrap_or("").starts_with("dspark"), "{spec}");
    assert!(x["drafted_tokens"].as_u64().unwrap() > 0, "{x}");
}
