//! The global suffix tree: recent outputs of every generation that drafts
//! with it, bounded in tokens, oldest evicted first, optionally kept in a
//! file between runs.
//!
//! File format (little endian): the magic `TNDMSUFX`, format version (u32),
//! the vocabulary's size (u32) and hash (u64) it was written for, the number
//! of sequences (u32), then each sequence as its length (u32) and token ids
//! (u32 each). The tree is rebuilt from the sequences on load.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::tree::{SuffixTree, MAX_DEPTH};

const MAGIC: &[u8; 8] = b"TNDMSUFX";
const VERSION: u32 = 1;

/// A suffix cache file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SuffixCacheError {
    #[error("suffix cache {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("suffix cache {}: not a tandem suffix cache", path.display())]
    NotACache { path: PathBuf },
    #[error("suffix cache {}: format version {found}; this build reads version {VERSION}", path.display())]
    Version { path: PathBuf, found: u32 },
    #[error(
        "suffix cache {}: written for another vocabulary ({found_size} tokens, hash {found_hash:016x}; this model has {size} tokens, hash {hash:016x}); remove it or name another file",
        path.display()
    )]
    VocabMismatch { path: PathBuf, found_size: u32, found_hash: u64, size: u32, hash: u64 },
    #[error("suffix cache {}: {why}", path.display())]
    Corrupt { path: PathBuf, why: String },
}

/// The vocabulary a cache holds ids of: its size and hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VocabId {
    pub size: u32,
    pub hash: u64,
}

#[derive(Debug)]
struct Stored {
    id: u64,
    tokens: Vec<u32>,
    /// The tree nodes of its open suffixes (it may still grow).
    active: Vec<u32>,
}

#[derive(Debug)]
struct Store {
    tree: SuffixTree,
    /// Oldest first; ids increase.
    seqs: VecDeque<Stored>,
    tokens: usize,
    next_id: u64,
    /// Changed since loaded or last saved.
    dirty: bool,
}

impl Store {
    fn new(depth: usize) -> Store {
        Store { tree: SuffixTree::new(depth), seqs: VecDeque::new(), tokens: 0, next_id: 1, dirty: false }
    }

    fn find(&self, id: u64) -> Option<usize> {
        self.seqs.binary_search_by_key(&id, |s| s.id).ok()
    }

    fn evict_oldest(&mut self) {
        if let Some(s) = self.seqs.pop_front() {
            self.tree.remove(&s.tokens);
            self.tokens -= s.tokens.len();
        }
    }

    /// Append to sequence `id` (a new one when None or evicted); returns
    /// the id the tokens went to. Never holds more than `cap` tokens.
    fn append(&mut self, id: Option<u64>, tokens: &[u32], cap: usize) -> u64 {
        let mut id = id.unwrap_or(0);
        for &t in tokens {
            while self.tokens >= cap {
                self.evict_oldest();
            }
            let i = match self.find(id) {
                Some(i) => i,
                None => {
                    id = self.next_id;
                    self.next_id += 1;
                    self.seqs.push_back(Stored { id, tokens: Vec::new(), active: self.tree.start() });
                    self.seqs.len() - 1
                }
            };
            let s = &mut self.seqs[i];
            self.tree.extend(&mut s.active, t);
            s.tokens.push(t);
            self.tokens += 1;
        }
        self.dirty |= !tokens.is_empty();
        id
    }
}

/// Recent outputs in a suffix tree shared by the drafters built on it
/// (clones share it). Thread-safe: a drafter holds the lock for one
/// proposal or one append, microseconds.
#[derive(Debug, Clone)]
pub struct SuffixCache {
    store: Arc<Mutex<Store>>,
    cap: usize,
    depth: usize,
    /// Where it is kept between runs, and for which vocabulary.
    file: Option<(PathBuf, VocabId)>,
}

impl SuffixCache {
    /// An empty cache of at most `cap` tokens (at least 1) in a tree of
    /// substrings of up to `depth` tokens (clamped to 2..=256).
    pub fn new(cap: usize, depth: usize) -> SuffixCache {
        let depth = depth.clamp(2, MAX_DEPTH);
        SuffixCache { store: Arc::new(Mutex::new(Store::new(depth))), cap: cap.max(1), depth, file: None }
    }

