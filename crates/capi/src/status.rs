//! Status codes, the thread's last error message, and the guard every entry
//! point runs its body in (errors and panics become a status, never unwind
//! into C).

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use tandem_engine::{EngineError, ModelError};

/// What a call returned. `TANDEM_OK` is 0; every other value is a failure
/// whose message `tandem_last_error()` gives.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tandem_status {
    TANDEM_OK = 0,
    /// An argument is NULL where it may not be, out of range, or not UTF-8.
    TANDEM_ERR_INVALID_ARGUMENT = 1,
    /// A handle is NULL, already freed, or of another kind.
    TANDEM_ERR_INVALID_HANDLE = 2,
    /// An output buffer is too small; the length it needs was written.
    TANDEM_ERR_BUFFER_TOO_SMALL = 3,
    /// A model or support file is missing, unreadable or malformed, or a
    /// catalogue model could not be fetched.
    TANDEM_ERR_MODEL = 4,
    /// The prompt and the generation do not fit the session's context.
    TANDEM_ERR_CONTEXT = 5,
    /// Speculative settings that are out of range or do not go together.
    TANDEM_ERR_SPECULATION = 6,
    /// The session is in use by another call (another thread, or a token
    /// callback calling back into its own session).
    TANDEM_ERR_BUSY = 7,
    /// A bug in tandem: a panic was caught at the boundary.
    TANDEM_ERR_INTERNAL = 8,
}

/// Why a generation ended.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tandem_stop {
    /// An end-of-generation token.
    TANDEM_STOP_EOG = 0,
    /// `max_tokens` reached.
    TANDEM_STOP_LENGTH = 1,
    /// The session's context is full.
    TANDEM_STOP_CONTEXT = 2,
    /// The token callback returned non-zero.
    TANDEM_STOP_CALLBACK = 3,
}

/// A failure: the status to return and the message to keep.
#[derive(Debug)]
pub struct Failure {
    pub status: tandem_status,
    pub message: String,
}

impl Failure {
    pub fn new(status: tandem_status, message: impl Into<String>) -> Self {
        Failure { status, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(tandem_status::TANDEM_ERR_INVALID_ARGUMENT, message)
    }
    pub fn handle(kind: &str) -> Self {
        Self::new(tandem_status::TANDEM_ERR_INVALID_HANDLE, format!("invalid {kind} handle (NULL, freed, or of another kind)"))
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        use tandem_status::*;
        let status = match &e {
            EngineError::PromptTooLong { .. } => TANDEM_ERR_CONTEXT,
            EngineError::EmptyPrompt | EngineError::SnapshotMismatch => TANDEM_ERR_INVALID_ARGUMENT,
            EngineError::Spec(_) | EngineError::Conflict(_) => TANDEM_ERR_SPECULATION,
            EngineError::Model(ModelError::ContextFull { .. }) => TANDEM_ERR_CONTEXT,
            EngineError::Model(ModelError::BadToken { .. }) => TANDEM_ERR_INVALID_ARGUMENT,
            _ => TANDEM_ERR_MODEL,
        };
        Failure::new(status, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // a message with an inner NUL is cut there rather than lost
    let bytes: Vec<u8> = message.bytes().take_while(|&b| b != 0).collect();
    let c = CString::new(bytes).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// The message of this thread's last failed call ("" if none). The pointer
/// stays valid until the next failing call on the same thread.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Run an entry point's body: its failure or panic becomes a status and this
/// thread's last error.
pub fn guard(body: impl FnOnce() -> Result<(), Failure>) -> tandem_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => tandem_status::TANDEM_OK,
        Ok(Err(f)) => {
            set_last_error(&f.message);
            f.status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            set_last_error(&format!("internal error (a bug in tandem; please report it): {what}"));
            tandem_status::TANDEM_ERR_INTERNAL
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: last_error_ptr points at this thread's live CString
        unsafe { CStr::from_ptr(last_error_ptr()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let s = guard(|| panic!("boom at the boundary"));
        assert_eq!(s, tandem_status::TANDEM_ERR_INTERNAL);
        assert!(last().contains("boom at the boundary"), "{}", last());
        let s = guard(|| Err(Failure::invalid("with an inner \0 NUL")));
        assert_eq!(s, tandem_status::TANDEM_ERR_INVALID_ARGUMENT);
        assert_eq!(last(), "with an inner ");
        assert_eq!(guard(|| Ok(())), tandem_status::TANDEM_OK);
        assert_eq!(last(), "with an inner ", "a successful call keeps the last error");
    }

    #[test]
    fn the_last_error_is_per_thread() {
        let _ = guard(|| Err(Failure::invalid("this thread's")));
        std::thread::spawn(|| assert_eq!(last(), "")).join().unwrap();
        assert_eq!(last(), "this thread's");
    }
}
