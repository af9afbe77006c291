//! Coding-assistant prompts built on Python code found on the machine, for
//! drafters of a coding model: the kinds of work an editor plugin sends
//! (complete a function from its signature and docstring, rename a
//! parameter, add type hints, add comments, explain) plus a few more
//! (tests, docstrings, fixes, translation).
//!
//! The code must not be the benchmark's: `../shared/bench/prompts-code-dev.jsonl`
//! is built on the Python standard library, so a directory that looks like
//! the standard library is refused, and the caller drops any prompt whose
//! function shares a `def` line with a benchmark prompt
//! ([`CodePrompt::def_line`]). Installed packages (`site-packages`) are the
//! intended source.

use crate::corpus::SplitMix;

/// One prompt: a user turn (rendered with the chat template) or raw text
/// the target continues as is (code completion).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Prompt {
    User(String),
    Raw(String),
}

impl Prompt {
    pub fn text(&self) -> &str {
        match self {
            Prompt::User(s) | Prompt::Raw(s) => s,
        }
    }
}

/// A prompt built on one function, with the function's `def` line (for the
/// leak check against the benchmark).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodePrompt {
    pub prompt: Prompt,
    pub def_line: String,
    /// The task: complete, rename, hints, comments, explain, tests,
    /// docstring, fix or translate.
    pub kind: &'static str,
}

const RENAME: &[&str] = &[
    "Rename the parameter `{p}` to `{q}` in this function and in every place it is used. Reply with the whole updated function only.",
    "In the function below, change the name of the argument `{p}` to `{q}` everywhere. Return only the complete function.",
    "Please rename `{p}` to `{q}` throughout this Python function and give me back the full function.",
];
const HINTS: &[&str] = &[
    "Add type hints to this function's parameters and return value, leave the rest as it is, and reply with the full function.",
    "Annotate this Python function with type hints (arguments and return type). Do not change anything else; return the complete function.",
    "Give every parameter of this function a type annotation and add the return type. Reply with the whole function.",
];
const COMMENTS: &[&str] = &[
    "Add brief comments above the important lines of this function. Reply with the complete function including the comments.",
    "Comment this Python function: a short comment before each line that is not obvious. Return the full commented function.",
    "Insert concise explanatory comments into this function and reply with the whole function.",
];
const EXPLAIN: &[&str] = &[
    "Explain what this Python function does, step by step.",
    "Walk me through this function line by line: what does it do and why?",
    "Describe in plain words how this function works and what it returns.",
];
const OTHER: &[(&str, &str)] = &[
    ("tests", "Write pytest unit tests for this function, covering the normal case and an edge case."),
    ("docstring", "Write a clear docstring for this function and reply with the function including it."),
    ("fix", "Is there a bug or an unhandled case in this function? Explain it and give a corrected version."),
    ("translate", "Translate this Python function into {lang}, keeping the same behaviour."),
];
const LANGS: &[&str] = &["JavaScript", "TypeScript", "Rust", "Go", "Java", "C++"];

/// A function found in a source file, dedented to column 0.
#[derive(Debug, Clone)]
struct Function {
    lines: Vec<String>,
    params: Vec<String>,
    has_docstring: bool,
}

