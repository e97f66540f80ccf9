//! How big a join's pieces of work are, and how much memory each needs: probe chunk rows and
//! output pass rows are chosen so that one chunk in flight (its input, keys, counts and one
//! output pass) takes at most half the device memory left after the build side (so two can be
//! in flight), and its host blocks fit a page of the pinned staging and output pools.

use datafusion::common::{Result, resources_err};

use crate::backend::probe_runs;
use crate::columns::{BlockLayout, ColumnKind};
use crate::join::hash::pass_bytes;

/// Fewest probe rows in a chunk.
pub const MIN_CHUNK_ROWS: usize = 1024;

/// The kinds of a join's columns: the probe columns it stages and the columns it outputs, each
/// with whether it may hold nulls.
#[derive(Debug, Clone)]
pub struct ColumnKinds {
    pub probe: Vec<(ColumnKind, bool)>,
    pub output: Vec<(ColumnKind, bool)>,
    /// Bytes a row the device derives from the staged columns before it encodes keys (a
    /// checked key's hashes: 8), on either side.
    pub derived: usize,
    /// Whether staged columns may be packed (`gpu_join.pack_uploads`).
    pub packed: bool,
}

/// Bytes a row that widening packed columns of `kinds` may take beyond what their staged
/// copies take: a packed column's offsets take at most half its width, and its values, widened
/// next to them, the whole width.
pub fn widening_bytes(kinds: &[(ColumnKind, bool)], packed: bool) -> usize {
    if !packed {
        return 0;
    }
    kinds
        .iter()
        .map(|(k, _)| match k {
            ColumnKind::Fixed(w) if *w >= 2 => w / 2,
            _ => 0,
        })
        .sum()
}

impl ColumnKinds {
    /// Device bytes a probe chunk of `rows` rows needs besides its output pass: the raw copy,
    /// bitmaps unpacked to bytes, packed values widened, derived columns, encoded keys, and the
    /// counts and offsets of the probe.
    pub fn chunk_bytes(&self, rows: usize) -> usize {
        let raw = BlockLayout::new(self.probe.iter().copied(), rows).bytes;
        let bytes_per_bitmap = self
            .probe
            .iter()
            .map(|&(k, n)| usize::from(n) + usize::from(k == ColumnKind::Boolean))
            .sum::<usize>();
        let widened = widening_bytes(&self.probe, self.packed);
        raw + rows * (bytes_per_bitmap + widened + self.derived + 8)
            + (probe_runs(rows) + 1) * 16
            + 64 * 1024
    }

    /// Device bytes one chunk of `chunk_rows` rows with output passes of `pass_rows` rows needs.
    pub fn slot_bytes(&self, chunk_rows: usize, pass_rows: usize) -> usize {
        let exact = self.chunk_bytes(chunk_rows) + pass_bytes(&self.output, pass_rows);
        exact + exact / 8
    }

    /// Host bytes of the staging block of a chunk of `rows` rows.
    pub fn staging_bytes(&self, rows: usize) -> usize {
        BlockLayout::new(self.probe.iter().copied(), rows).bytes
    }

    /// Host bytes of the output block of a pass of `rows` rows.
    pub fn output_bytes(&self, rows: usize) -> usize {
        BlockLayout::new(self.output.iter().copied(), rows).bytes
    }
}

