//! Exchange: relations spread over several devices dealt out again by key, so that all the rows
//! of a key, from every device, end up on one device. Two relations exchanged on the same keys
//! then join device by device, each device on its own share (library only: the streaming engine
//! replicates a build side on every device instead).
//!
//! ```text
//!  device 0: R₀ ─► encode keys ─► route: one stable pass, every column moving ─► 256 routes
//!  device 1: R₁ ─► encode keys ─► route                                      ─► 256 routes
//!  device d receives routes routes_of(d, n) of every source, one run of rows from each,
//!  copied over the devices' direct link:   [ from R₀ | from R₁ ]  (a relation on device d)
//! ```
//!
//! A key's route ([`Backend::route`]) is a hash independent of the partition hash, so the share
//! a device receives still fills every partition and bucket of the join that follows it.
//! Ordering: each destination records an event once its buffers exist, each source waits for
//! those events before its copies and records one after them, and each destination waits for
//! every source's event, so the returned relations are ready on their own backends' queues.

use std::ops::Range;

use datafusion::common::{Result, internal_err, plan_err};

use crate::backend::{Backend, ROUTE_BITS};
use crate::columns::{ColumnKind, DeviceColumn, DeviceRelation, KeyEncoder};

/// Routes in all: the most devices an exchange deals out to.
pub const ROUTES: usize = 1 << ROUTE_BITS;

/// The routes device `d` of `n` receives: an even share of the [`ROUTES`], in one run.
pub fn routes_of(d: usize, n: usize) -> Range<usize> {
    d * ROUTES / n..(d + 1) * ROUTES / n
}

/// What a column looks like on every source: its index, kind, and whether any source has a
/// validity plane for it (then every destination gets one).
struct ColumnShape {
    index: usize,
    kind: ColumnKind,
    nullable: bool,
}

