//! [`OutputLayout`]: what a join outputs — its schema and, for each output column, the input
//! column it comes from — which input columns are its keys (and their check bytes), and the
//! residual filter the device evaluates, if any (whose columns the join reads too).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::{Result, internal_err};

use super::checked::CheckedKeys;
use crate::filter::PairFilter;

/// Where an output column comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputColumn {
    Build(usize),
    Probe(usize),
    /// The mark of a mark join: whether the row has a match on the other side (Boolean).
    Mark,
    /// The build row's place in the table, [`NO_ROW`](crate::backend::NO_ROW) for none (UInt32;
    /// candidates of a residual filter).
    BuildRow,
    /// The probe row's place in its chunk, [`NO_ROW`](crate::backend::NO_ROW) for build rows
    /// alone (UInt32; candidates of a residual filter).
    ProbeRow,
}

/// The output of a join: its schema and, per column, its source.
#[derive(Debug, Clone)]
pub struct OutputLayout {
    pub schema: SchemaRef,
    pub columns: Vec<OutputColumn>,
    pub build_keys: Vec<usize>,
    pub probe_keys: Vec<usize>,
    /// A hashed key checked on the device: each side's columns of check bytes
    /// ([`KeyCheck`](crate::backend::KeyCheck), 16 bytes a row each), its key column staged as
    /// length classes; `None` otherwise.
    pub check: Option<CheckedKeys>,
    /// A residual filter compiled for the device: a pair matches only where it is true. Its
    /// build columns move with the keys into bucket order; its probe columns are staged.
    pub filter: Option<Arc<PairFilter>>,
}

impl OutputLayout {
    /// Build columns the output takes, in output order (repeats possible).
    pub fn build_columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.columns.iter().filter_map(|c| match c {
            OutputColumn::Build(i) => Some(*i),
            _ => None,
        })
    }

    /// Probe columns the output takes, in output order (repeats possible).
    pub fn probe_columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.columns.iter().filter_map(|c| match c {
            OutputColumn::Probe(i) => Some(*i),
            _ => None,
        })
    }

    /// The build columns the filter reads.
    pub fn build_filter_columns(&self) -> impl Iterator<Item = usize> + '_ {
        let columns = self.filter.iter().flat_map(|f| &f.build_columns);
        columns.map(|&(c, _)| c)
    }

    /// An error where keys are hashed and checked by their bytes: `algorithm` (a join over
    /// relations on the device) compares encoded keys alone; HASH checks them.
    pub(crate) fn keys_compared_alone(&self, algorithm: &str) -> Result<()> {
        match self.check {
            Some(_) => internal_err!("{algorithm} cannot check hashed keys' bytes; HASH does"),
            None => Ok(()),
        }
    }

    /// The build columns the join reads: keys, check bytes, the filter's columns and the
    /// columns the output takes, sorted.
    pub fn build_needed(&self) -> Vec<usize> {
        let mut read: Vec<usize> = self.build_columns().collect();
        read.extend(self.check.iter().flat_map(CheckedKeys::build_columns));
        read.extend(self.build_filter_columns());
        super::transform::needed(&self.build_keys, &read)
    }

    /// The probe columns the join reads: keys, check bytes, the filter's columns and the
    /// columns the output takes, sorted.
    pub fn probe_needed(&self) -> Vec<usize> {
        let mut read: Vec<usize> = self.probe_columns().collect();
        read.extend(self.check.iter().flat_map(CheckedKeys::probe_columns));
        read.extend(
            self.filter
                .iter()
                .flat_map(|f| &f.probe_columns)
                .map(|&(c, _)| c),
        );
        super::transform::needed(&self.probe_keys, &read)
    }
}
