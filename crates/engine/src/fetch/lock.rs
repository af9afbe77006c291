//! A lock file per model, so that concurrent fetches download it once.
//!
//! The lock is an advisory whole-file lock (`flock` on Linux) on
//! `<dir>/.<file_name>.lock`, held by whoever downloads and assembles the
//! model. It works between processes and between threads of one process
//! (each opens its own file description). The holder removes the lock file
//! before it unlocks, so none is left behind; a waiter that then wakes holding
//! a lock on the removed file notices (its file is no longer the one at the
//! path) and tries again on the new one. A process that dies holding the lock
//! releases it with its file descriptors.

use std::fs::{self, File, TryLockError};
use std::path::{Path, PathBuf};

use super::{io_err, FetchError};

/// An exclusive lock on a model's lock file; released (and the file removed) on drop.
pub(super) struct ModelLock {
    path: PathBuf,
    file: Option<File>,
}

impl ModelLock {
    /// Waits until this process holds the lock for `file_name` in `dir`.
    /// `on_wait` runs once if another holder makes us wait.
    pub(super) fn acquire(dir: &Path, file_name: &str, mut on_wait: impl FnMut()) -> Result<Self, FetchError> {
        let path = dir.join(format!(".{file_name}.lock"));
        let mut waited = false;
        loop {
            let file = File::options().create(true).truncate(false).write(true).open(&path).map_err(io_err(&path))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    if !waited {
                        waited = true;
                        on_wait();
                    }
                    file.lock().map_err(io_err(&path))?;
                }
                Err(TryLockError::Error(e)) => return Err(io_err(&path)(e)),
            }
            if still_at_path(&file, &path) {
                return Ok(ModelLock { path, file: Some(file) });
            }
            // The previous holder removed the file we locked; lock the new one.
        }
    }
}

impl Drop for ModelLock {
    fn drop(&mut self) {
        // Remove first, then unlock by closing: a waiter that wakes on this
        // file sees it is gone from the path and retries.
        let _ = fs::remove_file(&self.path);
        drop(self.file.take());
    }
}

#[cfg(unix)]
fn still_at_path(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn still_at_path(_file: &File, path: &Path) -> bool {
    path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn lock_excludes_threads_and_leaves_no_file() {
        let dir = std::env::temp_dir().join(format!("tandem-lock-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let max_inside = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (dir, inside, max_inside) = (dir.clone(), inside.clone(), max_inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        let _g = ModelLock::acquire(&dir, "m.gguf", || {}).unwrap();
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max_inside.fetch_max(now, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(max_inside.load(Ordering::SeqCst), 1);
        let left: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{left:?}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
