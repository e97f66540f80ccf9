//! [`MarksMerge`]: the build-row marks of a join on several devices, merged for the rows it
//! outputs after the probe side.
//!
//! A left, full, left semi, anti or mark join outputs its build rows after the probe side, by
//! whether any probe row matched them. On several devices each lane marks the build rows its
//! own probe partitions matched, in its copy of the table (every copy is in the same order).
//! When a lane's partitions are all done, it gives its marks (a byte a build row: the device's,
//! or where the host decides pairs the host's) to the merge; the last lane to do so gets every
//! lane's marks ORed, and outputs the build rows by them, as a lone lane does by its own.

use std::sync::Mutex;

use datafusion::common::{Result, exec_datafusion_err};

/// The marks of a join's lanes, gathered until the last lane takes them.
#[derive(Debug)]
pub(crate) struct MarksMerge {
    lanes: usize,
    /// Lanes that gave their marks, and the marks so far.
    merged: Mutex<(usize, Vec<u8>)>,
}

impl MarksMerge {
    /// A merge of `lanes` lanes' marks.
    pub fn new(lanes: usize) -> Self {
        Self {
            lanes,
            merged: Mutex::new((0, vec![])),
        }
    }

    /// Adds one lane's marks (a byte a build row, in table order; shorter where the rest are
    /// unmarked). For the last lane, returns every lane's marks ORed; for the others, `None`.
    pub fn add(&self, marks: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut merged = self
            .merged
            .lock()
            .map_err(|_| exec_datafusion_err!("a lane panicked while merging marks"))?;
        let (given, all) = &mut *merged;
        or_marks(all, marks);
        *given += 1;
        Ok((*given == self.lanes).then(|| std::mem::take(all)))
    }
}

/// ORs `marks` (a byte a build row; shorter where the rest are unmarked) into `all`, which
/// grows to their length.
pub(crate) fn or_marks(all: &mut Vec<u8>, marks: &[u8]) {
    if all.len() < marks.len() {
        all.resize(marks.len(), 0);
    }
    for (m, &new) in all.iter_mut().zip(marks) {
        *m |= new;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_lane_gets_every_lanes_marks() {
        let merge = MarksMerge::new(3);
        assert_eq!(merge.add(&[0, 1, 0, 0]).unwrap(), None);
        assert_eq!(merge.add(&[1]).unwrap(), None);
        assert_eq!(
            merge.add(&[0, 0, 0, 1, 0]).unwrap(),
            Some(vec![1, 1, 0, 1, 0])
        );
    }
}
