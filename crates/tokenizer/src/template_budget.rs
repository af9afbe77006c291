//! A work budget for chat-template renders.
//!
//! Templates come from model files, so a render must finish in bounded time and
//! memory whatever the template says. minijinja's fuel counts instructions, but
//! one instruction can copy a list, repeat a string or serialise a structure,
//! so a template inside its fuel can still run for minutes (a list grown by
//! `+` in a loop is quadratic) or exhaust memory (a string doubled by `~`).
//!
//! The bound here is on *work*: every value an operator, filter, test, method
//! or function call reads or creates, and every byte written, is charged by its
//! size (bytes of a string, elements of a list or map, counted through nested
//! values) against a per-render budget. Sizes are measured by a walk that
//! stops once the remaining budget is passed, so measuring is bounded too.
//!
//! minijinja has no hook on operators, so the compiled instructions are
//! rewritten before they run: each operator becomes a call of a function
//! registered here (same stack effect), filters, tests and methods go through
//! one dispatcher each, and a charging call follows every instruction that
//! builds a value or calls something. The functions compute the original
//! semantics by evaluating the same operator in a pristine environment, after
//! checking the cost.
//!
//! Width arguments (`center`, `indent`, `format`, ...) and repetition (`*`)
//! are charged *before* the call from their arguments, since their results
//! can be far larger than their inputs.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::LazyLock;

use minijinja::machinery::{tokenize, Instruction, Instructions, Token, WhitespaceConfig};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::ValueKind;
use minijinja::{Environment, Error, ErrorKind, Expression, State, Value};

thread_local! {
    /// Work units left to the render running on this thread; unlimited when
    /// no render is running.
    static REMAINING: Cell<u64> = const { Cell::new(u64::MAX) };
}

/// Runs `f` (a render) with `units` of work allowed on this thread.
pub(crate) fn with_budget<R>(units: u64, f: impl FnOnce() -> R) -> R {
    /// Restores the previous budget even if the render panics.
    struct Restore(u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            REMAINING.set(self.0);
        }
    }
    let _restore = Restore(REMAINING.replace(units));
    f()
}

fn over_budget() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        "the chat template exceeded its work budget (it builds, copies or writes more data than a render of this conversation may)",
    )
}

/// Units every rewritten operator or call costs besides its data: the
/// dispatch through a function call costs about as much as copying a few
/// dozen bytes, and without this a template could make millions of cheap
/// calls inside its fuel.
const CALL_COST: u64 = 32;

fn charge(units: u64) -> Result<(), Error> {
    let left = REMAINING.get();
    if units > left {
        REMAINING.set(0);
        return Err(over_budget());
    }
    REMAINING.set(left - units);
    Ok(())
}

/// Size of `v` in work units, counting nested values, or `limit + 1` once it
/// is known to exceed `limit`. Costs at most about `limit` steps.
pub(crate) fn size_up_to(v: &Value, limit: u64) -> u64 {
    let mut total: u64 = 0;
    let mut todo: Vec<Value> = vec![v.clone()];
    while let Some(v) = todo.pop() {
        total = total.saturating_add(1);
        match v.kind() {
            ValueKind::String | ValueKind::Bytes => total = total.saturating_add(v.len().unwrap_or(0) as u64),
            ValueKind::Seq => {
                if let Ok(items) = v.try_iter() {
                    for item in items {
                        total = total.saturating_add(1);
                        if total > limit {
                            return limit.saturating_add(1);
                        }
                        if matches!(
                            item.kind(),
                            ValueKind::String | ValueKind::Bytes | ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
                        ) {
                            todo.push(item);
                        }
                    }
                }
            }
            // Lazy sequences (minijinja keeps `a + b` of lists lazy): their
            // length, without walking them, which would cost more than the
            // operation measured. Every element was charged when it was made.
            ValueKind::Iterable => total = total.saturating_add(v.len().unwrap_or(0) as u64),
            ValueKind::Map => {
                if let Ok(keys) = v.try_iter() {
                    for key in keys {
                        total = total.saturating_add(1);
                        if total > limit {
                            return limit.saturating_add(1);
                        }
                        if let Ok(value) = v.get_item(&key) {
                            todo.push(value);
                        }
                        todo.push(key);
                    }
                }
            }
            // Unsized iterables (loop objects, streams) and scalars: one each.
            _ => {}
        }
        if total > limit {
            return limit.saturating_add(1);
        }
    }
    total
}

/// Charges the size of each value.
fn charge_values<'a>(values: impl IntoIterator<Item = &'a Value>) -> Result<(), Error> {
    for v in values {
        let size = size_up_to(v, REMAINING.get());
        charge(size)?;
    }
    Ok(())
}

