//! What handles stand for, and the registries that map a handle to it.
//!
//! A handle given to C is a number, never an address: every call looks it up
//! here, so a NULL, freed or made-up handle is refused instead of being
//! dereferenced. Numbers are never reused, so a freed handle stays invalid
//! even after new objects are made.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

use tandem_engine::{Engine, Session, SessionSnapshot, SpecOptions, Speculator};

use crate::status::{tandem_status, Failure};

/// An open engine: the model and the speculation every session uses.
pub struct EngineState {
    pub engine: Arc<Engine>,
    pub spec: SpecOptions,
    pub ctx: usize,
}

/// A session: its cache and tokens, and its own speculator (drafters keep
/// per-conversation state).
pub struct SessionState {
    pub engine: Arc<EngineState>,
    pub session: Session,
    pub spec: Option<Speculator>,
}

/// A saved session state, usable with sessions of the same engine.
pub struct SnapshotState {
    pub engine: Arc<EngineState>,
    pub snapshot: SessionSnapshot,
}

/// Live objects of one kind by handle number.
pub struct Registry<T> {
    kind: &'static str,
    live: Mutex<Option<HashMap<usize, Arc<T>>>>,
}

/// Handle numbers for every kind: multiples of 16 from 16, so a handle looks
/// like an aligned pointer and one kind's handle is never another's.
static NEXT: AtomicUsize = AtomicUsize::new(16);

impl<T> Registry<T> {
    pub const fn new(kind: &'static str) -> Self {
        Registry { kind, live: Mutex::new(None) }
    }

    fn map(&self) -> MutexGuard<'_, Option<HashMap<usize, Arc<T>>>> {
        // a panic while the map was locked left it consistent (inserts and
        // removes are single calls)
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn insert(&self, value: T) -> usize {
        let id = NEXT.fetch_add(16, Ordering::Relaxed);
        self.map().get_or_insert_with(HashMap::new).insert(id, Arc::new(value));
        id
    }

    pub fn get(&self, id: usize) -> Result<Arc<T>, Failure> {
        self.map().as_ref().and_then(|m| m.get(&id)).cloned().ok_or_else(|| Failure::handle(self.kind))
    }

    /// Forget a handle; the object goes when the last call using it returns.
    /// NULL (0) is accepted and does nothing, as `free(NULL)` does.
    pub fn free(&self, id: usize) -> Result<(), Failure> {
        if id == 0 {
            return Ok(());
        }
        self.map().as_mut().and_then(|m| m.remove(&id)).map(drop).ok_or_else(|| Failure::handle(self.kind))
    }

    pub fn len(&self) -> usize {
        self.map().as_ref().map_or(0, HashMap::len)
    }
}

pub static ENGINES: Registry<EngineState> = Registry::new("engine");
pub static SESSIONS: Registry<Mutex<SessionState>> = Registry::new("session");
pub static SNAPSHOTS: Registry<SnapshotState> = Registry::new("snapshot");

/// Lock a session for one call; a session already in a call is busy (a
/// second thread, or a token callback re-entering its own session).
pub fn lock(session: &Mutex<SessionState>) -> Result<MutexGuard<'_, SessionState>, Failure> {
    match session.try_lock() {
        Ok(g) => Ok(g),
        Err(TryLockError::Poisoned(p)) => {
            // a call panicked mid-generation: start the conversation afresh
            let mut g = p.into_inner();
            g.session.reset();
            session.clear_poison();
            Ok(g)
        }
        Err(TryLockError::WouldBlock) => Err(Failure::new(tandem_status::TANDEM_ERR_BUSY, "the session is in use by another call")),
    }
}
