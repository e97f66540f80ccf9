//! Check bytes: how a hashed key of one string or binary column is matched exactly on the
//! device.
//!
//! A hashed key ([`KeyHash`](super::key_hash::KeyHash)) says only that two keys *may* be
//! equal. Where the key is one column of bytes (`Utf8`, `LargeUtf8`, `Utf8View`, `Binary`,
//! `LargeBinary`, `BinaryView`, `FixedSizeBinary`, or a dictionary of those), each row also
//! carries its first bytes, zero-padded, in one to [`KEY_CHECK_WORDS`] words of
//! [`KEY_CHECK_BYTES`] bytes (`__key_check`, `__key_check1`, ...: `FixedSizeBinary(16)` columns,
//! word j holding bytes 16j..16j + 15), and the low bits of its hash hold its length class
//! ([`length_class`]): the length itself up to the words' bytes, [`NULL_CLASS`] for a null key,
//! [`LONG_CLASS`] for a longer key. The device's probe matches a build row only if the hashes
//! and every word of check bytes are equal (`KeyCheck` in `backend`). For keys that fit the
//! words that is exact: equal classes mean equal lengths (or both null), and equal padded bytes
//! then mean equal keys. So where every build key fits, no pair needs the host's verification;
//! a longer probe key is in the long class, which no build row is in, and matches nothing.
//!
//! A join stages one word (keys of up to 16 bytes) until its build side shows a longer key:
//! then it stages as many words as the longest build key needs ([`words_for`]; a 36-byte UUID
//! string, three), on both sides. Hashes need only agree for equal keys that fit the words, so
//! they are computed from the check bytes and the class alone ([`checked_hash`]). The host
//! stages a row's check bytes and class (16 bytes a word and one; [`checked_into`], in one pass
//! over the key column; a dictionary's values' once each, where they number no more than the
//! rows, then copied to each row) and the device hashes them (`Backend::hash_checked`). A
//! build side with a key longer than [`KEY_CHECK_WORDS`] words runs the same join verified on
//! the host instead (the key equalities in the residual filter), re-hashed over the whole
//! keys: a hash of the first 64 bytes would make long keys with a common prefix all collide.

use std::sync::Arc;

use arrow::array::{
    AnyDictionaryArray, Array, ArrayRef, AsArray, FixedSizeBinaryArray, GenericByteArray,
    GenericByteViewArray,
};
use arrow::buffer::Buffer;
use arrow::datatypes::{ArrowNativeType, ByteArrayType, ByteViewType, DataType};
use datafusion::common::{Result, internal_err};

use super::dictionary_gather::for_each_key;
use crate::backend::checked_hash;
pub use crate::backend::{
    CLASS_MASK, KEY_CHECK_BYTES, KEY_CHECK_MAX_BYTES, KEY_CHECK_WORDS, with_class,
};

/// The length class of a null key (under null-equal joins; otherwise a null key matches
/// nothing anyway).
pub const NULL_CLASS: u64 = KEY_CHECK_MAX_BYTES as u64 + 1;

/// The length class of a key longer than its check bytes.
pub const LONG_CLASS: u64 = NULL_CLASS + 1;

// Every class fits the low bits.
const _: () = assert!(LONG_CLASS <= CLASS_MASK);

/// Whether a key column of type `dt` can be checked: a column of bytes (of fixed-size binary
/// keys, only those that fit the most words: longer ones could never be), or a dictionary of
/// such bytes (each row's key is its value's bytes).
pub fn checkable(dt: &DataType) -> bool {
    use DataType::*;
    match dt {
        Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView => true,
        FixedSizeBinary(n) => *n as usize <= KEY_CHECK_MAX_BYTES,
        Dictionary(_, values) => !matches!(**values, Dictionary(..)) && checkable(values),
        _ => false,
    }
}

