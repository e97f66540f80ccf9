//! [`Residual`]: a join's residual filter (`ON a.k = b.k AND <filter>`), evaluated on the host
//! by DataFusion's own expression evaluator over the candidate pairs the device produced.
//!
//! With a filter, the lane outputs *candidate* rows: every pair of equal keys (and, for the
//! join types that keep probe rows without a match, one row with a null build side for a
//! probe row without any), with the filter's columns and two position columns, the build
//! row's place in the table and the probe row's in its chunk. Each partition's stream passes
//! its candidate windows through a [`ResidualStream`] before handing them out:
//!
//! ```text
//!  candidates ─► filter (nulls are false; rows without a build side fail) ─► kept pairs
//!      inner, left, right, full: the kept pairs            ─┐
//!      right, full:  a probe row with no kept pair, alone    ├─► output, in probe order
//!      right semi / anti / mark: each probe row once, by     │
//!                    whether a pair of it was kept          ─┘
//!      left, full, left semi / anti / mark: a kept pair marks its build row (host marks,
//!                    sent to the lane with the partition's `ProbeDone`, merged there and
//!                    copied to the device before the build rows are selected)
//! ```
//! The filter thus applies before any match flag is set, so outer, semi and anti joins keep
//! their meaning. A probe row's candidates are consecutive (the device writes them in probe
//! order), but may span windows of its chunk: the row's decision waits for its last candidate,
//! at the latest for the chunk's end ([`ResidualStream::end_chunk`]). Windows of build rows
//! (after the probe side, probe position [`NO_ROW`]) are already final.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array,
};
use arrow::compute::kernels::boolean::{and_kleene, or_kleene};
use arrow::compute::nullif;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::common::{JoinSide, JoinType, Result, internal_err};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::BinaryExpr;
use datafusion::physical_plan::joins::utils::JoinFilter;

use super::coalesce::take_rows;
use super::dictionary_gather::interleave_keeping_dictionary;
use crate::backend::NO_ROW;
use crate::join::OutputColumn;

/// The filter of one join and where its inputs lie among the candidate columns.
#[derive(Debug)]
pub struct Residual {
    filter: JoinFilter,
    join_type: JoinType,
    /// The filter's intermediate schema with every field nullable (a candidate's missing build
    /// side is null).
    filter_schema: SchemaRef,
    /// The candidate column of each of the filter's columns.
    filter_columns: Vec<usize>,
    /// Per output column (candidate column `k` is output column `k`): whether it comes from
    /// the build side.
    from_build: Vec<bool>,
    /// The output's mark column (right mark joins set it here).
    mark: Option<usize>,
    build_row: usize,
    probe_row: usize,
    schema: SchemaRef,
}

/// The candidate layout for a filtered join: the output columns, then the filter's columns
/// the output lacks, then the build and probe positions.
pub struct Candidates {
    pub columns: Vec<OutputColumn>,
    pub schema: SchemaRef,
    pub residual: Residual,
}

