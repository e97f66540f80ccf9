//! [`BuildViews`]: a build side's string or binary column carried through the device as
//! 16-byte views, while the bytes the views point to stay in host memory.
//!
//! A view array's rows are 16-byte views: a value of at most 12 bytes lies in its view; a
//! longer one is its length, its first 4 bytes, and the index and offset of its bytes among the
//! array's data buffers. The device moves fixed-width columns, so it carries a build column's
//! views like any 16-byte column, once every view indexes the same buffer list: staging gives
//! each batch's views the index of their buffer in one list of the whole build side's buffers
//! ([`stage`](BuildViews::stage)), and each output array is the device's gathered views over
//! that list ([`output`](BuildViews::output)). The host copies the views off the download page
//! and looks nothing up; an output array that uses few of the list's bytes has them copied
//! into a buffer of its own ([`compact_sparse`]), as gathered views on the host do.
//!
//! Columns of the view types (`Utf8View`, `BinaryView`) are carried as they are. Columns with
//! offsets (`Utf8`, `LargeUtf8`, `Binary`, `LargeBinary`) are carried the same way: staging
//! makes each batch's views over its own values buffer in one pass, the values not copied,
//! and each output array is cast back to the column's type, one sequential copy of its values.
//! Dictionaries of either (with 32- or 64-bit keys) carry each row as its value's view, over
//! the dictionary's buffers, and each output array is the gathered values under keys `0..n`.
//!
//! The other way, [`HostGather`](super::gather::HostGather), moves a 4-byte build row position
//! down instead of the 16-byte view and finds each row's batch and value on the host.
//! `gpu_join.views_on_device` chooses between them; BENCHMARKS.md measures both.
//!
//! ```text
//!  build batches' views ──stage: buffer index → place in the list──► device column (16 bytes)
//!  (Utf8, Binary, ...: views made over each batch's values buffer first)
//!  device window column ──output: views over the list, nulls zeroed──► Utf8View / BinaryView
//!                                                       (cast back to Utf8, Binary, ...)
//! ```

use std::sync::Arc;

use arrow::array::builder::make_view;
use arrow::array::{
    AnyDictionaryArray, Array, ArrayRef, AsArray, BinaryViewArray, FixedSizeBinaryArray,
    GenericByteArray, GenericByteViewArray, StringViewArray,
};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer, ScalarBuffer};
use arrow::compute::TakeOptions;
use arrow::datatypes::{
    ArrowNativeType, BinaryViewType, ByteArrayType, ByteViewType, DataType, StringViewType,
};
use datafusion::common::{Result, exec_err, internal_err};

use super::dictionary_gather::{for_each_key, over_values};
use super::view_gather::{ViewBuffers, compact_sparse};

/// Bytes of a view on the device.
pub const VIEW_BYTES: i32 = 16;

/// Whether `dt` is a view type.
pub fn is_view(dt: &DataType) -> bool {
    matches!(dt, DataType::Utf8View | DataType::BinaryView)
}

/// Whether the device can carry a build column of type `dt` as views: a view type, a string or
/// binary type with offsets ([`as_views`]), or a dictionary of those with 32- or 64-bit keys
/// (each row carried as its value's view; the output is the gathered values under keys
/// `0..n`, which 8- and 16-bit keys cannot number for a window of rows).
pub fn carried_as_views(dt: &DataType) -> bool {
    is_view(dt) || has_offsets(dt) || dictionary_values(dt).is_some()
}

/// The value type of a dictionary type the device carries as views ([`carried_as_views`]).
fn dictionary_values(dt: &DataType) -> Option<&DataType> {
    use DataType::*;
    match dt {
        Dictionary(keys, values)
            if matches!(**keys, Int32 | Int64 | UInt32 | UInt64)
                && (is_view(values) || has_offsets(values)) =>
        {
            Some(values)
        }
        _ => None,
    }
}

/// Whether `dt` is a string or binary type with offsets.
fn has_offsets(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary
    )
}

/// The buffers the views of `array` point into, if the device can carry it as views: a view
/// array's data buffers; a string or binary array's one values buffer; a dictionary's values'.
pub fn value_buffers(array: &dyn Array) -> Option<&[Buffer]> {
    fn values<T: ByteArrayType>(a: &GenericByteArray<T>) -> &[Buffer] {
        std::slice::from_ref(a.values())
    }
    match array.data_type() {
        DataType::Utf8 => Some(values(array.as_string::<i32>())),
        DataType::LargeUtf8 => Some(values(array.as_string::<i64>())),
        DataType::Binary => Some(values(array.as_binary::<i32>())),
        DataType::LargeBinary => Some(values(array.as_binary::<i64>())),
        dt if dictionary_values(dt).is_some() => {
            value_buffers(array.as_any_dictionary().values().as_ref())
        }
        _ => parts(array).map(|(_, buffers)| buffers),
    }
}

