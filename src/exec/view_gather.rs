//! [`gather_views`]: rows of many view arrays (`Utf8View`, `BinaryView`) gathered into one.
//!
//! Where the arrays' data buffers are listed once up front ([`ViewBuffers`]), each output
//! array takes the whole list and each view's buffer index is looked up in it: as cheap as
//! `take` from one concatenated array, without concatenating. Where they are not (too many
//! buffers), an output array holds only the buffers its rows use, each once, looked up as rows
//! use them (Arrow's `interleave` sizes a table by every buffer of every array on each call
//! instead). Either way, an output array that uses less than half the bytes of the buffers it
//! holds has its values copied into one buffer of their own ([`compact_sparse`]), as
//! DataFusion's own joins do, before it leaves the join.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, GenericByteViewArray, RecordBatch};
use arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use arrow::datatypes::{BinaryViewType, ByteViewType, DataType, StringViewType};
use datafusion::common::utils::memory::RecordBatchMemoryCounter;
use datafusion::common::{HashMap, Result, internal_err};

use super::device_views::parts;

/// The data buffers of `a`, if it is a view array.
fn data_buffers(a: &ArrayRef) -> Option<&[Buffer]> {
    parts(a.as_ref()).map(|(_, buffers)| buffers)
}

/// The data buffers of some view arrays, listed once (each distinct buffer once, however many
/// arrays share it), and where each array's buffers lie in the list.
#[derive(Debug)]
pub struct ViewBuffers {
    /// Shared by every array gathered with it (one count to raise, not one per buffer).
    all: Arc<[Buffer]>,
    /// Where array `a`'s buffers begin in `place`.
    base: Vec<u32>,
    /// For each array's buffer in turn: its index in `all`.
    place: Vec<u32>,
}

impl ViewBuffers {
    /// The buffers of `arrays`, if they are all view arrays.
    pub fn listed(arrays: &[ArrayRef]) -> Option<Self> {
        Self::listed_by(arrays, data_buffers)
    }

    /// The buffers `buffers_of` gives for each of `arrays`, if it gives them for all.
    pub fn listed_by(
        arrays: &[ArrayRef],
        buffers_of: impl Fn(&ArrayRef) -> Option<&[Buffer]>,
    ) -> Option<Self> {
        let mut all = vec![];
        let mut index: HashMap<(usize, usize), u32> = HashMap::default();
        let mut base = Vec::with_capacity(arrays.len());
        let mut place = vec![];
        for a in arrays {
            base.push(u32::try_from(place.len()).ok()?);
            for buffer in buffers_of(a)? {
                let address = (buffer.as_ptr() as usize, buffer.len());
                let i = *index.entry(address).or_insert_with(|| {
                    all.push(buffer.clone());
                    (all.len() - 1) as u32
                });
                place.push(i);
            }
        }
        Some(Self {
            all: all.into(),
            base,
            place,
        })
    }

    /// How many distinct buffers there are.
    pub fn buffers(&self) -> usize {
        self.all.len()
    }

    /// The distinct buffers.
    pub fn all(&self) -> &Arc<[Buffer]> {
        &self.all
    }

    /// The places in [`all`](Self::all) of array `a`'s buffers, in its order.
    pub fn places(&self, a: usize) -> &[u32] {
        let start = self.base.get(a).map_or(self.place.len(), |&b| b as usize);
        let end = self
            .base
            .get(a + 1)
            .map_or(self.place.len(), |&b| b as usize);
        &self.place[start..end]
    }
}

/// Bytes `arrays` hold, each buffer counted once however many of the arrays share it (the
/// batches of one upstream source often do: an aggregate's output batches are slices of one,
/// a scan's of a table's, view arrays share their data buffers; counting a buffer per array
/// would reserve many times the memory held), as DataFusion's hash join counts its build side
/// (`RecordBatchMemoryCounter`).
pub fn held_bytes(arrays: &[ArrayRef]) -> usize {
    new_bytes(&mut RecordBatchMemoryCounter::new(), arrays)
}

/// Bytes `batches` hold, each buffer counted once however many of them share it.
pub fn batches_bytes<'a>(batches: impl IntoIterator<Item = &'a RecordBatch>) -> usize {
    let mut counter = RecordBatchMemoryCounter::new();
    (batches.into_iter()).map(|b| counter.count_batch(b)).sum()
}

/// The bytes of `arrays`' buffers that `counter` has not counted yet (then counted).
pub fn new_bytes(counter: &mut RecordBatchMemoryCounter, arrays: &[ArrayRef]) -> usize {
    let mut count = |a: &ArrayRef| match RecordBatch::try_from_iter([("held", Arc::clone(a))]) {
        Ok(batch) => counter.count_batch(&batch),
        Err(_) => a.get_array_memory_size(),
    };
    arrays.iter().map(&mut count).sum()
}

