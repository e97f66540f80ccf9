//! [`CudaDevice`]: one GPU's context with every kernel module loaded, shared per process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use datafusion::common::{Result, exec_datafusion_err};

use super::kernels::{MODULES, compile, nvrtc_present};
use super::memory::{driver_error, keep_freed_memory};
use super::staging::StagingPool;

/// A GPU ready to run the join kernels.
#[derive(Debug)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    modules: HashMap<&'static str, Arc<CudaModule>>,
    name: String,
    arch: String,
    staging: StagingPool,
}

impl CudaDevice {
    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The virtual architecture the kernels were compiled for, e.g. `compute_90`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The pinned staging buffers of this device.
    pub fn staging(&self) -> &StagingPool {
        &self.staging
    }

    /// This device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// A new stream of this device's context.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx
            .new_stream()
            .map_err(|e| driver_error(e, "create stream"))
    }

    /// A kernel by module file and function name.
    pub fn function(&self, module: &str, name: &str) -> Result<CudaFunction> {
        let m = self
            .modules
            .get(module)
            .ok_or_else(|| exec_datafusion_err!("kernel module {module} not loaded"))?;
        m.load_function(name)
            .map_err(|e| exec_datafusion_err!("kernel {name} missing from {module}: {e:?}"))
    }

    /// Free and total device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.ctx
            .mem_get_info()
            .map_err(|e| driver_error(e, "query memory"))
    }

    fn open(ordinal: usize) -> Result<Self> {
        probe_cuda()?;
        nvrtc_present()?;
        let count = CudaContext::device_count().map_err(|e| driver_error(e, "count devices"))?;
        if ordinal >= count.max(0) as usize {
            return Err(exec_datafusion_err!(
                "no CUDA device {ordinal}: this machine has {count}"
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_error(e, "create context"))?;
        keep_freed_memory(&ctx)?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_error(e, "query compute capability"))?;
        let arch = format!("compute_{major}{minor}");
        let name = ctx.name().map_err(|e| driver_error(e, "query name"))?;
        let mut modules = HashMap::new();
        for file in MODULES {
            let module = ctx
                .load_module(compile(file, &arch)?)
                .map_err(|e| driver_error(e, "load kernel module"))?;
            modules.insert(*file, module);
        }
        let device = Self {
            ctx,
            modules,
            name,
            arch,
            staging: StagingPool::default(),
        };
        // The scatter stages a whole tile in shared memory (~46 KB a block): ask for the
        // largest shared-memory carveout, so that several blocks share an SM.
        for name in SHARED_MEMORY_KERNELS {
            device
                .function("partition.cu", name)?
                .set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    100,
                )
                .map_err(|e| driver_error(e, "set shared memory carveout"))?;
        }
        Ok(device)
    }
}

/// Kernels of partition.cu that want the largest shared-memory carveout.
const SHARED_MEMORY_KERNELS: &[&str] = &["radix_scatter_u32", "radix_scatter_u64"];

/// Checks that libcuda loads and has at least one device, without panicking.
pub fn probe_cuda() -> Result<()> {
    // SAFETY: only probes whether the shared library can be opened; calls nothing in it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(exec_datafusion_err!(
            "libcuda could not be loaded: no NVIDIA driver"
        ));
    }
    let count = CudaContext::device_count().map_err(|e| driver_error(e, "count devices"))?;
    if count <= 0 {
        return Err(exec_datafusion_err!(
            "the NVIDIA driver reports no CUDA device"
        ));
    }
    Ok(())
}

/// The process-wide [`CudaDevice`] for `ordinal`, opened (and its kernels compiled) on first use.
pub fn cuda_device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
    let devices = DEVICES.get_or_init(Default::default);
    let mut guard = devices
        .lock()
        .map_err(|_| exec_datafusion_err!("device table lock poisoned"))?;
    if let Some(d) = guard.get(&ordinal) {
        return Ok(Arc::clone(d));
    }
    let device = Arc::new(CudaDevice::open(ordinal)?);
    guard.insert(ordinal, Arc::clone(&device));
    Ok(device)
}