/// Filters whose work does not depend on the size of their input, charged one
/// unit for it (a loop asking `messages|length` must not pay for the whole
/// conversation each time).
const CONSTANT_FILTERS: &[&str] =
    &["length", "count", "first", "last", "default", "d", "safe", "attr", "bool", "abs", "int", "float", "round"];

/// Tests that read a constant amount of their input.
const CONSTANT_TESTS: &[&str] = &[
    "defined",
    "undefined",
    "none",
    "true",
    "false",
    "string",
    "number",
    "integer",
    "float",
    "boolean",
    "mapping",
    "sequence",
    "iterable",
    "odd",
    "even",
    "divisibleby",
    "safe",
    "escaped",
    "callable",
    "filter",
    "test",
];

/// Pre-charges the results of calls whose output can be far larger than their
/// inputs: the widths of padding and indentation, and `*` repetition.
fn precharge_width(name: &str, args: &[Value]) -> Result<(), Error> {
    let width_of = |v: Option<&Value>| -> u64 { v.and_then(|v| i64::try_from(v.clone()).ok()).map_or(0, |w| w.max(0) as u64) };
    let base = args.first().map_or(0, |v| size_up_to(v, REMAINING.get()));
    let extra = match name {
        // value|center(width), s.center(width), s.ljust(width), s.rjust(width), s.zfill(width)
        "center" | "ljust" | "rjust" | "zfill" => width_of(args.get(1)),
        // value|indent(width, ...): every line may grow by `width`.
        "indent" => {
            let lines = args.first().and_then(|v| v.as_str()).map_or(1, |s| s.bytes().filter(|&b| b == b'\n').count() as u64 + 1);
            lines.saturating_mul(width_of(args.get(1)).max(4))
        }
        // printf-style format: widths in the format string, and `*` widths
        // taken from the arguments (every integer argument counted as one).
        "format" => {
            let spec_widths = args.first().and_then(|v| v.as_str()).map_or(0, format_widths);
            let arg_widths = args.iter().skip(1).map(|v| width_of(Some(v))).fold(0u64, |a, b| a.saturating_add(b));
            spec_widths.saturating_add(arg_widths)
        }
        // value|replace(old, new): up to len(value) / max(len(old), 1) copies of `new`.
        "replace" => {
            let old = args.get(1).and_then(|v| v.as_str()).map_or(1, |s| s.len().max(1) as u64);
            let new = args.get(2).map_or(0, |v| size_up_to(v, REMAINING.get()));
            (base / old + 1).saturating_mul(new)
        }
        _ => 0,
    };
    charge(extra)
}

/// Sum of the numbers in the conversion specs (`%-10.3f`) of a printf-style
/// format string: a bound on the padding they can add.
fn format_widths(fmt: &str) -> u64 {
    let mut total: u64 = 0;
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        let mut number: u64 = 0;
        while let Some(&d) = chars.peek() {
            if let Some(digit) = d.to_digit(10) {
                number = number.saturating_mul(10).saturating_add(u64::from(digit));
            } else if "-+ #.*".contains(d) {
                total = total.saturating_add(number);
                number = 0;
            } else {
                break;
            }
            chars.next();
        }
        total = total.saturating_add(number);
    }
    total
}

/// The arithmetic and comparison operators, evaluated in an environment of
/// their own so that their meaning is minijinja's.
struct Operators {
    exprs: BTreeMap<&'static str, Expression<'static, 'static>>,
}

static OPERATORS: LazyLock<Operators> = LazyLock::new(|| {
    let env: &'static Environment<'static> = Box::leak(Box::new(Environment::new()));
    let mut exprs = BTreeMap::new();
    for (name, src) in OPERATOR_SOURCES {
        exprs.insert(*name, env.compile_expression(src).expect("operator expressions compile"));
    }
    Operators { exprs }
});

const OPERATOR_SOURCES: &[(&str, &str)] = &[
    ("__tandem_add", "a + b"),
    ("__tandem_sub", "a - b"),
    ("__tandem_mul", "a * b"),
    ("__tandem_div", "a / b"),
    ("__tandem_intdiv", "a // b"),
    ("__tandem_rem", "a % b"),
    ("__tandem_pow", "a ** b"),
    ("__tandem_concat", "a ~ b"),
    ("__tandem_in", "a in b"),
    ("__tandem_eq", "a == b"),
    ("__tandem_ne", "a != b"),
    ("__tandem_lt", "a < b"),
    ("__tandem_lte", "a <= b"),
    ("__tandem_gt", "a > b"),
    ("__tandem_gte", "a >= b"),
    ("__tandem_slice", "a[b:c:d]"),
];

