//! Minimal dump of a GGUF file's metadata and tensor table (the CLI's `inspect` is richer).
fn main() {
    let path = std::env::args().nth(1).expect("usage: gguf_dump FILE");
    let g = tandem_gguf::Gguf::open(&path).unwrap_or_else(|e| panic!("{e}"));
    for (k, v) in &g.metadata {
        println!("{k} = {}", v.display_short(8));
    }
    for t in &g.tensors {
        println!("{} {:?} {} @{}", t.name, t.dims, t.ty, t.offset);
    }
}