/// `array` as a view array over the buffers [`value_buffers`] gives: itself if it is one; a
/// string or binary array's views over its own values buffer, the values not copied (Arrow's
/// conversion, which reuses the buffer); a dictionary's rows' values' views. An error where
/// the buffer holds 2^32 - 1 bytes or more (a view's offset has 32 bits; [`beyond_views`]), or
/// for another type.
pub fn as_views(array: &ArrayRef) -> Result<ArrayRef> {
    if let Some(why) = beyond_view(array.as_ref()) {
        return exec_err!("{why}");
    }
    // Arrow's conversion reuses the values buffer, as one data buffer, where it fits 32 bits.
    Ok(match array.data_type() {
        DataType::Utf8View | DataType::BinaryView => Arc::clone(array),
        DataType::Utf8 => Arc::new(StringViewArray::from(array.as_string::<i32>())),
        DataType::LargeUtf8 => Arc::new(StringViewArray::from(array.as_string::<i64>())),
        DataType::Binary => Arc::new(BinaryViewArray::from(array.as_binary::<i32>())),
        DataType::LargeBinary => Arc::new(BinaryViewArray::from(array.as_binary::<i64>())),
        // Each row its value's view, over the values' buffers (a key past the values is an
        // error); null where the key or the value is. (Arrow's cast to a view type keeps a null
        // value's row valid.)
        dt if dictionary_values(dt).is_some() => {
            let d = array.as_any_dictionary();
            let values = as_views(d.values())?;
            let bounds = Some(TakeOptions { check_bounds: true });
            arrow::compute::take(values.as_ref(), d.keys(), bounds)?
        }
        dt => return internal_err!("views made of an array of type {dt}"),
    })
}

/// Why the device cannot carry `arrays` (a build column's batches, `nullable` as its field
/// says) as views, if it cannot: a batch of a type with offsets whose values buffer is longer
/// than a view's 32-bit offset can point into ([`as_views`]; Arrow's conversion refuses such a
/// buffer even where the batch's own values lie at its start); a dictionary of a column
/// declared non-null with a row whose value is null (Arrow checks only its keys' nulls, and
/// the staged column has no room for nulls).
pub fn beyond_views(arrays: &[ArrayRef], nullable: bool) -> Option<String> {
    arrays.iter().find_map(|a| {
        let a = a.as_ref();
        if !nullable && a.logical_null_count() > a.null_count() {
            return Some(format!(
                "a {} column declared non-null has rows whose dictionary value is null",
                a.data_type()
            ));
        }
        beyond_view(a)
    })
}

/// [`beyond_views`] for one batch (a dictionary's: its values').
fn beyond_view(a: &dyn Array) -> Option<String> {
    if dictionary_values(a.data_type()).is_some() {
        return beyond_view(a.as_any_dictionary().values().as_ref());
    }
    if !has_offsets(a.data_type()) {
        return None;
    }
    // The whole values buffer, which a sliced batch shares with the rest of its array.
    let len = value_buffers(a)?.first()?.len();
    (len >= u32::MAX as usize).then(|| {
        format!(
            "a {} batch's values buffer holds {len} bytes, past the 2^32 - 1 a view can point \
             into",
            a.data_type()
        )
    })
}

/// The views of a build batch (`array`) as staged: each out-of-line view's buffer index the
/// place in the list of the buffer it names (`places`: the places of the batch's buffers). A
/// view array's own views, renumbered; a string or binary array's views made over its one
/// values buffer in one pass; a dictionary's, each row its value's ([`dictionary_views`]).
fn staged_views(array: &dyn Array, places: &[u32]) -> Result<Vec<u128>> {
    fn over<T: ByteArrayType>(a: &GenericByteArray<T>, place: u32) -> Vec<u128> {
        (0..a.len())
            .map(|i| match a.is_valid(i) {
                true => offset_view(a, place, i),
                false => 0,
            })
            .collect()
    }
    if dictionary_values(array.data_type()).is_some() {
        return dictionary_views(array.as_any_dictionary(), places);
    }
    let unlisted = || internal_err!("a batch of views the build side did not list");
    if has_offsets(array.data_type()) {
        if let Some(why) = beyond_view(array) {
            return exec_err!("{why}");
        }
        let &[place] = places else {
            return unlisted();
        };
        return Ok(match array.data_type() {
            DataType::Utf8 => over(array.as_string::<i32>(), place),
            DataType::LargeUtf8 => over(array.as_string::<i64>(), place),
            DataType::Binary => over(array.as_binary::<i32>(), place),
            _ => over(array.as_binary::<i64>(), place),
        });
    }
    let Some((views, data)) = parts(array) else {
        return internal_err!("views staged from an array of type {}", array.data_type());
    };
    if places.len() != data.len() {
        return unlisted();
    }
    (views.iter())
        .map(|&view| listed_view(view, places))
        .collect()
}

