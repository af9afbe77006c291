/// Per-layer key/value rows for positions `0..len`, f32 or f16
/// ([`KvType`]), each row laid out `[kv_head][head_dim]`.
///
/// A global layer holds every position: one allocation of the whole context,
/// reserved at first use, so the OS commits its pages as positions are
/// written and rows are never moved (growing in steps left the heap
/// fragmented: at `--ctx 4096` the reallocations cost more resident memory
/// than the rows themselves).
///
/// A sliding-window layer (a row at position p attends to p − W + 1 ..= p)
/// holds a ring of `cap` rows, position p in slot p mod cap. The ring keeps
/// the window plus the rows of the widest forward pass seen (at least
/// [`RING_EXTRA`]): those rows are written before any of them attends, and
/// a rejected draft must leave the window of the row before it intact.
/// The ring grows when a wider pass comes.
///
/// Rolling back is truncation: rows past the new length are simply
/// forgotten. A sliding-window layer can only forget back to where its ring
/// still holds the new last row's window ([`KvCache::keepable`]); further
/// back, the cache starts over from empty.
#[derive(Debug)]
pub struct KvCache {
    /// Names the sequence to the other ranks of a split model: unique in
    /// this process, and new whenever the rows stop being a continuation of
    /// what the ranks saw (a clone, a restored snapshot, a copied prefix),
    /// so a follower never extends rows it does not hold.
    id: u64,
    n_layer: usize,
    kv_dim: usize,
    ctx: usize,
    len: usize,
    /// The most positions the global layers' buffers have held: their pages
    /// stay committed after a rollback, so this, not `len`, is what they
    /// occupy in memory.
    peak: usize,
    ty: KvType,
    k: Vec<Buf>,
    v: Vec<Buf>,
    /// Per layer: its sliding window, if it has one.
    windows: Vec<Option<usize>>,
    /// Per layer: ring capacity in positions (0 for a global layer, and for
    /// a ring not allocated yet).
    cap: Vec<usize>,
    /// Per layer: the first position whose rows its ring still holds (the
    /// rows before it were overwritten).
    held_from: Vec<usize>,
}

/// Rows a sliding-window ring holds beyond its window to begin with: a
/// verify pass of up to 64 rows (rings are also multiples of this, so a
/// block of 64 positions aligned to 64 never wraps).
pub const RING_EXTRA: usize = 64;

/// How a cache keeps its K/V rows.
///
/// f16 halves what attention reads per cached position (llama.cpp keeps
/// its cache in f16 by default). Rows are rounded to nearest even once,
/// as they are written, so every later read of a row sees the same value:
/// a cache type changes a model's numbers, never whether a row depends on
/// the batch it was computed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F32,
    F16,
}

impl KvType {
    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            _ => Err(format!("unknown K/V cache type {s:?} (known: f32, f16)")),
        }
    }
}

