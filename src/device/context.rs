//! [`CudaDevice`]: one GPU, shared per process: its context with every kernel module loaded,
//! its device memory pool and [`MemoryBudget`], and its pinned host memory pools (pinned once,
//! when the device opens: 4 GiB of pages for staging and output).
//!
//! The crate orders work between its streams itself, with events (see `backend`), and never
//! uses cudarc's tracked buffer types, so the context's automatic event tracking is turned off:
//! it would add an event record and wait per kernel argument for nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use cudarc::driver::sys::{CUevent_flags, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream};
use datafusion::common::{Result, exec_datafusion_err};

use super::budget::MemoryBudget;
use super::host_memory::HostPool;
use super::kernels::{MODULES, compile, compile_filtered, nvrtc_present};
use super::memory::{DevicePool, driver_error, poisoned};

/// Pages of the staging pool (probe and build batches on their way to the device) and bytes of
/// each: 2 GiB in all, pinned when the device opens.
pub const STAGING_PAGES: (usize, usize) = (64, 32 << 20);
/// Pages of the output pool (join output on its way to Arrow arrays) and bytes of each: 2 GiB.
pub const OUTPUT_PAGES: (usize, usize) = (32, 64 << 20);
/// Pages of the pool of small blocks (totals read back from the device) and bytes of each.
pub const SCALAR_PAGES: (usize, usize) = (256, 4 << 10);

/// One compiled filter's modules (by key type) and the kernels looked up in them (by name).
#[derive(Debug, Default)]
struct FilterModules {
    modules: HashMap<&'static str, Arc<CudaModule>>,
    functions: HashMap<&'static str, CudaFunction>,
}