/// The view of value `i` of `a` (a string or binary array with offsets), over its values
/// buffer, which lies at `place` in the list.
fn offset_view<T: ByteArrayType>(a: &GenericByteArray<T>, place: u32, i: usize) -> u128 {
    let offsets = a.value_offsets();
    let (start, end) = (offsets[i].as_usize(), offsets[i + 1].as_usize());
    make_view(&a.values()[start..end], place, start as u32)
}

/// `view` (of a view array whose buffers lie at `places` in the list) as staged: its buffer
/// index that buffer's place, where its value is out of line.
fn listed_view(view: u128, places: &[u32]) -> Result<u128> {
    match inline(view) {
        true => Ok(view),
        false => match places.get((view >> 64) as u32 as usize) {
            Some(&place) => Ok(with_buffer(view, place)),
            None => internal_err!("a view past its data buffers"),
        },
    }
}

/// [`staged_views`] of a dictionary: each row its value's staged view, 0 (an empty inline
/// value) for a null key or value. A dictionary with no more values than rows has each
/// value's view made once; a larger one (shared by the slices of a table's array) has each
/// row's value's made alone.
fn dictionary_views(dictionary: &dyn AnyDictionaryArray, places: &[u32]) -> Result<Vec<u128>> {
    let values = dictionary.values();
    let mut views = vec![0; dictionary.len()];
    if values.len() <= views.len() {
        let all = staged_views(values.as_ref(), places)?;
        for_each_key(dictionary, |row, key| {
            if let Some(k) = key.filter(|&k| values.is_valid(k)) {
                views[row] = all[k];
            }
        })?;
        return Ok(views);
    }
    // Each row's value's view alone, as `staged_views` makes it for the value's row.
    let unlisted = || internal_err!("a dictionary the build side did not list");
    let mut failed = Ok(());
    let mut each = |view_of: &dyn Fn(usize) -> Result<u128>| {
        for_each_key(dictionary, |row, key| {
            if let Some(k) = key.filter(|&k| values.is_valid(k) && failed.is_ok()) {
                match view_of(k) {
                    Ok(view) => views[row] = view,
                    Err(e) => failed = Err(e),
                }
            }
        })
    };
    let v = values.as_ref();
    if has_offsets(v.data_type()) {
        if let Some(why) = beyond_view(v) {
            return exec_err!("{why}");
        }
        let &[place] = places else {
            return unlisted();
        };
        match v.data_type() {
            DataType::Utf8 => each(&|k| Ok(offset_view(v.as_string::<i32>(), place, k))),
            DataType::LargeUtf8 => each(&|k| Ok(offset_view(v.as_string::<i64>(), place, k))),
            DataType::Binary => each(&|k| Ok(offset_view(v.as_binary::<i32>(), place, k))),
            _ => each(&|k| Ok(offset_view(v.as_binary::<i64>(), place, k))),
        }?;
    } else {
        let Some((value_views, data)) = parts(v) else {
            return internal_err!("dictionary values of type {}", v.data_type());
        };
        if places.len() != data.len() {
            return unlisted();
        }
        each(&|k| listed_view(value_views[k], places))?;
    }
    failed.map(|()| views)
}

/// The views and data buffers of a view array, `None` for other arrays.
pub fn parts(array: &dyn Array) -> Option<(&[u128], &[Buffer])> {
    match array.data_type() {
        DataType::Utf8View => {
            let a = array.as_string_view();
            Some((a.views(), a.data_buffers()))
        }
        DataType::BinaryView => {
            let a = array.as_binary_view();
            Some((a.views(), a.data_buffers()))
        }
        _ => None,
    }
}

/// Whether a view holds its value itself (at most 12 bytes).
fn inline(view: u128) -> bool {
    view as u32 <= 12
}

/// `view` with its buffer index (bits 64..96) replaced by `index`.
fn with_buffer(view: u128, index: u32) -> u128 {
    (view & !(u128::from(u32::MAX) << 64)) | (u128::from(index) << 64)
}

