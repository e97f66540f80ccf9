//! A build side's view values gathered on the device (`gpu_join.view_bytes_on_device`): where
//! the device carries a build string or binary column as its views ([`BuildViews`]), the bytes
//! those views point to are uploaded once too, and each output window's values are copied on the device
//! into a buffer of the window's own (lengths → scan → copy, `kernels/views.cu`), which comes
//! down with the window. The host then copies each output batch's views and its contiguous
//! bytes off the pages, reading nothing at random. Without it, a batch's views point into the
//! build side's buffers, and the host copies its values out of them row by row (Arrow's `gc`,
//! a random read each) where those buffers hold more than twice the bytes the batch uses
//! (`view_gather::compact_sparse`), which a batch of a large build side almost always does.
//!
//! ```text
//!  build: listed data buffers ──upload once──► device `data` (+ each buffer's start)
//!  window: gathered views ──view_offsets──► offsets ──view_copy──► window bytes, views → (0, offset)
//!  host:   views + window bytes ──output──► Utf8View / BinaryView, one buffer a batch
//! ```
//!
//! A column takes this way where its values are short enough for a window's bytes to be
//! bounded tightly ([`MAX_DEVICE_VALUE`]), and its buffers hold not much besides its values
//! ([`Plan::of`]): each window reserves room for its rows' longest value.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, GenericByteViewArray, OffsetSizeTrait};
use arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use arrow::datatypes::{BinaryViewType, ByteViewType, DataType, StringViewType};
use datafusion::common::{Result, internal_datafusion_err, internal_err};

use super::device_views::{BuildViews, cast_views, parts, window_views};
use super::sizing::PassValues;
use crate::backend::{Backend, ViewData};

/// Longest value (bytes) a column's values may have for the device to gather them: each
/// window reserves this much a row on the device and in its download.
pub const MAX_DEVICE_VALUE: usize = 1024;

/// What the out-of-line values of a build view column's arrays take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ValueStats {
    /// Bytes of the values held out of line (longer than 12 bytes), summed.
    pub used: usize,
    /// The longest such value.
    pub longest: usize,
}

impl ValueStats {
    /// Counts a value of `len` bytes, if it lies out of line.
    fn count(&mut self, len: usize) {
        if len > 12 {
            self.used += len;
            self.longest = self.longest.max(len);
        }
    }

    /// Counts the non-null values of a string or binary array with offsets `offsets`.
    fn count_offsets<O: OffsetSizeTrait>(&mut self, offsets: &[O], nulls: Option<&NullBuffer>) {
        for (i, w) in offsets.windows(2).enumerate() {
            if nulls.is_none_or(|n| n.is_valid(i)) {
                self.count(w[1].as_usize() - w[0].as_usize());
            }
        }
    }

    /// The stats of `arrays` (arrays of a type the device carries as views; others count
    /// nothing) as their views would have them, read on several threads where there are many
    /// rows.
    pub fn of(arrays: &[ArrayRef]) -> Self {
        let one = |arrays: &[ArrayRef]| {
            let mut s = Self::default();
            for a in arrays {
                let nulls = a.nulls();
                match a.data_type() {
                    DataType::Utf8 => s.count_offsets(a.as_string::<i32>().offsets(), nulls),
                    DataType::LargeUtf8 => s.count_offsets(a.as_string::<i64>().offsets(), nulls),
                    DataType::Binary => s.count_offsets(a.as_binary::<i32>().offsets(), nulls),
                    DataType::LargeBinary => s.count_offsets(a.as_binary::<i64>().offsets(), nulls),
                    _ => {
                        for &v in parts(a.as_ref()).map_or(&[][..], |(views, _)| views) {
                            s.count(v as u32 as usize);
                        }
                    }
                }
            }
            s
        };
        let rows: usize = arrays.iter().map(|a| a.len()).sum();
        let threads = super::run::host_cores().min(rows >> 16).max(1);
        if threads == 1 {
            return one(arrays);
        }
        let per = arrays.len().div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            let handles: Vec<_> = arrays
                .chunks(per)
                .map(|c| scope.spawn(move || one(c)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .fold(Self::default(), |a, b| Self {
                    used: a.used + b.used,
                    longest: a.longest.max(b.longest),
                })
        })
    }
}