/// `array`, with the bytes its views use copied into one fresh buffer if it is a view array
/// whose data buffers hold more than twice those bytes (the rule of Arrow's `BatchCoalescer`,
/// which DataFusion's hash join applies to its output); other arrays as they are. Gathered
/// rows otherwise keep every buffer they came from, a build side's whole: the operators above
/// then read values scattered across those buffers (TPC-H Q10's aggregate took ~30 % longer
/// over such output than over the same rows compacted) and count every buffer as memory each
/// batch holds (311 MB for Q10's 115 thousand rows at SF 1, against DataFusion's 39 MB).
pub fn compact_sparse(array: ArrayRef) -> ArrayRef {
    compact_if(array, |buffers, used| {
        buffers.iter().map(Buffer::len).sum::<usize>() > 2 * used()
    })
}

/// `array` with its values copied into fresh buffers (Arrow's `gc`) if it is a view array and
/// `should(its data buffers, the bytes its views use)` says so; other arrays as they are. The
/// bytes are counted only if `should` asks.
pub fn compact_if(
    array: ArrayRef,
    should: impl Fn(&[Buffer], &dyn Fn() -> usize) -> bool,
) -> ArrayRef {
    fn compact<T: ByteViewType>(
        a: &GenericByteViewArray<T>,
        should: impl Fn(&[Buffer], &dyn Fn() -> usize) -> bool,
    ) -> Option<ArrayRef> {
        should(a.data_buffers(), &|| a.total_buffer_bytes_used()).then(|| Arc::new(a.gc()) as _)
    }
    match array.data_type() {
        DataType::Utf8View => compact(array.as_string_view(), should),
        DataType::BinaryView => compact(array.as_binary_view(), should),
        _ => None,
    }
    .unwrap_or(array)
}

/// The rows `at` ((array, row) pairs) of `arrays`, all of type `dt`, a view type, with their
/// buffers `listed` if they are. `None` if `dt` is not a view type.
pub fn gather_views(
    arrays: &[&dyn Array],
    at: &[(usize, usize)],
    dt: &DataType,
    listed: Option<&ViewBuffers>,
) -> Option<Result<ArrayRef>> {
    match dt {
        DataType::Utf8View => Some(gather::<StringViewType>(arrays, at, listed)),
        DataType::BinaryView => Some(gather::<BinaryViewType>(arrays, at, listed)),
        _ => None,
    }
}