/// One layer's K or V values.
#[derive(Debug, Clone)]
enum Buf {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl Buf {
    fn new(ty: KvType) -> Self {
        match ty {
            KvType::F32 => Buf::F32(Vec::new()),
            KvType::F16 => Buf::F16(Vec::new()),
        }
    }
    fn zeros(ty: KvType, n: usize) -> Self {
        match ty {
            KvType::F32 => Buf::F32(vec![0.0; n]),
            KvType::F16 => Buf::F16(vec![0; n]),
        }
    }
    fn len(&self) -> usize {
        match self {
            Buf::F32(b) => b.len(),
            Buf::F16(b) => b.len(),
        }
    }
    fn capacity(&self) -> usize {
        match self {
            Buf::F32(b) => b.capacity(),
            Buf::F16(b) => b.capacity(),
        }
    }
    fn reserve_exact(&mut self, n: usize) {
        match self {
            Buf::F32(b) => b.reserve_exact(n),
            Buf::F16(b) => b.reserve_exact(n),
        }
    }
    fn truncate(&mut self, n: usize) {
        match self {
            Buf::F32(b) => b.truncate(n),
            Buf::F16(b) => b.truncate(n),
        }
    }
    /// Append f32 values, rounded to this buffer's type.
    fn extend_f32(&mut self, src: &[f32]) {
        match self {
            Buf::F32(b) => b.extend_from_slice(src),
            Buf::F16(b) => {
                let at = b.len();
                b.resize(at + src.len(), 0);
                tandem_kernels::ops::f32_to_f16(src, &mut b[at..]);
            }
        }
    }
    /// Overwrite values `at..at + src.len()` with f32 values, rounded.
    fn write_f32(&mut self, at: usize, src: &[f32]) {
        match self {
            Buf::F32(b) => b[at..at + src.len()].copy_from_slice(src),
            Buf::F16(b) => tandem_kernels::ops::f32_to_f16(src, &mut b[at..at + src.len()]),
        }
    }
    /// Values `range` of this buffer, as a new buffer of the same type.
    fn slice(&self, range: std::ops::Range<usize>) -> Buf {
        match self {
            Buf::F32(b) => Buf::F32(b[range].to_vec()),
            Buf::F16(b) => Buf::F16(b[range].to_vec()),
        }
    }
    /// Replace the contents with the first `n` values of `src` (same type),
    /// keeping at least `reserve` values of capacity.
    fn assign_prefix(&mut self, src: &Buf, n: usize, reserve: usize) {
        match (self, src) {
            (Buf::F32(d), Buf::F32(s)) => assign(d, &s[..n], reserve),
            (Buf::F16(d), Buf::F16(s)) => assign(d, &s[..n], reserve),
            _ => unreachable!("caches of one shape hold one K/V type"),
        }
    }
    /// Copy `n` values from `src` at `from` to this buffer at `to` (same type).
    fn copy_from(&mut self, to: usize, src: &Buf, from: usize, n: usize) {
        match (self, src) {
            (Buf::F32(d), Buf::F32(s)) => d[to..to + n].copy_from_slice(&s[from..from + n]),
            (Buf::F16(d), Buf::F16(s)) => d[to..to + n].copy_from_slice(&s[from..from + n]),
            _ => unreachable!("one cache holds one K/V type"),
        }
    }
    fn view(&self) -> Rows<'_> {
        match self {
            Buf::F32(b) => Rows::F32(b),
            Buf::F16(b) => Rows::F16(b),
        }
    }
}

fn assign<T: Copy>(d: &mut Vec<T>, s: &[T], reserve: usize) {
    d.clear();
    if d.capacity() < reserve {
        d.reserve_exact(reserve);
    }
    d.extend_from_slice(s);
}

/// One layer's cached K or V values as attention reads them.
#[derive(Clone, Copy)]
pub(crate) enum Rows<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
}

impl Rows<'_> {
    /// [`ops::dot_rows`](tandem_kernels::ops::dot_rows) over the rows from
    /// value `at` on.
    #[inline]
    pub(crate) fn dot_rows(&self, q: &[f32], at: usize, stride: usize, offset: usize, scale: f32, out: &mut [f32]) {
        match self {
            Rows::F32(r) => tandem_kernels::ops::dot_rows(q, &r[at..], stride, offset, scale, out),
            Rows::F16(r) => tandem_kernels::ops::dot_rows_f16(q, &r[at..], stride, offset, scale, out),
        }
    }

    /// [`ops::axpy_rows`](tandem_kernels::ops::axpy_rows) over the rows from
    /// value `at` on.
    #[inline]
    pub(crate) fn axpy_rows(&self, y: &mut [f32], p: &[f32], at: usize, stride: usize, offset: usize) {
        match self {
            Rows::F32(r) => tandem_kernels::ops::axpy_rows(y, p, &r[at..], stride, offset),
            Rows::F16(r) => tandem_kernels::ops::axpy_rows_f16(y, p, &r[at..], stride, offset),
        }
    }

    /// [`ops::dot_rows2`](tandem_kernels::ops::dot_rows2): two queries over
    /// the same rows from value `at` on, each with the bits of
    /// [`Rows::dot_rows`].
    #[inline]
    pub(crate) fn dot_rows2(&self, q: [&[f32]; 2], at: usize, stride: usize, offset: usize, scale: f32, out: [&mut [f32]; 2]) {
        match self {
            Rows::F32(r) => tandem_kernels::ops::dot_rows2(q, &r[at..], stride, offset, scale, out),
            Rows::F16(r) => tandem_kernels::ops::dot_rows2(q, &r[at..], stride, offset, scale, out),
        }
    }

    /// [`ops::axpy_rows2`](tandem_kernels::ops::axpy_rows2): two outputs
    /// over the same rows from value `at` on, each with the bits of
    /// [`Rows::axpy_rows`].
    #[inline]
    pub(crate) fn axpy_rows2(&self, y: [&mut [f32]; 2], p: [&[f32]; 2], at: usize, stride: usize, offset: usize) {
        match self {
            Rows::F32(r) => tandem_kernels::ops::axpy_rows2(y, p, &r[at..], stride, offset),
            Rows::F16(r) => tandem_kernels::ops::axpy_rows2(y, p, &r[at..], stride, offset),
        }
    }
}

