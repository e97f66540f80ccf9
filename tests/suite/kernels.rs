//! Every kernel file compiles under NVRTC for sm_80 and sm_90. Needs libnvrtc and the CUDA
//! headers (see `GPU_JOIN_CUDA_INCLUDE`), not a GPU; CI sets `GPU_JOIN_REQUIRE_NVRTC=1`.

use datafusion_gpu_join::device::compile_kernels_for_arch;

use crate::harness::{Outcome, Suite};

pub fn register(suite: &mut Suite) {
    for arch in ["compute_80", "compute_90"] {
        suite.add(format!("kernels::compile_{arch}"), move || {
            let required = std::env::var("GPU_JOIN_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
            match compile_kernels_for_arch(arch) {
                Ok(()) => Ok(Outcome::Passed),
                Err(e) if !required && e.to_string().contains("libnvrtc could not be loaded") => {
                    Ok(Outcome::Skipped("no libnvrtc on this machine".into()))
                }
                Err(e) => Err(e.to_string()),
            }
        });
    }
}
