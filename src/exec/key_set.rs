//! [`KeySetExpr`]: `probe_key IN (the build side's keys)` as one expression over one child, the
//! membership test a join publishes in its dynamic filter where few probe rows are expected to
//! match (`exec::filter`).
//!
//! DataFusion's `InListExpr` holds one literal child per value, and a dynamic filter rewrites
//! its expression's children every time it is evaluated (to the columns of the node that
//! evaluates it), so an IN list of thousands of values would cost a tree of thousands of nodes
//! per batch. This expression keeps the list's hashed set out of the tree: its one child is the
//! probe key, as the child of `HashJoinExec`'s `HashTableLookupExpr` is. It displays as
//! `key IN (n build keys)`, not as its values.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::Result;
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{Column, InListExpr, lit};
use datafusion::physical_expr_common::physical_expr::proto_encode::PhysicalExprEncodeCtx;
use datafusion_proto::protobuf;

/// The set of a build side's keys, and the probe key tested against it.
#[derive(Debug)]
pub(crate) struct KeySetExpr {
    /// The probe key (a column of the node that evaluates it).
    key: Arc<dyn PhysicalExpr>,
    /// The set: an `IN` list over column 0 of `one`, whose static filter hashes the values.
    set: Arc<InListExpr>,
    /// The schema of the one-column batch `set` reads.
    one: SchemaRef,
    /// How many keys the set was built from (for display).
    keys: usize,
}

impl KeySetExpr {
    /// The set of `values`' non-null values (the build side's keys, of the probe key's type),
    /// tested against `key`.
    pub fn try_new(key: Arc<dyn PhysicalExpr>, values: ArrayRef) -> Result<Self> {
        let values = match values.null_count() {
            0 => values,
            _ => arrow::compute::filter(&values, &arrow::compute::is_not_null(&values)?)?,
        };
        let one = Arc::new(Schema::new(vec![Field::new(
            "key",
            values.data_type().clone(),
            true,
        )]));
        let keys = values.len();
        let set =
            InListExpr::try_new_from_array(Arc::new(Column::new("key", 0)), values, false, &one)?;
        Ok(Self {
            key,
            set: Arc::new(set),
            one,
            keys,
        })
    }
}

impl fmt::Display for KeySetExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} IN ({} build keys)", self.key, self.keys)
    }
}

impl Hash for KeySetExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key.hash(state);
        // The set by identity: each execution builds its own, as HashJoinExec's lookup
        // expression compares its hash table by pointer.
        Arc::as_ptr(&self.set).hash(state);
    }
}

impl PartialEq for KeySetExpr {
    fn eq(&self, other: &Self) -> bool {
        self.key.eq(&other.key) && Arc::ptr_eq(&self.set, &other.set)
    }
}

impl Eq for KeySetExpr {}

impl PhysicalExpr for KeySetExpr {
    fn data_type(&self, _input_schema: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.key.nullable(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let keys = self.key.evaluate(batch)?.into_array(batch.num_rows())?;
        let one = RecordBatch::try_new(Arc::clone(&self.one), vec![keys])?;
        self.set.evaluate(&one)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.key]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let [key] = <[_; 1]>::try_from(children).map_err(|c| {
            datafusion::common::internal_datafusion_err!(
                "KeySetExpr takes one child, got {}",
                c.len()
            )
        })?;
        Ok(Arc::new(Self {
            key,
            set: Arc::clone(&self.set),
            one: Arc::clone(&self.one),
            keys: self.keys,
        }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }

    /// Sent as `true`, as DataFusion sends `HashJoinExec`'s lookup expression: the set lives in
    /// this process, and a dynamic filter only prunes (every row passes `true`).
    fn try_to_proto(
        &self,
        ctx: &PhysicalExprEncodeCtx<'_>,
    ) -> Result<Option<protobuf::PhysicalExprNode>> {
        ctx.encode_child(&lit(true)).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{BooleanArray, Int64Array};

    #[test]
    fn tests_membership_of_a_remapped_key_and_displays_its_count() {
        let values: ArrayRef = Arc::new(Int64Array::from(vec![Some(3), None, Some(7), Some(3)]));
        let expr = Arc::new(KeySetExpr::try_new(Arc::new(Column::new("k", 0)), values).unwrap());
        assert_eq!(expr.to_string(), "k@0 IN (3 build keys)");
        // The key moved to column 1, as a dynamic filter remaps it for the node below.
        let moved = Arc::clone(&expr)
            .with_new_children(vec![Arc::new(Column::new("k", 1))])
            .unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int64, true),
            Field::new("k", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![7, 7, 7, 7])),
                Arc::new(Int64Array::from(vec![Some(3), Some(4), None, Some(7)])),
            ],
        )
        .unwrap();
        let out = moved.evaluate(&batch).unwrap().into_array(4).unwrap();
        let out = out.as_any().downcast_ref::<BooleanArray>().unwrap();
        // A null key matches nothing: null or false both drop the row.
        assert!(out.value(0));
        assert!(out.is_valid(1) && !out.value(1));
        assert!(out.is_null(2) || !out.value(2));
        assert!(out.value(3));
    }
}