/// The words of check bytes keys of up to `longest` bytes need: at least one, `None` past
/// [`KEY_CHECK_WORDS`].
pub fn words_for(longest: usize) -> Option<usize> {
    let words = longest.div_ceil(KEY_CHECK_BYTES).max(1);
    (words <= KEY_CHECK_WORDS).then_some(words)
}

/// The length class of a key of `len` bytes (`None`: null) checked in `words` words.
fn length_class(len: Option<usize>, words: usize) -> u64 {
    match len {
        None => NULL_CLASS,
        Some(n) if n <= words * KEY_CHECK_BYTES => n as u64,
        Some(_) => LONG_CLASS,
    }
}

/// Calls `f(row, bytes)` for each row of a column of bytes (or a dictionary of bytes), `None`
/// for a null row.
fn for_each<'a>(array: &'a dyn Array, mut f: impl FnMut(usize, Option<&'a [u8]>)) -> Result<()> {
    match array.data_type() {
        DataType::Dictionary(..) => {
            let dictionary = array.as_any_dictionary();
            let value = value_at(dictionary.values().as_ref())?;
            for_each_key(dictionary, |row, key| f(row, key.and_then(&value)))
        }
        _ => {
            let value = value_at(array)?;
            (0..array.len()).for_each(|row| f(row, value(row)));
            Ok(())
        }
    }
}

/// A lookup of one row's bytes ([`value_at`]).
type ValueAt<'a> = Box<dyn Fn(usize) -> Option<&'a [u8]> + 'a>;

/// The bytes of row `i` of a column of bytes (`None`: null), looked up one row at a time: a
/// dictionary's values are read only where a key refers to them (the slices of one table's
/// array share one dictionary of all its values).
fn value_at<'a>(array: &'a dyn Array) -> Result<ValueAt<'a>> {
    macro_rules! at {
        ($a:expr) => {{
            let a = $a;
            Box::new(move |i| a.is_valid(i).then(|| -> &[u8] { a.value(i).as_ref() }))
        }};
    }
    Ok(match array.data_type() {
        DataType::Utf8 => at!(array.as_string::<i32>()),
        DataType::LargeUtf8 => at!(array.as_string::<i64>()),
        DataType::Utf8View => at!(array.as_string_view()),
        DataType::Binary => at!(array.as_binary::<i32>()),
        DataType::LargeBinary => at!(array.as_binary::<i64>()),
        DataType::BinaryView => at!(array.as_binary_view()),
        DataType::FixedSizeBinary(_) => at!(array.as_fixed_size_binary()),
        dt => return internal_err!("key check bytes of a {dt} column"),
    })
}

/// The length class of every row of a key column of bytes, checked in `words` words.
pub fn length_classes(array: &dyn Array, words: usize) -> Result<Vec<u64>> {
    let mut classes = vec![0; array.len()];
    for_each(array, |i, v| {
        classes[i] = length_class(v.map(<[u8]>::len), words)
    })?;
    Ok(classes)
}

/// The low `n` bytes of a u128 set (all of them from 16 on).
fn low_bytes(n: usize) -> u128 {
    match n {
        0 => 0,
        n if n >= KEY_CHECK_BYTES => u128::MAX,
        n => u128::MAX >> (8 * (KEY_CHECK_BYTES - n)),
    }
}

/// The check bytes of the value `bytes[at..at + len]` (its first 16 bytes, zero-padded, as a
/// little-endian u128): one 16-byte load where `bytes` holds 16 bytes from `at`, masked to the
/// value's length. `None` if the value is not within `bytes`.
fn check_bytes(bytes: &[u8], at: usize, len: usize) -> Option<u128> {
    let n = len.min(KEY_CHECK_BYTES);
    let from = bytes.get(at..)?;
    let data = match from.first_chunk::<KEY_CHECK_BYTES>() {
        Some(b) => u128::from_le_bytes(*b) & low_bytes(n),
        None => {
            let mut row = [0u8; KEY_CHECK_BYTES];
            row[..n].copy_from_slice(from.get(..n)?);
            u128::from_le_bytes(row)
        }
    };
    // A value past the end of `bytes` (a malformed array) is an error, not a short key.
    (from.len() >= len).then_some(data)
}

