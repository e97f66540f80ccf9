//! [`OutputLayout`]: what a join outputs — its schema and, for each output column, the input
//! column it comes from — and which input columns are its keys (and their check bytes).

use arrow::datatypes::SchemaRef;

use super::checked::CheckedKeys;

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
    /// A hashed key checked on the device: each side's column of check bytes
    /// ([`KeyCheck`](crate::backend::KeyCheck), 16 bytes a row), its key column staged as
    /// length classes; `None` otherwise.
    pub check: Option<CheckedKeys>,
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

    /// The build columns the join reads: keys, check bytes and the columns the output takes,
    /// sorted.
    pub fn build_needed(&self) -> Vec<usize> {
        let mut read: Vec<usize> = self.build_columns().collect();
        read.extend(self.check.map(|c| c.build));
        super::transform::needed(&self.build_keys, &read)
    }

    /// The probe columns the join reads: keys, check bytes and the columns the output takes,
    /// sorted.
    pub fn probe_needed(&self) -> Vec<usize> {
        let mut read: Vec<usize> = self.probe_columns().collect();
        read.extend(self.check.map(|c| c.probe));
        super::transform::needed(&self.probe_keys, &read)
    }
}
