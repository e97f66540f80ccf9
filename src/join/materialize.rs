//! Materialization from transformed relations (the "OM" of PHJ-OM and SMJ-OM): each output
//! column of a join's matches gathered from its side's columns as the transform left them
//! (partitioned or sorted with the keys), by the match positions in that side.

use std::collections::HashMap;

use datafusion::common::{Result, internal_err};

use super::layout::{OutputColumn, OutputLayout};
use super::phases::{Phases, timed};
use super::transform::column_of;
use crate::backend::{Backend, MatchIndices};
use crate::columns::{DeviceColumn, DeviceRelation};

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
    let columns = timed(backend, &phases.materialize, || {
        layout
            .columns
            .iter()
            .enumerate()
            .map(|(out, c)| {
                let (col, idx) = match c {
                    OutputColumn::Build(i) => (column_of(build, *i)?, &matches.build),
                    OutputColumn::Probe(i) => (column_of(probe, *i)?, &matches.probe),
                    _ => {
                        return internal_err!(
                            "materializing from transformed relations: unfiltered inner joins only"
                        );
                    }
                };
                Ok((out, col.map(rows, |b, w| backend.gather(b, idx, rows, w))?))
            })
            .collect::<Result<HashMap<_, _>>>()
    })?;
    Ok(DeviceRelation { columns, rows })
}
