//! Link options of the `cella` binary.

fn main() {
    // Relative relocations packed as DT_RELR (glibc ≥ 2.36, binutils ≥ 2.38): the 39 000
    // pointers a position-independent `cella` relocates at every start are read from ~10 KB
    // instead of ~950 KB of RELA entries: 297 → 272 page faults at each start of the binary
    // (the CLI, the helper spawner).
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}
