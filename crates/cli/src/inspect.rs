use std::path::Path;

use anyhow::{Context, Result};
use tandem_gguf::Gguf;

pub fn run(path: &Path, all: bool) -> Result<()> {
    let g = Gguf::open(path).with_context(|| format!("reading {}", path.display()))?;
    println!("file: {}", path.display());
    println!("GGUF version {}, alignment {}, {} bytes, data at {}", g.version, g.alignment, g.file_size(), g.data_offset());
    println!("\nmetadata ({} keys):", g.metadata.len());
    for (k, v) in &g.metadata {
        println!("  {k} = {}", v.display_short(if all { usize::MAX } else { 8 }));
    }
    println!("\ntensors ({}):", g.tensors.len());
    println!("  {:<36} {:<6} {:>22} {:>12} {:>12}", "name", "type", "shape", "bytes", "offset");
    let mut total = 0u64;
    for t in &g.tensors {
        let shape = t.dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(" x ");
        println!("  {:<36} {:<6} {:>22} {:>12} {:>12}", t.name, t.ty.name(), shape, t.size, t.offset);
        total += t.size;
    }
    println!("\ntotal tensor bytes: {total} ({:.1} MiB)", total as f64 / (1 << 20) as f64);
    Ok(())
}