fn operator_name(instr: &Instruction<'_>) -> Option<&'static str> {
    Some(match instr {
        Instruction::Add => "__tandem_add",
        Instruction::Sub => "__tandem_sub",
        Instruction::Mul => "__tandem_mul",
        Instruction::Div => "__tandem_div",
        Instruction::IntDiv => "__tandem_intdiv",
        Instruction::Rem => "__tandem_rem",
        Instruction::Pow => "__tandem_pow",
        Instruction::StringConcat => "__tandem_concat",
        Instruction::In => "__tandem_in",
        Instruction::Eq => "__tandem_eq",
        Instruction::Ne => "__tandem_ne",
        Instruction::Lt => "__tandem_lt",
        Instruction::Lte => "__tandem_lte",
        Instruction::Gt => "__tandem_gt",
        Instruction::Gte => "__tandem_gte",
        Instruction::Slice => "__tandem_slice",
        _ => return None,
    })
}

fn eval_operator(name: &'static str, args: &[Value]) -> Result<Value, Error> {
    charge(CALL_COST)?;
    charge_values(args)?;
    if name == "__tandem_mul" {
        // Repetition: the result is the repeated value times the count.
        if let [a, b] = args {
            let (seq, n) = if b.is_number() { (a, b) } else { (b, a) };
            if !seq.is_number() {
                let times = i64::try_from(n.clone()).unwrap_or(0).max(0) as u64;
                charge(size_up_to(seq, REMAINING.get()).saturating_mul(times))?;
            }
        }
    }
    if name == "__tandem_add" {
        if let [a, b] = args {
            if is_sequence(a) && is_sequence(b) {
                return concat_sequences(a, b);
            }
        }
    }
    let expr = &OPERATORS.exprs[name];
    // a map value built directly (no serde round trip): this runs per operator
    let ctx = Value::from_iter(["a", "b", "c", "d"].iter().zip(args).map(|(k, v)| (*k, v.clone())));
    let out = expr.eval(ctx)?;
    charge_values([&out])?;
    Ok(out)
}

fn is_sequence(v: &Value) -> bool {
    matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable)
}

/// `a + b` of two sequences, made at once. minijinja makes a lazy sequence
/// that refers to both operands and flattens the chain once it is 32 deep;
/// `ns.a = ns.a + ns.a` in a loop builds a chain whose flattening is
/// exponential (2^33 references for empty lists), which no size charge sees.
/// The result keeps minijinja's kind (an iterable of known length).
fn concat_sequences(a: &Value, b: &Value) -> Result<Value, Error> {
    let mut values = Vec::new();
    for side in [a, b] {
        let items = side.try_iter()?;
        for item in items {
            charge(1)?;
            values.push(item);
        }
    }
    let out = Value::from_object(ConcatList(values));
    charge_values([&out])?;
    Ok(out)
}

/// A concatenation of sequences: iterable, with a length, not indexable
/// (as minijinja's own lazy concatenation).
#[derive(Debug)]
struct ConcatList(Vec<Value>);

impl minijinja::value::Object for ConcatList {
    fn repr(self: &std::sync::Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Iterable
    }

    fn enumerate(self: &std::sync::Arc<Self>) -> minijinja::value::Enumerator {
        use minijinja::value::ObjectExt;
        self.mapped_enumerator(|this| Box::new(this.0.iter().cloned()))
    }

