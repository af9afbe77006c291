//! Seed inputs for the fuzz targets, written under OUT_DIR/TARGET/:
//!
//!   fuzz-seeds OUT_DIR
//!
//! Small synthetic llama and Gemma-3-shaped GGUF files; the committed
//! support files; tokenizer texts from the test data; the chat templates
//! of the models that are here, ChatML and Gemma's; request bodies of both
//! endpoints. Nothing here comes from the benchmark prompts' answers.

use std::path::Path;

use tandem_gguf::{GgmlType, Gguf};
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};

fn put(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn main() {
    let out = std::path::PathBuf::from(std::env::args().nth(1).expect("OUT_DIR"));
    let root = tandem_fuzz::root();
    // GGUF: synthetic models of a few shapes and types
    let d = out.join("gguf");
    for (i, (ty, window)) in
        [(GgmlType::Q8_0, None), (GgmlType::Q4_1, None), (GgmlType::F16, Some(4)), (GgmlType::Q5_0, Some(8))].into_iter().enumerate()
    {
        let spec =
            SyntheticSpec { ty, window, d_model: 32, n_head: 2, n_kv_head: 1, ffn: 64, vocab: 300, n_layer: 1, ..Default::default() };
        put(&d, &format!("synthetic-{i}.gguf"), &synthetic_llama(&spec));
    }
    // support files
    for f in ["smollm2-135m-instruct-mtp.gguf", "smollm2-135m-instruct-dspark.gguf"] {
        if let Ok(b) = std::fs::read(root.join("models/support").join(f)) {
            put(&out.join("support"), f, &b);
        }
    }
    // tokenizer: a picker byte, then text
    let d = out.join("tokenizer");
    let mut n = 0;
    for file in ["tokenizer_smollm2.jsonl", "tokenizer_gemma3.jsonl", "prompts-dev.jsonl"] {
        let text = std::fs::read_to_string(root.join("tests/data").join(file)).unwrap_or_default();
        for line in text.lines().take(40) {
            for pick in [0u8, 1] {
                let mut b = vec![pick];
                b.extend_from_slice(line.as_bytes());
                put(&d, &format!("t{n}"), &b);
                n += 1;
            }
        }
    }
    // chat templates
    let d = out.join("chat_template");
    for (i, m) in ["models/SmolLM2-135M-Instruct.Q4_1.gguf", "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"].iter().enumerate() {
        if let Ok(g) = Gguf::open(root.join(m)) {
            if let Ok(t) = g.get_str("tokenizer.chat_template") {
                put(&d, &format!("model-{i}.jinja"), t.as_bytes());
            }
        }
    }
    let hostile = [
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
        "{% for i in range(1000000) %}{{ i }}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{{ 'x' * 100000000 }}",
        "{% set ns = namespace(a=[]) %}{% for i in range(100000) %}{% set ns.a = ns.a + [i] %}{% endfor %}",
        "{{ raise_exception('no') }}",
        "{% if add_generation_prompt %}{{ bos_token }}{% endif %}{{ messages[0]['content'] | upper }}",
    ];
    for (i, t) in hostile.iter().enumerate() {
        put(&d, &format!("hostile-{i}.jinja"), t.as_bytes());
    }
    // request bodies
    let d = out.join("request");
    let bodies = [
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":8,"temperature":0}"#,
        r#"{"prompt":"hello","max_tokens":4,"stop":["\n","x"],"logprobs":2,"seed":7,"top_p":0.9}"#,
        r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"}]}],"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3}"#,
        r#"{"prompt":["a","b"],"n":1,"max_completion_tokens":3,"presence_penalty":0.5,"response_format":{"type":"text"}}"#,
        r#"{"messages":[],"max_tokens":-1}"#,
        r#"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"#,
    ];
    for (i, b) in bodies.iter().enumerate() {
        put(&d, &format!("body-{i}.json"), b.as_bytes());
    }
    println!("seeds written under {}", out.display());
}