/// One build column's data buffers, listed for the views the device carries.
#[derive(Debug)]
pub struct BuildViews {
    /// The build side's data buffers, each once, as the staged views index them, and each
    /// batch's buffers' places among them.
    listed: ViewBuffers,
    /// The build row of each listed array's first row (ascending; staging names a batch by
    /// its first row).
    firsts: Vec<usize>,
    /// Where the build side's arrays held more than `max_buffers` buffers: its rows, in build
    /// row order, with their values copied into a few buffers of their own, the one array
    /// listed; staging reads its views instead of the batches'. A single-threaded copy of the
    /// whole column: an execution gathers such views on the host instead where it can
    /// (`RunSpec::views_on_host`), so this is for a build side of 2^32 rows or more.
    compacted: Option<ArrayRef>,
}

impl BuildViews {
    /// The buffers of a build column whose non-empty batches hold `arrays` (of a type
    /// [`carried_as_views`], in build row order). Where they hold more than `max_buffers`
    /// distinct buffers, which every output array would list, the column's values are copied
    /// into a few buffers first.
    pub fn new(arrays: &[ArrayRef], max_buffers: usize) -> Result<Self> {
        let Some(listed) = Self::listed(arrays) else {
            return internal_err!("views listed from arrays of another type");
        };
        if listed.buffers() <= max_buffers {
            let firsts = arrays
                .iter()
                .scan(0, |at, a| {
                    *at += a.len();
                    Some(*at - a.len())
                })
                .collect();
            return Ok(Self {
                listed,
                firsts,
                compacted: None,
            });
        }
        // Each array's views first: Arrow's `concat` would merge dictionaries, and panics over
        // some (views).
        let views = arrays.iter().map(as_views).collect::<Result<Vec<_>>>()?;
        let refs: Vec<&dyn Array> = views.iter().map(|a| a.as_ref()).collect();
        let compacted = compact(&arrow::compute::concat(&refs)?)?;
        let Some(listed) = ViewBuffers::listed(std::slice::from_ref(&compacted)) else {
            return internal_err!("compacted views of another type");
        };
        Ok(Self {
            listed,
            firsts: vec![0],
            compacted: Some(compacted),
        })
    }

    /// The buffers of `arrays` (of a type [`carried_as_views`]) as their views point into
    /// them, each once; `None` if an array is of another type.
    pub fn listed(arrays: &[ArrayRef]) -> Option<ViewBuffers> {
        ViewBuffers::listed_by(arrays, |a| value_buffers(a.as_ref()))
    }

    /// The listed data buffers, as the staged views index them.
    pub fn buffers(&self) -> &Arc<[Buffer]> {
        self.listed.all()
    }

    /// Bytes of the listed data buffers.
    pub fn data_bytes(&self) -> usize {
        self.listed.all().iter().map(Buffer::len).sum()
    }

    /// Bytes of the data buffers held.
    pub fn held_bytes(&self) -> usize {
        self.listed.all().iter().map(Buffer::capacity).sum()
    }

    /// The views of `array` (a batch of the column, whose first row is build row `first_row`)
    /// as the device carries them: each out-of-line view's buffer index replaced by that
    /// buffer's place in the list, as a `FixedSizeBinary(16)` array with `array`'s nulls.
    pub fn stage(&self, array: &ArrayRef, first_row: usize) -> Result<ArrayRef> {
        if array.is_empty() {
            return Ok(Arc::new(FixedSizeBinaryArray::new_null(VIEW_BYTES, 0)));
        }
        let (source, listed_as) = match &self.compacted {
            Some(c) if first_row + array.len() <= c.len() => (c.slice(first_row, array.len()), 0),
            Some(_) => return internal_err!("build rows past the compacted views"),
            None => match self.firsts.binary_search(&first_row) {
                Ok(a) => (Arc::clone(array), a),
                Err(_) => return internal_err!("no build batch starts at row {first_row}"),
            },
        };
        let places = self.listed.places(listed_as);
        let staged = staged_views(source.as_ref(), places)?;
        let values = ScalarBuffer::from(staged).into_inner();
        // Logical nulls: a dictionary's row is null where its key or its value is.
        Ok(Arc::new(FixedSizeBinaryArray::try_new(
            VIEW_BYTES,
            values,
            source.logical_nulls(),
        )?))
    }