/// Which of a join's device view columns (in [`HostGather::build_views`]'s order) the device
/// gathers the values of, each with its longest value, for one execution.
///
/// [`HostGather::build_views`]: super::gather::HostGather::build_views
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Per column, its longest value where the device gathers its values.
    pub columns: Vec<Option<usize>>,
    /// Per column, where its values are gathered and why, for EXPLAIN ANALYZE.
    pub reasons: Vec<String>,
    /// Device bytes of the columns' data (the buffers and their starts).
    pub data_bytes: usize,
}

impl Plan {
    /// The plan for build view columns `views`, each with what its values take: each that has
    /// values out of line, whose longest value is at most [`MAX_DEVICE_VALUE`], and whose
    /// buffers hold at most four times the bytes of its values and 64 MiB more (a build side
    /// that is a small part of a larger table's batches, a filtered dimension, lists the whole
    /// table's buffers: uploading them all is worth it only where they are not much larger).
    pub fn of<'a>(views: impl IntoIterator<Item = (&'a BuildViews, ValueStats)>) -> Self {
        let mut plan = Self::default();
        for (v, stats) in views {
            let listed = v.data_bytes();
            let reason = if stats.used == 0 {
                "views (every value is inline)".to_string()
            } else if stats.longest > MAX_DEVICE_VALUE {
                format!(
                    "host (a value of {} bytes; the device gathers values of at most \
                     {MAX_DEVICE_VALUE})",
                    stats.longest
                )
            } else if listed > 4 * stats.used + (64 << 20) {
                format!(
                    "host (its buffers hold {listed} bytes for {} bytes of values)",
                    stats.used
                )
            } else {
                plan.data_bytes += listed + 8 * v.buffers().len() + 128;
                plan.columns.push(Some(stats.longest));
                plan.reasons.push("device".to_string());
                continue;
            };
            plan.columns.push(None);
            plan.reasons.push(reason);
        }
        plan
    }

    /// The plan of `columns` view columns whose values stay on the host by the setting.
    pub fn off(columns: usize) -> Self {
        Self {
            columns: vec![None; columns],
            reasons: vec!["host (gpu_join.view_bytes_on_device = false)".to_string(); columns],
            data_bytes: 0,
        }
    }

    /// This plan with every column's values on the host, those it gathered on the device for
    /// reason `why`.
    pub fn on_host(&self, why: &str) -> Self {
        let reasons = (self.columns.iter().zip(&self.reasons))
            .map(|(c, r)| match c {
                Some(_) => why.to_string(),
                None => r.clone(),
            })
            .collect();
        Self {
            columns: vec![None; self.columns.len()],
            reasons,
            data_bytes: 0,
        }
    }

    /// Whether the device gathers any column's values.
    pub fn any(&self) -> bool {
        self.columns.iter().any(Option::is_some)
    }

    /// What each output pass needs for the values ([`Limits::values`]).
    ///
    /// [`Limits::values`]: super::sizing::Limits::values
    pub fn pass_values(&self) -> PassValues {
        PassValues {
            row_bytes: self.columns.iter().flatten().sum(),
            columns: self.columns.iter().flatten().count(),
        }
    }
}

/// One build view column's data on a backend: its listed buffers one after another, and where
/// each begins.
#[derive(Debug)]
pub struct DeviceData<Buf> {
    data: Buf,
    starts: Buf,
    buffers: usize,
    /// The longest value, which bounds each window's bytes.
    longest: usize,
}

