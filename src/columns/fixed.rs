//! Fixed-width columns on a backend: values (1, 2, 4, 8 or 16 bytes per row), booleans (one
//! byte per row) and validity (one byte per row, only if the column has nulls). Uploading
//! concatenates the arrays of many batches into one device buffer (large columns through the
//! pinned staging pair); downloading builds Arrow arrays of the original data type.

use arrow::array::{Array, ArrayData, ArrayRef, BooleanBufferBuilder, make_array};
use arrow::buffer::{BooleanBuffer, Buffer, MutableBuffer, NullBuffer};
use arrow::datatypes::{DataType, IntervalUnit};
use datafusion::common::{Result, internal_err};

use crate::backend::Backend;

/// How a column's values are stored on a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnKind {
    /// Little-endian values of this many bytes.
    Fixed(usize),
    /// One byte per row, 0 or 1.
    Boolean,
}

impl ColumnKind {
    /// The storage of `dt`, or `None` if the GPU path does not support it yet.
    pub fn of(dt: &DataType) -> Option<Self> {
        use DataType::*;
        Some(match dt {
            Boolean => Self::Boolean,
            Int8 | UInt8 => Self::Fixed(1),
            Int16 | UInt16 | Float16 => Self::Fixed(2),
            Int32 | UInt32 | Float32 | Date32 | Time32(_) | Decimal32(_, _) => Self::Fixed(4),
            Interval(IntervalUnit::YearMonth) => Self::Fixed(4),
            Int64
            | UInt64
            | Float64
            | Date64
            | Time64(_)
            | Timestamp(_, _)
            | Duration(_)
            | Decimal64(_, _) => Self::Fixed(8),
            Interval(IntervalUnit::DayTime) => Self::Fixed(8),
            Decimal128(_, _) | Interval(IntervalUnit::MonthDayNano) => Self::Fixed(16),
            FixedSizeBinary(w @ (1 | 2 | 4 | 8 | 16)) => Self::Fixed(*w as usize),
            _ => return None,
        })
    }

    /// Bytes per row on the backend.
    pub fn width(self) -> usize {
        match self {
            Self::Fixed(w) => w,
            Self::Boolean => 1,
        }
    }
}

/// The bytes of the values of a fixed-width array's rows (`width` bytes each), which start
/// `offset` values into its buffer.
pub fn value_bytes(data: &ArrayData, width: usize) -> &[u8] {
    let start = data.offset() * width;
    &data.buffers()[0].as_slice()[start..start + data.len() * width]
}

/// One column of a relation on a backend.
#[derive(Debug)]
pub struct DeviceColumn<B> {
    pub kind: ColumnKind,
    pub values: B,
    /// One byte per row (1 = valid), present only if some row is null.
    pub validity: Option<B>,
    pub rows: usize,
}

impl<B> DeviceColumn<B> {
    /// Bytes of this column in Arrow's host layout (bit-packed validity and booleans).
    pub fn host_bytes(&self) -> usize {
        let bits = self.rows.div_ceil(8);
        let values = match self.kind {
            ColumnKind::Fixed(w) => self.rows * w,
            ColumnKind::Boolean => bits,
        };
        values + self.validity.as_ref().map_or(0, |_| bits)
    }

    /// Its buffers with their bytes per row: the values, then the validity if any (the order in
    /// which [`map`](Self::map) visits them).
    pub fn planes(&self) -> impl Iterator<Item = (&B, usize)> {
        std::iter::once((&self.values, self.kind.width()))
            .chain(self.validity.iter().map(|v| (v, 1)))
    }

    /// Applies `f` to the values and the validity (e.g. a scatter or gather), giving `rows` rows.
    pub fn map(&self, rows: usize, mut f: impl FnMut(&B, usize) -> Result<B>) -> Result<Self> {
        Ok(Self {
            kind: self.kind,
            values: f(&self.values, self.kind.width())?,
            validity: self.validity.as_ref().map(|v| f(v, 1)).transpose()?,
            rows,
        })
    }
}