    fn enumerator_len(self: &std::sync::Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// Registers the functions the rewritten instructions call.
pub(crate) fn register(env: &mut Environment<'static>) {
    for (name, _) in OPERATOR_SOURCES {
        let name: &'static str = name;
        env.add_function(name, move |args: &[Value]| eval_operator(name, args));
    }
    // Calls whose name was pushed after the arguments: [args..., name].
    env.add_function("__tandem_filter", |state: &State, args: &[Value]| -> Result<Value, Error> {
        let (name, args) = begin_dispatch(args, CONSTANT_FILTERS)?;
        precharge_width(name, args)?;
        let out = state.apply_filter(name, args)?;
        charge_values([&out])?;
        Ok(out)
    });
    env.add_function("__tandem_test", |state: &State, args: &[Value]| -> Result<Value, Error> {
        let (name, args) = begin_dispatch(args, CONSTANT_TESTS)?;
        Ok(Value::from(state.perform_test(name, args)?))
    });
    env.add_function("__tandem_method", |state: &State, args: &[Value]| -> Result<Value, Error> {
        let (name, args) = begin_dispatch(args, &[])?;
        let Some((obj, rest)) = args.split_first() else {
            return Err(Error::new(ErrorKind::InvalidOperation, "method call without an object"));
        };
        precharge_width(name, args)?;
        let out = obj.call_method(state, name, rest)?;
        charge_values([&out])?;
        Ok(out)
    });
    // Charges a value just built or returned, and passes it on.
    env.add_function("__tandem_charge", |value: Value| -> Result<Value, Error> {
        charge_values([&value])?;
        Ok(value)
    });
    // Charges `n` bytes of template text about to be written.
    env.add_function("__tandem_charge_raw", |n: u64| -> Result<Value, Error> {
        charge(n)?;
        Ok(Value::from(()))
    });
}

/// The start of every dispatched call (`[args..., name]`): its fixed cost,
/// its name, and its inputs charged, the first one as a single unit when
/// `name` is in `constant` (its work does not depend on that input's size).
fn begin_dispatch<'a>(args: &'a [Value], constant: &[&str]) -> Result<(&'a str, &'a [Value]), Error> {
    charge(CALL_COST)?;
    let Some((name, args)) = args.split_last() else {
        return Err(Error::new(ErrorKind::InvalidOperation, "dispatch without a name"));
    };
    let name = name.as_str().ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "dispatch name is not a string"))?;
    if constant.contains(&name) {
        charge(1)?;
        charge_values(args.iter().skip(1))?;
    } else {
        charge_values(args)?;
    }
    Ok((name, args))
}

/// The largest constant a template may spell out by repetition, in bytes of
/// the repeated string (or elements of a list) times the count: `'-' * 80`
/// is common; `'x' * 100000000` is an attack.
const MAX_CONSTANT_REPEAT: u128 = 1_000_000;

/// Tokens one `{{ ... }}` or `{% ... %}` tag may hold. Real chat templates
/// stay under about 60.
const MAX_TAG_TOKENS: usize = 512;

/// Refuses templates that repeat a constant string or list beyond
/// [`MAX_CONSTANT_REPEAT`]. minijinja folds constant expressions while
/// compiling, before any budget applies, and retries the fold at every level
/// of a failing expression, so `'x' * 100000000 * 10 * ...` would cost seconds
/// and hundreds of megabytes at load. The check multiplies the integer
/// literals of each run of constant tokens joined by `*` that contains a
/// string or list literal, times the longest string literal in it; integer arithmetic alone (`60 * 60 * 24`) is cheap
/// and allowed.
///
/// It also refuses tags of more than [`MAX_TAG_TOKENS`] tokens: minijinja
/// parses, folds and compiles a chain of operators, filters or attribute
/// lookups (`x + x + ...`, `not not ...`, `x|f|f...`, `x.a.a...`) by
/// recursion as deep as the chain, with no limit, so a long enough chain
/// overflows the stack and aborts the process.
pub(crate) fn check_source(source: &str, ws: WhitespaceConfig) -> Result<(), Error> {
    let mut product: u128 = 1;
    // longest string literal in the run: what one repetition copies
    let mut unit: u128 = 1;
    let mut has_sequence = false;
    let mut has_mul = false;
    let mut has_pow = false;
    let mut in_tag: usize = 0;
    for token in tokenize(source, false, SyntaxConfig, ws) {
        // Lexer errors are reported by the compiler with better context.
        let Ok((token, _)) = token else { return Ok(()) };
        match token {
            Token::VariableStart | Token::BlockStart | Token::TemplateData(_) => in_tag = 0,
            _ => in_tag += 1,
        }
        if in_tag > MAX_TAG_TOKENS {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("a tag of the chat template has more than {MAX_TAG_TOKENS} tokens (a chain that long would overflow the compiler's stack)"),
            ));
        }
        match token {
            // zero factors are skipped: constants fold left to right, so a
            // `* 0` at the end does not stop the repetitions before it
            Token::Int(n) => product = product.saturating_mul(u128::from(n).max(1)),
            Token::Int128(n) => product = product.saturating_mul((*n).max(1)),
            // a float repeats as its integer part (`'x' * 1e8`)
            Token::Float(f) => {
                product = product.saturating_mul(if f.is_finite() && f.abs() >= 1.0 { f.abs().min(1e30) as u128 } else { 1 })
            }
            Token::Str(text) => {
                has_sequence = true;
                unit = unit.max(text.len() as u128);
            }
            Token::String(text) => {
                has_sequence = true;
                unit = unit.max(text.len() as u128);
            }
            Token::BracketOpen => has_sequence = true,
            Token::Mul => has_mul = true,
            // the run goes on through other operators: constants fold across them
            Token::Pow => has_pow = true,
            Token::BracketClose
            | Token::ParenOpen
            | Token::ParenClose
            | Token::Comma
            | Token::Plus
            | Token::Minus
            | Token::Div
            | Token::FloorDiv
            | Token::Mod
            | Token::Tilde => {}
            _ => {
                product = 1;
                unit = 1;
                has_sequence = false;
                has_mul = false;
                has_pow = false;
            }
        }
        // with `**` the factors no longer bound the count (`'x' * 10 ** 8`)
        let too_many = product.saturating_mul(unit) > MAX_CONSTANT_REPEAT || (has_pow && product > 64);
        if has_mul && has_sequence && too_many {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("the chat template repeats a constant string or list to more than {MAX_CONSTANT_REPEAT} bytes or elements"),
            ));
        }
    }
    Ok(())
}

