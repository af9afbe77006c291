/// Per-layer key/value rows for positions `0..len`, f32, laid out
/// `[position][kv_head][head_dim]`. Each layer's K and V are one allocation
/// of the whole context, reserved at first use: the OS commits its pages as
/// positions are written, so resident memory grows with use, and rows are
/// never moved (growing in steps left the heap fragmented: at `--ctx 4096`
/// the reallocations cost more resident memory than the rows themselves).
///
/// Rolling back is truncation: rows past the new length are simply forgotten.
#[derive(Debug, Clone)]
pub struct KvCache {
    n_layer: usize,
    kv_dim: usize,
    ctx: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// A saved cache state (the rows up to its length).
#[derive(Debug, Clone)]
pub struct KvSnapshot {
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvSnapshot {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl KvCache {
    pub fn new(n_layer: usize, kv_dim: usize, ctx: usize) -> Self {
        KvCache { n_layer, kv_dim, ctx, len: 0, k: vec![Vec::new(); n_layer], v: vec![Vec::new(); n_layer] }
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

    /// Bytes of K/V data currently in use.
    pub fn bytes_used(&self) -> usize {
        2 * self.n_layer * self.len * self.kv_dim * 4
    }

    /// Forget everything at positions ≥ `len`.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
            for l in 0..self.n_layer {
                self.k[l].truncate(len * self.kv_dim);
                self.v[l].truncate(len * self.kv_dim);
            }
        }
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    pub fn snapshot(&self) -> KvSnapshot {
        KvSnapshot { len: self.len, k: self.k.clone(), v: self.v.clone() }
    }

    /// Whether `s` was taken from a cache of this shape and fits its context.
    pub fn fits(&self, s: &KvSnapshot) -> bool {
        s.len <= self.ctx
            && s.k.len() == self.n_layer
            && s.v.len() == self.n_layer
            && s.k.iter().chain(&s.v).all(|rows| rows.len() == s.len * self.kv_dim)
    }

    pub fn restore(&mut self, s: &KvSnapshot) {
        self.len = s.len;
        self.k.clone_from(&s.k);
        self.v.clone_from(&s.v);
    }

    /// Hold the first `n` positions of `src` (a cache of the same shape),
    /// in place of what this cache held: a prompt prefix evaluated by
    /// another sequence, reused bit for bit.
    pub fn copy_prefix_from(&mut self, src: &KvCache, n: usize) {
        let n = n.min(src.len).min(self.ctx);
        assert!(src.n_layer == self.n_layer && src.kv_dim == self.kv_dim, "copy_prefix_from: a cache of another shape");
        for l in 0..self.n_layer {
            for (dst, from) in [(&mut self.k[l], &src.k[l]), (&mut self.v[l], &src.v[l])] {
                dst.clear();
                if dst.capacity() < self.ctx * self.kv_dim {
                    dst.reserve_exact(self.ctx * self.kv_dim);
                }
                dst.extend_from_slice(&from[..n * self.kv_dim]);
            }
        }
        self.len = n;
    }

    /// A copy of the first `n` positions (a kept prompt prefix; it holds
    /// just those rows).
    pub fn prefix(&self, n: usize) -> KvCache {
        let n = n.min(self.len);
        let rows = |v: &Vec<Vec<f32>>| v.iter().map(|r| r[..n * self.kv_dim].to_vec()).collect();
        KvCache { n_layer: self.n_layer, kv_dim: self.kv_dim, ctx: self.ctx, len: n, k: rows(&self.k), v: rows(&self.v) }
    }

    /// Append K and V rows of one layer for `m` new positions (called once per
    /// layer during a forward pass; `commit` then advances the length).
    pub(crate) fn push_layer(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        for (buf, src) in [(&mut self.k[layer], k), (&mut self.v[layer], v)] {
            let need = buf.len() + src.len();
            if need > buf.capacity() {
                // the whole context at once (first use, or a clone, which
                // holds just its rows)
                buf.reserve_exact((self.ctx * self.kv_dim).max(need) - buf.len());
            }
            buf.extend_from_slice(src);
        }
    }

    pub(crate) fn commit(&mut self, m: usize) {
        self.len += m;
    }

    pub(crate) fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }
}
