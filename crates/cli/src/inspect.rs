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

/// Compare the tensors of two GGUF files, ignoring their metadata (a
/// reproduction records its own command line and training time).
pub fn same_tensors(a: &Path, b: &Path) -> Result<()> {
    let open = |p: &Path| Gguf::open(p).with_context(|| format!("reading {}", p.display()));
    let (ga, gb) = (open(a)?, open(b)?);
    let mut differ = Vec::new();
    for t in &ga.tensors {
        match gb.tensors.iter().find(|u| u.name == t.name) {
            Some(u) if u.ty == t.ty && u.dims == t.dims && ga.tensor_data(t) == gb.tensor_data(u) => {}
            _ => differ.push(t.name.clone()),
        }
    }
    differ.extend(gb.tensors.iter().filter(|u| !ga.tensors.iter().any(|t| t.name == u.name)).map(|u| u.name.clone()));
    anyhow::ensure!(differ.is_empty(), "{} and {}: {} tensors differ: {}", a.display(), b.display(), differ.len(), differ.join(", "));
    println!("{} and {}: the same {} tensors (names, types, shapes, bytes)", a.display(), b.display(), ga.tensors.len());
    Ok(())
}