/// Deals the rows of `relations` (relation `s` on `backends[s]`) out to the same backends by
/// the route of their `keys` encoded with `encoder`; relation `d` of the result, on
/// `backends[d]`, holds every row whose route is in [`routes_of`]`(d, n)`: first those of
/// relation 0, then those of relation 1, and so on, each source's rows in route order and the
/// rows of one route in their relation's order. Every
/// relation must have the same columns (indices and kinds). Reads each source's route bounds
/// back, so it waits for each source's routing; the copies are only enqueued. Peak memory per
/// device: its input, a routed copy of it, and its share.
pub fn exchange<B: Backend>(
    backends: &[B],
    relations: &[DeviceRelation<B::Buf>],
    keys: &[usize],
    encoder: &KeyEncoder,
) -> Result<Vec<DeviceRelation<B::Buf>>> {
    let n = backends.len();
    if n == 0 || n > ROUTES || relations.len() != n {
        return plan_err!(
            "exchange: {} relations over {n} backends (1 to {ROUTES} of each, as many of both)",
            relations.len()
        );
    }
    let shapes = shapes(relations)?;
    // Every source routes its rows; the passes of all sources are enqueued before any waits.
    let routed = backends
        .iter()
        .zip(relations)
        .map(|(b, r)| {
            let key_bufs = keys
                .iter()
                .map(|&c| {
                    let col = r.column(c)?;
                    Ok((&col.values, col.validity.as_ref()))
                })
                .collect::<Result<Vec<_>>>()?;
            let encoded = encoder.encode(b, &key_bufs, r.rows)?;
            let carry: Vec<_> = shapes
                .iter()
                .flat_map(|s| r.columns[&s.index].planes())
                .collect();
            b.route(&encoded, r.rows, encoder.width(), &carry)
        })
        .collect::<Result<Vec<_>>>()?;
    let bounds = backends
        .iter()
        .zip(&routed)
        .map(|(b, r)| {
            let mut bytes = vec![0u8; (ROUTES + 1) * 4];
            b.download(&r.bounds, &mut bytes)?;
            Ok(bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")) as usize)
                .collect::<Vec<_>>())
        })
        .collect::<Result<Vec<_>>>()?;
    // rows[s][d]: the rows source s sends to destination d, from row starts[s][d] of its routed
    // relation on.
    let runs: Vec<Vec<Range<usize>>> = bounds
        .iter()
        .map(|b| {
            (0..n)
                .map(|d| {
                    let r = routes_of(d, n);
                    b[r.start]..b[r.end]
                })
                .collect()
        })
        .collect();
    // Each destination's buffers, made ready for the sources' queues.
    let mut shares = Vec::with_capacity(n);
    let mut ready = Vec::with_capacity(n);
    for (d, b) in backends.iter().enumerate() {
        let rows: usize = runs.iter().map(|r| r[d].len()).sum();
        let columns = shapes
            .iter()
            .map(|s| {
                let values = b.alloc(rows * s.kind.width())?;
                let validity = match s.nullable {
                    true => {
                        // Rows from a source without a validity plane are all valid.
                        let mut v = b.alloc(rows)?;
                        b.fill(&mut v, 1)?;
                        Some(v)
                    }
                    false => None,
                };
                let col = DeviceColumn {
                    kind: s.kind,
                    values,
                    validity,
                    rows,
                };
                Ok((s.index, col))
            })
            .collect::<Result<_>>()?;
        shares.push(DeviceRelation { columns, rows });
        ready.push(b.record()?);
    }
    // Each source copies its runs to their destinations, on its own queue.
    let mut sent = Vec::with_capacity(n);
    for (s, (b, routed)) in backends.iter().zip(&routed).enumerate() {
        for event in &ready {
            b.wait(event)?;
        }
        let mut planes = routed.carried.iter();
        for shape in &shapes {
            let own = &relations[s].columns[&shape.index];
            let values = planes.next();
            let validity = match own.validity {
                Some(_) => planes.next(),
                None => None,
            };
            let Some(values) = values else {
                return internal_err!("exchange: the route lost a column");
            };
            for (d, share) in shares.iter_mut().enumerate() {
                let run = &runs[s][d];
                let at: usize = runs[..s].iter().map(|r| r[d].len()).sum();
                let col = share
                    .columns
                    .get_mut(&shape.index)
                    .expect("made above for every shape");
                let w = shape.kind.width();
                let peer = &backends[d];
                b.copy_to_peer(
                    values,
                    run.start * w,
                    peer,
                    &mut col.values,
                    at * w,
                    run.len() * w,
                )?;
                if let (Some(src), Some(dst)) = (validity, col.validity.as_mut()) {
                    b.copy_to_peer(src, run.start, peer, dst, at, run.len())?;
                }
            }
        }
        sent.push(b.record()?);
    }
    for b in backends {
        for event in &sent {
            b.wait(event)?;
        }
    }
    // The routed copies are freed in their queues' order, after the copies that read them.
    drop(routed);
    Ok(shares)
}

