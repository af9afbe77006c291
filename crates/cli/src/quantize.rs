//! `tandem quantize`: a GGUF's block-quantized matrices in another type
//! (the work is `tandem_tools::requantize`).

use std::path::Path;

use anyhow::{Context, Result};

/// Convert, then print a line per converted tensor and a summary (stderr).
pub fn run(input: &Path, output: &Path, ty: &str, keep: &[String]) -> Result<()> {
    use tandem_tools::requantize::{parse_target, requantize_file};
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
