//! Reading what C passes in and writing what it asked for: the only module
//! that touches caller memory.
//!
//! Contract for every function here: a non-NULL pointer must be valid for
//! the stated reads or writes for the duration of the call (C strings
//! NUL-terminated, arrays of the stated length). NULL is checked and refused
//! here; nothing else about a pointer can be checked.

use std::ffi::{c_char, CStr};

use crate::status::{tandem_status, Failure};

/// A NUL-terminated UTF-8 string, or None for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that outlives `'a`.
pub unsafe fn opt_str<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, Failure> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map(Some).map_err(|_| Failure::invalid(format!("{what} is not valid UTF-8")))
}

/// A NUL-terminated UTF-8 string that may not be NULL.
///
/// # Safety
/// As [`opt_str`].
pub unsafe fn str<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    // SAFETY: the caller's contract is opt_str's
    unsafe { opt_str(p, what) }?.ok_or_else(|| Failure::invalid(format!("{what} is NULL")))
}

/// `n` elements at `p`; NULL is allowed only when `n` is 0.
///
/// # Safety
/// `p` is NULL or points to `n` initialised elements that outlive `'a`.
pub unsafe fn slice<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T], Failure> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL with a length of {n}")));
    }
    if n.checked_mul(std::mem::size_of::<T>()).is_none_or(|b| b > isize::MAX as usize) {
        return Err(Failure::invalid(format!("{what}: length {n} is too large")));
    }
    // SAFETY: non-NULL, `n` elements by the caller's contract, size checked
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A copy of the struct at `p`, or None for NULL.
///
/// # Safety
/// `p` is NULL or points to an initialised `T`.
pub unsafe fn read_opt<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: non-NULL and initialised by the caller's contract
    (!p.is_null()).then(|| unsafe { p.read() })
}

/// Write `value` to `out`.
///
/// # Safety
/// `out` is NULL or valid for one write of `T`.
pub unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and writable by the caller's contract
    unsafe { out.write(value) };
    Ok(())
}

/// Write `value` to `out` when `out` is not NULL (optional outputs).
///
/// # Safety
/// As [`put`].
pub unsafe fn put_opt<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-NULL and writable by the caller's contract
        unsafe { out.write(value) };
    }
}

/// Copy `items` into the caller's array of `cap` elements and its count into
/// `n_out`. Too small an array gets nothing but the count needed, and
/// `TANDEM_ERR_BUFFER_TOO_SMALL`.
///
/// # Safety
/// `out` is NULL (then `cap` must be 0) or valid for `cap` writes of `T`;
/// `n_out` is valid for one write.
pub unsafe fn put_array<T: Copy>(items: &[T], out: *mut T, cap: usize, n_out: *mut usize, what: &str) -> Result<(), Failure> {
    // SAFETY: the caller's contract covers n_out
    unsafe { put(n_out, items.len(), "the count output") }?;
    if items.len() > cap {
        return Err(Failure::new(
            tandem_status::TANDEM_ERR_BUFFER_TOO_SMALL,
            format!("{what}: {} elements needed, room for {cap}", items.len()),
        ));
    }
    if items.is_empty() {
        return Ok(());
    }
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: `out` holds `cap` ≥ items.len() elements by the caller's contract
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), out, items.len()) };
    Ok(())
}

/// Copy `text` and a terminating NUL into the caller's buffer of `cap`
/// bytes, and its length without the NUL into `len_out`. Too small a buffer
/// gets nothing but the length, and `TANDEM_ERR_BUFFER_TOO_SMALL`.
///
/// # Safety
/// `buf` is NULL (then `cap` must be 0) or valid for `cap` byte writes;
/// `len_out` is valid for one write.
pub unsafe fn put_text(text: &str, buf: *mut c_char, cap: usize, len_out: *mut usize) -> Result<(), Failure> {
    // SAFETY: the caller's contract covers len_out
    unsafe { put(len_out, text.len(), "the length output") }?;
    if text.len() + 1 > cap {
        return Err(Failure::new(
            tandem_status::TANDEM_ERR_BUFFER_TOO_SMALL,
            format!("{} bytes and a NUL needed, room for {cap}", text.len()),
        ));
    }
    if buf.is_null() {
        return Err(Failure::invalid("the text buffer is NULL"));
    }
    // SAFETY: `buf` holds `cap` ≥ len + 1 bytes by the caller's contract
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        buf.add(text.len()).write(0);
    }
    Ok(())
}
