//! Dictionary columns gathered across many arrays. Where they share one dictionary (the
//! slices of one table's array, as a build side of many batches holds them),
//! [`shared_dictionary`] finds that they do, and [`gather_dictionary`] interleaves only their
//! keys, keeping that dictionary; where each has its own (batches made one by one),
//! [`gather_dictionary_values`] gathers each row's value.
//!
//! Arrow's `interleave` concatenates the dictionaries of all the arrays it is given, once per
//! array even where they are one and the same, so a gather from a few thousand such batches
//! copied gigabytes for a window of a few rows, and past 2^31 bytes of strings failed with an
//! offset overflow (the differential test's seed 5000151: a `Dictionary(Int32, Utf8)` key of a
//! full join over 44,251 build rows).

use std::sync::Arc;

use arrow::array::{
    AnyDictionaryArray, Array, ArrayRef, AsArray, BooleanArray, DictionaryArray, PrimitiveArray,
    UInt64Array,
};
use arrow::buffer::NullBuffer;
use arrow::compute::{cast, concat, interleave, nullif};
use arrow::datatypes::{
    ArrowNativeType, ArrowPrimitiveType, DataType, Int8Type, Int16Type, Int32Type, Int64Type,
    Schema, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::common::{Result, internal_err};

/// `$body` with `$k` the Arrow type of dictionary keys of data type `$dt` (any integer type),
/// an error for another type.
macro_rules! by_key_type {
    ($dt:expr, $k:ident => $body:expr) => {
        by_key_type!(@arms $dt, $k, $body, Int8 Int8Type, Int16 Int16Type, Int32 Int32Type,
            Int64 Int64Type, UInt8 UInt8Type, UInt16 UInt16Type, UInt32 UInt32Type,
            UInt64 UInt64Type)
    };
    (@arms $dt:expr, $k:ident, $body:expr, $($variant:ident $arrow:ident),*) => {
        match $dt {
            $(DataType::$variant => {
                type $k = $arrow;
                $body
            })*
            dt => internal_err!("dictionary keys of type {dt}"),
        }
    };
}

/// The dictionary that `arrays` share, if they are two or more dictionary arrays over one
/// dictionary (the same `Arc`, or arrays over the same buffers); `None` otherwise (for Arrow's
/// `interleave`). A comparison of buffers builds each array's `ArrayData`: a side's held
/// columns are checked once, not for every window gathered from them.
pub fn shared_dictionary(arrays: &[&dyn Array]) -> Option<ArrayRef> {
    if arrays.len() < 2 {
        return None;
    }
    let values = arrays.first()?.as_any_dictionary_opt()?.values();
    // The first array's data, made only if another array's dictionary is another `Arc`.
    let mut first_data = None;
    for a in arrays {
        let d = a.as_any_dictionary_opt()?;
        if !Arc::ptr_eq(d.values(), values)
            && !d
                .values()
                .to_data()
                .ptr_eq(first_data.get_or_insert_with(|| values.to_data()))
        {
            return None;
        }
    }
    Some(Arc::clone(values))
}

/// The rows `at` ((array, row) pairs) of dictionary arrays `arrays` that share the dictionary
/// `values` ([`shared_dictionary`]): their keys interleaved, over `values`.
pub fn gather_dictionary(
    arrays: &[&dyn Array],
    at: &[(usize, usize)],
    values: &ArrayRef,
) -> Result<ArrayRef> {
    let keys = arrays
        .iter()
        .map(|a| a.as_any_dictionary_opt().map(|d| d.keys()))
        .collect::<Option<Vec<&dyn Array>>>();
    let Some(keys) = keys else {
        return internal_err!("gathering dictionary keys from arrays of another type");
    };
    with_values(&interleave(&keys, at)?, Arc::clone(values))
}

/// The rows `at` of `arrays`, as Arrow's `interleave` gives them, except that arrays sharing
/// one dictionary ([`shared_dictionary`]) interleave their keys alone and keep it: `interleave`
/// copies every array's dictionary into the result, the same one twice where it is given one
/// array twice (a residual filter's output batch of 7 rows over a 115-thousand-value
/// dictionary copied it twice a batch: differential seed 8003917 ran out of 20 GB); and
/// dictionary arrays over different dictionaries gather their rows' values
/// ([`gather_dictionary_values`]).
pub fn interleave_keeping_dictionary(
    arrays: &[&dyn Array],
    at: &[(usize, usize)],
) -> Result<ArrayRef> {
    match shared_dictionary(arrays) {
        Some(values) => gather_dictionary(arrays, at, &values),
        None => gather_dictionary_values(arrays, at),
    }
}

/// The rows `at` of dictionary arrays over different dictionaries: each row's value gathered
/// from its array's dictionary, under keys `0..n` (null where the row's key is null), so the
/// cost is in the rows alone. Arrow's `interleave` merges the arrays' dictionaries, reading
/// every key of every array it is given, once per call: a build side collected as thousands of
/// batches, each with a dictionary of its own, cost the whole side for every output window
/// (a join on 16-byte dictionary strings over 2^24 build rows took 13 s against DataFusion's
/// 2.1 s). Arrays of other types go to `interleave`, and so do windows of more rows than the
/// dictionary's key type can number where the arrays' values together fit the keys; where they
/// do not, the rows' values are deduplicated by arrow's cast to the dictionary type (an error,
/// not `interleave`'s panic, where even the distinct values are too many).
pub fn gather_dictionary_values(arrays: &[&dyn Array], at: &[(usize, usize)]) -> Result<ArrayRef> {
    let Some((dictionaries, key_type)) = as_dictionaries(arrays) else {
        return Ok(interleave(arrays, at)?);
    };
    // Keys that cannot number the rows: arrow's `interleave` where the dictionaries' values
    // together fit the keys; else the rows' values deduplicated (below), since `interleave`
    // over dictionaries it does not merge (views, fixed-size binary) panics where they do not.
    let many = at.len() as u64 > max_keys(key_type);
    let total: usize = dictionaries.iter().map(|d| d.values().len()).sum();
    if many && total as u64 <= max_keys(key_type) {
        return Ok(interleave(arrays, at)?);
    }
    let readers = (dictionaries.iter())
        .map(|d| key_reader(d.keys()))
        .collect::<Result<Vec<_>>>()?;
    // Each row's (array, value) place, and whether its key is null.
    let mut places = Vec::with_capacity(at.len());
    let mut nulls = Vec::with_capacity(at.len());
    for &(a, row) in at {
        let Some(d) = dictionaries.get(a) else {
            return internal_err!("gathering from dictionary array {a} of {}", arrays.len());
        };
        match readers[a](row)? {
            Some(k) if k < d.values().len() => {
                places.push((a, k));
                nulls.push(false);
            }
            Some(k) => return internal_err!("dictionary key {k} past its values"),
            None => {
                places.push((a, usize::MAX));
                nulls.push(true);
            }
        }
    }
    // A null row takes any valid row's place (its key is null, so its value is never read).
    let Some(&fill) = places.iter().find(|p| p.1 != usize::MAX) else {
        return Ok(arrow::array::new_null_array(
            arrays[0].data_type(),
            at.len(),
        ));
    };
    for p in places.iter_mut().filter(|p| p.1 == usize::MAX) {
        *p = fill;
    }
    let values: Vec<&dyn Array> = dictionaries.iter().map(|d| d.values().as_ref()).collect();
    let values = interleave(&values, &places)?;
    if many {
        // Arrow's cast to the dictionary type deduplicates, and errors where the distinct
        // values are still too many for the keys.
        let values = nullif(&values, &BooleanArray::from(nulls))?;
        return Ok(cast(&values, arrays[0].data_type())?);
    }
    let valid = NullBuffer::from(nulls.iter().map(|n| !n).collect::<Vec<_>>());
    let keys = UInt64Array::new((0..at.len() as u64).collect(), Some(valid));
    with_values(&cast(&keys, key_type)?, values)
}

/// A dictionary array whose dictionary holds more values than the array has rows, remade over
/// its rows' values alone ([`gather_dictionary_values`]); any other array as it is. A probe
/// chunk's rows concatenated from batches with dictionaries of their own hold all of them, and
/// an output batch taken from them held that whole dictionary: every consumer that evaluates
/// over a dictionary's values (`length`, casts) then did so for the chunk's values in every
/// batch.
pub fn compact_dictionary(array: ArrayRef) -> Result<ArrayRef> {
    match array.as_any_dictionary_opt() {
        Some(d) if d.values().len() > array.len() => {
            let at: Vec<(usize, usize)> = (0..array.len()).map(|row| (0, row)).collect();
            gather_dictionary_values(&[array.as_ref()], &at)
        }
        _ => Ok(array),
    }
}

/// `arrays` concatenated, as arrow's `concat` does, except that dictionary arrays over
/// different dictionaries are not merged: their values come one after another, each array's
/// keys offset by the values before it. `concat` merges string dictionaries whose values
/// outnumber the rows, hashing every value: for a probe chunk of hundreds of thousands of
/// rows, each batch with a dictionary of its own, once per chunk. Where the keys cannot number
/// all the values, an error: `concat` merges some types of values and panics over others
/// (views, fixed-size binary); the caller gathers from the arrays one by one instead.
pub fn concat_unmerged(arrays: &[&dyn Array]) -> Result<ArrayRef> {
    let Some((dictionaries, key_type)) = as_dictionaries(arrays) else {
        return Ok(concat(arrays)?);
    };
    if arrays.len() < 2 || shared_dictionary(arrays).is_some() {
        return Ok(concat(arrays)?);
    }
    let total: usize = dictionaries.iter().map(|d| d.values().len()).sum();
    if total as u64 > max_keys(key_type) {
        // `concat` would merge some types of values and panic over others (views).
        return internal_err!("{total} dictionary values cannot be numbered by {key_type} keys");
    }
    let rows: usize = arrays.iter().map(|a| a.len()).sum();
    let (mut keys, mut valid) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    let mut offset = 0;
    for d in &dictionaries {
        for_each_key(*d, |_, key| {
            keys.push(key.map_or(0, |k| (offset + k) as u64));
            valid.push(key.is_some());
        })?;
        offset += d.values().len();
    }
    let values: Vec<&dyn Array> = dictionaries.iter().map(|d| d.values().as_ref()).collect();
    let keys = UInt64Array::new(keys.into(), Some(NullBuffer::from(valid)));
    with_values(&cast(&keys, key_type)?, concat(&values)?)
}

/// The most rows an array of any dictionary column of `schemas` (at their top level) may hold
/// for its keys to number a value a row, `None` where none has keys smaller than 32 bits. A
/// window's rows over many dictionaries (each probe batch with its own) may hold a distinct
/// value each; where they are more than `Int8` keys number, no array of that type can hold
/// them.
pub fn dictionary_rows_cap<'a>(schemas: impl IntoIterator<Item = &'a Schema>) -> Option<usize> {
    (schemas.into_iter())
        .flat_map(|s| s.fields().iter())
        .filter_map(|f| match f.data_type() {
            DataType::Dictionary(key_type, _) => Some(max_keys(key_type)),
            _ => None,
        })
        .min()
        .filter(|&cap| cap <= u16::MAX as u64 + 1)
        .map(|cap| cap as usize)
}