/// Device bytes to reserve for a build side of `rows` rows of columns of `kinds` (the staged
/// build columns) whose staged copies take `raw` bytes, with `derived` bytes a row derived from
/// them ([`ColumnKinds::derived`]). At the peak of the build these live at once: the uploaded
/// parts (`raw`) with their bitmaps unpacked to bytes and, where `packed`, their packed values
/// widened ([`widening_bytes`]), the concatenated columns, the derived
/// ones, the encoded keys with two radix passes' outputs (three key buffers of at most 8 bytes
/// a row), the moved columns of two passes, histograms, and the bucket directory (at most 4
/// bytes a row for HASH; for DIRECT, whose table has `2^direct_bits` buckets, 4 bytes a bucket
/// besides). With `marked`, the join also keeps a mark byte per build row, and counts them
/// once after the probe side (two u64 per run of rows).
pub fn build_bytes(
    kinds: &[(ColumnKind, bool)],
    raw: usize,
    derived: usize,
    rows: usize,
    marked: bool,
    packed: bool,
    direct_bits: Option<u32>,
) -> usize {
    let values: usize = kinds.iter().map(|(k, _)| k.width()).sum();
    let bitmaps: usize = kinds
        .iter()
        .map(|&(k, n)| usize::from(n) + usize::from(k == ColumnKind::Boolean))
        .sum();
    let per_row = 3 * values + 4 * bitmaps + widening_bytes(kinds, packed) + derived + 3 * 8 + 5;
    let marks = if marked {
        rows + 16 * (crate::backend::probe_runs(rows) + 1)
    } else {
        0
    };
    let exact = raw + per_row * rows + marks + (256 << 10);
    let direct_bounds = direct_bits.map_or(0, |bits| 4 * ((1usize << bits) + 1));
    exact + exact / 8 + direct_bounds
}

/// The sizes of a join's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// Most probe rows in one chunk.
    pub chunk_rows: usize,
    /// Most output rows in one pass.
    pub pass_rows: usize,
    /// Device bytes one chunk in flight may hold.
    pub slot_bytes: usize,
}

/// Limits the sizes are chosen within.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `gpu_join.probe_chunk_rows`.
    pub max_chunk_rows: usize,
    /// The device memory budget.
    pub budget: usize,
    /// Device bytes reserved for the build side.
    pub build: usize,
    /// Bytes of a page of the pinned staging pool.
    pub staging_page: usize,
    /// Bytes of a page of the pinned output pool.
    pub output_page: usize,
    /// What each output pass needs for the build side's view values the device gathers.
    pub values: PassValues,
}

/// What an output pass needs for the build side's view values the device gathers
/// (`exec::view_bytes`): room for each row's longest gathered value of each such column, on the
/// device and in the download, and per column its lengths and offsets on the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassValues {
    /// The longest values the device gathers of the columns, summed.
    pub row_bytes: usize,
    /// How many columns.
    pub columns: usize,
}

impl PassValues {
    /// Device bytes a pass of `rows` rows needs for them.
    pub fn device_bytes(&self, rows: usize) -> usize {
        rows * self.row_bytes + self.columns * (16 * rows + (64 << 10))
    }

    /// Host bytes a pass of `rows` rows downloads for them at most, with the up to 63 bytes
    /// that align each column's values to 64 in the pass's block (`Chunk::start_pass`).
    pub fn host_bytes(&self, rows: usize) -> usize {
        rows * self.row_bytes + 64 * self.columns
    }
}

