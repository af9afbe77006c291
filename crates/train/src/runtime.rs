//! Process settings for training runs: the allocator and candle's thread pool.
//!
//! A training step allocates and frees hundreds of tensors of a few hundred
//! KB to 16 MB. With glibc's defaults the big ones are `mmap`ed and the heap
//! is trimmed on free, so every step faults in (and the kernel zeroes) fresh
//! pages: `perf` put a sixth of a DSpark training run's CPU time in
//! `clear_page`. And candle's elementwise worker spins 25,000 times after each
//! op before it parks, on a machine where the gemm's rayon threads want both
//! cores. Neither setting touches a single computed bit (checked: same tensor
//! bytes); they only change where memory comes from and who waits how.

/// Call once, at the start of a training command and before any candle op
/// (candle reads its spin limit when its pool starts). Settings the user
/// made (`CANDLE_BARRIER_POOL_SPIN_LIMIT`, `GLIBC_TUNABLES`) win.
pub fn tune_for_training() {
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        // Short spin: elementwise ops come back to back (they stay hot), while
        // during a gemm the worker parks instead of taking a core from it.
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "2000");
    }
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        keep_freed_memory();
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: mallopt only changes allocator parameters; it is called before
    // training starts its threads, with constant arguments glibc accepts
    // (32 MiB is its largest mmap threshold on 64-bit). A rejected value
    // returns 0 and leaves the default, which is still correct.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}
