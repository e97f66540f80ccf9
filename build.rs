//! Embeds the CUDA kernel sources (`kernels/*.cu`, `kernels/*.cuh`) into the crate, so that
//! NVRTC can compile them at run time for whatever GPU the process finds. Writes
//! `$OUT_DIR/kernel_sources.rs`, which `src/device/kernels.rs` includes.
use std::{env, fs, path::Path};

fn main() {
    // Read when the script runs, not when it is compiled: a target directory shared by two
    // checkouts reuses one compiled script.
    let manifest = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let dir = Path::new(&manifest).join("kernels");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .expect("kernels/ exists")
        .map(|e| e.expect("readable kernels/ entry").path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("cu" | "cuh")))
        .collect();
    entries.sort();
    let mut out = String::from("/// (file name, source) of every kernel file, sorted by name.\n");
    out.push_str("pub const KERNEL_SOURCES: &[(&str, &str)] = &[\n");
    for path in &entries {
        println!("cargo:rerun-if-changed={}", path.display());
        let name = path.file_name().unwrap().to_string_lossy();
        out.push_str(&format!(
            "    ({name:?}, include_str!({:?})),\n",
            path.display().to_string()
        ));
    }
    out.push_str("];\n");
    let dest = Path::new(&env::var("OUT_DIR").unwrap()).join("kernel_sources.rs");
    fs::write(dest, out).expect("write kernel_sources.rs");
}