/// One pass over a key column of bytes: each row's hash (`mask`ed, its length class in the low
/// bits; equal for equal keys that fit `words` words) and its check bytes (`words` columns of
/// [`KEY_CHECK_BYTES`] bytes, the key's bytes zero-padded, zeros for a null row) as
/// `FixedSizeBinary(16)` without nulls. The join stages the check bytes and classes
/// ([`checked_into`]) and hashes them on the device; this is their reference.
pub fn checked(array: &dyn Array, words: usize, mask: u64) -> Result<(Vec<u64>, Vec<ArrayRef>)> {
    let mut classes = vec![0u8; array.len()];
    let mut planes = vec![vec![[0u8; KEY_CHECK_BYTES]; array.len()]; words];
    {
        let mut rows: Vec<&mut [[u8; KEY_CHECK_BYTES]]> =
            planes.iter_mut().map(Vec::as_mut_slice).collect();
        checked_into(array, &mut rows, &mut classes)?;
    }
    let hashes = (0..array.len())
        .map(|i| {
            let row: Vec<u128> = planes.iter().map(|p| u128::from_le_bytes(p[i])).collect();
            checked_hash(&row, classes[i], mask)
        })
        .collect();
    let check = planes
        .into_iter()
        .map(|p| {
            let bytes = Buffer::from_vec(p.concat());
            let a = FixedSizeBinaryArray::try_new(KEY_CHECK_BYTES as i32, bytes, None)?;
            Ok(Arc::new(a) as ArrayRef)
        })
        .collect::<Result<_>>()?;
    Ok((hashes, check))
}

/// The check bytes and length classes of a key column of bytes, into memory the caller holds
/// (a staging block's regions, whatever they held): row i's word j of check bytes into
/// `words[j][i]` (one to [`KEY_CHECK_WORDS`] words) and its class into `classes[i]`.
pub fn checked_into(
    array: &dyn Array,
    words: &mut [&mut [[u8; KEY_CHECK_BYTES]]],
    classes: &mut [u8],
) -> Result<()> {
    let rows = array.len();
    if words.is_empty()
        || words.len() > KEY_CHECK_WORDS
        || words.iter().any(|w| w.len() != rows)
        || classes.len() != rows
    {
        return internal_err!(
            "check bytes of {rows} rows into {} words and {} classes",
            words.len(),
            classes.len()
        );
    }
    // One loop per word count, so that a row's words are written without a loop over them.
    match words {
        [a] => fill([&mut **a], array, classes),
        [a, b] => fill([&mut **a, &mut **b], array, classes),
        [a, b, c] => fill([&mut **a, &mut **b, &mut **c], array, classes),
        [a, b, c, d] => fill([&mut **a, &mut **b, &mut **c, &mut **d], array, classes),
        _ => internal_err!("check bytes in {} words", words.len()),
    }
}