/// The columns every relation has, in index order; an error where relations differ.
fn shapes<Buf>(relations: &[DeviceRelation<Buf>]) -> Result<Vec<ColumnShape>> {
    let mut indices: Vec<usize> = relations[0].columns.keys().copied().collect();
    indices.sort_unstable();
    indices
        .into_iter()
        .map(|index| {
            let kind = relations[0].columns[&index].kind;
            let mut nullable = false;
            for r in relations {
                match r.columns.get(&index) {
                    Some(c) if c.kind == kind && r.columns.len() == relations[0].columns.len() => {
                        nullable |= c.validity.is_some();
                    }
                    _ => {
                        return plan_err!(
                            "exchange: the relations differ in column {index} or in their columns"
                        );
                    }
                }
            }
            Ok(ColumnShape {
                index,
                kind,
                nullable,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow::array::{Array, AsArray, Int32Array, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};

    use super::*;
    use crate::backend::{HostBackend, HostBuffer};
    use crate::columns::Fitted;

    fn batch(keys: Vec<Option<i64>>, tags: Vec<i32>) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("tag", DataType::Int32, false),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(Int32Array::from(tags)),
            ],
        )
        .unwrap()
    }

    /// Rows (key, tag) of a downloaded relation, in order.
    fn rows(b: &HostBackend, r: &DeviceRelation<HostBuffer>) -> Vec<(Option<i64>, i32)> {
        let schema = Arc::new(batch(vec![], vec![]).schema().as_ref().clone());
        let batches = r.download(b, &schema, 1 << 20).unwrap();
        batches
            .iter()
            .flat_map(|bt| {
                let k = bt.column(0).as_primitive::<Int64Type>().clone();
                let t = bt.column(1).as_primitive::<Int32Type>().clone();
                (0..bt.num_rows())
                    .map(move |i| (k.is_valid(i).then(|| k.value(i)), t.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn encoder_of(batches: &[RecordBatch]) -> KeyEncoder {
        let keys = vec![batches.iter().map(|b| b.column(0)).collect()];
        match KeyEncoder::fit(&keys, false).unwrap() {
            Fitted::Encoder(e) => e,
            _ => panic!("keys do not encode"),
        }
    }

    #[test]
    fn every_row_goes_to_the_one_device_of_its_key_in_order() {
        let backends = vec![HostBackend::default(); 3];
        // Source 0 has null keys, the others none: the destinations' validity planes mix both.
        let inputs = [
            batch(
                (0..500)
                    .map(|i| (i % 7 != 0).then_some(i * 13 % 97))
                    .collect(),
                (0..500).collect(),
            ),
            batch(
                (0..300).map(|i| Some(i * 31 % 97)).collect(),
                (1000..1300).collect(),
            ),
            batch(vec![], vec![]),
        ];
        let encoder = encoder_of(&inputs);
        let relations: Vec<_> = backends
            .iter()
            .zip(&inputs)
            .map(|(b, i)| DeviceRelation::upload(b, std::slice::from_ref(i), &[0, 1]).unwrap())
            .collect();
        let shares = exchange(&backends, &relations, &[0], &encoder).unwrap();
        let mut device_of_key: HashMap<Option<i64>, usize> = HashMap::new();
        let mut seen = vec![];
        for (d, (b, share)) in backends.iter().zip(&shares).enumerate() {
            let got = rows(b, share);
            assert_eq!(got.len(), share.rows);
            for &(k, tag) in &got {
                assert_eq!(
                    *device_of_key.entry(k).or_insert(d),
                    d,
                    "key {k:?} on two devices"
                );
                seen.push(tag);
            }
            // Source 0's rows first; the rows of one key in their source's order (stable).
            let sources: Vec<bool> = got.iter().map(|r| r.1 >= 1000).collect();
            assert!(sources.is_sorted(), "device {d}");
            let mut last: HashMap<Option<i64>, i32> = HashMap::new();
            for &(k, tag) in &got {
                assert!(last.insert(k, tag).is_none_or(|t| t < tag), "device {d}");
            }
        }
        seen.sort();
        let expected: Vec<i32> = (0..500).chain(1000..1300).collect();
        assert_eq!(seen, expected, "every row once");
        assert!(device_of_key.len() > 3 && shares.iter().all(|s| s.rows > 0));
    }

    #[test]
    fn relations_must_match_their_backends_and_each_other() {
        let b = HostBackend::default();
        let one = batch(vec![Some(1)], vec![1]);
        let encoder = encoder_of(std::slice::from_ref(&one));
        let r = DeviceRelation::upload(&b, std::slice::from_ref(&one), &[0, 1]).unwrap();
        let narrow = DeviceRelation::upload(&b, std::slice::from_ref(&one), &[0]).unwrap();
        let two = [b.clone(), b.clone()];
        assert!(exchange(&two, std::slice::from_ref(&r), &[0], &encoder).is_err());
        assert!(exchange(&two, &[r, narrow], &[0], &encoder).is_err());
    }
}
