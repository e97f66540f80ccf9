//! A build side's view values gathered on the device (`gpu_join.view_bytes_on_device`): where
//! the device carries a build string or binary column as its views ([`BuildViews`]), the bytes
//! those views point to are uploaded once too, and each output window's values are copied on
//! the device into a buffer of the window's own (lengths → scan → copy, `kernels/views.cu`),
//! which comes down with the window. The host then copies each output batch's views and its
//! contiguous bytes off the pages, reading nothing at random. Without it, a batch's views point
//! into the build side's buffers, and the host copies its values out of them row by row
//! (Arrow's `gc`, a random read each) where those buffers hold more than twice the bytes the
//! batch uses (`view_gather::compact_sparse`), which a batch of a large build side almost
//! always does.
//!
//! ```text
//!  build: listed data buffers ──upload once──► device `data` (+ each buffer's start)
//!  window: gathered views ──view_offsets──► offsets ──view_copy──► window bytes, views → (0, offset)
//!  host:   views + window bytes ──output──► Utf8View / BinaryView, one buffer a batch
//!          (a second for the values the host copies; cast back to Utf8, Binary, ... if needed)
//! ```
//!
//! The device gathers a column's values up to a length chosen from the column
//! ([`ValueStats::limit`]: at most [`MAX_DEVICE_VALUE`] bytes, the shortest that leaves at most
//! one value in 128 to the host besides the longer ones), so that a window's bytes are bounded
//! tightly: each window reserves that length a row. It leaves each longer value's view naming
//! the build side's bytes (its buffer index raised by one), and the host copies those values
//! into a second buffer of the output batch, each once a batch. A column takes this way where
//! at least half its bytes lie in values the device gathers, and its buffers hold not much
//! besides its values ([`Plan::of`]).

use std::sync::Arc;

use arrow::array::{
    AnyDictionaryArray, Array, ArrayRef, AsArray, GenericByteArray, GenericByteViewArray,
    OffsetSizeTrait,
};
use arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use arrow::datatypes::{
    ArrowNativeType, BinaryViewType, ByteArrayType, ByteViewType, DataType, StringViewType,
};
use datafusion::common::{HashMap, Result, exec_err, internal_datafusion_err, internal_err};

use super::device_views::{BuildViews, as_type, parts, window_views};
use super::dictionary_gather::for_each_key;
use super::sizing::PassValues;
use crate::backend::{Backend, ViewData};

/// Longest value (bytes) the device gathers: each window reserves at most this much a row on
/// the device and in its download. Longer values are left to the host, which copies each from
/// the build side's buffers into the output batch ([`output`]).
pub const MAX_DEVICE_VALUE: usize = 1024;

/// Value lengths counted together by [`ValueStats`]: 16 bytes a bucket, the last for values
/// longer than [`MAX_DEVICE_VALUE`].
const BUCKET_BYTES: usize = 16;
const BUCKETS: usize = MAX_DEVICE_VALUE / BUCKET_BYTES + 1;

/// At most one in this many out-of-line values is left to the host ([`ValueStats::limit`]).
const HOST_COPIES_ONE_IN: usize = 128;

/// What the out-of-line values of a build view column's arrays take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueStats {
    /// Bytes of the values held out of line (longer than 12 bytes), summed.
    pub used: usize,
    /// The longest such value.
    pub longest: usize,
    /// How many such values of each length bucket (`16 b + 1 ..= 16 (b + 1)` bytes; the last,
    /// longer than [`MAX_DEVICE_VALUE`]), and their bytes.
    values: [usize; BUCKETS],
    bytes: [usize; BUCKETS],
}

impl Default for ValueStats {
    fn default() -> Self {
        Self {
            used: 0,
            longest: 0,
            values: [0; BUCKETS],
            bytes: [0; BUCKETS],
        }
    }
}

