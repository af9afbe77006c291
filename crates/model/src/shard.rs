//! Tensor parallelism: a model split over ranks (processes, or threads in
//! tests), each holding a share of every matrix, with output bit-identical
//! to one process.
//!
//! Every matrix is split by output columns (attention by key/value heads,
//! with their query heads and K/V rows), never by the reduction dimension:
//! a column's dot products run on one rank with the same kernel, so its
//! bits do not depend on how many ranks there are. Ranks exchange whole
//! columns with all-gathers in rank order, four per block (attention
//! output, its projection, the feed-forward's gate, its projection) and one
//! for the logits, and every rank keeps the full residual stream.
//!
//! Rank 0 (the leader) runs everything else: tokenizer, sampling, drafting,
//! scheduling. Each of its forward passes first broadcasts a frame (the
//! segments' sequence ids, start positions and tokens, and the rows that
//! get logits); the other ranks loop in [`crate::Model::follow`], run the
//! same forward on their shares and truncate their caches to the frame's
//! start positions, which is how a rejected draft rolls back everywhere.

use std::ops::Range;
use std::sync::{Barrier, Mutex};

use crate::ModelError;

/// The collective operations a split model needs, in a fixed rank order.
/// Implemented over MPI by the engine (feature `mpi`) and over threads by
/// [`LocalGroup`] for tests.
pub trait Collective: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Every rank's `mine`, concatenated in rank order, into `out`; rank r
    /// contributes `counts[r]` floats.
    fn all_gather(&self, mine: &[f32], counts: &[usize], out: &mut [f32]) -> Result<(), ModelError>;
    /// Rank 0's `frame` to every rank: sent from rank 0, received (replacing
    /// the contents) elsewhere.
    fn broadcast(&self, frame: &mut Vec<u8>) -> Result<(), ModelError>;
    /// What the collectives cost so far, where the group counts it.
    fn stats(&self) -> CommStats {
        CommStats::default()
    }
}

/// Collective calls, bytes this rank received, and seconds inside them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommStats {
    pub gathers: u64,
    pub broadcasts: u64,
    pub bytes_in: u64,
    pub seconds: f64,
}

/// `n` split into `parts` contiguous ranges whose boundaries are multiples
/// of `align` (the last range takes the remainder).
pub fn split(n: usize, parts: usize, align: usize) -> Vec<Range<usize>> {
    let units = n / align;
    let mut out = Vec::with_capacity(parts);
    for r in 0..parts {
        let a = units * r / parts * align;
        let b = if r + 1 == parts { n } else { units * (r + 1) / parts * align };
        out.push(a..b);
    }
    out
}

/// What one rank holds: ranges of every split dimension, for all ranks
/// (gathers need the others' widths).
#[derive(Debug, Clone)]
pub struct Layout {
    pub rank: usize,
    pub size: usize,
    /// Key/value heads per rank (all heads on every rank when there are
    /// fewer heads than ranks: attention is then computed everywhere).
    pub kv_heads: Vec<Range<usize>>,
    pub heads_split: bool,
    /// Columns of the residual width (attention output and FFN down
    /// projections), of the FFN width, and vocabulary rows of the head.
    pub d: Vec<Range<usize>>,
    pub ffn: Vec<Range<usize>>,
    pub vocab: Vec<Range<usize>>,
}

impl Layout {
    pub fn new(rank: usize, size: usize, n_kv_head: usize, d: usize, ffn: usize, vocab: usize) -> Result<Self, ModelError> {
        if size == 0 || rank >= size {
            return Err(ModelError::BadConfig(format!("rank {rank} of {size}")));
        }
        if d / 8 < size || ffn / 8 < size || vocab / 8 < size {
            return Err(ModelError::BadConfig(format!("a model of width {d} cannot be split over {size} ranks")));
        }
        let heads_split = n_kv_head >= size;
        let kv_heads = if heads_split { split(n_kv_head, size, 1) } else { vec![0..n_kv_head; size] };
        Ok(Layout { rank, size, kv_heads, heads_split, d: split(d, size, 8), ffn: split(ffn, size, 8), vocab: split(vocab, size, 8) })
    }

    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }
}

/// Gather a column split of an `m`-row matrix: rank r holds `m × widths[r]`
/// row-major; `out` becomes `m × Σ widths` row-major, columns in rank order.
pub fn gather_columns(
    comm: &dyn Collective,
    mine: &[f32],
    m: usize,
    widths: &[usize],
    tmp: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), ModelError> {
    let total: usize = widths.iter().sum();
    let counts: Vec<usize> = widths.iter().map(|w| w * m).collect();
    tmp.resize(m * total, 0.0);
    comm.all_gather(mine, &counts, tmp)?;
    let mut src = 0;
    let mut col = 0;
    for &w in widths {
        for i in 0..m {
            out[i * total + col..i * total + col + w].copy_from_slice(&tmp[src + i * w..src + (i + 1) * w]);
        }
        src += m * w;
        col += w;
    }
    Ok(())
}

/// One forward pass as the leader describes it to the other ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Segments (sequence id, its context size, its start position, its
    /// tokens) in row order, and the rows that get logits.
    Forward { segs: Vec<FrameSeg>, rows: Vec<usize> },
    /// The leader is done: followers return.
    Stop,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameSeg {
    pub id: u64,
    pub ctx: usize,
    pub start: usize,
    pub tokens: Vec<u32>,
}

