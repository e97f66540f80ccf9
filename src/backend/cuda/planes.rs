//! `Planes`, the kernels' by-value list of the columns one launch moves (`kernels/common.cuh`):
//! `radix_scatter` moves them with the keys, `gather_planes` by one list of positions.

use cudarc::driver::DeviceRepr;

use crate::device::{DeviceBuffer, MAX_PLANES};

/// Device addresses and value widths of at most [`MAX_PLANES`] columns: plane `p`'s values go
/// from `input[p]` to `output[p]`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct Planes {
    input: [u64; MAX_PLANES],
    output: [u64; MAX_PLANES],
    width: [u32; MAX_PLANES],
    count: u32,
}

// SAFETY: `Planes` is plain old data laid out like `struct Planes` in kernels/common.cuh
// (repr(C): kMaxPlanes input and output addresses, kMaxPlanes widths, a count; kMaxPlanes is
// MAX_PLANES through KERNEL_CONSTANTS), so passing it by value copies exactly what the kernels
// read.
unsafe impl DeviceRepr for Planes {}

impl Planes {
    /// Launch arguments for `inputs` (buffers with their bytes a value) into `outputs`, in
    /// groups of at most [`MAX_PLANES`], in order; one empty group where there are none.
    pub(super) fn groups(
        inputs: &[(&DeviceBuffer, usize)],
        outputs: &mut [DeviceBuffer],
    ) -> Vec<Self> {
        let mut groups: Vec<Self> = inputs
            .chunks(MAX_PLANES)
            .zip(outputs.chunks_mut(MAX_PLANES))
            .map(|(ins, outs)| {
                let mut arg = Self::default();
                for (p, (&(input, w), out)) in ins.iter().zip(outs.iter_mut()).enumerate() {
                    arg.input[p] = input.ptr();
                    arg.output[p] = out.ptr_mut();
                    arg.width[p] = w as u32;
                }
                arg.count = ins.len() as u32;
                arg
            })
            .collect();
        if groups.is_empty() {
            groups.push(Self::default());
        }
        groups
    }

    /// Moves a scatter makes of these planes: one a plane, two for a 16-byte plane (moved as
    /// two 8-byte halves).
    pub(super) fn moves(&self) -> usize {
        self.width[..self.count as usize]
            .iter()
            .map(|&w| if w == 16 { 2 } else { 1 })
            .sum()
    }
}