/// [`checked_into`] with `N` words, of as many rows as `classes` (which the caller checked).
fn fill<const N: usize>(
    mut words: [&mut [[u8; KEY_CHECK_BYTES]]; N],
    array: &dyn Array,
    classes: &mut [u8],
) -> Result<()> {
    if let Some(dictionary) = array.as_any_dictionary_opt()
        && dictionary.values().len() <= array.len()
    {
        return fill_by_value(words, dictionary, classes);
    }
    // Row i's first word and where its bytes lie (`None`: null) give its words and class.
    let mut put = |i: usize, key: Option<(u128, Value)>| {
        let Some((first, Value { bytes, at, len })) = key else {
            for w in words.iter_mut() {
                w[i] = [0; KEY_CHECK_BYTES];
            }
            classes[i] = NULL_CLASS as u8;
            return;
        };
        words[0][i] = first.to_le_bytes();
        for (j, w) in words.iter_mut().enumerate().skip(1) {
            // Within `bytes`, as the first word's `check_bytes` found the whole value to be.
            let skip = j * KEY_CHECK_BYTES;
            let word = match len > skip {
                true => check_bytes(bytes, at + skip, len - skip).unwrap_or(0),
                false => 0,
            };
            w[i] = word.to_le_bytes();
        }
        classes[i] = length_class(Some(len), N) as u8;
    };
    match array.data_type() {
        DataType::Utf8View => view_rows(array.as_string_view(), put),
        DataType::BinaryView => view_rows(array.as_binary_view(), put),
        DataType::Utf8 => offset_rows(array.as_string::<i32>(), put),
        DataType::LargeUtf8 => offset_rows(array.as_string::<i64>(), put),
        DataType::Binary => offset_rows(array.as_binary::<i32>(), put),
        DataType::LargeBinary => offset_rows(array.as_binary::<i64>(), put),
        _ => for_each(array, |i, v| {
            put(
                i,
                v.and_then(|v| Some((check_bytes(v, 0, v.len())?, Value::new(v, 0, v.len())))),
            )
        }),
    }
}

/// [`fill`] for a dictionary of no more values than rows: each value's words and class are
/// found once, in one pass over the values, and each row's are copied from its value's (a
/// row at a time through its value would cost a lookup of the value's bytes per row). A
/// dictionary with more values than the batch has rows (one shared by a table's slices) is
/// read a row at a time instead, by [`fill`]: only its values that rows refer to.
fn fill_by_value<const N: usize>(
    mut words: [&mut [[u8; KEY_CHECK_BYTES]]; N],
    dictionary: &dyn AnyDictionaryArray,
    classes: &mut [u8],
) -> Result<()> {
    let values = dictionary.values();
    let mut value_words: [Vec<[u8; KEY_CHECK_BYTES]>; N] =
        std::array::from_fn(|_| vec![[0; KEY_CHECK_BYTES]; values.len()]);
    let mut value_classes = vec![0u8; values.len()];
    fill(
        value_words.each_mut().map(Vec::as_mut_slice),
        values.as_ref(),
        &mut value_classes,
    )?;
    for_each_key(dictionary, |row, key| match key {
        Some(k) => {
            for (w, v) in words.iter_mut().zip(&value_words) {
                w[row] = v[k];
            }
            classes[row] = value_classes[k];
        }
        None => {
            for w in words.iter_mut() {
                w[row] = [0; KEY_CHECK_BYTES];
            }
            classes[row] = NULL_CLASS as u8;
        }
    })
}

/// Where a key's bytes lie: `bytes[at..at + len]`, or nowhere for a key of up to 12 bytes
/// inline in its view (`bytes` empty), which its first word holds whole.
#[derive(Clone, Copy)]
struct Value<'a> {
    bytes: &'a [u8],
    at: usize,
    len: usize,
}

impl<'a> Value<'a> {
    fn new(bytes: &'a [u8], at: usize, len: usize) -> Self {
        Self { bytes, at, len }
    }
}

/// Calls `put(row, Some((first word, where the key lies)))`, or `put(row, None)` for a null
/// row, for each row of a view array, read from its views: a view is its length (bytes 0-3)
/// and either the data itself zero-padded (bytes 4-15, up to 12 bytes) or a prefix, a buffer index (bytes
/// 8-11) and an offset (bytes 12-15). Inline data is masked to its length, so padding that is
/// not zero cannot matter.
fn view_rows<T: ByteViewType + ?Sized>(
    array: &GenericByteViewArray<T>,
    mut put: impl FnMut(usize, Option<(u128, Value)>),
) -> Result<()> {
    let buffers = array.data_buffers();
    let nulls = array.nulls();
    for (i, &view) in array.views().iter().enumerate() {
        if nulls.is_some_and(|n| n.is_null(i)) {
            put(i, None);
            continue;
        }
        let len = view as u32 as usize;
        let key = if len <= 12 {
            ((view >> 32) & low_bytes(len), Value::new(&[], 0, len))
        } else {
            let (buffer, offset) = ((view >> 64) as u32 as usize, (view >> 96) as u32 as usize);
            let data = buffers
                .get(buffer)
                .and_then(|b| Some((check_bytes(b, offset, len)?, Value::new(b, offset, len))));
            let Some(data) = data else {
                return internal_err!("a view past its data buffers");
            };
            data
        };
        put(i, Some(key));
    }
    Ok(())
}

