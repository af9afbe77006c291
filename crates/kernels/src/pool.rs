//! A persistent worker pool for the many small parallel regions of a forward pass.
//!
//! A token step runs ~150 parallel regions (five per layer). Fork-join through a
//! general scheduler costs a wake/steal/sleep cycle per region; here workers spin
//! on a generation counter for a short while after each region (so back-to-back
//! regions cost a few hundred nanoseconds) and park on a condition variable when
//! idle for longer (so an idle engine does not burn CPU).
//!
//! Results never depend on the thread count: callers split work over independent
//! outputs (matmul columns, attention rows), never over a reduction.
//!
//! Each part `f(t, n)` of a region is *claimed* once, by its worker or — when
//! the worker has not picked it up by the time the caller finished its own part
//! (it is parked, or descheduled because other processes want the cores) — by
//! the caller, which then runs it itself. A part computes the same bits on any
//! thread, so this changes timing only; without it a busy machine turns every
//! region into a wait for a scheduler time slice.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Job = *const (dyn Fn(usize, usize) + Sync);

struct Shared {
    n: usize,
    generation: AtomicU64,
    /// Written by the caller before bumping `generation`, read by workers after
    /// observing the bump; never touched while a region is in flight.
    job: UnsafeCell<Option<Job>>,
    remaining: AtomicUsize,
    /// Per part index: the last generation whose part was claimed. Before
    /// region G starts every entry is G − 1; whoever moves it to G runs it.
    claims: Box<[AtomicU64]>,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    panicked: AtomicBool,
    spin: Duration,
}

// SAFETY: `job` is only written by the thread holding `run_lock` while no worker
// is executing a job (remaining == 0), and published by the Release store of
// `generation`; workers read it after an Acquire load of `generation`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadPool({} threads)", self.shared.n)
    }
}

/// Number of physical cores (distinct core sibling sets), falling back to the
/// logical CPU count.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut sets = std::collections::HashSet::new();
    for cpu in 0..logical {
        let p = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list");
        match std::fs::read_to_string(&p) {
            Ok(s) => {
                sets.insert(s.trim().to_string());
            }
            Err(_) => return logical,
        }
    }
    if sets.is_empty() {
        logical
    } else {
        sets.len().min(logical)
    }
}

impl ThreadPool {
    /// A pool of `n` threads in all: the caller of [`run`](Self::run) is thread 0,
    /// `n - 1` workers are spawned.
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        let spin_us = std::env::var("TANDEM_SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(1000u64);
        let shared = Arc::new(Shared {
            n,
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            remaining: AtomicUsize::new(0),
            claims: (0..n).map(|_| AtomicU64::new(0)).collect(),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            spin: Duration::from_micros(spin_us),
        });
        let handles = (1..n)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new().name(format!("tandem-worker-{i}")).spawn(move || worker(s, i)).expect("spawn worker thread")
            })
            .collect();
        ThreadPool { shared, handles, run_lock: Mutex::new(()) }
    }

    pub fn threads(&self) -> usize {
        self.shared.n
    }

    /// Run `f(thread_index, n_threads)` on every thread of the pool and wait for all.
    /// A panic in any thread is re-raised here. Re-entrant or concurrent calls run
    /// serially on the calling thread (same results, by the contract above).
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let n = self.shared.n;
        if n == 1 {
            f(0, 1);
            return;
        }
        let Ok(_guard) = self.run_lock.try_lock() else {
            for t in 0..n {
                f(t, n);
            }
            return;
        };
        let s = &*self.shared;
        let dynf: &(dyn Fn(usize, usize) + Sync) = &f;
        // SAFETY: we erase the lifetime of `f`; this function does not return
        // until every worker has finished with it (remaining == 0 below), and the
        // pointer is cleared before returning.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), Job>(dynf) };
        unsafe { *s.job.get() = Some(job) };
        s.remaining.store(n - 1, Ordering::SeqCst);
        let gen = s.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mut mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(0, n)));
        // take over the parts no worker has started
        for t in 1..n {
            if s.claims[t].compare_exchange(gen - 1, gen, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(t, n)));
                if mine.is_ok() {
                    mine = r;
                }
                s.remaining.fetch_sub(1, Ordering::Release);
            }
        }
        let mut spins = 0u32;
        while s.remaining.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::SeqCst) {
            panic!("a tandem worker thread panicked");
        }
    }
}

fn worker(s: Arc<Shared>, index: usize) {
    let mut seen = 0u64;
    loop {
        // Spin for a while, then park.
        let start = Instant::now();
        let mut k = 0u32;
        let mut g = s.generation.load(Ordering::Acquire);
        while g == seen && !s.shutdown.load(Ordering::Relaxed) {
            std::hint::spin_loop();
            k = k.wrapping_add(1);
            if k.is_multiple_of(256) && start.elapsed() > s.spin {
                let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.generation.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
                    guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(guard);
            }
            g = s.generation.load(Ordering::Acquire);
        }
        if s.shutdown.load(Ordering::SeqCst) {
            return;
        }
        seen = g;
        // claim our part of region g; if the caller already took it, the region
        // may be over (and its job gone): touch nothing
        if s.claims[index].compare_exchange(g - 1, g, Ordering::AcqRel, Ordering::Acquire).is_err() {
            continue;
        }
        // SAFETY: published before the generation bump we just observed, and
        // the region cannot end before our claimed part is done.
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            let f = unsafe { &*job };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(index, s.n))).is_err() {
                s.panicked.store(true, Ordering::SeqCst);
            }
        }
        s.remaining.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Write access to one `f32` slice shared by the threads of a pool region,
