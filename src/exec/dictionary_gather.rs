//! Dictionary columns gathered across arrays that share one dictionary (the slices of one
//! table's array, as a build side of many batches holds them): [`shared_dictionary`] finds
//! that they do, and [`gather_dictionary`] interleaves only their keys, keeping that
//! dictionary.
//!
//! Arrow's `interleave` concatenates the dictionaries of all the arrays it is given, once per
//! array even where they are one and the same, so a gather from a few thousand such batches
//! copied gigabytes for a window of a few rows, and past 2^31 bytes of strings failed with an
//! offset overflow (the differential test's seed 5000151: a `Dictionary(Int32, Utf8)` key of a
//! full join over 44,251 build rows).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, DictionaryArray};
use arrow::compute::interleave;
use arrow::datatypes::{
    ArrowDictionaryKeyType, DataType, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::common::{Result, internal_err};

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
/// dictionary copied it twice a batch: differential seed 8003917 ran out of 20 GB).
pub fn interleave_keeping_dictionary(
    arrays: &[&dyn Array],
    at: &[(usize, usize)],
) -> Result<ArrayRef> {
    match shared_dictionary(arrays) {
        Some(values) => gather_dictionary(arrays, at, &values),
        None => Ok(interleave(arrays, at)?),
    }
}

/// The dictionary array of `keys` (of any dictionary key type) over `values`.
fn with_values(keys: &ArrayRef, values: ArrayRef) -> Result<ArrayRef> {
    fn make<K: ArrowDictionaryKeyType>(keys: &ArrayRef, values: ArrayRef) -> Result<ArrayRef> {
        let keys = keys.as_primitive::<K>().clone();
        Ok(Arc::new(DictionaryArray::<K>::try_new(keys, values)?))
    }
    match keys.data_type() {
        DataType::Int8 => make::<Int8Type>(keys, values),
        DataType::Int16 => make::<Int16Type>(keys, values),
        DataType::Int32 => make::<Int32Type>(keys, values),
        DataType::Int64 => make::<Int64Type>(keys, values),
        DataType::UInt8 => make::<UInt8Type>(keys, values),
        DataType::UInt16 => make::<UInt16Type>(keys, values),
        DataType::UInt32 => make::<UInt32Type>(keys, values),
        DataType::UInt64 => make::<UInt64Type>(keys, values),
        dt => internal_err!("dictionary keys of type {dt}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, StringArray};

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
        let strings = |a: &ArrayRef| {
            let s = arrow::compute::cast(a, &DataType::Utf8).unwrap();
            s.as_string::<i32>()
                .iter()
                .map(|v| v.map(String::from))
                .collect::<Vec<_>>()
        };
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
        // Arrays over other dictionaries go to `interleave`.
        let other: DictionaryArray<Int32Type> = vec!["b", "c"].into_iter().collect();
        let other: ArrayRef = Arc::new(other);
        let mixed = [whole.as_ref(), other.as_ref()];
        let got = interleave_keeping_dictionary(&mixed, &[(1, 1), (0, 0)]).unwrap();
        assert_eq!(&got, &interleave(&mixed, &[(1, 1), (0, 0)]).unwrap());
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