impl ValueStats {
    /// Counts a value of `len` bytes, if it lies out of line.
    fn count(&mut self, len: usize) {
        if len > 12 {
            self.used += len;
            self.longest = self.longest.max(len);
            let b = ((len - 1) / BUCKET_BYTES).min(BUCKETS - 1);
            self.values[b] += 1;
            self.bytes[b] += len;
        }
    }

    /// Both counts together.
    fn add(mut self, other: &Self) -> Self {
        self.used += other.used;
        self.longest = self.longest.max(other.longest);
        for b in 0..BUCKETS {
            self.values[b] += other.values[b];
            self.bytes[b] += other.bytes[b];
        }
        self
    }

    /// The longest value the device gathers, and the bytes of the longer values, which the host
    /// copies: the shortest length (a bucket's end, at most [`MAX_DEVICE_VALUE`]) that leaves to
    /// the host at most one in [`HOST_COPIES_ONE_IN`] out-of-line values, or only the values
    /// longer than [`MAX_DEVICE_VALUE`] where those are more. Each window reserves that length a
    /// row, so a few long values among short ones do not shrink every window.
    pub fn limit(&self) -> (usize, usize) {
        let all: usize = self.values.iter().sum();
        let (mut above, mut above_bytes) = (self.values[BUCKETS - 1], self.bytes[BUCKETS - 1]);
        let mut limit = MAX_DEVICE_VALUE;
        for b in (0..BUCKETS - 1).rev() {
            // An empty bucket leaves no more values to the host.
            let more = self.values[b];
            if more > 0 && (above + more) * HOST_COPIES_ONE_IN > all {
                break;
            }
            above += self.values[b];
            above_bytes += self.bytes[b];
            limit = b * BUCKET_BYTES;
        }
        (limit.max(BUCKET_BYTES).min(self.longest), above_bytes)
    }

    /// Counts the non-null values of a string or binary array with offsets `offsets`.
    fn count_offsets<O: OffsetSizeTrait>(&mut self, offsets: &[O], nulls: Option<&NullBuffer>) {
        for (i, w) in offsets.windows(2).enumerate() {
            if nulls.is_none_or(|n| n.is_valid(i)) {
                self.count(w[1].as_usize() - w[0].as_usize());
            }
        }
    }

    /// Counts each row's value of a dictionary of strings or binary (nothing for others, or for
    /// a dictionary whose keys are past its values, which staging refuses).
    fn count_dictionary(&mut self, dictionary: &dyn AnyDictionaryArray) {
        let values = dictionary.values();
        /// The length of value `k` of an array with offsets.
        fn length<T: ByteArrayType>(a: &GenericByteArray<T>) -> impl Fn(usize) -> usize + '_ {
            |k| a.value_length(k).as_usize()
        }
        match values.data_type() {
            DataType::Utf8 => self.count_keys(dictionary, length(values.as_string::<i32>())),
            DataType::LargeUtf8 => self.count_keys(dictionary, length(values.as_string::<i64>())),
            DataType::Binary => self.count_keys(dictionary, length(values.as_binary::<i32>())),
            DataType::LargeBinary => self.count_keys(dictionary, length(values.as_binary::<i64>())),
            _ => {
                if let Some((views, _)) = parts(values.as_ref()) {
                    self.count_keys(dictionary, |k| views[k] as u32 as usize)
                }
            }
        }
    }

    /// Counts `length(k)` for each row's value `k` of `dictionary` that is not null.
    fn count_keys(&mut self, dictionary: &dyn AnyDictionaryArray, length: impl Fn(usize) -> usize) {
        let values = dictionary.values();
        let _ = for_each_key(dictionary, |_, key| {
            if let Some(k) = key.filter(|&k| values.is_valid(k)) {
                self.count(length(k));
            }
        });
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
                    DataType::Dictionary(..) => s.count_dictionary(a.as_any_dictionary()),
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
                .fold(Self::default(), |a, b| a.add(&b))
        })
    }
}