/// [`view_rows`] for an array of offsets into one values buffer.
fn offset_rows<T: ByteArrayType>(
    array: &GenericByteArray<T>,
    mut put: impl FnMut(usize, Option<(u128, Value)>),
) -> Result<()> {
    let values = array.value_data();
    let nulls = array.nulls();
    for (i, w) in array.value_offsets().windows(2).enumerate() {
        if nulls.is_some_and(|n| n.is_null(i)) {
            put(i, None);
            continue;
        }
        let (start, len) = (
            w[0].as_usize(),
            w[1].as_usize().saturating_sub(w[0].as_usize()),
        );
        let Some(data) = check_bytes(values, start, len) else {
            return internal_err!("an offset past its values");
        };
        put(i, Some((data, Value::new(values, start, len))));
    }
    Ok(())
}

/// The length of the longest non-null key of a key column of bytes (0 for none).
pub fn longest_key(array: &dyn Array) -> Result<usize> {
    let valid = |i: usize| array.is_valid(i);
    Ok(match array.data_type() {
        DataType::Utf8View | DataType::BinaryView => {
            let views = match array.data_type() {
                DataType::Utf8View => array.as_string_view().views(),
                _ => array.as_binary_view().views(),
            };
            let lens = views.iter().enumerate().filter(|&(i, _)| valid(i));
            lens.map(|(_, &v)| v as u32 as usize).max().unwrap_or(0)
        }
        DataType::FixedSizeBinary(n) if array.null_count() < array.len() => *n as usize,
        DataType::FixedSizeBinary(_) => 0,
        DataType::Utf8 => longest_offset(array.as_string::<i32>().value_offsets(), valid),
        DataType::LargeUtf8 => longest_offset(array.as_string::<i64>().value_offsets(), valid),
        DataType::Binary => longest_offset(array.as_binary::<i32>().value_offsets(), valid),
        DataType::LargeBinary => longest_offset(array.as_binary::<i64>().value_offsets(), valid),
        _ => {
            let mut longest = 0;
            for_each(array, |_, v| {
                longest = longest.max(v.map_or(0, <[u8]>::len))
            })?;
            longest
        }
    })
}