/// `arrays` as dictionary arrays, with the key type of the first, if every one is a dictionary.
fn as_dictionaries<'a>(
    arrays: &[&'a dyn Array],
) -> Option<(Vec<&'a dyn AnyDictionaryArray>, &'a DataType)> {
    let dictionaries = (arrays.iter())
        .map(|a| a.as_any_dictionary_opt())
        .collect::<Option<Vec<_>>>()?;
    match arrays.first()?.data_type() {
        DataType::Dictionary(key_type, _) => Some((dictionaries, key_type.as_ref())),
        _ => None,
    }
}

/// The most values keys of type `key_type` can number.
fn max_keys(key_type: &DataType) -> u64 {
    match key_type {
        DataType::Int8 => i8::MAX as u64 + 1,
        DataType::UInt8 => u8::MAX as u64 + 1,
        DataType::Int16 => i16::MAX as u64 + 1,
        DataType::UInt16 => u16::MAX as u64 + 1,
        DataType::Int32 => i32::MAX as u64 + 1,
        _ => u32::MAX as u64,
    }
}

/// A reader of a dictionary's keys as indices into its values: `read(row)` is `None` for a
/// null key, an error for a negative key or a row past the keys. The keys' type is matched
/// once, here, not for every row.
type KeyReader<'a> = Box<dyn Fn(usize) -> Result<Option<usize>> + 'a>;

