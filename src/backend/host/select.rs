//! Host twin of `kernels/select.cu`: the positions of the rows whose flag byte passes a
//! [`Keep`] test.

use crate::backend::{Keep, PROBE_RUN, probe_runs};

fn passes(flag: u8, keep: Keep) -> bool {
    match keep {
        Keep::Unset => flag == 0,
        Keep::Set => flag != 0,
        Keep::All => true,
    }
}

/// Where each run's kept rows start, and their total (`runs + 1` values).
pub(crate) fn count(flags: &[u8], keep: Keep) -> Vec<u64> {
    let mut offsets = Vec::with_capacity(probe_runs(flags.len()) + 1);
    let mut total = 0u64;
    for run in flags.chunks(PROBE_RUN) {
        offsets.push(total);
        total += run.iter().filter(|&&f| passes(f, keep)).count() as u64;
    }
    offsets.push(total);
    offsets
}

/// Writes the positions of the kept rows whose place lies in `first..first + out.len()`.
pub(crate) fn write(flags: &[u8], keep: Keep, first: u64, out: &mut [u32]) {
    let hi = first + out.len() as u64;
    let mut place = 0u64;
    for (i, &f) in flags.iter().enumerate() {
        if passes(f, keep) {
            if (first..hi).contains(&place) {
                out[(place - first) as usize] = i as u32;
            }
            place += 1;
        }
    }
}
