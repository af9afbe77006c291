//! include/tandem.h is what cbindgen makes of this crate now. With
//! TANDEM_BLESS=1 the test rewrites it instead.

use std::path::Path;

#[test]
fn header_is_fresh() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = crate_dir.join("../../include/tandem.h");
    if std::env::var_os("TANDEM_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/tandem.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/tandem.h is stale: regenerate it with `TANDEM_BLESS=1 cargo test -p tandem-capi --test header`"
    );
}