/// The [`KeyReader`] of `keys` (a dictionary's keys, of an integer type).
fn key_reader(keys: &dyn Array) -> Result<KeyReader<'_>> {
    by_key_type!(keys.data_type(), K => {
        let keys = keys.as_primitive::<K>();
        Ok(Box::new(move |row: usize| -> Result<Option<usize>> {
            if row >= keys.len() {
                return internal_err!("dictionary row {row} of {}", keys.len());
            }
            if keys.is_null(row) {
                return Ok(None);
            }
            match keys.value(row).to_usize() {
                Some(k) => Ok(Some(k)),
                None => internal_err!("a negative dictionary key"),
            }
        }) as KeyReader<'_>)
    })
}

/// Calls `f(row, Some(key))` for each row of a dictionary whose key is valid (`key`: the index
/// of its value), `f(row, None)` for the others; an error for a key past the values. (Arrow's
/// `normalized_keys` would clamp such a key to the last value, and panic over no values.) The
/// keys' type is matched once, not per row.
pub(crate) fn for_each_key(
    dictionary: &dyn AnyDictionaryArray,
    mut f: impl FnMut(usize, Option<usize>),
) -> Result<()> {
    let (keys, values) = (dictionary.keys(), dictionary.values().len());
    by_key_type!(keys.data_type(), K => each_key(keys.as_primitive::<K>(), values, &mut f))
}

