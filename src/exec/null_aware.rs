//! Null-aware anti joins (`x NOT IN (SELECT y ...)`): DataFusion plans them as left anti joins
//! on one key whose nulls follow SQL's three-valued logic, as its `HashJoinExec` decides them:
//!
//! - a null key on the probe (right) side makes `NOT IN` unknown for every build row: the join
//!   outputs nothing;
//! - a build row with a null key is output only if the probe side has no row at all
//!   (`NULL NOT IN (empty)` is true);
//! - every other build row is output if no probe key equals its key, as in a plain anti join.
//!
//! The device runs the plain anti join over the build rows whose key is not null. The host
//! sets the rows with a null key aside when the build side is collected ([`NullAware::split`]),
//! and the probe partitions record what they read ([`NullAwareRun::observe`]). The build rows
//! the device emits go out only if no probe key was null, and the partition that finishes last
//! outputs the rows set aside if the probe side was empty ([`NullAwareRun::finish`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use arrow::array::{Array, RecordBatch, RecordBatchOptions};
use arrow::compute::{concat_batches, filter_record_batch, is_not_null, is_null};
use arrow::datatypes::SchemaRef;
use datafusion::common::{Result, plan_err};

use crate::join::OutputColumn;

/// What a null-aware anti join needs of its inputs: its key column on each side, and the
/// build (left) columns it outputs.
#[derive(Debug, Clone)]
pub struct NullAware {
    build_key: usize,
    probe_key: usize,
    output: Vec<usize>,
    schema: SchemaRef,
}

impl NullAware {
    /// The null-aware anti join on key columns `keys` whose output (of schema `schema`) is
    /// `columns`, build columns only.
    pub fn plan(
        keys: (usize, usize),
        columns: &[OutputColumn],
        schema: &SchemaRef,
    ) -> Result<Self> {
        let output = columns
            .iter()
            .map(|c| match c {
                OutputColumn::Build(i) => Ok(*i),
                _ => plan_err!("a null-aware anti join outputs build columns only"),
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            build_key: keys.0,
            probe_key: keys.1,
            output,
            schema: Arc::clone(schema),
        })
    }

    /// Splits collected build batches into the rows whose key is not null, which go to the
    /// device, and the output rows of those whose key is null. `None` if no key is null (the
    /// batches are left as they are) or every key is (DataFusion's join decides those).
    pub fn split<'a>(
        &self,
        batches: impl IntoIterator<Item = &'a mut RecordBatch>,
    ) -> Result<Option<RecordBatch>> {
        let mut batches: Vec<&mut RecordBatch> = batches.into_iter().collect();
        let nulls: usize = batches
            .iter()
            .map(|b| b.column(self.build_key).logical_null_count())
            .sum();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        if nulls == 0 || nulls == rows {
            return Ok(None);
        }
        let mut set_aside = vec![];
        for batch in batches.iter_mut() {
            let key = Arc::clone(batch.column(self.build_key));
            if key.logical_null_count() == 0 {
                continue;
            }
            let null = is_null(key.as_ref())?;
            let output = batch.project(&self.output)?;
            set_aside.push(filter_record_batch(&output, &null)?);
            **batch = filter_record_batch(batch, &is_not_null(key.as_ref())?)?;
        }
        let set_aside = concat_batches(&self.schema, &set_aside)?;
        // (A query may output no column at all: `count(*)`.)
        let options = RecordBatchOptions::new().with_row_count(Some(set_aside.num_rows()));
        Ok(Some(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            set_aside.columns().to_vec(),
            &options,
        )?))
    }
}

/// One execution's state of a null-aware anti join, shared by its partitions.
#[derive(Debug)]
pub struct NullAwareRun {
    plan: NullAware,
    /// The output rows of the build rows with a null key (none: `None`).
    set_aside: Option<RecordBatch>,
    probe_rows: AtomicBool,
    probe_null: AtomicBool,
    /// Partitions that have not finished.
    running: AtomicUsize,
}

impl NullAwareRun {
    pub fn new(plan: NullAware, set_aside: Option<RecordBatch>, partitions: usize) -> Self {
        Self {
            plan,
            set_aside,
            probe_rows: AtomicBool::new(false),
            probe_null: AtomicBool::new(false),
            running: AtomicUsize::new(partitions),
        }
    }

    /// Records a probe batch as it arrives.
    pub fn observe(&self, batch: &RecordBatch) {
        if batch.num_rows() > 0 {
            self.probe_rows.store(true, Ordering::Release);
        }
        if batch.column(self.plan.probe_key).logical_null_count() > 0 {
            self.probe_null.store(true, Ordering::Release);
        }
    }

    /// Whether the build rows the device emits go out: no probe key was null. The device emits
    /// them only after every partition has read all of its probe input, so this is final then.
    pub fn emits(&self) -> bool {
        !self.probe_null.load(Ordering::Acquire)
    }

    /// A partition has handed out everything else: the rows set aside, if this partition is
    /// the last to finish and the probe side had no row.
    pub fn finish(&self) -> Option<RecordBatch> {
        if self.running.fetch_sub(1, Ordering::AcqRel) != 1 {
            return None;
        }
        match self.probe_rows.load(Ordering::Acquire) {
            true => None,
            false => self.set_aside.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Int32Array};
    use arrow::datatypes::{DataType, Field, Int32Type, Schema};

    fn batch(keys: Vec<Option<i32>>) -> RecordBatch {
        let v: Vec<i32> = (0..keys.len() as i32).collect();
        RecordBatch::try_from_iter([
            ("k", Arc::new(Int32Array::from(keys)) as _),
            ("v", Arc::new(Int32Array::from(v)) as _),
        ])
        .unwrap()
    }

    fn plan() -> NullAware {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]));
        NullAware::plan((0, 0), &[OutputColumn::Build(1)], &schema).unwrap()
    }

    #[test]
    fn null_keys_are_set_aside_and_output_only_after_an_empty_probe_side() {
        let plan = plan();
        let mut batches = vec![batch(vec![Some(1), None, Some(3)]), batch(vec![None])];
        let aside = plan.split(&mut batches).unwrap().unwrap();
        assert_eq!(
            aside.column(0).as_primitive::<Int32Type>().values(),
            &[1, 0]
        );
        assert_eq!(batches[0].num_rows(), 2);
        assert_eq!(batches[1].num_rows(), 0);
        // Two partitions, neither read a row: the last to finish outputs the rows set aside.
        let run = NullAwareRun::new(plan.clone(), Some(aside.clone()), 2);
        assert!(run.finish().is_none());
        assert_eq!(run.finish().map(|b| b.num_rows()), Some(2));
        // A probe row: nothing set aside goes out; a null probe key: nothing at all.
        let run = NullAwareRun::new(plan.clone(), Some(aside), 1);
        run.observe(&batch(vec![Some(7)]));
        assert!(run.emits() && run.finish().is_none());
        run.observe(&batch(vec![None]));
        assert!(!run.emits());
    }

    #[test]
    fn batches_without_null_keys_or_with_only_null_keys_stay_whole() {
        let plan = plan();
        let mut batches = vec![batch(vec![Some(1), Some(2)])];
        assert!(plan.split(&mut batches).unwrap().is_none());
        let mut batches = vec![batch(vec![None, None])];
        assert!(plan.split(&mut batches).unwrap().is_none());
        assert_eq!(batches[0].num_rows(), 2);
    }
}