impl Frame {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        match self {
            Frame::Stop => out.push(0),
            Frame::Forward { segs, rows } => {
                out.push(1);
                out.extend((segs.len() as u32).to_le_bytes());
                for s in segs {
                    out.extend(s.id.to_le_bytes());
                    out.extend((s.ctx as u64).to_le_bytes());
                    out.extend((s.start as u64).to_le_bytes());
                    out.extend((s.tokens.len() as u32).to_le_bytes());
                    s.tokens.iter().for_each(|t| out.extend(t.to_le_bytes()));
                }
                out.extend((rows.len() as u32).to_le_bytes());
                rows.iter().for_each(|r| out.extend((*r as u32).to_le_bytes()));
            }
        }
    }

    pub fn decode(b: &[u8]) -> Result<Frame, ModelError> {
        let bad = || ModelError::Shard("malformed frame from the leader".into());
        let mut at = 0;
        let mut take = |n: usize| -> Result<&[u8], ModelError> {
            let s = b.get(at..at + n).ok_or_else(bad)?;
            at += n;
            Ok(s)
        };
        let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap());
        let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap());
        match take(1)?[0] {
            0 => Ok(Frame::Stop),
            1 => {
                let n = u32_(take(4)?) as usize;
                let mut segs = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    let id = u64_(take(8)?);
                    let ctx = u64_(take(8)?) as usize;
                    let start = u64_(take(8)?) as usize;
                    let len = u32_(take(4)?) as usize;
                    let raw = take(len.checked_mul(4).ok_or_else(bad)?)?;
                    let tokens = raw.chunks_exact(4).map(u32_).collect();
                    segs.push(FrameSeg { id, ctx, start, tokens });
                }
                let nr = u32_(take(4)?) as usize;
                let raw = take(nr.checked_mul(4).ok_or_else(bad)?)?;
                let rows = raw.chunks_exact(4).map(|s| u32_(s) as usize).collect();
                Ok(Frame::Forward { segs, rows })
            }
            _ => Err(bad()),
        }
    }
}

/// Ranks as threads of one process, for tests: collectives through shared
/// buffers and a barrier.
pub struct LocalGroup {
    rank: usize,
    shared: std::sync::Arc<Shared>,
}

struct Shared {
    size: usize,
    barrier: Barrier,
    parts: Mutex<Vec<Vec<f32>>>,
    frame: Mutex<Vec<u8>>,
}

impl LocalGroup {
    /// `size` members, one per thread that will act as that rank.
    pub fn new(size: usize) -> Vec<LocalGroup> {
        let shared = std::sync::Arc::new(Shared {
            size,
            barrier: Barrier::new(size),
            parts: Mutex::new(vec![Vec::new(); size]),
            frame: Mutex::new(Vec::new()),
        });
        (0..size).map(|rank| LocalGroup { rank, shared: shared.clone() }).collect()
    }
}

impl Collective for LocalGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.size
    }
    fn all_gather(&self, mine: &[f32], counts: &[usize], out: &mut [f32]) -> Result<(), ModelError> {
        if mine.len() != counts[self.rank] {
            return Err(ModelError::Shard(format!("rank {}: {} floats for a count of {}", self.rank, mine.len(), counts[self.rank])));
        }
        self.shared.parts.lock().unwrap()[self.rank] = mine.to_vec();
        self.shared.barrier.wait();
        {
            let parts = self.shared.parts.lock().unwrap();
            let mut at = 0;
            for p in parts.iter() {
                out[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
        }
        self.shared.barrier.wait();
        Ok(())
    }
    fn broadcast(&self, frame: &mut Vec<u8>) -> Result<(), ModelError> {
        if self.rank == 0 {
            self.shared.frame.lock().unwrap().clone_from(frame);
        }
        self.shared.barrier.wait();
        if self.rank != 0 {
            frame.clone_from(&self.shared.frame.lock().unwrap());
        }
        self.shared.barrier.wait();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_and_align() {
        for (n, p, a) in [(576, 2, 8), (49152, 3, 8), (3, 2, 1), (1536, 2, 8), (100, 4, 8)] {
            let s = split(n, p, a);
            assert_eq!(s.len(), p);
            assert_eq!(s[0].start, 0);
            assert_eq!(s[p - 1].end, n);
            for w in s.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert_eq!(w[0].end % a, 0);
            }
        }
    }

    #[test]
    fn frames_round_trip_and_bad_ones_are_errors() {
        let f = Frame::Forward {
            segs: vec![
                FrameSeg { id: 7, ctx: 512, start: 3, tokens: vec![1, 2, 3] },
                FrameSeg { id: 9, ctx: 64, start: 0, tokens: vec![] },
            ],
            rows: vec![2, 0],
        };
        let mut b = Vec::new();
        f.encode(&mut b);
        assert_eq!(Frame::decode(&b).unwrap(), f);
        Frame::Stop.encode(&mut b);
        assert_eq!(Frame::decode(&b).unwrap(), Frame::Stop);
        f.encode(&mut b);
        for cut in 0..b.len() {
            assert!(Frame::decode(&b[..cut]).is_err(), "a frame cut at {cut} bytes");
        }
        assert!(Frame::decode(&[]).is_err());
        assert!(Frame::decode(&[7]).is_err());
    }
}
