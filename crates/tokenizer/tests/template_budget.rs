//! The work budget of chat-template renders: rewritten templates render exactly
//! what minijinja renders unmodified, and hostile templates stop quickly.

use std::time::{Duration, Instant};

use minijinja::{context, Environment, Error, ErrorKind, Value};
use tandem_tokenizer::{ChatMessage, ChatTemplate};

/// What `ChatTemplate` renders, computed by minijinja without the rewrite.
fn plain_render(source: &str, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, String> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> { Err(Error::new(ErrorKind::InvalidOperation, msg)) });
    env.add_template_owned("chat", source.to_owned()).map_err(|e| e.to_string())?;
    let tmpl = env.get_template("chat").map_err(|e| e.to_string())?;
    tmpl.render(context! {
        messages => Value::from_serialize(messages),
        add_generation_prompt => add_generation_prompt,
        bos_token => "<s>",
        eos_token => "</s>",
    })
    .map_err(|e| e.to_string())
}

fn conversations() -> Vec<Vec<ChatMessage>> {
    fn m(role: &str, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
    }
    let long: String = "fn main() {\n    println!(\"héllo, wörld — 你好\");\n}\n".repeat(200);
    vec![
        vec![],
        vec![m("user", "Hi")],
        vec![m("system", "You are terse."), m("user", "  Spaces around  "), m("assistant", "Ok."), m("user", "Again?")],
        vec![m("user", &long), m("assistant", "It prints a greeting."), m("tool", "{\"ok\": true}"), m("user", "")],
        (0..300).map(|i| m(if i % 2 == 0 { "user" } else { "assistant" }, format!("message {i}: {}", "x".repeat(i)).as_str())).collect(),
    ]
}

/// Templates that use the features real chat templates use: loops and loop
/// variables, namespaces, macros, slices, filters with keyword arguments,
/// Python methods, tests, chained comparisons, string and list operators.
const FEATURE_TEMPLATES: &[&str] = &[
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set rest = messages[1:] %}{% else %}{% set sys = '' %}{% set rest = messages %}{% endif %}{% for m in rest %}{% if loop.first and sys %}[SYS]{{ sys|trim }}[/SYS]{% endif %}{{ m.role|upper }}: {{ m.content|trim }}{% if not loop.last %}\n{% endif %}{% endfor %}{{ eos_token }}",
    "{%- set ns = namespace(last_user=-1, n=0) -%}{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- set ns.n = ns.n + m.content|length -%}{%- endfor -%}{{ ns.last_user }}/{{ ns.n }}/{{ messages|length }}{% for m in messages[::-1][:3] %}|{{ m.content[:20] }}|{% endfor %}",
    "{% macro turn(role, text, last=false) %}<{{ role }}>{{ text|replace('\\n', ' ')|truncate(40, true, '...') }}</{{ role }}>{% if last %}!{% endif %}{% endmacro %}{% for m in messages %}{{ turn(m.role, m.content, last=loop.last) }}{% endfor %}",
    "{% for m in messages %}{{ m.content.strip().startswith('message') }}{{ m.content.split(':')[0]|lower }}{{ m.content.upper()[:5] }}{{ m.role in ['user', 'tool'] }}{{ 0 < loop.index < 3 }}{{ loop.cycle('a', 'b') }}{{ (loop.index * 2) ~ '-' ~ (loop.index // 2) ~ (7 % 3) ~ (2 ** 3) ~ (1 / 4) }}{% endfor %}",
    "{{ messages|map(attribute='role')|join(',') }}|{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ messages|tojson }}|{{ (messages|first).content if messages else 'none' }}|{{ {'a': 1, 'b': [1, 2]}|tojson }}|{{ ['x', 'y'] + ['z'] }}|{{ 'ab' * 3 }}|{{ [1, 2] * 2 }}|{{ 'x'|center(9) }}|{{ 'a\\nb'|indent(2) }}|{{ '%s=%d'|format('k', 3) }}",
    "{% for m in messages %}{% if m.role is defined and m.content is string %}{% if m.content is not none and loop.index is odd %}{{ loop.index }}{% endif %}{% endif %}{% if loop.index > 5 %}{% break %}{% endif %}{% endfor %}{% set d = dict(a=1) %}{{ d.items()|list }}{{ d.get('a') }}{{ 'a,b'.split(',') }}{{ ' x '.rstrip() }}{{ 'x'.ljust(3, '.') }}{{ '7'.zfill(3) }}",
    "{% for m in messages recursive %}{{ m.role }}{% endfor %}{% set parts = [] %}{% for m in messages %}{% set _ = parts.append(m.role) %}{% endfor %}{{ parts|join(' ') if parts is defined }}{% filter upper %}shout {{ messages|length }}{% endfilter %}{% set cap %}captured {{ messages|length }}{% endset %}{{ cap }}",
    "{% set both = messages + messages %}{{ both|length }}{% for m in both + [{'role': 'x', 'content': 'y'}] %}{{ m.role }}{% endfor %}{{ (both + [])|list|length }}{{ both is sequence }}{{ both is iterable }}{{ both[0] is defined }}{{ [1] + [2] }}{{ ([1] + [2]) == [1, 2] }}{{ ([] + [])|tojson }}{% set ns = namespace(a=[]) %}{% for m in messages %}{% set ns.a = ns.a + [m.role] %}{% endfor %}{{ ns.a|join('/') }}",
    "{%- if messages|length == 0 -%}{{ raise_exception('no messages') }}{%- endif -%}{{ messages[-1].content|wordcount }} {{ messages|sort(attribute='role')|map(attribute='role')|unique|join(',') }} {{ range(3)|list }} {{ messages|batch(2)|list|length }}",
];