/// each writing its own disjoint cells: the one place where the kernels and
/// the model hand a mutable output to several threads at once.
#[derive(Clone, Copy)]
pub struct DisjointSlice<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: the slice is borrowed mutably for 'a, so nothing else touches it;
// the methods that write require their callers to keep threads on disjoint
// cells.
unsafe impl Send for DisjointSlice<'_> {}
unsafe impl Sync for DisjointSlice<'_> {}

impl<'a> DisjointSlice<'a> {
    pub fn new(s: &'a mut [f32]) -> Self {
        DisjointSlice { ptr: s.as_mut_ptr(), len: s.len(), _borrow: std::marker::PhantomData }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Cells `range` as a mutable slice (panics when out of bounds).
    ///
    /// # Safety
    /// While the returned slice lives, no other thread or reference reads or
    /// writes any cell of `range`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, range: std::ops::Range<usize>) -> &'a mut [f32] {
        assert!(range.start <= range.end && range.end <= self.len, "DisjointSlice: {range:?} out of 0..{}", self.len);
        // SAFETY: in bounds (checked), and exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.end - range.start) }
    }

    /// Write cell `i` (checked only in debug builds: this is the store of
    /// every matmul output).
    ///
    /// # Safety
    /// `i < self.len()`, and no other thread reads or writes cell `i` during
    /// the region.
    #[inline(always)]
    pub unsafe fn write(&self, i: usize, v: f32) {
        debug_assert!(i < self.len, "DisjointSlice: cell {i} out of 0..{}", self.len);
        // SAFETY: in bounds and exclusive by the caller's contract.
        unsafe { *self.ptr.add(i) = v };
    }
}

impl ThreadPool {
    /// Run `out.len() / len` units of work over the pool's threads, unit `u`
    /// writing piece `piece(u)` of `out` (pieces of `len` cells, in order).
    /// The units are divided among the threads in contiguous ranges, so a
    /// thread may order them for its caches through `piece`; `init` makes
    /// each thread's scratch state. Panics unless `piece` maps the units one
    /// to one onto the pieces, which is what makes the writes disjoint.
    pub fn run_pieces<S>(
        &self,
        out: &mut [f32],
        len: usize,
        piece: impl Fn(usize) -> usize + Sync,
        init: impl Fn() -> S + Sync,
        f: impl Fn(&mut S, usize, &mut [f32]) + Sync,
    ) {
        let units = out.len().checked_div(len).unwrap_or(0);
        assert_eq!(units * len, out.len(), "run_pieces: output is not whole pieces");
        let mut taken = vec![false; units];
        for u in 0..units {
            let p = piece(u);
            assert!(p < units && !taken[p], "run_pieces: piece({u}) = {p} is out of range or taken twice");
            taken[p] = true;
        }
        let out = DisjointSlice::new(out);
        self.run(|t, nt| {
            let mut state = init();
            for u in split_range(units, nt, t, 1) {
                let p = piece(u);
                // SAFETY: `piece` is one to one (checked above) and the unit
                // ranges of the threads are disjoint, so no two live slices
                // share a cell.
                let chunk = unsafe { out.slice_mut(p * len..(p + 1) * len) };
                f(&mut state, u, chunk);
            }
        });
    }
}

/// Split `0..n` into `parts` contiguous ranges whose starts are multiples of `align`.
pub fn split_range(n: usize, parts: usize, index: usize, align: usize) -> std::ops::Range<usize> {
    let units = n.div_ceil(align);
    let per = units / parts;
    let extra = units % parts;
    let start_u = index * per + index.min(extra);
    let end_u = start_u + per + usize::from(index < extra);
    (start_u * align).min(n)..(end_u * align).min(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_pieces_writes_each_piece_once() {
        for threads in 1..=3 {
            let pool = ThreadPool::new(threads);
            let mut out = vec![0f32; 12 * 4];
            // head-major order over 3 rows × 4 heads, as attention does
            pool.run_pieces(
                &mut out,
                4,
                |u| (u % 3) * 4 + u / 3,
                || 0usize,
                |n, u, c| {
                    *n += 1;
                    c.iter_mut().for_each(|v| *v += u as f32 + 1.0);
                },
            );
            for u in 0..12 {
                let p = (u % 3) * 4 + u / 3;
                assert!(out[p * 4..(p + 1) * 4].iter().all(|&v| v == u as f32 + 1.0), "threads {threads} unit {u}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "taken twice")]
    fn run_pieces_rejects_a_map_that_is_not_one_to_one() {
        let pool = ThreadPool::new(2);
        let mut out = vec![0f32; 8];
        pool.run_pieces(&mut out, 2, |u| u / 2, || (), |_, _, _| {});
    }

    #[test]
    fn runs_every_index_once() {
        for n in 1..=4 {
            let pool = ThreadPool::new(n);
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(|t, nt| {
                    assert_eq!(nt, n);
                    hits[t].fetch_add(1, Ordering::SeqCst);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 1));
            }
        }
    }

    #[test]
    fn wakes_after_parking() {
        std::env::set_var("TANDEM_SPIN_US", "10");
        let pool = ThreadPool::new(2);
        let c = AtomicUsize::new(0);
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(5));
            pool.run(|_, _| {
                c.fetch_add(1, Ordering::SeqCst);
            });
        }
        assert_eq!(c.load(Ordering::SeqCst), 10);
    }

    #[test]
    fn worker_panic_propagates() {
        let pool = ThreadPool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(|t, _| {
                if t == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        // the pool still works afterwards
        let c = AtomicUsize::new(0);
        pool.run(|_, _| {
            c.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(c.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn split_covers_range() {
        for n in [0, 1, 7, 64, 577] {
            for parts in 1..5 {
                let mut next = 0;
                for i in 0..parts {
                    let r = split_range(n, parts, i, 4);
                    assert_eq!(r.start, next.min(n));
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