/// A saved cache state.
#[derive(Debug, Clone)]
pub struct KvSnapshot(KvCache);

impl KvSnapshot {
    pub fn len(&self) -> usize {
        self.0.len
    }
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
}

/// One layer's cached rows as attention reads them.
#[derive(Clone, Copy)]
pub(crate) struct LayerRows<'a> {
    pub(crate) k: Rows<'a>,
    pub(crate) v: Rows<'a>,
    kv_dim: usize,
    /// Ring capacity (0: positions are rows).
    cap: usize,
    window: Option<usize>,
}

impl LayerRows<'_> {
    /// The first position a row at `pos` attends to.
    #[inline]
    pub(crate) fn first(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// Positions `a..b` as runs contiguous in memory, in order:
    /// `f(run_start, run_end, float offset of run_start's row)`. A global
    /// layer gives one run; a ring gives two where the range wraps.
    #[inline]
    pub(crate) fn runs(&self, a: usize, b: usize, mut f: impl FnMut(usize, usize, usize)) {
        if a >= b {
            return;
        }
        if self.cap == 0 {
            return f(a, b, a * self.kv_dim);
        }
        let mut p = a;
        while p < b {
            let slot = p % self.cap;
            let end = b.min(p + self.cap - slot);
            f(p, end, slot * self.kv_dim);
            p = end;
        }
    }
}

impl Clone for KvCache {
    fn clone(&self) -> Self {
        KvCache {
            id: next_id(),
            n_layer: self.n_layer,
            kv_dim: self.kv_dim,
            ctx: self.ctx,
            len: self.len,
            peak: self.len,
            ty: self.ty,
            k: self.k.clone(),
            v: self.v.clone(),
            windows: self.windows.clone(),
            cap: self.cap.clone(),
            held_from: self.held_from.clone(),
        }
    }
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

impl KvCache {
    /// A cache of f32 rows whose layers all hold every position.
    pub fn new(n_layer: usize, kv_dim: usize, ctx: usize) -> Self {
        Self::with_windows(kv_dim, ctx, &vec![None; n_layer], KvType::F32)
    }

    /// A cache with one entry of `windows` per layer: `Some(w)` for a layer
    /// that attends over a sliding window of `w` positions.
    pub fn with_windows(kv_dim: usize, ctx: usize, windows: &[Option<usize>], ty: KvType) -> Self {
        let n_layer = windows.len();
        let windows = windows.iter().map(|w| w.filter(|&w| w > 0)).collect();
        KvCache {
            id: next_id(),
            n_layer,
            kv_dim,
            ctx,
            len: 0,
            peak: 0,
            ty,
            k: vec![Buf::new(ty); n_layer],
            v: vec![Buf::new(ty); n_layer],
            windows,
            cap: vec![0; n_layer],
            held_from: vec![0; n_layer],
        }
    }

    /// The sequence's id (what a split model's frames name it by).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Positions currently held.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Maximum positions (the context size).
    pub fn ctx(&self) -> usize {
        self.ctx
    }
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }
    pub fn n_layer(&self) -> usize {
        self.n_layer
    }
    /// How the rows are kept.
    pub fn kv_type(&self) -> KvType {
        self.ty
    }
    /// Per layer: its sliding window, if it has one.
    pub fn windows(&self) -> &[Option<usize>] {
        &self.windows
    }