/// A GPU ready to run the join kernels.
#[derive(Debug)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    modules: HashMap<&'static str, Arc<CudaModule>>,
    /// Kernels already looked up, by name.
    functions: RwLock<HashMap<&'static str, CudaFunction>>,
    /// The bucket probe modules of compiled residual filters, by the filter's CUDA code.
    filtered: Mutex<HashMap<String, FilterModules>>,
    name: String,
    arch: String,
    total_memory: usize,
    pool: Arc<DevicePool>,
    budget: Arc<MemoryBudget>,
    staging: HostPool,
    output: HostPool,
    scalars: HostPool,
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

    /// This device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Bytes of device memory in all.
    pub fn total_memory(&self) -> usize {
        self.total_memory
    }

    /// The crate's device memory pool on this device.
    pub fn pool(&self) -> &Arc<DevicePool> {
        &self.pool
    }

    /// The device memory joins may hold at once on this device.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// Pinned blocks that probe and build batches are staged in before they are uploaded.
    pub fn staging(&self) -> &HostPool {
        &self.staging
    }

    /// Pinned blocks that join output is downloaded into and handed out as Arrow buffers.
    pub fn output(&self) -> &HostPool {
        &self.output
    }

    /// Small pinned blocks that totals are read back into.
    pub fn scalars(&self) -> &HostPool {
        &self.scalars
    }

    /// A new stream of this device's context.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx
            .new_stream()
            .map_err(|e| driver_error(e, "create stream"))
    }

    /// A new event (timing enabled). Host waits on it spin or yield rather than sleep until an
    /// interrupt, which was seen to be missed on a virtualized GPU host.
    pub fn new_event(&self) -> Result<CudaEvent> {
        self.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| driver_error(e, "create event"))
    }

    /// Kernel `name` of the bucket probe module with a compiled residual filter (`filter`, its
    /// CUDA code) appended, for keys of C type `key`, compiled and loaded on first use and then
    /// cached.
    pub fn filtered_function(
        &self,
        filter: &str,
        key: &'static str,
        name: &'static str,
    ) -> Result<CudaFunction> {
        let mut all = self
            .filtered
            .lock()
            .map_err(|_| poisoned("filter modules"))?;
        if let Some(f) = all.get(filter).and_then(|m| m.functions.get(name)) {
            return Ok(f.clone());
        }
        let entry = all.entry(filter.to_string()).or_default();
        let module = match entry.modules.get(key) {
            Some(m) => Arc::clone(m),
            None => {
                let m = self
                    .ctx
                    .load_module(compile_filtered(filter, key, &self.arch)?)
                    .map_err(|e| driver_error(e, "load filter module"))?;
                entry.modules.insert(key, Arc::clone(&m));
                m
            }
        };
        let f = module.load_function(name).map_err(|e| {
            exec_datafusion_err!("kernel {name} missing from a filter module: {e:?}")
        })?;
        entry.functions.insert(name, f.clone());
        Ok(f)
    }

    /// A kernel by module file and function name, looked up once and then cached.
    pub fn function(&self, module: &str, name: &'static str) -> Result<CudaFunction> {
        if let Some(f) = self
            .functions
            .read()
            .map_err(|_| poisoned("kernel table"))?
            .get(name)
        {
            return Ok(f.clone());
        }
        let m = self
            .modules
            .get(module)
            .ok_or_else(|| exec_datafusion_err!("kernel module {module} is not loaded"))?;
        let f = m
            .load_function(name)
            .map_err(|e| exec_datafusion_err!("kernel {name} missing from {module}: {e:?}"))?;
        self.functions
            .write()
            .map_err(|_| poisoned("kernel table"))?
            .insert(name, f.clone());
        Ok(f)
    }

    /// Free and total device memory in bytes, as the driver sees them.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.ctx
            .mem_get_info()
            .map_err(|e| driver_error(e, "query memory"))
    }

    /// Gives back what the device's pools keep but nobody uses: idle pinned blocks and
    /// unused pooled device memory. Tools that check for leaks at exit call this first.
    pub fn release_cached_memory(&self) -> Result<()> {
        self.staging.trim();
        self.output.trim();
        self.scalars.trim();
        self.pool.trim()
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
        // SAFETY: nothing of the crate uses cudarc's tracked buffer types (CudaSlice,
        // PinnedHostSlice) on this context; the crate orders its streams with its own events.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_error(e, "query compute capability"))?;
        let arch = format!("compute_{major}{minor}");
        let name = ctx.name().map_err(|e| driver_error(e, "query name"))?;
        let total_memory = ctx
            .total_mem()
            .map_err(|e| driver_error(e, "query memory"))?;
        let mut modules = HashMap::new();
        for file in MODULES {
            let module = ctx
                .load_module(compile(file, &arch)?)
                .map_err(|e| driver_error(e, "load kernel module"))?;
            modules.insert(*file, module);
        }
        let device = Self {
            pool: Arc::new(DevicePool::new(&ctx)?),
            budget: MemoryBudget::new(total_memory / 10 * 8),
            staging: HostPool::pinned(&ctx, STAGING_PAGES.1, STAGING_PAGES.0)?,
            output: HostPool::pinned(&ctx, OUTPUT_PAGES.1, OUTPUT_PAGES.0)?,
            scalars: HostPool::pinned(&ctx, SCALAR_PAGES.1, SCALAR_PAGES.0)?,
            ctx,
            modules,
            functions: RwLock::new(HashMap::new()),
            filtered: Mutex::new(HashMap::new()),
            name,
            arch,
            total_memory,
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
const SHARED_MEMORY_KERNELS: &[&str] = &[
    "radix_scatter_u32",
    "radix_scatter_u64",
    "route_scatter_u32",
    "route_scatter_u64",
    "radix_scatter_narrow_u32",
    "route_scatter_narrow_u32",
];

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

/// Outcome of opening each device, kept for the life of the process: a device that could not
/// be opened is not tried again at every query.
type DeviceTable = HashMap<usize, std::result::Result<Arc<CudaDevice>, String>>;

fn device_table() -> &'static Mutex<DeviceTable> {
    static DEVICES: OnceLock<Mutex<DeviceTable>> = OnceLock::new();
    DEVICES.get_or_init(Default::default)
}

/// The devices this process has opened so far, by ordinal.
pub fn opened_devices() -> Vec<Arc<CudaDevice>> {
    let Ok(table) = device_table().lock() else {
        return vec![];
    };
    let mut opened: Vec<_> = table
        .iter()
        .filter_map(|(o, d)| Some((*o, Arc::clone(d.as_ref().ok()?))))
        .collect();
    opened.sort_by_key(|(o, _)| *o);
    opened.into_iter().map(|(_, d)| d).collect()
}

/// The process-wide [`CudaDevice`] for `ordinal`, opened (and its kernels compiled) on first use.
/// If opening failed once, later calls return the same error without trying again.
pub fn cuda_device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    let mut guard = device_table()
        .lock()
        .map_err(|_| poisoned("device table"))?;
    let opened = guard.entry(ordinal).or_insert_with(|| {
        CudaDevice::open(ordinal)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    });
    match opened {
        Ok(d) => Ok(Arc::clone(d)),
        Err(e) => Err(exec_datafusion_err!("{e}")),
    }
}
