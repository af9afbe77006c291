//! Chat templates: the Jinja template a model ships in `tokenizer.chat_template`,
//! rendered with minijinja under the settings HF `transformers` uses.

use minijinja::machinery::{make_string_output, CompiledTemplate, TemplateConfig, Vm, WhitespaceConfig};
use minijinja::syntax::SyntaxConfig;
use minijinja::{context, AutoEscape, Environment, Error, ErrorKind, Value};
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Tokenizer, TokenizerError};

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// Instructions one render may execute. Templates come from model files, so a
/// hostile or broken one must fail instead of hanging; real chat templates use a
/// few hundred instructions per message, far below this.
const FUEL: u64 = 5_000_000;

/// Work one render may do besides instructions (see `template_budget`): a
/// fixed allowance plus a multiple of the conversation's size. Real templates
/// read each message a handful of times; copying a growing list or doubling a
/// string exhausts this long before it costs a second.
const WORK_BASE: u64 = 16 << 20;
const WORK_PER_INPUT_UNIT: u64 = 64;

/// ChatML, for models whose GGUF carries no template.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Gemma's turn format (Gemma 1-3), for Gemma files without a template. It
/// follows the template Gemma 3 ships on Hugging Face: `assistant` is rendered
/// as `model`, a leading system message is put in front of the first turn's
/// content followed by a blank line, and contents are trimmed. Unlike that
/// template it does not emit `bos_token` (the tokenizer adds BOS, as
/// `add_bos_token` asks) and does not insist that roles alternate.
const GEMMA: &str = r#"{%- if messages and messages[0]['role'] == 'system' -%}
{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set first_user_prefix = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + (message['content'] | trim) + '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<start_of_turn>model\n' }}
{%- endif -%}"#;

/// A compiled chat template.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl ChatTemplate {
    /// Compiles `source`. The environment mirrors `transformers`'
    /// `apply_chat_template` (and llama-cpp-python's formatter): `trim_blocks` and
    /// `lstrip_blocks` on, Python string/dict methods available, and
    /// `raise_exception(msg)` / `strftime_now(fmt)` defined.
    pub fn new(source: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> { Err(Error::new(ErrorKind::InvalidOperation, msg)) });
        env.add_function("strftime_now", |fmt: String| -> Result<Value, Error> { strftime_now(&fmt).map(Value::from) });
        crate::template_budget::register(&mut env);
        crate::template_budget::check_source(source, whitespace()).map_err(template_error)?;
        compile(source).map_err(template_error)?;
        Ok(Self { env, source: source.to_owned() })
    }

    /// The ChatML template (`<|im_start|>role\ncontent<|im_end|>\n`), the usual
    /// fallback when a model has no template of its own.
    pub fn chatml() -> Self {
        Self::new(CHATML).expect("the built-in ChatML template compiles")
    }

    /// Gemma's turn format: `<start_of_turn>user\n{content}<end_of_turn>\n` per
    /// message and `<start_of_turn>model\n` as the generation prompt.
    pub fn gemma() -> Self {
        Self::new(GEMMA).expect("the built-in Gemma template compiles")
    }

    /// The template for a model whose file has none: Gemma's turn format when
    /// the vocabulary has `<start_of_turn>`, else ChatML.
    pub fn fallback(tok: &Tokenizer) -> Self {
        if tok.token_id("<start_of_turn>").is_some() {
            Self::gemma()
        } else {
            Self::chatml()
        }
    }

    /// Renders `messages`. `bos` and `eos` are exposed as `bos_token` and
    /// `eos_token`, which many templates emit themselves.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool, bos: &str, eos: &str) -> Result<String, TokenizerError> {
        // Compiled per render: the rewritten instructions borrow the source,
        // and compiling a chat template costs microseconds next to a request.
        let compiled = compile(&self.source).map_err(template_error)?;
        let instructions = crate::template_budget::rewrite(&compiled.instructions);
        let blocks: BTreeMap<&str, _> = compiled.blocks.iter().map(|(k, v)| (*k, crate::template_budget::rewrite(v))).collect();
        let root = context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => bos,
            eos_token => eos,
        };
        let input = crate::template_budget::size_up_to(&root, u64::MAX / WORK_PER_INPUT_UNIT);
        let budget = WORK_BASE.saturating_add(input.saturating_mul(WORK_PER_INPUT_UNIT));
        let mut rendered = String::new();
        // minijinja can panic on some template constructs (a backwards slice
        // of an empty lazy sequence indexes out of bounds); a template from a
        // file must not take the process down, so a panic is an error here.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::template_budget::with_budget(budget, || {
                let mut out = make_string_output(&mut rendered);
                Vm::new(&self.env).eval(&instructions, root, &blocks, &mut out, AutoEscape::None).map(|_| ())
            })
        }));
        match result {
            Ok(done) => done.map_err(template_error)?,
            Err(_) => return Err(TokenizerError::Template("the chat template crashed the renderer (a minijinja panic)".into())),
        }
        Ok(rendered)
    }
}