impl Residual {
    /// Plans the candidate layout of a join whose output is `output` (`columns`, `schema`),
    /// with inputs `left` and `right`.
    pub fn plan(
        filter: &JoinFilter,
        join_type: JoinType,
        columns: &[OutputColumn],
        schema: &SchemaRef,
        left: &SchemaRef,
        right: &SchemaRef,
    ) -> Result<Candidates> {
        let mut cand_columns = columns.to_vec();
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        let mut filter_columns = vec![];
        for (k, c) in filter.column_indices().iter().enumerate() {
            let (col, field) = match c.side {
                JoinSide::Left => (OutputColumn::Build(c.index), left.field(c.index)),
                JoinSide::Right => (OutputColumn::Probe(c.index), right.field(c.index)),
                JoinSide::None => return internal_err!("a join filter over a mark column"),
            };
            let at = match cand_columns.iter().position(|&x| x == col) {
                Some(at) => at,
                None => {
                    cand_columns.push(col);
                    fields.push(field.as_ref().clone().with_name(format!("__filter_{k}")));
                    cand_columns.len() - 1
                }
            };
            // Any column may be null where a probe row has no build row.
            fields[at] = fields[at].clone().with_nullable(true);
            filter_columns.push(at);
        }
        let build_row = cand_columns.len();
        cand_columns.push(OutputColumn::BuildRow);
        fields.push(Field::new("__build_row", DataType::UInt32, false));
        let probe_row = cand_columns.len();
        cand_columns.push(OutputColumn::ProbeRow);
        fields.push(Field::new("__probe_row", DataType::UInt32, false));
        let filter_schema = Arc::new(Schema::new(
            filter
                .schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        ));
        let from_build = columns
            .iter()
            .map(|c| matches!(c, OutputColumn::Build(_)))
            .collect();
        let mark = columns.iter().position(|c| *c == OutputColumn::Mark);
        Ok(Candidates {
            columns: cand_columns,
            schema: Arc::new(Schema::new(fields)),
            residual: Self {
                filter: filter.clone(),
                join_type,
                filter_schema,
                filter_columns,
                from_build,
                mark,
                build_row,
                probe_row,
                schema: Arc::clone(schema),
            },
        })
    }

    /// The schema of the rows that go out.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Whether kept pairs mark their build rows.
    fn marks_build(&self) -> bool {
        matches!(
            self.join_type,
            JoinType::Left
                | JoinType::Full
                | JoinType::LeftSemi
                | JoinType::LeftAnti
                | JoinType::LeftMark
        )
    }

    /// Which candidate rows pass: the row has a build side and the filter is true. As
    /// DataFusion's join evaluates its filter only over pairs of equal keys, a row without a
    /// build side is not evaluated ([`decide`] takes the rest, a hashed key's equalities
    /// first: `KeyHash::verification`).
    fn keep(&self, batch: &RecordBatch, build_rows: &UInt32Array) -> Result<Vec<bool>> {
        let rows = batch.num_rows();
        let columns: Vec<ArrayRef> = self
            .filter_columns
            .iter()
            .map(|&c| Arc::clone(batch.column(c)))
            .collect();
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        let input =
            RecordBatch::try_new_with_options(Arc::clone(&self.filter_schema), columns, &options)?;
        let paired: UInt32Array = (0..rows as u32)
            .filter(|&i| build_rows.value(i as usize) != NO_ROW)
            .collect();
        let mut kept = vec![false; rows];
        if paired.is_empty() {
            return Ok(kept);
        }
        let input = match paired.len() == rows {
            true => input,
            false => take_rows(&input, &paired)?,
        };
        let passed = decide(self.filter.expression(), &input)?;
        for (j, &i) in paired.values().iter().enumerate() {
            kept[i as usize] = passed.is_valid(j) && passed.value(j);
        }
        Ok(kept)
    }
}