    /// The array of type `dt` whose views the device gathered into `column` (a
    /// `FixedSizeBinary(16)` column of a download page): the views and nulls copied off the
    /// page, over the listed buffers, and compacted where they use few of their bytes; for a
    /// type with offsets, those views cast to it (its values copied in row order); for a
    /// dictionary, those values under keys `0..n`.
    pub fn output(&self, column: &ArrayRef, dt: &DataType) -> Result<ArrayRef> {
        as_type(
            dt,
            |string| match string {
                true => self.output_as::<StringViewType>(column),
                false => self.output_as::<BinaryViewType>(column),
            },
            compact_sparse,
        )
    }

    fn output_as<T: ByteViewType>(&self, column: &ArrayRef) -> Result<ArrayRef> {
        // Copied off the page, a null row's view zeroed (an empty inline value: the device
        // leaves it undefined).
        let (raw, nulls) = window_views(column)?;
        let mut views = Vec::with_capacity(raw.len() / 16);
        for (i, bytes) in raw.chunks_exact(16).enumerate() {
            let view = u128::from_le_bytes(bytes.try_into().unwrap_or([0; 16]));
            if nulls.as_ref().is_some_and(|n| n.is_null(i)) {
                views.push(0);
                continue;
            }
            if !inline(view) {
                let (len, index, offset) = (
                    view as u32 as usize,
                    (view >> 64) as u32 as usize,
                    (view >> 96) as u32 as usize,
                );
                let fits = self
                    .listed
                    .all()
                    .get(index)
                    .is_some_and(|b| offset.checked_add(len).is_some_and(|end| end <= b.len()));
                if !fits {
                    return internal_err!("a device view past the build side's buffers");
                }
            }
            views.push(view);
        }
        // SAFETY: every non-null view is one `stage` wrote for a valid array of type `T` (the
        // device copies fixed-width values bit for bit): the array's own view with its buffer
        // index replaced by that same buffer's place in the listed buffers, so it names the same
        // valid bytes (each out-of-line view's bounds are checked above besides); every null
        // row's view is zero, an empty inline value; `nulls` has one bit per view.
        let array = unsafe {
            GenericByteViewArray::<T>::new_unchecked(
                ScalarBuffer::from(views),
                Arc::clone(self.listed.all()),
                nulls,
            )
        };
        Ok(Arc::new(array))
    }
}

/// The output array of type `dt` (a type [`carried_as_views`]) of a column whose rows' views
/// `views` gives, as a `Utf8View` array (`views(true)`) or a `BinaryView` one (`views(false)`):
/// for a view type, that array `finish`ed; for a type with offsets, that array cast to it
/// ([`cast_views`]); for a dictionary, its values' type made so, under keys `0..n`.
pub(super) fn as_type(
    dt: &DataType,
    views: impl FnOnce(bool) -> Result<ArrayRef>,
    finish: impl FnOnce(ArrayRef) -> ArrayRef,
) -> Result<ArrayRef> {
    match dt {
        DataType::Dictionary(keys, values) if dictionary_values(dt).is_some() => {
            over_values(keys, as_type(values, views, finish)?)
        }
        DataType::Utf8View => Ok(finish(views(true)?)),
        DataType::BinaryView => Ok(finish(views(false)?)),
        DataType::Utf8 | DataType::LargeUtf8 => cast_views(&views(true)?, dt),
        DataType::Binary | DataType::LargeBinary => cast_views(&views(false)?, dt),
        _ => internal_err!("device views output as {dt}"),
    }
}

/// `views` (a view array) cast to `dt`, the type with offsets whose column the device carried as
/// views ([`carried_as_views`]). An error, as Arrow's `take` gives on the host, where a `Utf8` or
/// `Binary` batch's values would pass its 32-bit offsets (Arrow's cast would panic).
fn cast_views(views: &ArrayRef, dt: &DataType) -> Result<ArrayRef> {
    if !has_offsets(dt) {
        return internal_err!("device views cast to {dt}");
    }
    if matches!(dt, DataType::Utf8 | DataType::Binary) {
        // Summed over the views: rows may share a value's bytes.
        let (raw, _) = parts(views.as_ref()).unwrap_or_default();
        let bytes: u64 = (raw.iter().enumerate())
            .filter(|&(i, _)| views.is_valid(i))
            .map(|(_, &v)| u64::from(v as u32))
            .sum();
        if bytes > i32::MAX as u64 {
            return exec_err!(
                "an output batch of {dt} would hold {bytes} bytes of values, more than its \
                 32-bit offsets can address"
            );
        }
    }
    Ok(arrow::compute::cast(views, dt)?)
}

