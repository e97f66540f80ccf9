//! Pinned host buffers that large uploads and downloads are staged through, pooled per device.
//!
//! Pinned memory is slow to allocate, so each pair of buffers is made once per process and
//! reused by every later copy; a copy takes a pair from the pool and puts it back. The device
//! copies from (or into) one buffer of the pair while the host fills (or empties) the other.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, PinnedHostSlice};
use datafusion::common::{Result, exec_datafusion_err};

use super::memory::driver_error;

/// Bytes of each staging buffer.
pub const STAGE_BYTES: usize = 8 << 20;

/// Two pinned buffers of [`STAGE_BYTES`].
#[derive(Debug)]
pub struct Staging(pub [PinnedHostSlice<u8>; 2]);

/// The free staging pairs of one device.
#[derive(Debug, Default)]
pub struct StagingPool {
    free: Mutex<Vec<Staging>>,
}

impl StagingPool {
    /// A free pair, or a new one.
    pub fn take(&self, ctx: &Arc<CudaContext>) -> Result<Staging> {
        let reused = self
            .free
            .lock()
            .map_err(|_| exec_datafusion_err!("staging pool lock poisoned"))?
            .pop();
        match reused {
            Some(s) => Ok(s),
            None => {
                // SAFETY: the host touches the buffers only through `PinnedHostSlice::as_slice`
                // / `as_mut_slice`, which wait for the event cudarc recorded after the last
                // device copy that used them (every backend copies on its own stream, so
                // cudarc tracks those events); a copy cudarc does not track (a plain sub-slice)
                // is followed by a stream synchronize before the pair returns to the pool.
                // Flags 0: cached memory, which the host reads fast (write-combined would not).
                let one = || {
                    unsafe { ctx.alloc_pinned_with_flags::<u8>(STAGE_BYTES, 0) }
                        .map_err(|e| driver_error(e, "allocate pinned memory"))
                };
                Ok(Staging([one()?, one()?]))
            }
        }
    }

    /// Returns a pair to the pool.
    pub fn put(&self, staging: Staging) {
        if let Ok(mut free) = self.free.lock() {
            free.push(staging);
        }
    }
}