/// `expr`, a boolean expression, over `batch`, the right side of each `AND` and `OR` evaluated
/// only over the rows its left side leaves open (not false under `AND`, not true under `OR`),
/// in SQL's three-valued logic. DataFusion skips a side only where few rows need it, and over
/// its own batches, which are not this join's windows; so that a side that fails on rows it
/// does not decide (a division by zero behind `b.z <> 0 AND`) fails here nowhere DataFusion's
/// join could succeed, it is never evaluated over them.
fn decide(expr: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Result<BooleanArray> {
    let rows = batch.num_rows();
    let connective = (expr.downcast_ref::<BinaryExpr>())
        .filter(|b| matches!(b.op(), Operator::And | Operator::Or));
    let Some(binary) = connective else {
        let result = expr.evaluate(batch)?.into_array(rows)?;
        return match result.as_boolean_opt() {
            Some(r) => Ok(r.clone()),
            None => internal_err!("a join filter of type {}", result.data_type()),
        };
    };
    let and = *binary.op() == Operator::And;
    let left = decide(binary.left(), batch)?;
    // A row is decided where its left side is false under AND, true under OR.
    let open: UInt32Array = (0..rows as u32)
        .filter(|&i| !(left.is_valid(i as usize) && left.value(i as usize) != and))
        .collect();
    if open.is_empty() {
        return Ok(left);
    }
    let right = match open.len() == rows {
        true => decide(binary.right(), batch)?,
        false => {
            let some = take_rows(batch, &open)?;
            let values = decide(binary.right(), &some)?;
            // Back in place; a decided row's right side is null, which its left side outvotes.
            let mut at = vec![None; rows];
            for (j, &i) in open.values().iter().enumerate() {
                at[i as usize] = values.is_valid(j).then(|| values.value(j));
            }
            BooleanArray::from(at)
        }
    };
    Ok(match and {
        true => and_kleene(&left, &right)?,
        false => or_kleene(&left, &right)?,
    })
}

/// A probe row whose candidates have begun but not necessarily ended.
struct Group {
    probe_row: u32,
    /// Its first candidate: a one-row batch once the window it is in has gone.
    first: First,
    kept: bool,
    /// Whether it has gone out (right semi joins: at its first kept pair).
    out: bool,
}

enum First {
    /// Row `i` of the current window.
    Here(usize),
    Saved(RecordBatch),
}

/// One output row: which source (0: the saved first row, 1: the window) and row, whether its
/// build side is cleared, and its mark.
type Pick = ((usize, usize), bool, bool);

/// One partition's pass over its candidate windows.
pub struct ResidualStream {
    residual: Arc<Residual>,
    group: Option<Group>,
    /// A byte per build row (its place in the table), set when a pair of it was kept; for join
    /// types that output build rows after the probe side.
    marks: Vec<u8>,
}

impl ResidualStream {
    pub fn new(residual: Arc<Residual>) -> Self {
        Self {
            residual,
            group: None,
            marks: vec![],
        }
    }

    /// The marks of the build rows this partition kept pairs of, leaving none.
    pub fn take_marks(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.marks)
    }

    /// The output of one candidate window (`None`: no row).
    pub fn push(&mut self, batch: RecordBatch) -> Result<Option<RecordBatch>> {
        let r = Arc::clone(&self.residual);
        let n = batch.num_rows();
        let build_rows = batch
            .column(r.build_row)
            .as_primitive::<UInt32Type>()
            .clone();
        let probe_rows = batch
            .column(r.probe_row)
            .as_primitive::<UInt32Type>()
            .clone();
        if n == 0 {
            return Ok(None);
        }
        if probe_rows.value(0) == NO_ROW {
            // Build rows after the probe side: final already.
            let picks: Vec<Pick> = (0..n).map(|i| ((1, i), false, false)).collect();
            return self.output(None, &batch, &picks, false).map(Some);
        }
        let keep = r.keep(&batch, &build_rows)?;
        if r.marks_build() {
            for (i, _) in keep.iter().enumerate().filter(|(_, k)| **k) {
                let b = build_rows.value(i) as usize;
                if self.marks.len() <= b {
                    self.marks.resize(b + 1, 0);
                }
                self.marks[b] = 1;
            }
        }
        match r.join_type {
            JoinType::Inner | JoinType::Left => {
                let picks: Vec<Pick> = (0..n)
                    .filter(|&i| keep[i])
                    .map(|i| ((1, i), false, false))
                    .collect();
                return self.output(None, &batch, &picks, false).map(Some);
            }
            JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => return Ok(None),
            _ => {}
        }
        let saved = match &self.group {
            Some(Group {
                first: First::Saved(b),
                ..
            }) => Some(b.clone()),
            _ => None,
        };
        let mut picks = vec![];
        for (i, &kept) in keep.iter().enumerate() {
            let row = probe_rows.value(i);
            if self.group.as_ref().is_none_or(|g| g.probe_row != row) {
                if let Some(g) = self.group.take() {
                    self.close(g, &mut picks);
                }
                self.group = Some(Group {
                    probe_row: row,
                    first: First::Here(i),
                    kept: false,
                    out: false,
                });
            }
            let Some(g) = self.group.as_mut() else {
                continue;
            };
            if kept {
                match r.join_type {
                    JoinType::Right | JoinType::Full => picks.push(((1, i), false, false)),
                    JoinType::RightSemi if !g.out => {
                        picks.push(((1, i), false, false));
                        g.out = true;
                    }
                    _ => {}
                }
                g.kept = true;
            }
        }
        // The open row's first candidate outlives this window.
        if let Some(Group {
            first: first @ First::Here(_),
            ..
        }) = self.group.as_mut()
            && let First::Here(i) = *first
        {
            *first = First::Saved(batch.slice(i, 1));
        }
        if picks.is_empty() {
            return Ok(None);
        }
        self.output(saved.as_ref(), &batch, &picks, true).map(Some)
    }

    /// The end of a chunk: the open probe row's decision.
    pub fn end_chunk(&mut self) -> Result<Option<RecordBatch>> {
        let Some(g) = self.group.take() else {
            return Ok(None);
        };
        let First::Saved(saved) = &g.first else {
            return internal_err!("an open probe row without its first candidate");
        };
        let saved = saved.clone();
        let mut picks = vec![];
        self.close(g, &mut picks);
        if picks.is_empty() {
            return Ok(None);
        }
        self.output(None, &saved, &picks, true).map(Some)
    }

    /// What a probe row whose candidates have all been seen adds.
    fn close(&self, g: Group, picks: &mut Vec<Pick>) {
        let at = match g.first {
            First::Here(i) => (1, i),
            First::Saved(_) => (0, 0),
        };
        match self.residual.join_type {
            JoinType::Right | JoinType::Full if !g.kept => picks.push((at, true, false)),
            JoinType::RightAnti if !g.kept => picks.push((at, false, false)),
            JoinType::RightMark => picks.push((at, false, g.kept)),
            _ => {}
        }
    }

    /// The output rows `picks` of `batch` (source 1) and `saved` (source 0; without one, source
    /// 0 is `batch`); `set_mark`: the mark column takes the picks' marks.
    fn output(
        &self,
        saved: Option<&RecordBatch>,
        batch: &RecordBatch,
        picks: &[Pick],
        set_mark: bool,
    ) -> Result<RecordBatch> {
        let r = &self.residual;
        let saved = saved.unwrap_or(batch);
        let indices: Vec<(usize, usize)> = picks.iter().map(|p| p.0).collect();
        let cleared = BooleanArray::from(picks.iter().map(|p| p.1).collect::<Vec<_>>());
        let any_cleared = picks.iter().any(|p| p.1);
        let columns = r
            .from_build
            .iter()
            .enumerate()
            .map(|(c, &from_build)| {
                if set_mark && r.mark == Some(c) {
                    return Ok(Arc::new(BooleanArray::from(
                        picks.iter().map(|p| p.2).collect::<Vec<_>>(),
                    )) as ArrayRef);
                }
                let (a, b) = (saved.column(c), batch.column(c));
                let taken = if picks.iter().all(|p| p.0.0 == 1) && !any_cleared {
                    let idx =
                        UInt32Array::from(picks.iter().map(|p| p.0.1 as u32).collect::<Vec<_>>());
                    arrow::compute::take(b.as_ref(), &idx, None)?
                } else {
                    interleave_keeping_dictionary(&[a.as_ref(), b.as_ref()], &indices)?
                };
                Ok(if from_build && any_cleared {
                    nullif(taken.as_ref(), &cleared)?
                } else {
                    taken
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(picks.len()));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&r.schema),
            columns,
            &options,
        )?)
    }
}
