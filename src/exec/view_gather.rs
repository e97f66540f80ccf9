//! [`gather_views`]: rows of many view arrays (`Utf8View`, `BinaryView`) gathered into one.
//!
//! Where the arrays' data buffers are listed once up front ([`ViewBuffers`]), each output
//! array takes the whole list and each view's buffer index is looked up in it: as cheap as
//! `take` from one concatenated array, without concatenating. Where the list is long, it can
//! be copied into one buffer first ([`ViewBuffers::joined`]), so output arrays carry one
//! buffer, not hundreds, into the operators above. Where neither is done (too many buffers,
//! too many bytes), an output array holds only the buffers its rows use, each once, looked up
//! as rows use them (Arrow's `interleave` sizes a table by every buffer of every array on each
//! call instead).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, GenericByteViewArray};
use arrow::buffer::{Buffer, MutableBuffer, NullBuffer, ScalarBuffer};
use arrow::datatypes::{BinaryViewType, ByteViewType, DataType, StringViewType};
use datafusion::common::{HashMap, Result, internal_err};

/// The data buffers of `a`, if it is a view array.
fn data_buffers(a: &ArrayRef) -> Option<&[Buffer]> {
    match a.data_type() {
        DataType::Utf8View => Some(a.as_string_view().data_buffers()),
        DataType::BinaryView => Some(a.as_binary_view().data_buffers()),
        _ => None,
    }
}

/// The data buffers of some view arrays, listed once (each distinct buffer once, however many
/// arrays share it), and where each array's buffers lie in the list.
#[derive(Debug)]
pub struct ViewBuffers {
    /// Shared by every array gathered with it (one count to raise, not one per buffer).
    all: Arc<[Buffer]>,
    /// Where array `a`'s buffers begin in `place`.
    base: Vec<u32>,
    /// For each array's buffer in turn: its index in `all`, and where its bytes begin there
    /// (0 unless [`joined`](Self::joined) copied the buffers into one).
    place: Vec<(u32, u32)>,
}

