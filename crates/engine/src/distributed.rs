//! Running one model over several processes (`mpirun -np N tandem ...`):
//! rank 0 loads its share of the model and runs everything a single
//! process runs (tokenizer, sampling, drafters, the scheduler, the
//! server); the other ranks load theirs and follow its forward passes (see
//! `tandem_model::shard`). The collectives go over MPI (feature `mpi`).
//!
//! Before the first forward every rank checks that it loaded the same
//! file as rank 0 (a fingerprint of the tensor table and the start of
//! every tensor's data), so a rank with another model stops the run with
//! a clear error instead of computing garbage.

use std::sync::{Arc, OnceLock};

use tandem_gguf::Gguf;
use tandem_model::shard::Collective;
use tandem_model::{Model, ModelError};

/// The group this process belongs to, when started by `mpirun` with more
/// than one rank.
static GROUP: OnceLock<Arc<dyn Collective>> = OnceLock::new();

/// The model rank 0 leads, so that its followers can be stopped at exit.
static LED: OnceLock<Arc<Model>> = OnceLock::new();

/// Use `comm` for every model loaded from now on (once per process).
pub fn join(comm: Arc<dyn Collective>) {
    let _ = GROUP.set(comm);
}

/// The group, if this process is one of several ranks.
pub fn group() -> Option<&'static Arc<dyn Collective>> {
    GROUP.get().filter(|g| g.size() > 1)
}

/// Whether this process is a follower (a rank other than 0).
pub fn is_follower() -> bool {
    group().is_some_and(|g| g.rank() != 0)
}

/// Load this rank's share of the model in `g` and check that every rank
/// loaded the same file.
pub fn load_split(g: Arc<Gguf>, comm: Arc<dyn Collective>) -> Result<Model, ModelError> {
    handshake(&g, &*comm)?;
    Model::from_gguf_shard(g, comm)
}

/// Rank 0: remember the model whose followers [`finish`] stops.
pub(crate) fn lead(model: &Arc<Model>) {
    if model.is_split() && !is_follower() {
        let _ = LED.set(model.clone());
    }
}

/// Rank 0 at exit: tell the followers to return (and, with
/// `TANDEM_COMM_STATS` set, print what the collectives cost).
pub fn finish() {
    if let Some(m) = LED.get() {
        if std::env::var_os("TANDEM_COMM_STATS").is_some() {
            if let Some(g) = group() {
                let s = g.stats();
                eprintln!(
                    "tensor parallel, rank 0 of {}: {} all-gathers, {} broadcasts, {:.1} MB received, {:.3} s in collectives",
                    g.size(),
                    s.gathers,
                    s.broadcasts,
                    s.bytes_in as f64 / 1e6,
                    s.seconds
                );
            }
        }
        if let Err(e) = m.stop_followers() {
            eprintln!("tandem: stopping the other ranks: {e}");
        }
    }
}

/// A fingerprint of a model file: its size, tensor table and the first
/// bytes of every tensor (FNV-1a).
fn fingerprint(g: &Gguf) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= x as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    };
    eat(&(g.bytes().len() as u64).to_le_bytes());
    for t in &g.tensors {
        eat(t.name.as_bytes());
        t.dims.iter().for_each(|d| eat(&d.to_le_bytes()));
        eat(&(t.ty as u32).to_le_bytes());
        let data = g.tensor_data(t);
        eat(&data[..data.len().min(64)]);
    }
    h
}

/// Every rank's fingerprint to every rank; an error on any rank whose file
/// differs from rank 0's (rank 0's error names them).
fn handshake(g: &Gguf, comm: &dyn Collective) -> Result<(), ModelError> {
    let f = fingerprint(g);
    let mine = [f32::from_bits(f as u32), f32::from_bits((f >> 32) as u32)];
    let n = comm.size();
    let mut all = vec![0f32; 2 * n];
    comm.all_gather(&mine, &vec![2; n], &mut all)?;
    let of = |r: usize| all[2 * r].to_bits() as u64 | (all[2 * r + 1].to_bits() as u64) << 32;
    let differ: Vec<usize> = (1..n).filter(|&r| of(r) != of(0)).collect();
    match (differ.is_empty(), comm.rank()) {
        (true, _) => Ok(()),
        (false, 0) => Err(ModelError::Shard(format!("rank(s) {differ:?} loaded a different model file than rank 0"))),
        (false, r) => Err(ModelError::Shard(format!("rank {r}: a different model file than rank 0's"))),
    }
}

#[cfg(feature = "mpi")]
pub use self::mpi_group::MpiGroup;

/// The collectives over MPI's world communicator. Calls are serialized by
/// a lock (MPI is initialized with `Threading::Serialized`); the world
/// communicator is a handle obtained per call, so the group is `Send` and
/// `Sync` without any unsafe code.
#[cfg(feature = "mpi")]
mod mpi_group {
    use std::sync::Mutex;

    use mpi::datatype::PartitionMut;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;
    use tandem_model::shard::{Collective, CommStats};
    use tandem_model::ModelError;

    pub struct MpiGroup {
        rank: usize,
        size: usize,
        /// Serializes the calls, and counts them.
        lock: Mutex<CommStats>,
    }

    impl MpiGroup {
        /// The group of an initialized MPI (keep the `Universe` alive for
        /// as long as the group is used).
        pub fn world() -> MpiGroup {
            let w = SimpleCommunicator::world();
            MpiGroup { rank: w.rank() as usize, size: w.size() as usize, lock: Mutex::new(CommStats::default()) }
        }
    }

    impl Collective for MpiGroup {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn all_gather(&self, mine: &[f32], counts: &[usize], out: &mut [f32]) -> Result<(), ModelError> {
            if counts.len() != self.size || mine.len() != counts[self.rank] || out.len() < counts.iter().sum() {
                return Err(ModelError::Shard("all_gather: counts do not match the buffers".into()));
            }
            let c: Vec<i32> = counts.iter().map(|&n| n as i32).collect();
            let displs: Vec<i32> = c
                .iter()
                .scan(0, |at, &n| {
                    let d = *at;
                    *at += n;
                    Some(d)
                })
                .collect();
            let total = counts.iter().sum::<usize>();
            let mut st = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            let t0 = std::time::Instant::now();
            let w = SimpleCommunicator::world();
            let mut part = PartitionMut::new(&mut out[..total], c, &displs[..]);
            w.all_gather_varcount_into(mine, &mut part);
            st.gathers += 1;
            st.bytes_in += 4 * (total - mine.len()) as u64;
            st.seconds += t0.elapsed().as_secs_f64();
            Ok(())
        }
        fn broadcast(&self, frame: &mut Vec<u8>) -> Result<(), ModelError> {
            let mut st = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            let t0 = std::time::Instant::now();
            let w = SimpleCommunicator::world();
            let root = w.process_at_rank(0);
            let mut len = frame.len() as u64;
            root.broadcast_into(&mut len);
            if self.rank != 0 {
                frame.resize(len as usize, 0);
                st.bytes_in += 8 + len;
            }
            root.broadcast_into(&mut frame[..]);
            st.broadcasts += 1;
            st.seconds += t0.elapsed().as_secs_f64();
            Ok(())
        }
        fn stats(&self) -> CommStats {
            *self.lock.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}