/// Chooses chunk and pass rows within `limits`. A pass holds at most a chunk's rows, and fewer
/// where a page of the output pool holds fewer output rows: a chunk's output, which is known
/// only once it is counted, comes in as many passes as it needs, so output rows wider than the
/// staged probe rows (a build side's views, 16 bytes each) do not make chunks smaller.
pub fn plan(kinds: &ColumnKinds, limits: Limits) -> Result<Sizing> {
    let left = limits.budget.saturating_sub(limits.build);
    let values = limits.values;
    let output_bytes = |pass: usize| kinds.output_bytes(pass) + values.host_bytes(pass);
    let slot_bytes = |rows: usize, pass: usize| {
        let exact = values.device_bytes(pass);
        kinds.slot_bytes(rows, pass) + exact + exact / 8
    };
    let pass = |rows: usize| {
        let mut pass = rows;
        while pass > MIN_CHUNK_ROWS && output_bytes(pass) > limits.output_page {
            pass /= 2;
        }
        pass
    };
    let fits = |rows: usize| {
        slot_bytes(rows, pass(rows)) <= left / 2
            && kinds.staging_bytes(rows) <= limits.staging_page
            && output_bytes(pass(rows)) <= limits.output_page
    };
    let mut rows = limits
        .max_chunk_rows
        .clamp(MIN_CHUNK_ROWS, u32::MAX as usize / 2)
        .next_power_of_two();
    while rows > MIN_CHUNK_ROWS && !fits(rows) {
        rows /= 2;
    }
    let rows = rows.min(limits.max_chunk_rows.max(MIN_CHUNK_ROWS));
    let pass_rows = pass(rows).min(rows);
    let slot_bytes = slot_bytes(rows, pass_rows);
    if slot_bytes > left {
        return resources_err!(
            "GpuJoinExec: gpu_join.memory_limit ({} bytes) leaves {left} bytes after the build \
             side ({} bytes), less than a probe chunk of {rows} rows needs ({slot_bytes} bytes)",
            limits.budget,
            limits.build
        );
    }
    Ok(Sizing {
        chunk_rows: rows,
        pass_rows,
        slot_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds() -> ColumnKinds {
        ColumnKinds {
            probe: vec![(ColumnKind::Fixed(4), false), (ColumnKind::Fixed(8), true)],
            output: vec![(ColumnKind::Fixed(4), false), (ColumnKind::Fixed(8), true)],
            derived: 0,
            packed: true,
        }
    }

    fn limits(budget: usize) -> Limits {
        Limits {
            max_chunk_rows: 1 << 24,
            budget,
            build: 1 << 20,
            staging_page: 16 << 20,
            output_page: 32 << 20,
            values: PassValues::default(),
        }
    }

    #[test]
    fn chunks_shrink_to_fit_the_budget() {
        let big = plan(&kinds(), limits(64 << 30)).unwrap();
        assert_eq!(big.chunk_rows, 1 << 20, "staging pool limits it first");
        let small = plan(&kinds(), limits(8 << 20)).unwrap();
        assert!(small.chunk_rows < big.chunk_rows);
        assert!(2 * small.slot_bytes <= (8 << 20) - (1 << 20));
        assert!(plan(&kinds(), limits(1 << 20)).is_err());
    }

    #[test]
    fn wide_output_rows_make_passes_smaller_not_chunks() {
        // 44-byte output rows (two build views and a few numbers) of a 4-byte probe row.
        let mut wide = kinds();
        wide.probe = vec![(ColumnKind::Fixed(4), false)];
        wide.output = vec![
            (ColumnKind::Fixed(16), false),
            (ColumnKind::Fixed(16), true),
            (ColumnKind::Fixed(8), false),
            (ColumnKind::Fixed(4), false),
        ];
        let s = plan(&wide, limits(64 << 30)).unwrap();
        assert_eq!(s.chunk_rows, 1 << 22, "the staging page limits chunks");
        assert_eq!(s.pass_rows, 1 << 19, "the output page limits passes");
        assert!(wide.output_bytes(s.pass_rows) <= 32 << 20);
        assert!(2 * s.slot_bytes <= (64 << 30) - (1 << 20));
    }

    #[test]
    fn gathered_view_values_make_passes_smaller() {
        let mut l = limits(64 << 30);
        let plain = plan(&kinds(), l).unwrap();
        // Two columns of values of up to 200 bytes: 400 bytes a row more in each pass.
        l.values = PassValues {
            row_bytes: 400,
            columns: 2,
        };
        let s = plan(&kinds(), l).unwrap();
        assert!(s.pass_rows < plain.pass_rows);
        // The block a pass takes: its columns, then each column's values at 64-byte alignment.
        let rows = s.pass_rows;
        let columns = kinds().output_bytes(rows);
        let room = (columns.next_multiple_of(64) + 200 * rows).next_multiple_of(64) + 200 * rows;
        assert!(room <= 32 << 20);
        assert!(s.slot_bytes >= kinds().slot_bytes(s.chunk_rows, s.pass_rows) + 400 * s.pass_rows);
    }

    #[test]
    fn the_setting_caps_chunks() {
        let mut l = limits(64 << 30);
        l.max_chunk_rows = 5000;
        assert_eq!(plan(&kinds(), l).unwrap().chunk_rows, 5000);
    }
}