/// `n` prompts over the `.py` files under `dir`, deterministic for the
/// directory's contents and the seed. Kinds are drawn with weights
/// complete 20, rename 15, hints 15, comments 15, explain 15, others 20.
pub fn code_prompts(dir: &std::path::Path, n: usize, seed: u64) -> std::io::Result<Vec<CodePrompt>> {
    if dir.join("os.py").is_file() && dir.join("argparse.py").is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} looks like the Python standard library, which the code benchmark is built on: use installed packages (site-packages)",
                dir.display()
            ),
        ));
    }
    let mut files = Vec::new();
    crate::corpus::collect_py(dir, SKIP_DIRS, &|name| name.starts_with("test_"), &mut files)?;
    files.sort();
    let mut fns = Vec::new();
    for f in &files {
        let Ok(src) = std::fs::read_to_string(f) else { continue };
        extract(&src, &mut fns);
    }
    if fns.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("no Python functions under {}", dir.display())));
    }
    let documented: Vec<usize> = (0..fns.len()).filter(|&i| fns[i].has_docstring).collect();
    let with_params: Vec<usize> = (0..fns.len()).filter(|&i| !fns[i].params.is_empty()).collect();
    let all: Vec<usize> = (0..fns.len()).collect();
    let mut r = SplitMix::new(seed ^ 0x636F_6465_5F64_6972);
    let mut out = Vec::with_capacity(n);
    let mut seen = std::collections::HashSet::new();
    let mut tries = 0;
    while out.len() < n && tries < n * 20 {
        tries += 1;
        let roll = r.below(100);
        let pool: &[usize] = match roll {
            0..=19 if !documented.is_empty() => &documented,
            20..=34 if !with_params.is_empty() => &with_params,
            _ => &all,
        };
        let f = &fns[*r.pick(pool)];
        let code = f.lines.join("\n");
        let fenced = format!("```python\n{code}\n```");
        let (kind, prompt) = match roll {
            0..=19 if f.has_docstring => ("complete", Prompt::Raw(signature_and_docstring(&f.lines))),
            20..=34 if !f.params.is_empty() => {
                let p = r.pick(&f.params).clone();
                let q = match r.below(3) {
                    0 => format!("{p}_value"),
                    1 => format!("new_{p}"),
                    _ => format!("{p}_arg"),
                };
                let t = r.pick(RENAME).replace("{p}", &p).replace("{q}", &q);
                ("rename", Prompt::User(format!("{t}\n\n{fenced}")))
            }
            35..=49 => ("hints", Prompt::User(format!("{}\n\n{fenced}", r.pick(HINTS)))),
            50..=64 => ("comments", Prompt::User(format!("{}\n\n{fenced}", r.pick(COMMENTS)))),
            65..=79 => ("explain", Prompt::User(format!("{}\n\n{fenced}", r.pick(EXPLAIN)))),
            _ => {
                let (k, t) = *r.pick(OTHER);
                let t = t.replace("{lang}", *r.pick(LANGS));
                (k, Prompt::User(format!("{t}\n\n{fenced}")))
            }
        };
        if seen.insert(prompt.clone()) {
            out.push(CodePrompt { prompt, def_line: f.lines[0].trim().to_string(), kind });
        }
    }
    Ok(out)
}

/// Directories not entered when collecting a package tree's sources.
const SKIP_DIRS: &[&str] = &["__pycache__", "test", "tests", "testing", "_vendor", "vendored"];

fn indent_of(l: &str) -> usize {
    l.len() - l.trim_start_matches(' ').len()
}

/// Functions and methods of 4–40 lines (lines ≤ 100 characters, spaces
/// only), dedented.
fn extract(src: &str, out: &mut Vec<Function>) {
    let lines: Vec<&str> = src.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        let ind = indent_of(l);
        let t = &l[ind..];
        if (ind == 0 || ind == 4) && (t.starts_with("def ") || t.starts_with("async def ")) && l.trim_end().ends_with(':') {
            let mut j = i + 1;
            while j < lines.len() && (lines[j].trim().is_empty() || indent_of(lines[j]) > ind) {
                j += 1;
            }
            let mut end = j;
            while end > i && lines[end - 1].trim().is_empty() {
                end -= 1;
            }
            let body = &lines[i..end];
            if (4..=40).contains(&body.len()) && body.iter().all(|l| l.len() <= 100 && !l.contains('\t')) {
                let lines: Vec<String> =
                    body.iter().map(|l| if l.len() >= ind { l[ind..].to_string() } else { l.trim_start().to_string() }).collect();
                let has_docstring = lines.get(1).is_some_and(|l| {
                    let t = l.trim_start();
                    t.starts_with("\"\"\"") || t.starts_with("r\"\"\"")
                });
                let params = params_of(&lines[0]);
                out.push(Function { lines, params, has_docstring });
            }
            i = j;
        } else {
            i += 1;
        }
    }
}