/// [`for_each_key`] over keys of one type, for a dictionary of `values` values.
fn each_key<K: ArrowPrimitiveType>(
    keys: &PrimitiveArray<K>,
    values: usize,
    f: &mut impl FnMut(usize, Option<usize>),
) -> Result<()> {
    let nulls = keys.nulls();
    for (row, key) in keys.values().iter().enumerate() {
        if nulls.is_some_and(|n| n.is_null(row)) {
            f(row, None);
            continue;
        }
        match key.to_usize() {
            Some(k) if k < values => f(row, Some(k)),
            Some(k) => return internal_err!("dictionary key {k} past its {values} values"),
            None => return internal_err!("a negative dictionary key"),
        }
    }
    Ok(())
}

/// A dictionary with keys of type `key_type` whose rows are the rows of `values`, in order:
/// keys `0..n`, null where the value is (the output of a dictionary column whose values a
/// window gathered, as [`gather_dictionary_values`] gives it). An error where the keys cannot
/// number the rows.
pub(crate) fn over_values(key_type: &DataType, values: ArrayRef) -> Result<ArrayRef> {
    let rows = values.len() as u64;
    if rows > max_keys(key_type) {
        return internal_err!("{rows} dictionary values cannot be numbered by {key_type} keys");
    }
    let keys = UInt64Array::new((0..rows).collect(), values.logical_nulls());
    with_values(&cast(&keys, key_type)?, values)
}