fn gather<T: ByteViewType>(
    arrays: &[&dyn Array],
    at: &[(usize, usize)],
    listed: Option<&ViewBuffers>,
) -> Result<ArrayRef> {
    let arrays = arrays
        .iter()
        .map(|a| a.as_byte_view_opt::<T>())
        .collect::<Option<Vec<&GenericByteViewArray<T>>>>();
    let Some(arrays) = arrays else {
        return internal_err!("gathering views from arrays of another type");
    };
    if listed.is_some_and(|l| l.base.len() != arrays.len()) {
        return internal_err!("view buffers listed for other arrays");
    }
    let mut buffers: Vec<Buffer> = vec![];
    // Output index of each (array, buffer) seen, and of each distinct buffer (by address).
    let mut by_array: HashMap<(usize, u32), u32> = HashMap::default();
    let mut by_address: HashMap<(usize, usize), u32> = HashMap::default();
    let mut views = Vec::with_capacity(at.len());
    let mut valid = Vec::with_capacity(at.len());
    for &(a, r) in at {
        let Some(array) = arrays.get(a).filter(|x| r < x.len()) else {
            return internal_err!("row {r} of array {a} is not held");
        };
        valid.push(array.is_valid(r));
        let view = array.views()[r];
        if view as u32 <= 12 {
            views.push(view);
            continue;
        }
        let b = (view >> 64) as u32;
        let index = match listed {
            Some(l) if (b as usize) < array.data_buffers().len() => {
                l.place[(l.base[a] + b) as usize]
            }
            Some(_) => return internal_err!("a view past its data buffers"),
            None => match by_array.get(&(a, b)) {
                Some(&i) => i,
                None => {
                    let Some(buffer) = array.data_buffers().get(b as usize) else {
                        return internal_err!("a view past its data buffers");
                    };
                    let address = (buffer.as_ptr() as usize, buffer.len());
                    let i = *by_address.entry(address).or_insert_with(|| {
                        buffers.push(buffer.clone());
                        (buffers.len() - 1) as u32
                    });
                    by_array.insert((a, b), i);
                    i
                }
            },
        };
        // A view out of line: length (32 bits), prefix (32), buffer index (32), offset (32).
        let rest = view & !(u128::from(u32::MAX) << 64);
        views.push(rest | (u128::from(index) << 64));
    }
    let buffers: Arc<[Buffer]> = match listed {
        Some(l) => Arc::clone(&l.all),
        None => buffers.into(),
    };
    let nulls = NullBuffer::from(valid);
    let nulls = (nulls.null_count() > 0).then_some(nulls);
    // SAFETY: every view is a view of a valid array of type `T` (checked by the downcast),
    // copied as it is, except that a view whose data is out of line has its buffer index
    // replaced by the index in `buffers` of that same buffer; so each view's bytes are the
    // same valid bytes, and `nulls` has one bit per view.
    let gathered = unsafe {
        GenericByteViewArray::<T>::new_unchecked(ScalarBuffer::from(views), buffers, nulls)
    };
    Ok(Arc::new(gathered))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringViewArray;

    #[test]
    fn gathered_views_equal_interleave_and_keep_shared_buffers_once() {
        let a = StringViewArray::from(vec![
            Some("a string longer than twelve bytes"),
            None,
            Some("short"),
            Some("a second long string, past the first in its buffer"),
        ]);
        // Two slices of one array share its buffers.
        let b = a.slice(1, 3);
        let c = StringViewArray::from(vec![Some("another long string, in its own buffer")]);
        let arrays: Vec<&dyn Array> = vec![&a, &b, &c];
        let at = [(2, 0), (0, 0), (1, 1), (1, 0), (0, 0), (1, 2), (0, 3)];
        let got = gather_views(&arrays, &at, &DataType::Utf8View, None)
            .unwrap()
            .unwrap();
        let want = arrow::compute::interleave(&arrays, &at).unwrap();
        assert_eq!(&got, &want);
        assert_eq!(got.as_string_view().data_buffers().len(), 2);
        // With the buffers listed, every output holds the whole list.
        let refs: Vec<ArrayRef> = vec![
            Arc::new(a.clone()),
            Arc::new(b.clone()),
            Arc::new(c.clone()),
        ];
        let listed = ViewBuffers::listed(&refs).unwrap();
        assert_eq!(listed.buffers(), 2);
        let got = gather_views(&arrays, &at, &DataType::Utf8View, Some(&listed))
            .unwrap()
            .unwrap();
        assert_eq!(&got, &want);
        assert_eq!(got.as_string_view().data_buffers().len(), 2);
        let numbers: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![1]));
        assert!(ViewBuffers::listed(&[numbers]).is_none());
        let past = gather_views(&arrays, &[(3, 0)], &DataType::Utf8View, None);
        assert!(past.unwrap().is_err());
        assert!(gather_views(&arrays, &at, &DataType::Utf8, None).is_none());
        // `b`, a slice of `a`, shares all of `a`'s buffers: they count once.
        let a_data: usize = a.data_buffers().iter().map(Buffer::capacity).sum();
        assert_eq!(held_bytes(&refs[..2]), held_bytes(&refs[..1]));
        assert!(held_bytes(&refs[..1]) > a_data);
        let c_data: usize = c.data_buffers().iter().map(Buffer::capacity).sum();
        assert!(held_bytes(&refs) > held_bytes(&refs[..2]) + c_data);
        // Slices of one array hold its buffers once.
        let ints: ArrayRef = Arc::new(arrow::array::Int32Array::from_iter_values(0..1000));
        let slices: Vec<ArrayRef> = (0..10).map(|i| ints.slice(i * 100, 100)).collect();
        assert_eq!(held_bytes(&slices), held_bytes(&[Arc::clone(&ints)]));
    }

    #[test]
    fn views_using_few_of_their_buffers_bytes_are_compacted_and_others_kept() {
        let long = [
            "the first string past twelve bytes",
            "the second string past twelve bytes",
            "the third string past twelve bytes",
        ];
        let a = StringViewArray::from(vec![Some(long[0]), None, Some(long[1]), Some(long[2])]);
        let buffer = a.data_buffers()[0].clone();
        // Every byte used: kept as it is.
        let kept = compact_sparse(Arc::new(a.clone()));
        assert_eq!(
            kept.as_string_view().data_buffers()[0].as_ptr(),
            buffer.as_ptr()
        );
        // Two thirds used: kept (Arrow's rule copies below half).
        let most = compact_sparse(Arc::new(a.slice(1, 3)));
        assert_eq!(
            most.as_string_view().data_buffers()[0].as_ptr(),
            buffer.as_ptr()
        );
        // One third used: its bytes alone, in a buffer of their own, with its null kept.
        let few = compact_sparse(Arc::new(a.slice(0, 2)));
        let few = few.as_string_view();
        assert_eq!(few.data_buffers().len(), 1);
        assert_eq!(few.data_buffers()[0].len(), long[0].len());
        assert_eq!(few.iter().collect::<Vec<_>>(), vec![Some(long[0]), None]);
        // No bytes out of line: no buffer at all.
        let inline = StringViewArray::from(vec!["short"]);
        let shared =
            StringViewArray::try_new(inline.views().clone(), vec![buffer.clone()], None).unwrap();
        let none = compact_sparse(Arc::new(shared));
        assert!(none.as_string_view().data_buffers().is_empty());
        assert_eq!(none.as_string_view().value(0), "short");
        // Binary views alike; other types as they are.
        let bytes: Vec<&[u8]> = long.iter().map(|s| s.as_bytes()).collect();
        let b = arrow::array::BinaryViewArray::from(bytes).slice(2, 1);
        let b = compact_sparse(Arc::new(b));
        assert_eq!(b.as_binary_view().data_buffers()[0].len(), long[2].len());
        assert_eq!(b.as_binary_view().value(0), long[2].as_bytes());
        let numbers: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![1]));
        assert!(Arc::ptr_eq(&compact_sparse(Arc::clone(&numbers)), &numbers));
    }
}