/// Which of a join's device view columns (in [`HostGather::build_views`]'s order) the device
/// gathers the values of, each with the longest value it gathers, for one execution.
///
/// [`HostGather::build_views`]: super::gather::HostGather::build_views
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Per column, the longest value the device gathers ([`ValueStats::limit`]), where it
    /// gathers its values.
    pub columns: Vec<Option<usize>>,
    /// Per column, where its values are gathered and why, for EXPLAIN ANALYZE.
    pub reasons: Vec<String>,
    /// Device bytes of the columns' data (the buffers and their starts).
    pub data_bytes: usize,
}

impl Plan {
    /// The plan for build view columns `views`, each with what its values take: each that has
    /// values out of line, at most half of whose bytes lie in the values longer than its
    /// [`limit`](ValueStats::limit) (which the host copies), and whose buffers hold at most
    /// four times the bytes of its values and 64 MiB more (a build side that is a small part of
    /// a larger table's batches, a filtered dimension, lists the whole table's buffers:
    /// uploading them all is worth it only where they are not much larger).
    pub fn of<'a>(views: impl IntoIterator<Item = (&'a BuildViews, ValueStats)>) -> Self {
        let mut plan = Self::default();
        for (v, stats) in views {
            let listed = v.data_bytes();
            let (limit, long) = stats.limit();
            let reason = if stats.used == 0 {
                "views (every value is inline)".to_string()
            } else if 2 * long > stats.used {
                format!(
                    "host ({long} of its {} bytes of values lie in values longer than the \
                     {limit} the device would gather)",
                    stats.used
                )
            } else if listed > 4 * stats.used + (64 << 20) {
                format!(
                    "host (its buffers hold {listed} bytes for {} bytes of values)",
                    stats.used
                )
            } else {
                plan.data_bytes += listed + 8 * v.buffers().len() + 128;
                plan.columns.push(Some(limit));
                plan.reasons.push(match long {
                    0 => "device".to_string(),
                    long => format!(
                        "device (the host copies the {long} bytes of values longer than \
                         {limit})"
                    ),
                });
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
    /// The longest value the device gathers (longer ones are left to the host), which bounds
    /// each window's bytes.
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
            max_copied: u32::try_from(self.longest).unwrap_or(u32::MAX),
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
/// value, and the batch's bytes copied into a buffer of their own; each value the device left
/// to the host (longer than it gathers: its view names its bytes in the build side's buffers
/// `build`, the buffer index raised by one) copied from there into a second buffer; for a type
/// with offsets, those views cast to it.
pub fn output(
    column: &ArrayRef,
    bytes: &Buffer,
    build: &[Buffer],
    dt: &DataType,
) -> Result<ArrayRef> {
    // The batch's values are its own already: nothing to compact.
    as_type(
        dt,
        |string| match string {
            true => output_as::<StringViewType>(column, bytes, build),
            false => output_as::<BinaryViewType>(column, bytes, build),
        },
        |views| views,
    )
}

fn output_as<T: ByteViewType>(
    column: &ArrayRef,
    bytes: &Buffer,
    build: &[Buffer],
) -> Result<ArrayRef> {
    let (raw, nulls) = window_views(column)?;
    let mut views = Vec::with_capacity(raw.len() / 16);
    // The device placed the batch's values one after another, in row order, from `first`.
    let mut first = None;
    let mut next = 0usize;
    // The values longer than the device gathers, copied from the build side's buffers, each
    // once however many rows of the batch take it (by where it lies and its length).
    let mut long = vec![];
    let mut copied: HashMap<(u32, usize, usize), u32> = HashMap::default();
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
        let kept = view & ((1u128 << 64) - 1);
        if index != 0 {
            let at = match copied.get(&(index, offset, len)) {
                Some(&at) => at,
                None => {
                    let value = (build.get(index as usize - 1))
                        .and_then(|b| b.get(offset..offset.checked_add(len)?));
                    let Some(value) = value else {
                        return internal_err!("a device view past the build side's buffers");
                    };
                    let at = long.len();
                    if at + len > u32::MAX as usize {
                        return exec_err!(
                            "the long values of an output batch, which the host copies, take \
                             more than the 2^32 - 1 bytes its views can point into"
                        );
                    }
                    long.extend_from_slice(value);
                    copied.insert((index, offset, len), at as u32);
                    at as u32
                }
            };
            views.push(kept | (1u128 << 64) | (u128::from(at) << 96));
            continue;
        }
        let start = *first.get_or_insert(offset);
        if offset != start + next || offset + len > bytes.len() {
            return internal_err!("a device view outside its window's values");
        }
        views.push(kept | (((offset - start) as u128) << 96));
        next += len;
    }
    let window = first.map(|start| Buffer::from_slice_ref(&bytes[start..start + next]));
    let data = match (window, long.is_empty()) {
        (window, false) => vec![window.unwrap_or_default(), Buffer::from_vec(long)],
        (Some(window), true) => vec![window],
        (None, true) => vec![],
    };
    // SAFETY: every non-null view is inline (as staged from a valid array of type `T`: the
    // device copies views bit for bit); or an out-of-line view that the device pointed at the
    // window's buffer (index 0) after copying the value its staged view named there, and which
    // the loop above checked lies within `data[0]` (the batch's values, placed one after
    // another from its first); or one the device left to the host (index raised by one), whose
    // bytes the loop copied from the build side's buffer that its staged view named (the same
    // valid value) to where it now points in `data[1]`; every null row's view is zero, an
    // empty inline value; `nulls` has one bit per view.
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
            let out = output(&column.slice(lo, len), &bytes, &[], &DataType::Utf8View).unwrap();
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
        let out = output(&column, &bytes, &[], &DataType::Utf8View).unwrap();
        assert_eq!(out.as_string_view(), &want);
    }

    #[test]
    fn values_longer_than_the_device_gathers_come_from_the_build_side() {
        let long = "a value longer than the device gathers, ".repeat(40);
        let other = "another long value, ".repeat(80);
        assert!(long.len() > MAX_DEVICE_VALUE && other.len() > MAX_DEVICE_VALUE);
        // The build side's buffers: the long values at offsets 7 and 3 of buffers 1 and 2.
        let build = [
            Buffer::from_vec(vec![0u8; 5]),
            Buffer::from_vec([&[1u8; 7][..], long.as_bytes()].concat()),
            Buffer::from_vec([&[2u8; 3][..], other.as_bytes()].concat()),
        ];
        let left = |s: &str, buffer: u32, offset: u32| {
            let prefix = u32::from_le_bytes(s.as_bytes()[..4].try_into().unwrap());
            (s.len() as u128)
                | (u128::from(prefix) << 32)
                | (u128::from(buffer) << 64)
                | (u128::from(offset) << 96)
        };
        // The window as the device leaves it: rows 1 and 4 left to the host, naming the build
        // side's bytes (buffer index raised by one).
        let values = [
            Some("a value past twelve bytes"),
            Some(long.as_str()),
            None,
            Some("short"),
            Some(other.as_str()),
            Some("the last value of the window, long"),
        ];
        let gathered: Vec<Option<&str>> = (values.iter())
            .map(|v| v.map(|s| if s.len() > MAX_DEVICE_VALUE { "x" } else { s }))
            .collect();
        let (column, window_bytes) = window(&gathered);
        let mut raw = column.as_fixed_size_binary().value_data().to_vec();
        raw[16..32].copy_from_slice(&left(&long, 2, 7).to_le_bytes());
        raw[64..80].copy_from_slice(&left(&other, 3, 3).to_le_bytes());
        let nulls = column.nulls().cloned();
        let column: ArrayRef =
            Arc::new(FixedSizeBinaryArray::try_new(16, Buffer::from_vec(raw), nulls).unwrap());
        for (lo, len) in [(0, 6), (1, 1), (1, 4), (3, 3), (2, 2)] {
            let out = output(
                &column.slice(lo, len),
                &window_bytes,
                &build,
                &DataType::Utf8,
            );
            let out = out.unwrap();
            let got: Vec<Option<&str>> = out.as_string::<i32>().iter().collect();
            assert_eq!(
                got,
                values[lo..lo + len].to_vec(),
                "rows {lo}..{}",
                lo + len
            );
        }
        // A long value that rows of a batch repeat is copied once.
        let twice = left(&long, 2, 7).to_le_bytes().repeat(2);
        let twice: ArrayRef =
            Arc::new(FixedSizeBinaryArray::try_new(16, Buffer::from_vec(twice), None).unwrap());
        let out = output(&twice, &window_bytes, &build, &DataType::Utf8View).unwrap();
        let out = out.as_string_view();
        assert_eq!(out.iter().collect::<Vec<_>>(), vec![Some(long.as_str()); 2]);
        let held: Vec<usize> = out.data_buffers().iter().map(|b| b.len()).collect();
        assert_eq!(held, vec![0, long.len()]);
        // A long view past the build side's buffers is refused.
        let mut raw = column.as_fixed_size_binary().value_data().to_vec();
        raw[16..32].copy_from_slice(&left(&long, 2, 9).to_le_bytes());
        let bad: ArrayRef =
            Arc::new(FixedSizeBinaryArray::try_new(16, Buffer::from_vec(raw), None).unwrap());
        assert!(output(&bad, &window_bytes, &build, &DataType::Utf8View).is_err());
    }

    #[test]
    fn columns_mostly_of_long_values_keep_them_on_the_host() {
        use arrow::array::StringArray;
        let long = "x".repeat(MAX_DEVICE_VALUE + 1);
        let plan_of = |values: Vec<String>| {
            let a: ArrayRef = Arc::new(StringArray::from(values));
            let views = BuildViews::new(std::slice::from_ref(&a), 16).unwrap();
            Plan::of([(&views, ValueStats::of(&[a]))])
        };
        // One long value among many short ones: the device gathers the short ones, each window
        // reserving their bucket's end (32 bytes) a row, and the host copies the long one.
        let mut few: Vec<String> = (0..200).map(|i| format!("value number {i:>8}")).collect();
        few.push(long.clone());
        let plan = plan_of(few.clone());
        assert_eq!(plan.columns, vec![Some(32)]);
        assert_eq!(
            plan.reasons[0],
            "device (the host copies the 1025 bytes of values longer than 32)"
        );
        // One in 100 long: more than the host copies; the device gathers them all.
        few.truncate(99);
        few.push("x".repeat(500));
        assert_eq!(plan_of(few.clone()).columns, vec![Some(500)]);
        // One in 100 over 1 KiB, which the host copies however many: the limit still comes
        // down to the short values.
        few.truncate(99);
        few.push(long.clone());
        let plan = plan_of(few);
        assert_eq!(plan.columns, vec![Some(32)]);
        // Most bytes in long values: the host.
        let plan = plan_of(vec![long.clone(), long, "value past twelve".into()]);
        assert_eq!(plan.columns, vec![None]);
        assert!(plan.reasons[0].starts_with("host (2050 of its 2067 bytes"));
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
        assert!(output(&column, &short, &[], &DataType::Utf8View).is_err());
        let (swapped, bytes2) = window(&[
            Some("second value, long"),
            Some("a value past twelve bytes"),
        ]);
        let raw = swapped.as_fixed_size_binary().value_data().to_vec();
        let mut twisted = raw.clone();
        twisted[16..32].copy_from_slice(&raw[..16]);
        let twisted: ArrayRef =
            Arc::new(FixedSizeBinaryArray::try_new(16, Buffer::from_vec(twisted), None).unwrap());
        assert!(output(&twisted, &bytes2, &[], &DataType::Utf8View).is_err());
        assert!(output(&column, &bytes, &[], &DataType::Int32).is_err());
    }
}