/// The whitespace settings of `transformers`.
fn whitespace() -> WhitespaceConfig {
    WhitespaceConfig { keep_trailing_newline: false, lstrip_blocks: true, trim_blocks: true }
}

/// Compiles `source` with the whitespace settings of `transformers`.
fn compile(source: &str) -> Result<CompiledTemplate<'_>, Error> {
    let config = TemplateConfig {
        syntax_config: SyntaxConfig,
        ws_config: whitespace(),
        default_auto_escape: std::sync::Arc::new(|_: &str| AutoEscape::None),
    };
    CompiledTemplate::new("chat", source, &config)
}

fn template_error(e: Error) -> TokenizerError {
    // The plain form names the template line ("(in chat:3)"). The alternate
    // form (`{:#}`), which also quotes the source around it, miscomputes
    // columns on some inputs (a lone `\r` in a tag) and panics on the
    // overflow, so it is not used for templates from files.
    TokenizerError::Template(e.to_string())
}

/// `strftime_now(fmt)` as HF defines it (Llama 3 templates print today's date),
/// supporting the common conversions in UTC.
fn strftime_now(fmt: &str) -> Result<String, Error> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime(fmt, secs)
}

fn strftime(fmt: &str, unix_secs: i64) -> Result<String, Error> {
    const MONTHS: [&str; 12] =
        ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let days = unix_secs.div_euclid(86_400);
    let tod = unix_secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];

    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') if chars.clone().next() == Some('d') => {
                chars.next();
                out.push_str(&d.to_string());
            }
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported conversion %{}", other.map(String::from).unwrap_or_default()),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
    }

    #[test]
    fn chatml_renders() {
        let t = ChatTemplate::chatml();
        let out = t.render(&msgs(&[("system", "S"), ("user", "Hi")]), true, "", "").unwrap();
        assert_eq!(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        let out = t.render(&msgs(&[("user", "Hi")]), false, "", "").unwrap();
        assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n");
    }

    #[test]
    fn gemma_renders() {
        let t = ChatTemplate::gemma();
        let out = t.render(&msgs(&[("user", "Hi"), ("assistant", "Hello!"), ("user", "How are you?")]), true, "<bos>", "<eos>").unwrap();
        assert_eq!(
            out,
            "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n"
        );
        // A system message goes in front of the first turn, then a blank line;
        // contents are trimmed (the system text is not, as in Gemma's own template).
        let out = t.render(&msgs(&[("system", "Be brief."), ("user", "  Hi\n")]), false, "", "").unwrap();
        assert_eq!(out, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n");
        assert_eq!(t.render(&[], true, "", "").unwrap(), "<start_of_turn>model\n");
        assert_eq!(t.render(&msgs(&[("system", "S")]), false, "", "").unwrap(), "");
    }

    #[test]
    fn python_methods_and_tokens() {
        let src = "{{ bos_token }}{% for m in messages %}{{ m['content'].strip().upper() }}{% if m.role.startswith('u') %}!{% endif %}{% endfor %}{{ eos_token }}";
        let t = ChatTemplate::new(src).unwrap();
        assert_eq!(t.render(&msgs(&[("user", "  hi ")]), false, "<s>", "</s>").unwrap(), "<s>HI!</s>");
    }

    #[test]
    fn trim_and_lstrip_blocks() {
        let src = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(src).unwrap();
        assert_eq!(t.render(&msgs(&[("user", "a"), ("user", "b")]), false, "", "").unwrap(), "a\nb\n");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}").unwrap();
        let e = t.render(&[], false, "", "").unwrap_err();
        assert!(matches!(&e, TokenizerError::Template(m) if m.contains("roles must alternate")), "{e}");
    }

    #[test]
    fn syntax_error_is_typed() {
        assert!(matches!(ChatTemplate::new("{% for %}"), Err(TokenizerError::Template(_))));
    }

    #[test]
    fn fuel_stops_runaway_templates() {
        let src =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src).unwrap();
        let start = std::time::Instant::now();
        let e = t.render(&[], false, "", "").unwrap_err();
        assert!(matches!(e, TokenizerError::Template(_)));
        assert!(start.elapsed().as_secs() < 20, "fuel limit took {:?}", start.elapsed());
    }

    #[test]
    fn strftime_formats() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "29 Feb 2024");
        assert_eq!(strftime("%A %B %-d, %H:%M:%S %%", t).unwrap(), "Thursday February 29, 13:05:09 %");
        assert!(strftime("%Q", t).is_err());
        assert_eq!(strftime("%Y-%m-%d", 0).unwrap(), "1970-01-01");
    }
}