/// The longest value of an array of `offsets` whose row i is `valid(i)`.
fn longest_offset<O: ArrowNativeType>(offsets: &[O], valid: impl Fn(usize) -> bool) -> usize {
    (offsets.windows(2).enumerate())
        .filter(|&(i, _)| valid(i))
        .map(|(_, w)| w[1].as_usize().saturating_sub(w[0].as_usize()))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{BinaryArray, StringArray, StringViewArray};

    /// One word of check bytes (keys of up to 16 bytes): the hashes and the word.
    fn checked1(a: &dyn Array, mask: u64) -> Result<(Vec<u64>, ArrayRef)> {
        let (hashes, mut words) = checked(a, 1, mask)?;
        Ok((hashes, words.remove(0)))
    }

    /// Whether a key is longer than one word.
    fn has_long_key(a: &dyn Array) -> Result<bool> {
        Ok(longest_key(a)? > KEY_CHECK_BYTES)
    }

    #[test]
    fn length_classes_tell_lengths_nulls_and_long_keys_apart() {
        let a = StringViewArray::from(vec![
            Some(""),
            None,
            Some("sixteen bytes!!!"),
            Some("seventeen bytes!!"),
            Some("Ünï"),
        ]);
        assert_eq!(
            length_classes(&a, 1).unwrap(),
            vec![0, NULL_CLASS, 16, LONG_CLASS, 5]
        );
    }

    #[test]
    fn check_bytes_are_the_key_zero_padded_for_every_byte_type() {
        let strings = StringArray::from(vec![Some("ab"), None, Some("0123456789abcdefXYZ")]);
        // A sliced array starts at an offset in its buffers.
        let sliced = StringArray::from(vec![Some("skip"), Some("ab")]).slice(1, 1);
        let binary = BinaryArray::from(vec![Some(b"ab".as_ref())]);
        let check = |a: &dyn Array| checked1(a, u64::MAX).unwrap().1;
        let c = check(&strings);
        let c = c.as_fixed_size_binary();
        assert_eq!(c.value(0), b"ab\0\0\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(c.value(1), [0u8; 16]);
        assert_eq!(c.value(2), b"0123456789abcdef");
        assert_eq!(c.null_count(), 0);
        for other in [check(&sliced), check(&binary)] {
            assert_eq!(other.as_fixed_size_binary().value(0), c.value(0));
        }
        let views = StringViewArray::from(vec!["a string longer than twelve", "short"]);
        let v = check(&views);
        assert_eq!(v.as_fixed_size_binary().value(0), b"a string longer ");
        assert_eq!(
            v.as_fixed_size_binary().value(1),
            b"short\0\0\0\0\0\0\0\0\0\0\0"
        );
        assert!(checked1(&arrow::array::Int32Array::from(vec![1]), u64::MAX).is_err());
    }

    #[test]
    fn views_give_the_check_bytes_and_hashes_of_their_values() {
        let values = vec![
            Some(""),
            None,
            Some("twelve bytes"),
            Some("thirteen byte"),
            Some("a string of many more than sixteen bytes"),
            Some("Ünï"),
        ];
        let views = StringViewArray::from(values.clone());
        let strings = StringArray::from(values);
        for (v, s) in [
            (views.slice(0, 6), strings.slice(0, 6)),
            (views.slice(2, 3), strings.slice(2, 3)),
        ] {
            let (hv, cv) = checked1(&v, u64::MAX).unwrap();
            let (hs, cs) = checked1(&s, u64::MAX).unwrap();
            assert_eq!((hv, &cv), (hs, &cs));
        }
        let binary =
            arrow::array::BinaryViewArray::from(vec![b"abc".as_ref(), b"abcdefghijklmnopq"]);
        let bytes = BinaryArray::from(vec![b"abc".as_ref(), b"abcdefghijklmnopq"]);
        assert_eq!(
            checked1(&binary, u64::MAX).unwrap().0,
            checked1(&bytes, u64::MAX).unwrap().0
        );
    }

    #[test]
    fn checked_hashes_agree_for_equal_keys_and_tell_long_ones() {
        let a = StringViewArray::from(vec![Some("abc"), Some("a key longer than sixteen"), None]);
        let b = arrow::array::LargeStringArray::from(vec![Some("abc"), Some("abd")]);
        let (ha, _) = checked1(&a, u64::MAX).unwrap();
        let (hb, _) = checked1(&b, u64::MAX).unwrap();
        assert_eq!(ha[0], hb[0]);
        assert_ne!(hb[0], hb[1]);
        assert_eq!(ha[2] & CLASS_MASK, NULL_CLASS);
        let (few, _) = checked1(&a, 0).unwrap();
        assert_eq!(few, vec![3, LONG_CLASS, NULL_CLASS]);
        assert!(has_long_key(&a).unwrap());
        assert!(!has_long_key(&b).unwrap());
        // A long key in a row sliced away, or under a null, does not count.
        assert!(!has_long_key(&a.slice(0, 1)).unwrap());
        let masked = StringViewArray::from(vec![Some("a key longer than sixteen")])
            .to_data()
            .into_builder()
            .nulls(Some(arrow::buffer::NullBuffer::new_null(1)))
            .build()
            .unwrap();
        assert!(!has_long_key(&StringViewArray::from(masked)).unwrap());
        let fixed =
            arrow::array::FixedSizeBinaryArray::try_from_iter([b"0123456789abcdef"].into_iter())
                .unwrap();
        assert!(!has_long_key(&fixed).unwrap());
        assert!(!checkable(&DataType::FixedSizeBinary(65)));
        assert!(checkable(&DataType::FixedSizeBinary(64)));
    }

    #[test]
    fn dictionaries_give_the_check_bytes_of_their_values() {
        use arrow::array::{DictionaryArray, Int8Array, Int32Array};
        use arrow::datatypes::{Int8Type, Int32Type};
        // Values: a null, a short key, a long key that only an unused key refers to.
        let values = StringArray::from(vec![
            None,
            Some("ab"),
            Some("a key longer than sixteen"),
            Some(""),
        ]);
        // Keys: a null key, a key to a null value, and valid ones.
        let keys = Int32Array::from(vec![Some(1), None, Some(0), Some(3), Some(1), Some(2)]);
        let dict = DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values)).unwrap();
        let plain = StringArray::from(vec![
            Some("ab"),
            None,
            None,
            Some(""),
            Some("ab"),
            Some("a key longer than sixteen"),
        ]);
        assert_eq!(
            checked1(&dict, u64::MAX).unwrap(),
            checked1(&plain, u64::MAX).unwrap()
        );
        assert_eq!(
            length_classes(&dict, 1).unwrap(),
            length_classes(&plain, 1).unwrap()
        );
        assert!(has_long_key(&dict).unwrap());
        // Sliced past the long key's row: no long key, though the values hold one.
        let sliced = dict.slice(1, 4);
        assert!(!has_long_key(&sliced).unwrap());
        assert_eq!(
            checked1(&sliced, u64::MAX).unwrap(),
            checked1(&plain.slice(1, 4), u64::MAX).unwrap()
        );
        // Fewer rows than values (the slice of a table's dictionary column): read a row at a
        // time instead of value by value, with the same words and classes, in more words too.
        let few = dict.slice(4, 2);
        assert!(few.values().len() > few.len());
        for (array, plain) in [(&dict, plain.clone()), (&few, plain.slice(4, 2))] {
            for words in 1..=KEY_CHECK_WORDS {
                assert_eq!(
                    checked(array, words, u64::MAX).unwrap(),
                    checked(&plain, words, u64::MAX).unwrap()
                );
            }
        }
        // Another key type, over views.
        let small = DictionaryArray::<Int8Type>::try_new(
            Int8Array::from(vec![0, 0]),
            Arc::new(StringViewArray::from(vec!["ab"])),
        )
        .unwrap();
        let two = StringArray::from(vec!["ab", "ab"]);
        assert_eq!(
            checked1(&small, u64::MAX).unwrap(),
            checked1(&two, u64::MAX).unwrap()
        );
        assert!(checkable(small.data_type()));
        // No values at all: only null keys.
        let empty = DictionaryArray::<Int32Type>::try_new(
            Int32Array::from(vec![None, None]),
            Arc::new(StringArray::from(Vec::<&str>::new())),
        )
        .unwrap();
        assert_eq!(length_classes(&empty, 1).unwrap(), vec![NULL_CLASS; 2]);
        assert!(!has_long_key(&empty).unwrap());
        assert_eq!(
            checked1(&empty, u64::MAX).unwrap(),
            checked1(&StringArray::from(vec![None::<&str>; 2]), u64::MAX).unwrap()
        );
        let ints = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Int64));
        assert!(!checkable(&ints));
    }

    #[test]
    fn checked_into_overwrites_whatever_the_memory_held() {
        let a = StringViewArray::from(vec![Some("a string longer than twelve"), None, Some("ab")]);
        let b = StringArray::from(vec![Some("a string longer than twelve"), None, Some("ab")]);
        let (_, check) = checked1(&a, u64::MAX).unwrap();
        for array in [&a as &dyn Array, &b] {
            let mut rows = vec![[0xAB; KEY_CHECK_BYTES]; 3];
            let mut classes = vec![0xCD; 3];
            checked_into(array, &mut [&mut rows], &mut classes).unwrap();
            assert_eq!(rows.concat(), check.to_data().buffers()[0].as_slice());
            assert_eq!(classes, vec![LONG_CLASS as u8, NULL_CLASS as u8, 2]);
        }
        let mut two = [[0u8; 16]; 2];
        assert!(checked_into(&a, &mut [&mut two], &mut [0; 3]).is_err());
        assert!(checked_into(&a, &mut [], &mut [0; 3]).is_err());
    }

    #[test]
    fn longer_keys_fill_more_words_and_their_classes_are_their_lengths() {
        let uuid = "123e4567-e89b-12d3-a456-426614174000";
        let values = vec![
            Some(uuid),
            None,
            Some("ab"),
            Some("exactly thirty-two bytes long!!!"),
            Some("a key of more than the forty-eight bytes of three words"),
        ];
        let views = StringViewArray::from(values.clone());
        let strings = StringArray::from(values);
        let dictionary: arrow::array::DictionaryArray<arrow::datatypes::Int32Type> =
            strings.iter().collect();
        for array in [&views as &dyn Array, &strings, &dictionary] {
            let (hashes, words) = checked(array, 3, u64::MAX).unwrap();
            assert_eq!(words.len(), 3);
            let word = |j: usize, i: usize| words[j].as_fixed_size_binary().value(i).to_vec();
            assert_eq!(
                [word(0, 0), word(1, 0), word(2, 0)].concat(),
                [uuid.as_bytes(), &[0u8; 12]].concat()
            );
            assert_eq!([word(0, 1), word(1, 1), word(2, 1)].concat(), vec![0u8; 48]);
            assert_eq!(word(1, 2), vec![0u8; 16]);
            assert_eq!(
                [word(0, 3), word(1, 3)].concat(),
                b"exactly thirty-two bytes long!!!"
            );
            let classes: Vec<u64> = hashes.iter().map(|h| h & CLASS_MASK).collect();
            assert_eq!(classes, vec![36, NULL_CLASS, 2, 32, LONG_CLASS]);
            assert_eq!(length_classes(array, 3).unwrap(), classes);
            assert_eq!(longest_key(array).unwrap(), 55);
            assert_eq!(longest_key(&array.slice(0, 4)).unwrap(), 36);
        }
        // A word cut short by the end of the values buffer (read without a 16-byte load).
        for array in [
            &StringArray::from(vec!["twenty bytes exactly"]) as &dyn Array,
            &StringViewArray::from(vec!["twenty bytes exactly"]),
        ] {
            let (_, words) = checked(array, 3, u64::MAX).unwrap();
            let word = |j: usize| words[j].as_fixed_size_binary().value(0).to_vec();
            assert_eq!(word(1), [&b"ctly"[..], &[0u8; 12]].concat());
            assert_eq!(word(2), vec![0u8; 16]);
        }
        // Keys equal in their first word, different in their third, hash apart.
        let a = StringArray::from(vec![
            "same first sixteen, then 1",
            "same first sixteen, then 2",
        ]);
        let (hashes, _) = checked(&a, 2, u64::MAX).unwrap();
        assert_ne!(hashes[0], hashes[1]);
        assert_eq!(words_for(0), Some(1));
        assert_eq!(words_for(16), Some(1));
        assert_eq!(words_for(17), Some(2));
        assert_eq!(words_for(36), Some(3));
        assert_eq!(words_for(64), Some(4));
        assert_eq!(words_for(65), None);
    }
}