#[test]
fn rewritten_templates_render_what_minijinja_renders() {
    for (t, source) in FEATURE_TEMPLATES.iter().enumerate() {
        let ours = ChatTemplate::new(source).unwrap_or_else(|e| panic!("template {t} compiles: {e}"));
        for (c, messages) in conversations().iter().enumerate() {
            for gen in [false, true] {
                let expected = std::panic::catch_unwind(|| plain_render(source, messages, gen)).unwrap_or_else(|_| Err("panic".into()));
                let got = ours.render(messages, gen, "<s>", "</s>").map_err(|e| e.to_string());
                match (&expected, &got) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "template {t}, conversation {c}"),
                    (Err(_), Err(_)) => {}
                    _ => panic!("template {t}, conversation {c}: minijinja gives {expected:?}, tandem {got:?}"),
                }
            }
        }
    }
}

/// Hostile templates each fail (or finish) within a bounded time.
/// Errors name the template line; a lone carriage return in a tag (which
/// made minijinja's source excerpt overflow) gives a plain error.
#[test]
fn template_errors_name_the_line() {
    let t = ChatTemplate::new("{% for \r in messages %}{{ m.role }}\n {{ m.avtr%nk }}\n{% endfor %}");
    let err = match t {
        Ok(t) => t.render(&[ChatMessage::new("user", "hi")], true, "", "").unwrap_err(),
        Err(e) => e,
    };
    assert!(err.to_string().contains("(in chat:"), "{err}");
}

#[test]
fn cheap_constant_arithmetic_is_allowed() {
    let t = ChatTemplate::new("{{ 60 * 60 * 24 * 365 }} {{ '-' * 80 }} {{ [0] * 3 }} {{ '=' * 2 ** 3 }} {{ '-' * 40 + '\\n' + '=' * 40 }}")
        .unwrap();
    let out = t.render(&[], false, "", "").unwrap();
    assert_eq!(out, format!("31536000 {} [0, 0, 0] ======== {}\n{}", "-".repeat(80), "-".repeat(40), "=".repeat(40)));
    let err = ChatTemplate::new("{{ 'x' * 100000000 }}").unwrap_err().to_string();
    assert!(err.contains("repeats a constant"), "{err}");
}

