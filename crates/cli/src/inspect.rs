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

/// `tandem quantize`: the conversion and a line per converted tensor (stderr).
pub fn quantize(input: &Path, output: &Path, ty: &str, keep: &[String]) -> Result<()> {
    use tandem_engine::requantize::{parse_target, requantize_file};
    let to = parse_target(ty).with_context(|| format!("--type {ty}: choose q4_0, q4_1, q5_0, q5_1 or q8_0"))?;
    let done = requantize_file(input, output, to, keep)?;
    let (before, after) = done.iter().fold((0, 0), |(a, b), c| (a + c.bytes_before, b + c.bytes_after));
    for c in &done {
        eprintln!("  {:<36} {} -> {}  {} -> {} bytes", c.name, c.from.name(), to.name(), c.bytes_before, c.bytes_after);
    }
    eprintln!(
        "wrote {}: {} tensors converted to {} ({:.1} MiB -> {:.1} MiB), the rest copied",
        output.display(),
        done.len(),
        to.name(),
        before as f64 / (1 << 20) as f64,
        after as f64 / (1 << 20) as f64
    );
    Ok(())
}