impl<Buf> DeviceData<Buf> {
    /// Uploads `views`' buffers on `q`, one after another, and where each begins; the copies
    /// have finished when this returns.
    pub fn upload<B: Backend<Buf = Buf>>(
        q: &B,
        views: &BuildViews,
        longest: usize,
    ) -> Result<Self> {
        let buffers = views.buffers();
        let mut starts = Vec::with_capacity(buffers.len());
        let mut at = 0usize;
        for b in buffers.iter() {
            starts.push(at as u64);
            at += b.len();
        }
        let parts: Vec<&[u8]> = buffers.iter().map(|b| b.as_slice()).collect();
        let data = staged_upload(q, &parts)?;
        let starts: Vec<u8> = starts.iter().flat_map(|s| s.to_le_bytes()).collect();
        Ok(Self {
            data,
            starts: q.upload(&starts)?,
            buffers: buffers.len(),
            longest,
        })
    }

    fn view_data(&self) -> ViewData<'_, Buf> {
        ViewData {
            data: &self.data,
            starts: &self.starts,
            buffers: self.buffers,
        }
    }
}

/// Pinned pages one upload of view data fills at once, each on a thread of its own.
const UPLOAD_PAGES: usize = 8;

/// `parts`, one after another, in a new buffer of `q`, copied through the pinned staging pages:
/// up to [`UPLOAD_PAGES`] pages at a time, each filled on a thread of its own and then copied;
/// a page is filled again once its copy has finished. Without a free page, the parts go to the
/// device as they are ([`Backend::upload_parts`]: pageable memory, which the driver stages
/// itself, at a fraction of the speed). Waits for the copies.
fn staged_upload<B: Backend>(q: &B, parts: &[&[u8]]) -> Result<B::Buf> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let page = q.staging().page_bytes().max(1);
    let mut blocks = vec![];
    while blocks.len() < UPLOAD_PAGES.min(total.div_ceil(page)) {
        match q.staging().try_take(page)? {
            Some(b) => blocks.push(b),
            None => break,
        }
    }
    if blocks.is_empty() {
        return q.upload_parts(parts);
    }
    let mut data = q.alloc(total)?;
    // Bytes `at..at + out.len()` of the parts laid one after another, into `out`.
    let fill = |out: &mut [u8], at: usize| {
        let (mut start, mut filled) = (0usize, 0usize);
        for p in parts {
            let end = start + p.len();
            if end > at + filled && filled < out.len() {
                let from = at + filled - start;
                let n = (p.len() - from).min(out.len() - filled);
                out[filled..filled + n].copy_from_slice(&p[from..from + n]);
                filled += n;
            }
            start = end;
        }
    };
    let mut at = 0;
    while at < total {
        let round: Vec<(usize, usize)> = (0..blocks.len())
            .map(|i| (at + i * page, page.min(total.saturating_sub(at + i * page))))
            .filter(|&(_, len)| len > 0)
            .collect();
        std::thread::scope(|s| {
            let filling: Vec<_> = (blocks.iter_mut().zip(&round))
                .map(|(block, &(from, len))| {
                    s.spawn(move || -> Result<()> {
                        fill(&mut block.bytes_mut()?[..len], from);
                        Ok(())
                    })
                })
                .collect();
            filling.into_iter().try_for_each(|h| {
                h.join()
                    .map_err(|_| internal_datafusion_err!("a view data copy panicked"))?
            })
        })?;
        for (block, &(from, len)) in blocks.iter_mut().zip(&round) {
            q.copy_to_device(block, 0, &mut data, from, len)?;
        }
        at += round.iter().map(|(_, len)| len).sum::<usize>();
    }
    for block in &mut blocks {
        block.wait()?;
    }
    Ok(data)
}

/// One window column's values being gathered on a backend: kept until the window's copies
/// have finished.
#[derive(Debug)]
pub struct WindowValues<Buf> {
    /// The window's column (its place among the window's columns).
    pub column: usize,
    /// `rows + 1` offsets; the last, the total, is read back.
    pub offsets: Buf,
    /// The values, room for the rows' longest value each.
    pub bytes: Buf,
}