/// Plain parameter names of a one-line `def` (not `self`/`cls`, no
/// `*args`/`**kwargs`).
fn params_of(def: &str) -> Vec<String> {
    let (Some(a), Some(b)) = (def.find('('), def.rfind(')')) else { return Vec::new() };
    if b <= a {
        return Vec::new();
    }
    def[a + 1..b]
        .split(',')
        .filter_map(|p| {
            let name = p.split([':', '=']).next()?.trim();
            let ok = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && !matches!(name, "self" | "cls");
            ok.then(|| name.to_string())
        })
        .collect()
}

/// The `def` line and its docstring, ending with a newline: what an editor
/// sends for the model to complete the body.
fn signature_and_docstring(lines: &[String]) -> String {
    let mut out = vec![lines[0].clone()];
    let open = lines[1].trim_start();
    let quote = if open.starts_with("r\"\"\"") { 4 } else { 3 };
    let single_line = open.len() > quote + 2 && open[quote..].contains("\"\"\"");
    out.push(lines[1].clone());
    if !single_line {
        for l in &lines[2..] {
            out.push(l.clone());
            if l.contains("\"\"\"") {
                break;
            }
        }
    }
    let mut s = out.join("\n");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tandem-code-corpus-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("pkg").join("tests")).unwrap();
        std::fs::write(
            dir.join("pkg").join("mod.py"),
            "def area(width, height=1):\n    \"\"\"Area of a rectangle.\n\n    Both sides in metres.\n    \"\"\"\n    w = float(width)\n    return w * height\n\n\
             class Box:\n    def grow(self, by):\n        \"\"\"Grow by `by`.\"\"\"\n        self.size += by\n        return self.size\n",
        )
        .unwrap();
        std::fs::write(dir.join("pkg").join("tests").join("t.py"), "def skipped(x):\n    y = x\n    z = y\n    return z\n").unwrap();
        dir
    }

    #[test]
    fn functions_methods_and_kinds() {
        let dir = tree();
        let a = code_prompts(&dir, 30, 5).unwrap();
        assert_eq!(a, code_prompts(&dir, 30, 5).unwrap());
        assert!(a.iter().all(|p| !p.prompt.text().contains("skipped")));
        let defs: std::collections::HashSet<_> = a.iter().map(|p| p.def_line.as_str()).collect();
        assert!(defs.contains("def area(width, height=1):") && defs.contains("def grow(self, by):"));
        let complete = a.iter().find(|p| p.kind == "complete" && p.def_line.starts_with("def area")).unwrap();
        assert_eq!(
            complete.prompt,
            Prompt::Raw("def area(width, height=1):\n    \"\"\"Area of a rectangle.\n\n    Both sides in metres.\n    \"\"\"\n".into())
        );
        let rename = a.iter().find(|p| p.kind == "rename").unwrap();
        assert!(matches!(&rename.prompt, Prompt::User(s) if s.contains("```python\ndef ")));
        assert!(!a.iter().any(|p| p.kind == "rename" && p.prompt.text().contains("`self`")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_the_standard_library() {
        let dir = std::env::temp_dir().join(format!("tandem-code-stdlib-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("os.py"), "").unwrap();
        std::fs::write(dir.join("argparse.py"), "").unwrap();
        let e = code_prompts(&dir, 5, 1).unwrap_err();
        assert!(e.to_string().contains("standard library"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parameters() {
        assert_eq!(params_of("def f(self, a, b: int = 3, *args, c=None, **kw):"), vec!["a", "b", "c"]);
        assert!(params_of("def g():").is_empty());
    }
}