/// Rewrites compiled instructions so that every costly step is charged (see
/// the module documentation). Jump targets are remapped to the new positions.
pub(crate) fn rewrite<'s>(old: &Instructions<'s>) -> Instructions<'s> {
    let mut new = Instructions::new(old.name(), old.source());
    let len = (0u32..).take_while(|&i| old.get(i).is_some()).count() as u32;
    // map[i]: where the code for old instruction i starts in the new list.
    let mut map: Vec<u32> = Vec::with_capacity(len as usize + 1);
    let mut out: Vec<(Instruction<'s>, u32)> = Vec::with_capacity(len as usize * 2);
    let charge_call = || Instruction::CallFunction("__tandem_charge", Some(1));
    for i in 0..len {
        let instr = old.get(i).expect("index below len").clone();
        map.push(out.len() as u32);
        let mut push = |x: Instruction<'s>| out.push((x, i));
        if let Some(name) = operator_name(&instr) {
            let arity = if matches!(instr, Instruction::Slice) { 4 } else { 2 };
            push(Instruction::CallFunction(name, Some(arity)));
            continue;
        }
        match instr {
            Instruction::ApplyFilter(name, Some(n), _) => {
                push(Instruction::LoadConst(Value::from(name)));
                push(Instruction::CallFunction("__tandem_filter", Some(n + 1)));
            }
            Instruction::PerformTest(name, Some(n), _) => {
                push(Instruction::LoadConst(Value::from(name)));
                push(Instruction::CallFunction("__tandem_test", Some(n + 1)));
            }
            Instruction::CallMethod(name, Some(n)) => {
                push(Instruction::LoadConst(Value::from(name)));
                push(Instruction::CallFunction("__tandem_method", Some(n + 1)));
            }
            // Calls with a splatted argument count: the result is charged.
            Instruction::ApplyFilter(..)
            | Instruction::PerformTest(..)
            | Instruction::CallMethod(..)
            | Instruction::CallFunction(..)
            | Instruction::CallObject(..)
            | Instruction::BuildList(..)
            | Instruction::BuildMap(..) => {
                push(instr);
                push(charge_call());
            }
            Instruction::Emit => {
                push(charge_call());
                push(Instruction::Emit);
            }
            Instruction::EmitRaw(raw) => {
                push(Instruction::LoadConst(Value::from(raw.len() as u64)));
                push(Instruction::CallFunction("__tandem_charge_raw", Some(1)));
                push(Instruction::DiscardTop);
                push(Instruction::EmitRaw(raw));
            }
            other => push(other),
        }
    }
    map.push(out.len() as u32);
    let target = |t: u32| map.get(t as usize).copied().unwrap_or(out.len() as u32);
    let remapped: Vec<(Instruction<'s>, u32)> = out
        .iter()
        .map(|(instr, i)| {
            let instr = match instr.clone() {
                Instruction::Jump(t) => Instruction::Jump(target(t)),
                Instruction::JumpIfFalse(t) => Instruction::JumpIfFalse(target(t)),
                Instruction::JumpIfFalseOrPop(t) => Instruction::JumpIfFalseOrPop(target(t)),
                Instruction::JumpIfTrueOrPop(t) => Instruction::JumpIfTrueOrPop(target(t)),
                Instruction::Iterate(t) => Instruction::Iterate(target(t)),
                Instruction::BuildMacro(name, t, flags) => Instruction::BuildMacro(name, target(t), flags),
                other => other,
            };
            (instr, *i)
        })
        .collect();
    for (instr, i) in remapped {
        if let Some(span) = old.get_span(i) {
            new.add_with_span(instr, span);
        } else if let Some(line) = old.get_line(i) {
            new.add_with_line(instr, line.min(u16::MAX as usize) as u16);
        } else {
            new.add(instr);
        }
    }
    new
}