/// The dictionary array of `keys` (of any dictionary key type) over `values`.
fn with_values(keys: &ArrayRef, values: ArrayRef) -> Result<ArrayRef> {
    by_key_type!(keys.data_type(), K => {
        let keys = keys.as_primitive::<K>().clone();
        Ok(Arc::new(DictionaryArray::<K>::try_new(keys, values)?) as ArrayRef)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, StringArray};

    /// An array's values as strings (`None`: null).
    fn strings(a: &ArrayRef) -> Vec<Option<String>> {
        let s = arrow::compute::cast(a, &DataType::Utf8).unwrap();
        s.as_string::<i32>()
            .iter()
            .map(|v| v.map(String::from))
            .collect()
    }

    #[test]
    fn slices_of_one_dictionary_gather_their_keys_and_keep_it() {
        let whole: DictionaryArray<Int32Type> =
            vec![Some("a"), None, Some("b"), Some("a"), Some("c"), Some("b")]
                .into_iter()
                .collect();
        let whole: ArrayRef = Arc::new(whole);
        let slices: Vec<ArrayRef> = (0..3).map(|i| whole.slice(2 * i, 2)).collect();
        let arrays: Vec<&dyn Array> = slices.iter().map(|a| a.as_ref()).collect();
        let at = [(2, 1), (0, 1), (1, 0), (0, 0), (2, 0)];
        let values = shared_dictionary(&arrays).unwrap();
        let got = gather_dictionary(&arrays, &at, &values).unwrap();
        let want = interleave(&arrays, &at).unwrap();
        assert_eq!(strings(&got), strings(&want));
        assert_eq!(got.null_count(), 1);
        // The dictionary is the table's own, not a copy per slice.
        let values = got.as_any_dictionary().values();
        assert!(Arc::ptr_eq(values, whole.as_any_dictionary().values()));
    }

    #[test]
    fn one_array_given_twice_keeps_its_dictionary() {
        let whole: DictionaryArray<Int32Type> =
            vec![Some("a"), None, Some("b")].into_iter().collect();
        let whole: ArrayRef = Arc::new(whole);
        let arrays = [whole.as_ref(), whole.as_ref()];
        let at = [(1, 2), (0, 0), (1, 1)];
        let got = interleave_keeping_dictionary(&arrays, &at).unwrap();
        assert_eq!(&got, &interleave(&arrays, &at).unwrap());
        let values = got.as_any_dictionary().values();
        assert!(Arc::ptr_eq(values, whole.as_any_dictionary().values()));
        // Arrays over other dictionaries gather their values: the same rows.
        let other: DictionaryArray<Int32Type> = vec!["b", "c"].into_iter().collect();
        let other: ArrayRef = Arc::new(other);
        let mixed = [whole.as_ref(), other.as_ref()];
        let got = interleave_keeping_dictionary(&mixed, &[(1, 1), (0, 0)]).unwrap();
        assert_eq!(&got, &interleave(&mixed, &[(1, 1), (0, 0)]).unwrap());
    }

    #[test]
    fn rows_over_different_dictionaries_gather_their_values() {
        use arrow::array::Int8Array;
        use arrow::datatypes::Int8Type;
        // Null keys, a null value, and a third array whose values are all unused.
        let one: DictionaryArray<Int32Type> = vec![Some("a"), None, Some("b"), Some("a")]
            .into_iter()
            .collect();
        let values = StringArray::from(vec![Some("c"), None]);
        let two =
            DictionaryArray::<Int32Type>::try_new(Int32Array::from(vec![1, 0]), Arc::new(values))
                .unwrap();
        let three: DictionaryArray<Int32Type> = vec!["unused"; 3].into_iter().collect();
        let (one, two, three): (ArrayRef, ArrayRef, ArrayRef) =
            (Arc::new(one), Arc::new(two), Arc::new(three));
        let arrays = [one.as_ref(), two.as_ref(), three.as_ref()];
        let at = [(1, 1), (0, 1), (0, 2), (1, 0), (0, 0), (0, 3)];
        let got = interleave_keeping_dictionary(&arrays, &at).unwrap();
        assert_eq!(got.data_type(), one.data_type());
        assert_eq!(
            strings(&got),
            strings(&interleave(&arrays, &at).unwrap()),
            "{got:?}"
        );
        assert_eq!(got.null_count(), 1);
        assert_eq!(got.logical_null_count(), 2);
        // Only null rows: a null array of the type.
        let nulls = gather_dictionary_values(&arrays, &[(0, 1), (0, 1)]).unwrap();
        assert_eq!((nulls.len(), nulls.logical_null_count()), (2, 2));
        // Keys that cannot number the rows (Int8, 200 rows): `interleave`'s merge.
        let small: DictionaryArray<Int8Type> = DictionaryArray::try_new(
            Int8Array::from(vec![0, 1]),
            Arc::new(StringArray::from(vec!["x", "y"])),
        )
        .unwrap();
        let other: DictionaryArray<Int8Type> = vec!["y", "z"].into_iter().collect();
        let (small, other): (ArrayRef, ArrayRef) = (Arc::new(small), Arc::new(other));
        let pair = [small.as_ref(), other.as_ref()];
        let many: Vec<(usize, usize)> = (0..200).map(|i| (i % 2, (i / 2) % 2)).collect();
        let got = gather_dictionary_values(&pair, &many).unwrap();
        assert_eq!(strings(&got), strings(&interleave(&pair, &many).unwrap()));
        let few = gather_dictionary_values(&pair, &many[..100]).unwrap();
        assert_eq!(few.as_any_dictionary().values().len(), 100);
        assert_eq!(strings(&few), strings(&got)[..100]);
    }

    #[test]
    fn a_dictionary_larger_than_its_rows_is_compacted() {
        let whole: DictionaryArray<Int32Type> =
            vec![Some("a"), None, Some("b"), Some("c"), Some("d")]
                .into_iter()
                .collect();
        let whole: ArrayRef = Arc::new(whole);
        let taken =
            arrow::compute::take(&whole, &arrow::array::UInt32Array::from(vec![3, 1]), None)
                .unwrap();
        assert_eq!(taken.as_any_dictionary().values().len(), 4);
        let compact = compact_dictionary(Arc::clone(&taken)).unwrap();
        assert_eq!(compact.as_any_dictionary().values().len(), 2);
        assert_eq!(&compact, &taken);
        assert_eq!(compact.logical_null_count(), 1);
        // An array whose dictionary is no larger stays as it is.
        assert!(Arc::ptr_eq(
            &compact_dictionary(Arc::clone(&whole)).unwrap(),
            &whole
        ));
    }

    #[test]
    fn dictionaries_concatenate_without_merging() {
        let one: DictionaryArray<Int32Type> =
            vec![Some("a"), None, Some("b")].into_iter().collect();
        let values = StringArray::from(vec![Some("b"), None]);
        let two = DictionaryArray::<Int32Type>::try_new(
            Int32Array::from(vec![Some(1), Some(0), None]),
            Arc::new(values),
        )
        .unwrap();
        let (one, two): (ArrayRef, ArrayRef) = (Arc::new(one), Arc::new(two));
        let sliced = two.slice(1, 2);
        let arrays = [one.as_ref(), sliced.as_ref(), two.as_ref()];
        let got = concat_unmerged(&arrays).unwrap();
        assert_eq!(&got, &concat(&arrays).unwrap());
        // Every value of every dictionary, none merged.
        assert_eq!(got.as_any_dictionary().values().len(), 2 + 2 + 2);
        assert_eq!(got.logical_null_count(), 4);
        // One dictionary shared, and arrays of other types: `concat`.
        let shared = [one.as_ref(), one.as_ref()];
        assert_eq!(
            concat_unmerged(&shared).unwrap().to_data(),
            concat(&shared).unwrap().to_data()
        );
        let plain = StringArray::from(vec!["x"]);
        assert_eq!(concat_unmerged(&[&plain, &plain]).unwrap().len(), 2);
    }

    #[test]
    fn small_keys_over_many_view_dictionaries_deduplicate_or_fail_cleanly() {
        use arrow::array::{Int8Array, StringViewArray};
        use arrow::datatypes::Int8Type;
        // 40 arrays of 7 rows over 7 values each: 280 values, more than Int8 keys number.
        let arrays: Vec<ArrayRef> = (0..40)
            .map(|a| {
                let values: Vec<String> =
                    (0..7).map(|i| format!("v{}", (a * 7 + i) % 50)).collect();
                let dict = DictionaryArray::<Int8Type>::try_new(
                    Int8Array::from((0..7).collect::<Vec<i8>>()),
                    Arc::new(StringViewArray::from_iter_values(values)),
                )
                .unwrap();
                Arc::new(dict) as ArrayRef
            })
            .collect();
        let each: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
        // 200 rows, 50 distinct values: deduplicated under Int8 keys.
        let at: Vec<(usize, usize)> = (0..200).map(|i| (i % 40, i % 7)).collect();
        let got = gather_dictionary_values(&each, &at).unwrap();
        assert_eq!(got.data_type(), arrays[0].data_type());
        let want: Vec<String> = at
            .iter()
            .map(|&(a, r)| format!("v{}", (a * 7 + r) % 50))
            .collect();
        let got_strings = arrow::compute::cast(&got, &DataType::Utf8).unwrap();
        let got_strings: Vec<&str> = got_strings.as_string::<i32>().iter().flatten().collect();
        assert_eq!(got_strings, want);
        // 280 distinct values: an error, not a panic.
        let wide: Vec<ArrayRef> = (0..40)
            .map(|a| {
                let values: Vec<String> = (0..7).map(|i| format!("w{}", a * 7 + i)).collect();
                Arc::new(
                    DictionaryArray::<Int8Type>::try_new(
                        Int8Array::from((0..7).collect::<Vec<i8>>()),
                        Arc::new(StringViewArray::from_iter_values(values)),
                    )
                    .unwrap(),
                ) as ArrayRef
            })
            .collect();
        let each: Vec<&dyn Array> = wide.iter().map(|a| a.as_ref()).collect();
        let all: Vec<(usize, usize)> = (0..280).map(|i| (i / 7, i % 7)).collect();
        assert!(gather_dictionary_values(&each, &all).is_err());
        // Concatenated, they would need 280 keys: an error for the caller to gather instead.
        assert!(concat_unmerged(&each).is_err());
    }

    #[test]
    fn other_arrays_are_left_to_interleave() {
        let one: DictionaryArray<Int32Type> = vec!["a", "b"].into_iter().collect();
        let two: DictionaryArray<Int32Type> = vec!["b", "c"].into_iter().collect();
        let (one, two): (ArrayRef, ArrayRef) = (Arc::new(one), Arc::new(two));
        assert!(shared_dictionary(&[one.as_ref(), two.as_ref()]).is_none());
        assert!(shared_dictionary(&[one.as_ref()]).is_none());
        let plain: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        let strings: ArrayRef = Arc::new(StringArray::from(vec!["x"]));
        assert!(shared_dictionary(&[plain.as_ref(), strings.as_ref()]).is_none());
    }
}