    /// Rows currently held by layer `l` (the positions of a global layer,
    /// at most the ring of a sliding-window one).
    pub fn rows_held(&self, l: usize) -> usize {
        match self.windows[l] {
            None => self.len,
            Some(_) => self.len.saturating_sub(self.held_from[l]).min(self.cap[l]),
        }
    }

    /// Bytes of K/V data currently in use.
    pub fn bytes_used(&self) -> usize {
        (0..self.n_layer).map(|l| 2 * self.rows_held(l) * self.kv_dim * self.ty.bytes()).sum()
    }

    /// Bytes of memory K/V rows occupy (rings in full; a global layer's
    /// reservation counts only as its rows are written, and rows rolled
    /// back still count: their pages stay committed).
    pub fn bytes_reserved(&self) -> usize {
        (0..self.n_layer)
            .map(|l| match self.windows[l] {
                None => 2 * self.peak * self.kv_dim * self.ty.bytes(),
                Some(_) => 2 * self.cap[l] * self.kv_dim * self.ty.bytes(),
            })
            .sum()
    }

    /// The longest length `≤ n` this cache can roll back to exactly: `n`
    /// itself when every sliding-window layer still holds the window of
    /// position `n − 1`'s successor, else 0 (start over).
    pub fn keepable(&self, n: usize) -> usize {
        let n = n.min(self.len);
        let ok = (0..self.n_layer).all(|l| match self.windows[l] {
            None => true,
            // the first position the next row needs vs the oldest still held
            Some(w) => n == 0 || (n + 1).saturating_sub(w) >= self.held_from[l],
        });
        if ok {
            n
        } else {
            0
        }
    }

