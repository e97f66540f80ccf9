//! Materialization from transformed relations (the "OM" of PHJ-OM and SMJ-OM): each output
//! column of a join's matches gathered from its side's columns as the transform left them
//! (partitioned or sorted with the keys), by the match positions in that side; and from the
//! untransformed relations (the "UM" of PHJ-UM and SMJ-UM), by the positions in the relation
//! as given that the transform moved with the keys.

use std::collections::HashMap;

use datafusion::common::{Result, internal_err};

use super::layout::{OutputColumn, OutputLayout};
use super::phases::{Phases, timed};
use super::transform::{column_of, encode_keys};
use crate::backend::{Backend, MatchIndices, Partitioned, Sorted};
use crate::columns::{DeviceColumn, DeviceRelation, KeyEncoder};

/// The output of `matches` (positions in `build` and `probe`, the transformed columns of each
/// side by input column): every column `layout` names, gathered from its side. Inner joins
/// without a residual filter only: a layout with one is an error (nothing here applies it).
pub(crate) fn gather_output<B: Backend>(
    backend: &B,
    build: &HashMap<usize, DeviceColumn<B::Buf>>,
    probe: &HashMap<usize, DeviceColumn<B::Buf>>,
    matches: &MatchIndices<B::Buf>,
    layout: &OutputLayout,
    phases: &Phases,
) -> Result<DeviceRelation<B::Buf>> {
    if layout.filter.is_some() {
        return internal_err!(
            "materializing from transformed relations: a residual filter is not applied here"
        );
    }
    let rows = matches.len;
    // Each side's output columns, in layout order.
    let (mut build_side, mut probe_side) = (Vec::new(), Vec::new());
    for (out, c) in layout.columns.iter().enumerate() {
        match c {
            OutputColumn::Build(i) => build_side.push((out, column_of(build, *i)?)),
            OutputColumn::Probe(i) => probe_side.push((out, column_of(probe, *i)?)),
            _ => {
                return internal_err!(
                    "materializing from transformed relations: unfiltered inner joins only"
                );
            }
        }
    }
    let columns = timed(backend, &phases.materialize, || {
        let mut columns = HashMap::new();
        for (side, idx) in [(build_side, &matches.build), (probe_side, &matches.probe)] {
            // Every plane of the side's columns by the side's positions, read once.
            let planes: Vec<_> = side.iter().flat_map(|(_, col)| col.planes()).collect();
            let mut gathered = backend.gather_planes(&planes, idx, rows)?.into_iter();
            for (out, col) in side {
                columns.insert(
                    out,
                    col.map(rows, |_, _| gathered.next().ok_or_else(too_few))?,
                );
            }
        }
        Ok(columns)
    })?;
    Ok(DeviceRelation { columns, rows })
}

/// The UM joins (PHJ-UM, SMJ-UM) over `build` and `probe`, on the keys `layout` names, encoded
/// with `encoder`: each side's keys moved with its rows' positions by `transform` (given the
/// encoded keys, their rows and the positions, the one column it carries), the two sides
/// matched by `find`, and every column `layout` names gathered from `build` and `probe` as
/// given, by the matched rows' positions. Times go to `phases`. Inner joins without a residual
/// filter only, as [`gather_output`].
pub(crate) fn join_untransformed_by<B: Backend, T: Carried<B::Buf>>(
    backend: &B,
    (build, probe): (&DeviceRelation<B::Buf>, &DeviceRelation<B::Buf>),
    layout: &OutputLayout,
    encoder: &KeyEncoder,
    phases: &Phases,
    transform: impl Fn(&B::Buf, usize, &B::Buf) -> Result<T>,
    find: impl FnOnce(&T, &T) -> Result<MatchIndices<B::Buf>>,
) -> Result<DeviceRelation<B::Buf>> {
    let side = |relation: &DeviceRelation<B::Buf>, keys: &[usize]| {
        let encoded = encode_keys(backend, relation, keys, encoder)?;
        transform(
            &encoded,
            relation.rows,
            &backend.row_positions(relation.rows)?,
        )
    };
    let (b, p) = timed(backend, &phases.transform, || {
        Ok((
            side(build, &layout.build_keys)?,
            side(probe, &layout.probe_keys)?,
        ))
    })?;
    let matches = timed(backend, &phases.matching, || find(&b, &p))?;
    // The transformed keys are freed here, before the gathers.
    let (build_rows, probe_rows) = (positions_carried(b)?, positions_carried(p)?);
    let rows = timed(backend, &phases.materialize, || {
        Ok(MatchIndices {
            build: backend.gather(&build_rows, &matches.build, matches.len, 4)?,
            probe: backend.gather(&probe_rows, &matches.probe, matches.len, 4)?,
            len: matches.len,
        })
    })?;
    // Gathered (`timed` waits for the queue): only the rows' positions are needed now.
    drop((matches, build_rows, probe_rows));
    gather_output(
        backend,
        &build.columns,
        &probe.columns,
        &rows,
        layout,
        phases,
    )
}

/// The one column a transform for [`join_untransformed_by`] carried: each row's position; the
/// rest of the transformed relation is dropped.
fn positions_carried<Buf>(transformed: impl Carried<Buf>) -> Result<Buf> {
    let mut carried = transformed.into_carried();
    match (carried.pop(), carried.len()) {
        (Some(positions), 0) => Ok(positions),
        (_, more) => internal_err!(
            "a transform carried {} columns, not the row positions alone",
            more + 1
        ),
    }
}

/// What a partitioning or sorting pass gives: the columns it carried, taken out of it.
pub(crate) trait Carried<Buf> {
    fn into_carried(self) -> Vec<Buf>;
}

impl<Buf> Carried<Buf> for Partitioned<Buf> {
    fn into_carried(self) -> Vec<Buf> {
        self.carried
    }
}

impl<Buf> Carried<Buf> for Sorted<Buf> {
    fn into_carried(self) -> Vec<Buf> {
        self.carried
    }
}

fn too_few() -> datafusion::common::DataFusionError {
    datafusion::common::internal_datafusion_err!(
        "gather_planes gave fewer planes than it was given"
    )
}