impl ViewBuffers {
    /// The buffers of `arrays`, if they are all view arrays.
    pub fn listed(arrays: &[ArrayRef]) -> Option<Self> {
        let mut all = vec![];
        let mut index: HashMap<(usize, usize), u32> = HashMap::default();
        let mut base = Vec::with_capacity(arrays.len());
        let mut place = vec![];
        for a in arrays {
            base.push(u32::try_from(place.len()).ok()?);
            for buffer in data_buffers(a)? {
                let address = (buffer.as_ptr() as usize, buffer.len());
                let i = *index.entry(address).or_insert_with(|| {
                    all.push(buffer.clone());
                    (all.len() - 1) as u32
                });
                place.push((i, 0));
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

    /// Their bytes.
    pub fn bytes(&self) -> usize {
        self.all.iter().map(Buffer::len).sum()
    }

    /// The same buffers copied into one, if their bytes fit the 32-bit offsets of a view. An
    /// array gathered with it holds that one buffer instead of the whole list: DataFusion's
    /// operators above a join concatenate and `take` its output, and each array they build
    /// keeps every buffer of the arrays it came from, so a list of hundreds of buffers, copied
    /// into every output batch and multiplied by each concatenation, slows them several times.
    pub fn joined(self) -> Option<Self> {
        let bytes = self.bytes();
        u32::try_from(bytes).ok()?;
        let mut start = Vec::with_capacity(self.all.len());
        let mut at = 0;
        for buffer in self.all.iter() {
            start.push(at as u32);
            at += buffer.len();
        }
        let mut one = MutableBuffer::from_len_zeroed(bytes);
        copy_in_turn(&self.all, one.as_slice_mut());
        let place = self
            .place
            .iter()
            .map(|&(i, _)| (0, start[i as usize]))
            .collect();
        Some(Self {
            all: vec![Buffer::from(one)].into(),
            base: self.base,
            place,
        })
    }
}

/// Least bytes worth a thread of their own in [`copy_in_turn`].
const BYTES_A_THREAD: usize = 4 << 20;

/// Copies `buffers` one after another into `into`, which is as long as they are together, on
/// a thread per [`BYTES_A_THREAD`] up to the host's cores: the copy is on a join's critical path
/// (before its first chunk), and writing fresh memory (a page fault a page) takes longer than
/// the copy itself, ~0.5 s a GiB on one core of the build machine.
fn copy_in_turn(buffers: &[Buffer], into: &mut [u8]) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (into.len() / BYTES_A_THREAD).clamp(1, cores);
    let share = into.len().div_ceil(threads);
    let copy = |group: &[Buffer], into: &mut [u8]| {
        let mut at = 0;
        for buffer in group {
            into[at..at + buffer.len()].copy_from_slice(buffer.as_slice());
            at += buffer.len();
        }
    };
    if threads == 1 {
        return copy(buffers, into);
    }
    std::thread::scope(|scope| {
        let (mut rest, mut first, mut bytes) = (into, 0, 0);
        for (i, buffer) in buffers.iter().enumerate() {
            bytes += buffer.len();
            if bytes >= share && i + 1 < buffers.len() {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(bytes);
                rest = tail;
                let group = &buffers[first..=i];
                scope.spawn(move || copy(group, head));
                (first, bytes) = (i + 1, 0);
            }
        }
        copy(&buffers[first..], rest);
    });
}

/// Bytes `arrays` hold, each data buffer of a view array counted once however many of the
/// arrays share it (the batches of one upstream source often do: counting it per array would
/// reserve many times the memory held).
pub fn held_bytes(arrays: &[ArrayRef]) -> usize {
    let mut seen = datafusion::common::HashSet::<usize>::default();
    arrays
        .iter()
        .map(|a| {
            let Some(buffers) = data_buffers(a) else {
                return a.get_array_memory_size();
            };
            let all: usize = buffers.iter().map(Buffer::capacity).sum();
            let new: usize = buffers
                .iter()
                .filter(|b| seen.insert(b.as_ptr() as usize))
                .map(Buffer::capacity)
                .sum();
            a.get_array_memory_size().saturating_sub(all) + new
        })
        .sum()
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
        let (index, shift) = match listed {
            Some(l) if (b as usize) < array.data_buffers().len() => {
                l.place[(l.base[a] + b) as usize]
            }
            Some(_) => return internal_err!("a view past its data buffers"),
            None => match by_array.get(&(a, b)) {
                Some(&i) => (i, 0),
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
                    (i, 0)
                }
            },
        };
        // A view out of line: length (32 bits), prefix (32), buffer index (32), offset (32).
        let offset = (view >> 96) as u32 + shift;
        let low = view & u128::from(u64::MAX);
        views.push(low | (u128::from(index) << 64) | (u128::from(offset) << 96));
    }
    let buffers: Arc<[Buffer]> = match listed {
        Some(l) => Arc::clone(&l.all),
        None => buffers.into(),
    };
    let nulls = NullBuffer::from(valid);
    let nulls = (nulls.null_count() > 0).then_some(nulls);
    // SAFETY: every view is a view of a valid array of type `T` (checked by the downcast),
    // copied as it is, except that a view whose data is out of line has its buffer index
    // replaced by the index in `buffers` of that same buffer, or (listed and joined) of the
    // one buffer holding a copy of it, with its offset moved by where that copy begins; so
    // each view's bytes are the same valid bytes, and `nulls` has one bit per view.
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
    fn buffers_copied_in_turn_on_several_threads_keep_their_order() {
        let buffers: Vec<Buffer> = (0..7u8)
            .map(|i| Buffer::from_vec(vec![i; (3 << 20) + usize::from(i)]))
            .chain([Buffer::from_vec(Vec::<u8>::new())])
            .collect();
        let want: Vec<u8> = buffers.iter().flat_map(|b| b.as_slice().to_vec()).collect();
        let mut got = vec![0xff; want.len()];
        copy_in_turn(&buffers, &mut got);
        assert!(got == want);
        copy_in_turn(&[], &mut []);
    }

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
        // Joined, every output holds one buffer with both buffers' bytes.
        let joined = listed.joined().unwrap();
        let got = gather_views(&arrays, &at, &DataType::Utf8View, Some(&joined))
            .unwrap()
            .unwrap();
        assert_eq!(&got, &want);
        let buffers = got.as_string_view().data_buffers();
        assert_eq!(buffers.len(), 1);
        assert_eq!(
            buffers[0].len(),
            a.data_buffers()[0].len() + c.data_buffers()[0].len()
        );
        let numbers: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![1]));
        assert!(ViewBuffers::listed(&[numbers]).is_none());
        let past = gather_views(&arrays, &[(3, 0)], &DataType::Utf8View, None);
        assert!(past.unwrap().is_err());
        assert!(gather_views(&arrays, &at, &DataType::Utf8, None).is_none());
        // `b` shares `a`'s buffers: they count once.
        let shared = held_bytes(&refs[..1]) + refs[1].get_array_memory_size()
            - b.data_buffers().iter().map(Buffer::capacity).sum::<usize>();
        assert_eq!(held_bytes(&refs[..2]), shared);
    }
}