    /// Forget everything at positions ≥ `len` (clamped to
    /// [`keepable`](Self::keepable): a sliding-window cache asked to go back
    /// further than its rings reach starts over from empty).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            let len = self.keepable(len);
            self.len = len;
            if len == 0 {
                self.held_from.iter_mut().for_each(|h| *h = 0);
            }
            for l in 0..self.n_layer {
                if self.windows[l].is_none() {
                    self.k[l].truncate(len * self.kv_dim);
                    self.v[l].truncate(len * self.kv_dim);
                }
            }
        }
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    pub fn snapshot(&self) -> KvSnapshot {
        KvSnapshot(self.clone())
    }

    /// Whether `s` was taken from a cache of this shape and fits its context.
    pub fn fits(&self, s: &KvSnapshot) -> bool {
        let s = &s.0;
        s.len <= self.ctx && s.n_layer == self.n_layer && s.kv_dim == self.kv_dim && s.windows == self.windows && s.ty == self.ty
    }

    pub fn restore(&mut self, s: &KvSnapshot) {
        let ctx = self.ctx;
        *self = s.0.clone();
        self.ctx = ctx;
    }

    /// Hold the first `n` positions of `src` (a cache of the same shape),
    /// in place of what this cache held: a prompt prefix evaluated by
    /// another sequence, reused bit for bit. `n` is clamped to what `src`
    /// can keep ([`keepable`](Self::keepable)).
    pub fn copy_prefix_from(&mut self, src: &KvCache, n: usize) {
        let n = src.keepable(n.min(self.ctx));
        assert!(
            src.n_layer == self.n_layer && src.kv_dim == self.kv_dim && src.windows == self.windows && src.ty == self.ty,
            "copy_prefix_from: a cache of another shape"
        );
        for l in 0..self.n_layer {
            let ring = self.windows[l].is_some();
            let rows = if ring { src.cap[l] } else { n };
            let reserve = if ring { 0 } else { self.ctx * self.kv_dim };
            for (dst, from) in [(&mut self.k[l], &src.k[l]), (&mut self.v[l], &src.v[l])] {
                dst.assign_prefix(from, rows * self.kv_dim, reserve);
            }
            self.cap[l] = if ring { src.cap[l] } else { 0 };
            self.held_from[l] = if n == 0 { 0 } else { src.held_from[l] };
        }
        self.len = n;
        self.peak = self.peak.max(n);
        self.id = next_id();
    }

    /// A copy of the first `n` positions (a kept prompt prefix; it holds
    /// just those rows, or its rings), `n` clamped like
    /// [`copy_prefix_from`](Self::copy_prefix_from).
    pub fn prefix(&self, n: usize) -> KvCache {
        let n = self.keepable(n);
        let rows = |l: usize, v: &Buf| match self.windows[l] {
            None => v.slice(0..n * self.kv_dim),
            Some(_) => v.clone(),
        };
        KvCache {
            id: next_id(),
            n_layer: self.n_layer,
            kv_dim: self.kv_dim,
            ctx: self.ctx,
            len: n,
            peak: n,
            ty: self.ty,
            k: self.k.iter().enumerate().map(|(l, v)| rows(l, v)).collect(),
            v: self.v.iter().enumerate().map(|(l, v)| rows(l, v)).collect(),
            windows: self.windows.clone(),
            cap: self.cap.clone(),
            held_from: if n == 0 { vec![0; self.n_layer] } else { self.held_from.clone() },
        }
    }

    /// Rows a sliding-window layer's ring holds for `ctx` positions when
    /// the widest forward pass is `widest` rows.
    pub fn ring_rows(window: usize, ctx: usize, widest: usize) -> usize {
        round_up((window.max(1) - 1 + widest.max(RING_EXTRA)).min(ctx.max(1)), RING_EXTRA)
    }

    /// Make layer `l`'s ring hold its window plus `m` new rows, re-laying
    /// out the positions it holds when it grows.
    fn ring_fit(&mut self, l: usize, w: usize, m: usize) {
        let need = Self::ring_rows(w, self.ctx, m);
        let old = self.cap[l];
        if need <= old {
            return;
        }
        let kvd = self.kv_dim;
        let first = self.held_from[l].max(self.len.saturating_sub(old));
        for buf in [&mut self.k[l], &mut self.v[l]] {
            let mut grown = Buf::zeros(self.ty, need * kvd);
            for p in first..self.len {
                grown.copy_from((p % need) * kvd, buf, (p % old) * kvd, kvd);
            }
            *buf = grown;
        }
        self.cap[l] = need;
    }

    /// Append K and V rows of one layer for `m` new positions (called once per
    /// layer during a forward pass; `commit` then advances the length).
    pub(crate) fn push_layer(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let kvd = self.kv_dim;
        let m = k.len() / kvd.max(1);
        if let Some(w) = self.windows[layer] {
            self.ring_fit(layer, w, m);
            let cap = self.cap[layer];
            for (buf, src) in [(&mut self.k[layer], k), (&mut self.v[layer], v)] {
                for (i, row) in src.chunks_exact(kvd).enumerate() {
                    buf.write_f32(((self.len + i) % cap) * kvd, row);
                }
            }
            self.held_from[layer] = self.held_from[layer].max((self.len + m).saturating_sub(cap));
            return;
        }
        for (buf, src) in [(&mut self.k[layer], k), (&mut self.v[layer], v)] {
            let need = buf.len() + src.len();
            if need > buf.capacity() {
                // the whole context at once (first use, or a clone, which
                // holds just its rows)
                buf.reserve_exact((self.ctx * kvd).max(need) - buf.len());
            }
            buf.extend_f32(src);
        }
    }

    pub(crate) fn commit(&mut self, m: usize) {
        self.len += m;
        self.peak = self.peak.max(self.len);
    }

    /// Layer `layer`'s K and V rows of positions `0..len` (a cache of f32
    /// rows, made by [`new`](Self::new), whose layers all hold every
    /// position).
    pub(crate) fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        debug_assert!(self.windows[layer].is_none(), "layer(): a sliding-window layer");
        match (&self.k[layer], &self.v[layer]) {
            (Buf::F32(k), Buf::F32(v)) => (k, v),
            _ => unreachable!("layer(): a cache of f16 rows"),
        }
    }

    /// Layer `layer`'s rows as attention reads them.
    pub(crate) fn rows(&self, layer: usize) -> LayerRows<'_> {
        LayerRows {
            k: self.k[layer].view(),
            v: self.v[layer].view(),
            kv_dim: self.kv_dim,
            cap: self.cap[layer],
            window: self.windows[layer],
        }
    }
}