/// The views of a device window's view column (`column`: a `FixedSizeBinary(16)` slice of a
/// download page), 16 bytes a row, and its nulls copied off the page (which goes back to its
/// pool).
pub(super) fn window_views(column: &ArrayRef) -> Result<(&[u8], Option<NullBuffer>)> {
    let Some(fixed) = column.as_fixed_size_binary_opt() else {
        return internal_err!("device views in a column of type {}", column.data_type());
    };
    if fixed.value_length() != VIEW_BYTES {
        return internal_err!("device views of {} bytes", fixed.value_length());
    }
    let nulls = fixed.nulls().map(|n| {
        let bits = n.inner();
        NullBuffer::new(BooleanBuffer::new(
            Buffer::from_slice_ref(bits.values()),
            bits.offset(),
            bits.len(),
        ))
    });
    Ok((fixed.value_data(), nulls))
}

/// `array` (a view array) with its values copied into buffers of its own.
fn compact(array: &ArrayRef) -> Result<ArrayRef> {
    Ok(match array.data_type() {
        DataType::Utf8View => Arc::new(array.as_string_view().gc()),
        DataType::BinaryView => Arc::new(array.as_binary_view().gc()),
        dt => return internal_err!("compacting views of type {dt}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each of `arrays` staged, starting at row `firsts[i]` of the build side.
    fn staged(views: &BuildViews, arrays: &[ArrayRef], firsts: &[usize]) -> Vec<ArrayRef> {
        (arrays.iter().zip(firsts))
            .map(|(a, &first)| views.stage(a, first).unwrap())
            .collect()
    }

    /// What the device does with a staged column: rows `at` gathered bit for bit, `None` a
    /// null (its bytes left as garbage).
    fn gathered(staged: &[ArrayRef], at: &[Option<(usize, usize)>]) -> ArrayRef {
        let mut bytes = vec![];
        let mut valid = vec![];
        for a in at {
            match *a {
                Some((batch, row)) => {
                    let f = staged[batch].as_fixed_size_binary();
                    bytes.extend_from_slice(f.value(row));
                    valid.push(f.is_valid(row));
                }
                None => {
                    bytes.extend_from_slice(&[0xAB; 16]);
                    valid.push(false);
                }
            }
        }
        Arc::new(
            FixedSizeBinaryArray::try_new(16, Buffer::from_vec(bytes), Some(valid.into())).unwrap(),
        )
    }

    #[test]
    fn views_carried_by_the_device_come_back_as_the_build_sides_values() {
        let long = |i: usize| format!("a value past twelve bytes, number {i}");
        let a = StringViewArray::from(vec![Some(long(0)), None, Some("short".into())]);
        // Two slices of one array share its buffer; `c` has buffers of its own.
        let b = a.slice(1, 2);
        let c = StringViewArray::from(vec![Some(long(1)), Some(String::new()), Some(long(2))]);
        let arrays: Vec<ArrayRef> = vec![Arc::new(a.clone()), Arc::new(b), Arc::new(c.clone())];
        let firsts = [0, 3, 5];
        let rows: Vec<Option<&str>> = arrays
            .iter()
            .flat_map(|x| x.as_string_view().iter().collect::<Vec<_>>())
            .collect();
        for max_buffers in [16, 1] {
            let views = BuildViews::new(&arrays, max_buffers).unwrap();
            assert_eq!(views.compacted.is_some(), max_buffers == 1);
            let staged = staged(&views, &arrays, &firsts);
            let at = [
                Some((2, 2)),
                None,
                Some((0, 0)),
                Some((1, 0)),
                Some((2, 1)),
                Some((0, 2)),
                Some((2, 0)),
            ];
            let out = views
                .output(&gathered(&staged, &at), &DataType::Utf8View)
                .unwrap();
            let want: Vec<Option<&str>> = at
                .iter()
                .map(|a| a.and_then(|(batch, row)| rows[firsts[batch] + row]))
                .collect();
            assert_eq!(out.as_string_view().iter().collect::<Vec<_>>(), want);
            // The null row's garbage is not kept.
            assert_eq!(out.as_string_view().views()[1], 0);
        }
        // Binary views alike.
        let bin: ArrayRef = Arc::new(BinaryViewArray::from(vec![
            b"binary value past twelve bytes".as_slice(),
            b"tiny",
        ]));
        let views = BuildViews::new(std::slice::from_ref(&bin), 16).unwrap();
        let staged = views.stage(&bin, 0).unwrap();
        let out = views
            .output(
                &gathered(&[staged], &[Some((0, 1)), Some((0, 0))]),
                &DataType::BinaryView,
            )
            .unwrap();
        let got: Vec<_> = out.as_binary_view().iter().flatten().collect();
        assert_eq!(
            got,
            vec![b"tiny".as_slice(), b"binary value past twelve bytes"]
        );
    }

    #[test]
    fn strings_and_binary_with_offsets_come_back_as_their_own_type() {
        use arrow::array::{BinaryArray, LargeBinaryArray, LargeStringArray, StringArray};
        let values = [
            Some("a value past twelve bytes, ключ"),
            None,
            Some(""),
            Some("short"),
            Some("another value past twelve bytes"),
        ];
        let bytes: Vec<Option<&[u8]>> = values.iter().map(|v| v.map(str::as_bytes)).collect();
        let columns: [ArrayRef; 4] = [
            Arc::new(StringArray::from(values.to_vec())),
            Arc::new(LargeStringArray::from(values.to_vec())),
            Arc::new(BinaryArray::from(bytes.clone())),
            Arc::new(LargeBinaryArray::from(bytes)),
        ];
        for whole in columns {
            let dt = whole.data_type().clone();
            assert!(carried_as_views(&dt));
            // Two batches: slices of one array, whose offsets start past its buffer's first
            // byte, sharing its values buffer.
            let arrays = [whole.slice(0, 2), whole.slice(2, 3)];
            let views = BuildViews::new(&arrays, 16).unwrap();
            assert_eq!(
                views.buffers().len(),
                1,
                "{dt}: one values buffer, listed once"
            );
            let made = as_views(&arrays[1]).unwrap();
            let (_, data) = parts(made.as_ref()).unwrap();
            assert_eq!(
                data[0].as_ptr(),
                views.buffers()[0].as_ptr(),
                "{dt}: views over the values, not a copy"
            );
            let staged = staged(&views, &arrays, &[0, 2]);
            let at = [Some((1, 2)), Some((0, 1)), Some((0, 0)), None, Some((1, 0))];
            let out = views.output(&gathered(&staged, &at), &dt).unwrap();
            assert_eq!(out.data_type(), &dt);
            let rows: Vec<usize> = at
                .iter()
                .map(|a| a.map_or(1, |(batch, row)| [0, 2][batch] + row))
                .collect();
            let want = arrow::compute::take(
                &whole,
                &arrow::array::UInt32Array::from_iter_values(rows.iter().map(|&r| r as u32)),
                None,
            )
            .unwrap();
            assert_eq!(out.as_ref(), want.as_ref(), "{dt}");
        }
        let numbers: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![1]));
        assert!(as_views(&numbers).is_err() && !carried_as_views(&DataType::Int32));
    }

    #[test]
    fn dictionaries_come_back_as_their_rows_values_under_keys_of_their_type() {
        use arrow::array::{DictionaryArray, Int32Array, StringArray, UInt64Array};
        use arrow::datatypes::{Int32Type, UInt64Type};
        let long = "a value past twelve bytes, ключ";
        // Values with a null and an inline one; keys with a null, a key to the null value,
        // repeats.
        let values = [
            Some(long),
            None,
            Some("short"),
            Some("another value past twelve"),
        ];
        let keys = [Some(0), None, Some(1), Some(3), Some(0), Some(2), Some(3)];
        let utf8: ArrayRef = Arc::new(StringArray::from(values.to_vec()));
        let views: ArrayRef = Arc::new(StringViewArray::from(values.to_vec()));
        let want_rows: Vec<Option<&str>> = keys
            .iter()
            .map(|k| k.and_then(|k: i32| values[k as usize]))
            .collect();
        for dictionary_values in [utf8, views] {
            let dict: ArrayRef = Arc::new(
                DictionaryArray::<Int32Type>::try_new(
                    Int32Array::from(keys.to_vec()),
                    Arc::clone(&dictionary_values),
                )
                .unwrap(),
            );
            let dt = dict.data_type().clone();
            assert!(carried_as_views(&dt));
            // Batches: the whole array (no more values than rows: each value's view made once)
            // and a slice of two rows (more values than rows: each row's value alone).
            let arrays = [Arc::clone(&dict), dict.slice(5, 2)];
            // Listed as they are, and (no buffer allowed) compacted into views of their own.
            for max_buffers in [16, 0] {
                let views = BuildViews::new(&arrays, max_buffers).unwrap();
                assert_eq!(views.compacted.is_some(), max_buffers == 0);
                let staged = staged(&views, &arrays, &[0, 7]);
                // The null key's and the null value's rows are null as staged.
                assert_eq!(staged[0].null_count(), 2, "{dt}");
                let at = [
                    Some((0, 3)),
                    Some((1, 1)),
                    Some((0, 2)),
                    None,
                    Some((0, 0)),
                    Some((1, 0)),
                    Some((0, 1)),
                    Some((0, 4)),
                ];
                let out = views.output(&gathered(&staged, &at), &dt).unwrap();
                assert_eq!(out.data_type(), &dt);
                let got: Vec<Option<String>> = (0..out.len())
                    .map(|i| {
                        let d = out.as_any_dictionary();
                        let one = arrow::compute::cast(&d.slice(i, 1), &DataType::Utf8).unwrap();
                        one.as_string::<i32>()
                            .iter()
                            .next()
                            .flatten()
                            .map(str::to_string)
                    })
                    .collect();
                let want: Vec<Option<String>> = at
                    .iter()
                    .map(|a| {
                        a.and_then(|(batch, row)| want_rows[[0, 5][batch] + row])
                            .map(str::to_string)
                    })
                    .collect();
                assert_eq!(got, want, "{dt}");
                // Keys 0..n over the gathered values: nothing else of the dictionary.
                assert_eq!(out.as_any_dictionary().values().len(), at.len());
            }
        }
        // A column declared non-null whose dictionary holds a null value that a row takes: its
        // views are gathered on the host (the staged column would have no room for the null).
        let with_null_value: ArrayRef = Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(vec![0, 1]),
                Arc::new(StringArray::from(vec![Some("x"), None])),
            )
            .unwrap(),
        );
        let arrays = std::slice::from_ref(&with_null_value);
        assert!(beyond_views(arrays, false).is_some());
        assert!(beyond_views(arrays, true).is_none());
        assert!(
            beyond_views(
                &arrays[..1]
                    .iter()
                    .map(|a| a.slice(0, 1))
                    .collect::<Vec<_>>(),
                false
            )
            .is_none()
        );
        // 8- and 16-bit keys cannot number a window's rows: gathered on the host instead.
        let small = DataType::Dictionary(Box::new(DataType::Int16), Box::new(DataType::Utf8));
        assert!(!carried_as_views(&small));
        let wide = DataType::Dictionary(Box::new(DataType::UInt64), Box::new(DataType::Binary));
        assert!(carried_as_views(&wide));
        let ints = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Int64));
        assert!(!carried_as_views(&ints));
        // A 64-bit key type alike.
        let d64: ArrayRef = Arc::new(
            DictionaryArray::<UInt64Type>::try_new(
                UInt64Array::from(vec![1, 0]),
                Arc::new(StringArray::from(vec![long, "x"])),
            )
            .unwrap(),
        );
        let views = BuildViews::new(std::slice::from_ref(&d64), 16).unwrap();
        let staged = views.stage(&d64, 0).unwrap();
        let out = views
            .output(
                &gathered(&[staged], &[Some((0, 1)), Some((0, 0))]),
                d64.data_type(),
            )
            .unwrap();
        let plain = arrow::compute::cast(&out, &DataType::Utf8).unwrap();
        let got: Vec<_> = plain.as_string::<i32>().iter().flatten().collect();
        assert_eq!(got, vec![long, "x"]);
    }

    #[test]
    fn views_the_build_side_did_not_list_are_refused() {
        let a: ArrayRef = Arc::new(StringViewArray::from(vec!["a value past twelve bytes"]));
        let views = BuildViews::new(std::slice::from_ref(&a), 16).unwrap();
        // A batch at a row no listed batch starts at, or with other buffers.
        assert!(views.stage(&a, 1).is_err());
        let two = StringViewArray::from(vec!["a value past twelve bytes", "two buffers' worth"]);
        let (views_of_two, buffers, nulls) = two.into_parts();
        let mut buffers = buffers.to_vec();
        buffers.push(Buffer::from_vec(vec![0u8; 4]));
        let two: ArrayRef = Arc::new(StringViewArray::new(views_of_two, buffers, nulls));
        assert!(views.stage(&two, 0).is_err());
        let numbers: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![1]));
        assert!(BuildViews::new(&[numbers], 16).is_err());
        // A view whose bytes lie past its buffer is an error, not an array.
        let mut bad = 25u128 | (u128::from(1000u32) << 96);
        bad |= u128::from(u32::from_le_bytes(*b"a va")) << 32;
        let column: ArrayRef = Arc::new(
            FixedSizeBinaryArray::try_new(16, ScalarBuffer::from(vec![bad]).into_inner(), None)
                .unwrap(),
        );
        assert!(views.output(&column, &DataType::Utf8View).is_err());
    }
}