/// The bits of `arrays` (validity, or boolean values) concatenated into one bitmap.
fn concat_bits(
    arrays: &[&ArrayRef],
    bits_of: impl Fn(&dyn Array) -> Option<BooleanBuffer>,
) -> BooleanBuffer {
    let rows = arrays.iter().map(|a| a.len()).sum();
    let mut b = BooleanBufferBuilder::new(rows);
    for a in arrays {
        match bits_of(a.as_ref()) {
            Some(bits) => b.append_buffer(&bits),
            None => b.append_n(a.len(), true),
        }
    }
    b.finish()
}

/// Uploads one column given as the arrays of several batches (all of one data type).
pub fn upload_column<B: Backend>(
    backend: &B,
    arrays: &[&ArrayRef],
) -> Result<DeviceColumn<B::Buf>> {
    let Some(first) = arrays.first() else {
        return internal_err!("upload_column: no arrays");
    };
    let Some(kind) = ColumnKind::of(first.data_type()) else {
        return internal_err!("upload_column: unsupported type {}", first.data_type());
    };
    let rows: usize = arrays.iter().map(|a| a.len()).sum();
    let upload_bits = |bits: BooleanBuffer| -> Result<B::Buf> {
        let packed = bits.sliced();
        backend.unpack_bits(&backend.upload(packed.as_slice())?, rows)
    };
    let values = match kind {
        ColumnKind::Boolean => upload_bits(concat_bits(arrays, |a| {
            a.as_any()
                .downcast_ref::<arrow::array::BooleanArray>()
                .map(|b| b.values().clone())
        }))?,
        ColumnKind::Fixed(w) => {
            let datas: Vec<ArrayData> = arrays.iter().map(|a| a.to_data()).collect();
            let parts: Vec<&[u8]> = datas.iter().map(|d| value_bytes(d, w)).collect();
            backend.upload_parts(&parts)?
        }
    };
    let validity = if arrays.iter().any(|a| a.null_count() > 0) {
        Some(upload_bits(concat_bits(arrays, |a| {
            a.nulls().map(|n| n.inner().clone())
        }))?)
    } else {
        None
    };
    Ok(DeviceColumn {
        kind,
        values,
        validity,
        rows,
    })
}

/// Downloads a column as Arrow arrays of type `dt`, one per batch of `batch_rows` rows (slices
/// of one host buffer). Waits for the backend.
pub fn download_column<B: Backend>(
    backend: &B,
    col: &DeviceColumn<B::Buf>,
    dt: &DataType,
    batch_rows: usize,
) -> Result<Vec<ArrayRef>> {
    let rows = col.rows;
    let batch_rows = batch_rows.max(1);
    let download = |buf: &B::Buf, bytes: usize| -> Result<Buffer> {
        let mut host = MutableBuffer::from_len_zeroed(bytes);
        backend.download(buf, host.as_slice_mut())?;
        Ok(Buffer::from(host))
    };
    let download_bits = |bytes: &B::Buf| -> Result<BooleanBuffer> {
        let packed = backend.pack_bits(bytes, rows)?;
        Ok(BooleanBuffer::new(
            download(&packed, rows.div_ceil(8))?,
            0,
            rows,
        ))
    };
    let nulls = col
        .validity
        .as_ref()
        .map(download_bits)
        .transpose()?
        .map(NullBuffer::new);
    let values = match col.kind {
        ColumnKind::Boolean => download_bits(&col.values)?.into_inner(),
        ColumnKind::Fixed(w) => download(&col.values, rows * w)?,
    };
    (0..rows)
        .step_by(batch_rows)
        .map(|lo| {
            let len = batch_rows.min(rows - lo);
            let builder = ArrayData::builder(dt.clone()).len(len);
            let builder = match col.kind {
                // The whole bitmap, at the batch's bit offset.
                ColumnKind::Boolean => builder.offset(lo).add_buffer(values.clone()),
                ColumnKind::Fixed(w) => {
                    builder.add_buffer(values.slice_with_length(lo * w, len * w))
                }
            };
            let data = builder
                .nulls(nulls.as_ref().map(|n| n.slice(lo, len)))
                .build()?;
            Ok(make_array(data))
        })
        .collect()
}