    /// A cache kept in `path`: loaded from it when it exists (the oldest
    /// sequences beyond `cap` are dropped), saved there by
    /// [`persist`](Self::persist).
    pub fn open(path: &Path, cap: usize, depth: usize, vocab: VocabId) -> Result<SuffixCache, SuffixCacheError> {
        let mut c = SuffixCache::new(cap, depth);
        c.file = Some((path.to_path_buf(), vocab));
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(c),
            Err(source) => return Err(SuffixCacheError::Io { path: path.to_path_buf(), source }),
        };
        let seqs = parse(path, &bytes, vocab)?;
        {
            let mut st = c.lock();
            for s in &seqs {
                st.append(None, s, cap.max(1));
            }
            st.dirty = false;
        }
        Ok(c)
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        match self.store.lock() {
            Ok(g) => g,
            Err(poisoned) => {
                // a panic mid-update may have left the tree inconsistent:
                // start again empty rather than draft from it
                let mut g = poisoned.into_inner();
                *g = Store::new(self.depth);
                self.store.clear_poison();
                g
            }
        }
    }

    /// Tree depth: the longest substring counted.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Most tokens held.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Tokens held.
    pub fn tokens(&self) -> usize {
        self.lock().tokens
    }

    /// Sequences held.
    pub fn sequences(&self) -> usize {
        self.lock().seqs.len()
    }

    /// Tree nodes in use (at most `depth` per token held, plus the root).
    pub fn nodes(&self) -> usize {
        self.lock().tree.nodes()
    }

    /// Approximate bytes of the tree.
    pub fn bytes(&self) -> usize {
        self.lock().tree.bytes()
    }

    /// The file it is kept in, if any.
    pub fn path(&self) -> Option<&Path> {
        self.file.as_ref().map(|f| f.0.as_path())
    }

    /// Append `tokens` to the sequence `id` returned by an earlier call
    /// (None: start a new sequence); returns the sequence's id. A sequence
    /// evicted meanwhile is started again.
    pub fn append(&self, id: Option<u64>, tokens: &[u32]) -> u64 {
        self.lock().append(id, tokens, self.cap)
    }

    /// Forget every output held.
    pub fn clear(&self) {
        let mut st = self.lock();
        *st = Store::new(self.depth);
        st.dirty = true;
    }

    /// Run `f` on the tree (under the lock).
    pub fn with_tree<R>(&self, f: impl FnOnce(&SuffixTree) -> R) -> R {
        f(&self.lock().tree)
    }

    /// Save to the cache's file, if it has one and changed since it was
    /// loaded or saved. The file is replaced whole (written beside it, then
    /// renamed), so a crash leaves the old one or the new one.
    pub fn persist(&self) -> Result<(), SuffixCacheError> {
        let Some((path, vocab)) = &self.file else { return Ok(()) };
        let bytes = {
            let mut st = self.lock();
            if !st.dirty {
                return Ok(());
            }
            st.dirty = false;
            let mut b = Vec::with_capacity(28 + 4 * (st.tokens + st.seqs.len()));
            b.extend_from_slice(MAGIC);
            b.extend_from_slice(&VERSION.to_le_bytes());
            b.extend_from_slice(&vocab.size.to_le_bytes());
            b.extend_from_slice(&vocab.hash.to_le_bytes());
            b.extend_from_slice(&(st.seqs.len() as u32).to_le_bytes());
            for s in &st.seqs {
                b.extend_from_slice(&(s.tokens.len() as u32).to_le_bytes());
                s.tokens.iter().for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
            }
            b
        };
        let io = |source| SuffixCacheError::Io { path: path.clone(), source };
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        std::fs::write(&tmp, &bytes).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

/// The sequences of a cache file, checked against `vocab`.
fn parse(path: &Path, b: &[u8], vocab: VocabId) -> Result<Vec<Vec<u32>>, SuffixCacheError> {
    let corrupt = |why: String| SuffixCacheError::Corrupt { path: path.to_path_buf(), why };
    if b.len() < 8 || &b[..8] != MAGIC {
        return Err(SuffixCacheError::NotACache { path: path.to_path_buf() });
    }
    let mut at = 8;
    let u32_at = |at: &mut usize| -> Result<u32, SuffixCacheError> {
        let v = b.get(*at..*at + 4).ok_or_else(|| corrupt(format!("truncated at byte {}", *at)))?;
        *at += 4;
        Ok(u32::from_le_bytes(v.try_into().unwrap_or_default()))
    };
    let version = u32_at(&mut at)?;
    if version != VERSION {
        return Err(SuffixCacheError::Version { path: path.to_path_buf(), found: version });
    }
    let size = u32_at(&mut at)?;
    let hash = (u32_at(&mut at)? as u64) | (u32_at(&mut at)? as u64) << 32;
    if size != vocab.size || hash != vocab.hash {
        return Err(SuffixCacheError::VocabMismatch {
            path: path.to_path_buf(),
            found_size: size,
            found_hash: hash,
            size: vocab.size,
            hash: vocab.hash,
        });
    }
    let n = u32_at(&mut at)? as usize;
    let mut seqs = Vec::new();
    for i in 0..n {
        let len = u32_at(&mut at)? as usize;
        if len > (b.len() - at) / 4 {
            return Err(corrupt(format!("sequence {i} of {len} tokens runs past the end of the file")));
        }
        let mut s = Vec::with_capacity(len);
        for _ in 0..len {
            let t = u32_at(&mut at)?;
            if t >= vocab.size {
                return Err(corrupt(format!("token id {t} in sequence {i} is outside the vocabulary of {} tokens", vocab.size)));
            }
            s.push(t);
        }
        seqs.push(s);
    }
    if at != b.len() {
        return Err(corrupt(format!("{} bytes after the last sequence", b.len() - at)));
    }
    Ok(seqs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: VocabId = VocabId { size: 1000, hash: 0xabcdef };

    #[test]
    fn never_holds_more_than_its_bound() {
        let c = SuffixCache::new(50, 8);
        let mut ids = Vec::new();
        for i in 0..40u32 {
            let toks: Vec<u32> = (0..(i % 7 + 1)).map(|j| (i * 7 + j) % 13).collect();
            let id = c.append(ids.last().copied().filter(|_| i % 3 != 0), &toks);
            ids.push(id);
            assert!(c.tokens() <= 50, "{} tokens", c.tokens());
            assert!(c.nodes() <= 1 + 50 * 8);
            c.with_tree(|t| t.check());
        }
        // one output longer than the whole cache
        let long: Vec<u32> = (0..200).map(|j| j % 17).collect();
        c.append(None, &long);
        assert!(c.tokens() <= 50);
        c.with_tree(|t| t.check());
        c.clear();
        assert_eq!((c.tokens(), c.sequences(), c.nodes()), (0, 0, 1));
    }

    #[test]
    fn persists_and_refuses_bad_files() {
        let dir = std::env::temp_dir().join(format!("tandem-suffix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cache.bin");
        let _ = std::fs::remove_file(&path);
        let c = SuffixCache::open(&path, 100, 8, V).unwrap();
        assert_eq!(c.tokens(), 0);
        let id = c.append(None, &[1, 2, 3]);
        c.append(Some(id), &[4]);
        c.append(None, &[5, 6]);
        c.persist().unwrap();
        let d = SuffixCache::open(&path, 100, 8, V).unwrap();
        assert_eq!((d.tokens(), d.sequences()), (6, 2));
        assert!(d.with_tree(|t| t.walk(&[2, 3, 4]).is_some()));
        // loaded into a smaller bound: the oldest go
        let e = SuffixCache::open(&path, 3, 8, V).unwrap();
        assert_eq!(e.tokens(), 3);
        assert!(e.with_tree(|t| t.walk(&[5, 6]).is_some() && t.walk(&[1]).is_none()));
        // another vocabulary
        let other = VocabId { size: 1000, hash: 1 };
        assert!(matches!(SuffixCache::open(&path, 100, 8, other), Err(SuffixCacheError::VocabMismatch { .. })));
        // damaged files
        let good = std::fs::read(&path).unwrap();
        let bad = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            SuffixCache::open(&path, 100, 8, V).unwrap_err()
        };
        assert!(matches!(bad(b"hello"), SuffixCacheError::NotACache { .. }));
        assert!(matches!(bad(&good[..good.len() - 2]), SuffixCacheError::Corrupt { .. }));
        let mut more = good.clone();
        more.push(0);
        assert!(matches!(bad(&more), SuffixCacheError::Corrupt { .. }));
        let mut huge = good.clone();
        huge[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(bad(&huge), SuffixCacheError::Corrupt { .. }));
        let mut oov = good.clone();
        oov[32..36].copy_from_slice(&5000u32.to_le_bytes());
        assert!(bad(&oov).to_string().contains("outside the vocabulary"));
        let mut ver = good;
        ver[8] = 9;
        assert!(matches!(bad(&ver), SuffixCacheError::Version { found: 9, .. }));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