/// Enqueues on `q` the gather of the values of `rows` views (`views`, with `validity`) from
/// `data`: the offsets, then the copy, which points the views at the window's bytes.
pub fn gather<B: Backend>(
    q: &B,
    column: usize,
    views: &mut B::Buf,
    validity: Option<&B::Buf>,
    rows: usize,
    data: &DeviceData<B::Buf>,
) -> Result<WindowValues<B::Buf>> {
    let offsets = q.view_offsets(views, validity, rows, data.view_data())?;
    let mut bytes = q.alloc((rows * data.longest).max(1))?;
    q.view_copy(
        views,
        validity,
        rows,
        &offsets,
        data.view_data(),
        &mut bytes,
    )?;
    Ok(WindowValues {
        column,
        offsets,
        bytes,
    })
}

/// The array of type `dt` of one output batch whose views the device pointed into its window's
/// bytes `bytes` (`column`: a `FixedSizeBinary(16)` slice of a download page): the views
/// copied off the page, each out-of-line view's offset made relative to the batch's first
/// value, and the batch's bytes copied into a buffer of their own; for a type with offsets,
/// those views cast to it.
pub fn output(column: &ArrayRef, bytes: &Buffer, dt: &DataType) -> Result<ArrayRef> {
    match dt {
        DataType::Utf8View => output_as::<StringViewType>(column, bytes),
        DataType::BinaryView => output_as::<BinaryViewType>(column, bytes),
        DataType::Utf8 | DataType::LargeUtf8 => {
            cast_views(&output_as::<StringViewType>(column, bytes)?, dt)
        }
        DataType::Binary | DataType::LargeBinary => {
            cast_views(&output_as::<BinaryViewType>(column, bytes)?, dt)
        }
        _ => internal_err!("device view values output as {dt}"),
    }
}