#[test]
fn hostile_templates_stop_within_the_budget() {
    let hostile = [
        // quadratic: a list copied on every append
        "{% set ns = namespace(a=[]) %}{% for i in range(100000) %}{% set ns.a = ns.a + [i] %}{% endfor %}{{ ns.a|length }}",
        // one huge repetition
        "{{ 'x' * 100000000 }}",
        "{{ ['x'] * 100000000 }}",
        // doubling a lazy list of empty lists (exponential flattening in minijinja)
        "{% set ns = namespace(a=[]) %}{% for i in range(100000) %}{% set ns.a = ns.a + ns.a %}{% endfor %}",
        "{% set ns = namespace(a=[[]]) %}{% for i in range(100000) %}{% set ns.a = ns.a + ns.a %}{% endfor %}",
        // doubling a string
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        "{% set ns = namespace(s='xy') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
        // doubling a list by nesting, then serialising it
        "{% set ns = namespace(a=['x']) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a|tojson|length }}",
        // padding and replacement that multiply their input
        "{{ 'x'|center(1000000000) }}",
        "{{ 'x'.ljust(1000000000) }}",
        "{{ 'a\\n' * 1000 |indent(1000000) }}",
        "{% set ns = namespace(s='aaaaaaaaaaaaaaaa') %}{% for i in range(10) %}{% set ns.s = ns.s|replace('a', ns.s) %}{% endfor %}{{ ns.s|length }}",
        "{{ '%1000000000s'|format('x') }}",
        // reading a large value over and over
        "{% set big = 'x' * 1000000 %}{% for i in range(100000) %}{% if 'y' in big %}{% endif %}{% endfor %}",
        "{% set big = range(100000)|list %}{% for i in range(100000) %}{{ big == big }}{% endfor %}",
        // writing a lot
        "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{% endfor %}{% endfor %}",
        "{% set s = 'y' * 10000000 %}{% for i in range(100000) %}{{ s }}{% endfor %}",
        // constants folded while compiling
        "{{ 'x' * 100000000 * 10000 * 10000 * 10000 * 10000 * 10000 * 10000 * 10000 * 10000 * 10000 * 10000 }}",
        "{{ ('x' * 1000) * 1000 * 1000 }}",
        "{{ ['x'] * 99 * 99 * 99 * 99 }}",
        "{{ 'x' * 1e0000000 * 10000 * 10000 * 10000 * 10000 * 10000 * 10000 * 10000 * 0000 * 10000 * 0000 }}",
        "{{ 'x' * 1e9 }}",
        "{{ 'x' * 1e0000000 ** 10000 * 10000 * 10000 * 10000 * 10000 * 0000 * 10000 * 0000 }}",
        "{{ 'x' * 10 ** 8 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 * 2 }}",
        // deep recursion
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    ];
    // chains minijinja compiles by recursion as deep as the chain (each of
    // these overflowed an 8 MB stack before tags were bounded)
    let chains = [
        format!("{{{{ {} }}}}", vec!["x"; 50000].join(" + ")),
        format!("{{{{ {} }}}}", vec!["1"; 50000].join(" ~ ")),
        format!("{{% if {} %}}{{% endif %}}", vec!["x"; 50000].join(" and ")),
        format!("{{{{ x{} }}}}", "|upper".repeat(50000)),
        format!("{{{{ x{} }}}}", ".a".repeat(50000)),
        format!("{{{{ {}x }}}}", "not ".repeat(50000)),
        format!("{{{{ {}x }}}}", "-".repeat(50000)),
        format!("{{{{ x{} }}}}", "[0]".repeat(50000)),
        format!("{{{{ x{} }}}}", "()".repeat(50000)),
    ];
    for (i, source) in chains.iter().enumerate() {
        let start = Instant::now();
        let err = ChatTemplate::new(source).expect_err("a 50,000-link chain is refused").to_string();
        assert!(err.contains("tokens"), "chain {i}: {err}");
        assert!(start.elapsed() < Duration::from_secs(1), "chain {i} took {:?}", start.elapsed());
    }
    let messages = [ChatMessage::new("user", "hi")];
    for (i, source) in hostile.iter().enumerate() {
        let Ok(tmpl) = ChatTemplate::new(source) else { continue };
        let start = Instant::now();
        let out = tmpl.render(&messages, true, "<s>", "</s>");
        let took = start.elapsed();
        eprintln!(
            "hostile template {i}: {took:?}, {}",
            match &out {
                Ok(t) => format!("{} bytes", t.len()),
                Err(e) => e.to_string().chars().take(60).collect(),
            }
        );
        assert!(took < Duration::from_secs(5), "hostile template {i} took {took:?}: {source}");
        if let Ok(text) = out {
            assert!(text.len() < 1 << 30, "hostile template {i} rendered {} bytes", text.len());
        }
    }
}

/// The templates of the models in `models/` (those fetched so far) render as
/// minijinja renders them, long conversations included, well inside the
/// budget and quickly.
#[test]
fn model_templates_render_what_minijinja_renders() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let files = ["SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "gemma-3-270m-q4_k_m.gguf"];
    let mut conversations = conversations();
    // A long session: 2,000 turns of 1 KB each (2 MB of text).
    conversations.push(
        (0..2000)
            .map(|i| {
                ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, format!("{i} {}", "def f(x):\n    return x\n".repeat(45)))
            })
            .collect(),
    );
    for file in files {
        let Ok(g) = tandem_gguf::Gguf::open(root.join(file)) else {
            eprintln!("{file}: not fetched, skipped");
            continue;
        };
        let Ok(source) = g.get_str("tokenizer.chat_template") else { continue };
        let ours = ChatTemplate::new(source).expect("the model's template compiles");
        for (c, messages) in conversations.iter().enumerate() {
            let expected = std::panic::catch_unwind(|| plain_render(source, messages, true)).unwrap_or_else(|_| Err("panic".into()));
            let start = Instant::now();
            let got = ours.render(messages, true, "<s>", "</s>").map_err(|e| e.to_string());
            let took = start.elapsed();
            match (&expected, &got) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{file}, conversation {c}"),
                (Err(_), Err(_)) => {}
                _ => panic!("{file}, conversation {c}: minijinja gives {expected:?}, tandem {got:?}"),
            }
            eprintln!("{file}: conversation {c} ({} messages) rendered in {took:?}", messages.len());
        }
    }
}