fn output_as<T: ByteViewType>(column: &ArrayRef, bytes: &Buffer) -> Result<ArrayRef> {
    let (raw, nulls) = window_views(column)?;
    let mut views = Vec::with_capacity(raw.len() / 16);
    // The device placed the batch's values one after another, in row order, from `first`.
    let mut first = None;
    let mut next = 0usize;
    for (i, view) in raw.chunks_exact(16).enumerate() {
        let view = u128::from_le_bytes(view.try_into().unwrap_or([0; 16]));
        if nulls.as_ref().is_some_and(|n| n.is_null(i)) {
            views.push(0);
            continue;
        }
        let len = view as u32 as usize;
        if len <= 12 {
            views.push(view);
            continue;
        }
        let (index, offset) = ((view >> 64) as u32, (view >> 96) as u32 as usize);
        let start = *first.get_or_insert(offset);
        if index != 0 || offset != start + next || offset + len > bytes.len() {
            return internal_err!("a device view outside its window's values");
        }
        views.push((view & ((1u128 << 96) - 1)) | (((offset - start) as u128) << 96));
        next += len;
    }
    let data = match first {
        Some(start) => vec![Buffer::from_slice_ref(&bytes[start..start + next])],
        None => vec![],
    };
    // SAFETY: every non-null view is inline (as staged from a valid array of type `T`: the
    // device copies views bit for bit), or an out-of-line view whose bytes the device copied
    // from the value its staged view named, and which the loop above checked lie within
    // `data[0]` (the batch's values, placed one after another from its first); every null row's
    // view is zero, an empty inline value; `nulls` has one bit per view.
    let array =
        unsafe { GenericByteViewArray::<T>::new_unchecked(ScalarBuffer::from(views), data, nulls) };
    Ok(Arc::new(array))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, FixedSizeBinaryArray, StringViewArray};

    /// A window's views as the device leaves them: `values` placed one after another.
    fn window(values: &[Option<&str>]) -> (ArrayRef, Buffer) {
        let mut bytes = vec![];
        let mut views = vec![];
        for v in values {
            let view = match v {
                None => 0u128,
                Some(s) if s.len() <= 12 => {
                    let mut raw = [0u8; 16];
                    raw[..4].copy_from_slice(&(s.len() as u32).to_le_bytes());
                    raw[4..4 + s.len()].copy_from_slice(s.as_bytes());
                    u128::from_le_bytes(raw)
                }
                Some(s) => {
                    let prefix = u32::from_le_bytes(s.as_bytes()[..4].try_into().unwrap());
                    let view = (s.len() as u128)
                        | (u128::from(prefix) << 32)
                        | ((bytes.len() as u128) << 96);
                    bytes.extend_from_slice(s.as_bytes());
                    view
                }
            };
            views.extend_from_slice(&view.to_le_bytes());
        }
        let nulls: Vec<bool> = values.iter().map(Option::is_some).collect();
        let column = FixedSizeBinaryArray::try_new(16, Buffer::from_vec(views), Some(nulls.into()));
        (Arc::new(column.unwrap()), Buffer::from_vec(bytes))
    }

    #[test]
    fn a_batch_of_a_window_gets_its_own_values() {
        let values = [
            Some("a value past twelve bytes"),
            Some("short"),
            None,
            Some("another value past twelve bytes, ключ"),
            Some(""),
            Some("the last long value of the window"),
        ];
        let (column, bytes) = window(&values);
        // Each slice of the window, as the stream cuts batches.
        for (lo, len) in [(0, 6), (1, 3), (3, 3), (2, 1)] {
            let out = output(&column.slice(lo, len), &bytes, &DataType::Utf8View).unwrap();
            let got: Vec<Option<&str>> = out.as_string_view().iter().collect();
            assert_eq!(got, values[lo..lo + len].to_vec());
            let used: usize = (values[lo..lo + len].iter().flatten())
                .filter(|s| s.len() > 12)
                .map(|s| s.len())
                .sum();
            let held: usize = out
                .as_string_view()
                .data_buffers()
                .iter()
                .map(|b| b.len())
                .sum();
            assert_eq!(held, used, "a batch holds its own values' bytes only");
        }
        // Compared with Arrow's own arrays of the same values.
        let want = StringViewArray::from(values.to_vec());
        let out = output(&column, &bytes, &DataType::Utf8View).unwrap();
        assert_eq!(out.as_string_view(), &want);
    }

    #[test]
    fn data_staged_through_pages_arrives_whole() {
        use crate::backend::HostBackend;
        // Parts that straddle the pages, an empty one, and more pages than a round fills.
        let q = HostBackend::default();
        let page = q.staging().page_bytes();
        let sizes = [3 * page / 2, 0, 17, 9 * page + 5, page];
        let parts: Vec<Vec<u8>> = (sizes.iter().enumerate())
            .map(|(i, &n)| (0..n).map(|b| (b * 7 + i) as u8).collect())
            .collect();
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        let data = staged_upload(&q, &slices).unwrap();
        assert_eq!(data.as_slice(), parts.concat().as_slice());
    }

    #[test]
    fn views_outside_their_window_are_refused() {
        let (column, bytes) = window(&[
            Some("a value past twelve bytes"),
            Some("second value, long"),
        ]);
        // Fewer bytes than the views name, or a view not where the one before it ended.
        let short = bytes.slice_with_length(0, 30);
        assert!(output(&column, &short, &DataType::Utf8View).is_err());
        let (swapped, bytes2) = window(&[
            Some("second value, long"),
            Some("a value past twelve bytes"),
        ]);
        let raw = swapped.as_fixed_size_binary().value_data().to_vec();
        let mut twisted = raw.clone();
        twisted[16..32].copy_from_slice(&raw[..16]);
        let twisted: ArrayRef =
            Arc::new(FixedSizeBinaryArray::try_new(16, Buffer::from_vec(twisted), None).unwrap());
        assert!(output(&twisted, &bytes2, &DataType::Utf8View).is_err());
        assert!(output(&column, &bytes, &DataType::Int32).is_err());
    }
}
