//! [`compile`]: a DataFusion `JoinFilter` into a [`PairFilter`], or the reason it stays on the
//! host. Only expressions whose every value DataFusion computes without a possible error, and
//! whose types the device reads, compile; anything else is refused whole.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Schema};
use datafusion::common::{JoinSide, ScalarValue};
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CaseExpr, CastExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, Literal,
    NegativeExpr, NotExpr,
};
use datafusion::physical_plan::joins::utils::JoinFilter;

use super::{ArithOp, CmpOp, MAX_FILTER_COLUMNS, Node, PairFilter, Scalar, Side, Ty};

/// Compiles `filter` (whose left side is the build side) for the bucket probe; `Err` says why
/// it stays on the host.
pub fn compile(filter: &JoinFilter) -> Result<PairFilter, String> {
    let mut c = Compiler {
        filter,
        build: vec![],
        probe: vec![],
    };
    let (root, dt) = c.node(filter.expression())?;
    if dt != DataType::Boolean {
        return Err(format!("the filter is of type {dt}"));
    }
    Ok(PairFilter::new(root, c.build, c.probe))
}

/// The value type of a column or literal of type `dt`, if the device reads it.
fn ty_of(dt: &DataType) -> Option<Ty> {
    use DataType::*;
    Some(match dt {
        Boolean => Ty::Bool,
        Int8 => Ty::I8,
        Int16 => Ty::I16,
        Int32 | Date32 | Time32(_) | Decimal32(..) => Ty::I32,
        Int64 | Date64 | Time64(_) | Timestamp(..) | Duration(_) | Decimal64(..) => Ty::I64,
        Decimal128(..) => Ty::I128,
        UInt8 => Ty::U8,
        UInt16 => Ty::U16,
        UInt32 => Ty::U32,
        UInt64 => Ty::U64,
        Float32 => Ty::F32,
        Float64 => Ty::F64,
        _ => return None,
    })
}

/// Whether values of type `dt` take part in arithmetic on the device (integers and floats;
/// temporal and decimal arithmetic changes types and stays on the host).
fn arithmetic(dt: &DataType) -> bool {
    dt.is_integer() || matches!(dt, DataType::Float32 | DataType::Float64)
}

/// Whether a cast from `from` to `to` is exact or rounds (integer to float), never failing.
fn widening(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let bits = |dt: &DataType| dt.primitive_width().unwrap_or(0) * 8;
    match (from, to) {
        _ if from == to => true,
        (f, t) if f.is_signed_integer() && t.is_signed_integer() => bits(t) >= bits(f),
        (f, t) if f.is_unsigned_integer() && t.is_unsigned_integer() => bits(t) >= bits(f),
        (f, t) if f.is_unsigned_integer() && t.is_signed_integer() => bits(t) > bits(f),
        (f, Float32 | Float64) if f.is_integer() => true,
        (Float32, Float64) => true,
        _ => false,
    }
}

/// The literal `value` as a device value, with its type.
fn literal(value: &ScalarValue) -> Result<(Node, DataType), String> {
    use ScalarValue as S;
    let dt = value.data_type();
    // An untyped null (a CASE result the others give the type of).
    if dt == DataType::Null {
        return Ok((
            Node::Literal {
                ty: Ty::Bool,
                value: None,
            },
            dt,
        ));
    }
    let ty = ty_of(&dt).ok_or_else(|| format!("a literal of type {dt}"))?;
    let int = |v: Option<i128>| v.map(Scalar::Int);
    let value = match value {
        S::Boolean(v) => v.map(Scalar::Bool),
        S::Float32(v) => v.map(Scalar::F32),
        S::Float64(v) => v.map(Scalar::F64),
        S::Int8(v) => int(v.map(i128::from)),
        S::Int16(v) => int(v.map(i128::from)),
        S::Int32(v)
        | S::Date32(v)
        | S::Time32Second(v)
        | S::Time32Millisecond(v)
        | S::Decimal32(v, ..) => int(v.map(i128::from)),
        S::Int64(v)
        | S::Date64(v)
        | S::Time64Microsecond(v)
        | S::Time64Nanosecond(v)
        | S::TimestampSecond(v, _)
        | S::TimestampMillisecond(v, _)
        | S::TimestampMicrosecond(v, _)
        | S::TimestampNanosecond(v, _)
        | S::DurationSecond(v)
        | S::DurationMillisecond(v)
        | S::DurationMicrosecond(v)
        | S::DurationNanosecond(v)
        | S::Decimal64(v, ..) => int(v.map(i128::from)),
        S::Decimal128(v, ..) => int(*v),
        S::UInt8(v) => int(v.map(i128::from)),
        S::UInt16(v) => int(v.map(i128::from)),
        S::UInt32(v) => int(v.map(i128::from)),
        S::UInt64(v) => int(v.map(i128::from)),
        _ => return Err(format!("a literal of type {dt}")),
    };
    Ok((Node::Literal { ty, value }, dt))
}

/// The value of `e`, an expression of literals alone, as DataFusion computes it.
fn constant(e: &Arc<dyn PhysicalExpr>) -> Result<ScalarValue, String> {
    let batch = RecordBatch::new_empty(Arc::new(Schema::empty()));
    match e.evaluate(&batch) {
        Ok(ColumnarValue::Scalar(v)) => Ok(v),
        Ok(ColumnarValue::Array(_)) => Err(format!("{e} is not a constant")),
        Err(err) => Err(format!("{e} fails: {err}")),
    }
}

struct Compiler<'a> {
    filter: &'a JoinFilter,
    build: Vec<(usize, Ty)>,
    probe: Vec<(usize, Ty)>,
}

impl Compiler<'_> {
    /// The node of `e`, with its Arrow type.
    fn node(&mut self, e: &Arc<dyn PhysicalExpr>) -> Result<(Node, DataType), String> {
        let any = e.as_ref();
        if let Some(c) = any.downcast_ref::<Column>() {
            return self.column(c.index());
        }
        if let Some(l) = any.downcast_ref::<Literal>() {
            return literal(l.value());
        }
        if let Some(b) = any.downcast_ref::<BinaryExpr>() {
            return self.binary(b);
        }
        if let Some(n) = any.downcast_ref::<NotExpr>() {
            let x = self.boolean(n.arg())?;
            return Ok((Node::Not(Box::new(x)), DataType::Boolean));
        }
        if let Some(n) = any.downcast_ref::<IsNullExpr>() {
            let (x, _) = self.node(n.arg())?;
            return Ok((Node::IsNull(Box::new(x)), DataType::Boolean));
        }
        if let Some(n) = any.downcast_ref::<IsNotNullExpr>() {
            let (x, _) = self.node(n.arg())?;
            return Ok((Node::IsNotNull(Box::new(x)), DataType::Boolean));
        }
        if let Some(n) = any.downcast_ref::<NegativeExpr>() {
            // A negated literal is a literal (DataFusion fails on the minimum integer).
            if n.arg().as_ref().is::<Literal>() {
                return literal(&constant(e)?);
            }
            let (x, dt) = self.node(n.arg())?;
            if !arithmetic(&dt) || dt.is_unsigned_integer() {
                return Err(format!("negation of {dt}"));
            }
            return Ok((
                Node::Neg {
                    ty: x.ty(),
                    x: Box::new(x),
                },
                dt,
            ));
        }
        if let Some(c) = any.downcast_ref::<CastExpr>() {
            // A cast of a literal is a literal (as DataFusion computes it), if it succeeds.
            if c.expr().as_ref().is::<Literal>() {
                return literal(&constant(e)?);
            }
            let (x, from) = self.node(c.expr())?;
            let to = c.cast_type().clone();
            if let (DataType::Null, Some(ty)) = (&from, ty_of(&to)) {
                return Ok((Node::Literal { ty, value: None }, to));
            }
            let ty = ty_of(&to).filter(|_| widening(&from, &to));
            let Some(ty) = ty else {
                return Err(format!("a cast from {from} to {to}"));
            };
            return Ok((
                Node::Cast {
                    to: ty,
                    x: Box::new(x),
                },
                to,
            ));
        }
        if let Some(c) = any.downcast_ref::<CaseExpr>() {
            return self.case(c);
        }
        if let Some(l) = any.downcast_ref::<InListExpr>() {
            return self.in_list(l);
        }
        Err(format!("the expression {e}"))
    }

    /// A boolean node.
    fn boolean(&mut self, e: &Arc<dyn PhysicalExpr>) -> Result<Node, String> {
        match self.node(e)? {
            (n, DataType::Boolean) => Ok(n),
            (_, dt) => Err(format!("{e} is of type {dt}, not Boolean")),
        }
    }

    /// Column `index` of the filter's intermediate schema, given a slot on its side.
    fn column(&mut self, index: usize) -> Result<(Node, DataType), String> {
        let (Some(ci), Some(field)) = (
            self.filter.column_indices().get(index),
            self.filter.schema().fields().get(index),
        ) else {
            return Err(format!("filter column {index} is out of range"));
        };
        let dt = field.data_type().clone();
        let ty = ty_of(&dt).ok_or_else(|| format!("column {} of type {dt}", field.name()))?;
        let (side, columns) = match ci.side {
            JoinSide::Left => (Side::Build, &mut self.build),
            JoinSide::Right => (Side::Probe, &mut self.probe),
            JoinSide::None => return Err("a column of neither side".to_string()),
        };
        let slot = match columns.iter().position(|&(c, _)| c == ci.index) {
            Some(slot) => slot,
            None if columns.len() < MAX_FILTER_COLUMNS => {
                columns.push((ci.index, ty));
                columns.len() - 1
            }
            None => {
                return Err(format!(
                    "more than {MAX_FILTER_COLUMNS} columns of one side"
                ));
            }
        };
        Ok((Node::Column { side, slot, ty }, dt))
    }

    fn binary(&mut self, b: &BinaryExpr) -> Result<(Node, DataType), String> {
        let op = *b.op();
        let (l, ldt) = self.node(b.left())?;
        let (r, rdt) = self.node(b.right())?;
        let (l, r) = (Box::new(l), Box::new(r));
        let cmp = |op| {
            Ok((
                Node::Cmp {
                    op,
                    l: l.clone(),
                    r: r.clone(),
                },
                DataType::Boolean,
            ))
        };
        if ldt != rdt {
            return Err(format!("{op} between {ldt} and {rdt}"));
        }
        let arith = |arith_op| {
            if !arithmetic(&ldt) {
                return Err(format!("{op} on {ldt}"));
            }
            // Wrapping arithmetic only: `fail_on_overflow` is not readable, so compare.
            let wrapping = BinaryExpr::new(Arc::clone(b.left()), op, Arc::clone(b.right()));
            if &wrapping != b {
                return Err(format!("{op} failing on overflow"));
            }
            Ok((
                Node::Arith {
                    op: arith_op,
                    ty: l.ty(),
                    l: l.clone(),
                    r: r.clone(),
                },
                ldt.clone(),
            ))
        };
        match op {
            Operator::And | Operator::Or if ldt == DataType::Boolean => {
                let node = match op {
                    Operator::And => Node::And(l, r),
                    _ => Node::Or(l, r),
                };
                Ok((node, DataType::Boolean))
            }
            Operator::IsDistinctFrom | Operator::IsNotDistinctFrom => {
                let distinct = Node::Distinct { l, r };
                let node = match op {
                    Operator::IsDistinctFrom => distinct,
                    _ => Node::Not(Box::new(distinct)),
                };
                Ok((node, DataType::Boolean))
            }
            Operator::Eq => cmp(CmpOp::Eq),
            Operator::NotEq => cmp(CmpOp::Ne),
            Operator::Lt => cmp(CmpOp::Lt),
            Operator::LtEq => cmp(CmpOp::Le),
            Operator::Gt => cmp(CmpOp::Gt),
            Operator::GtEq => cmp(CmpOp::Ge),
            Operator::Plus => arith(ArithOp::Add),
            Operator::Minus => arith(ArithOp::Sub),
            Operator::Multiply => arith(ArithOp::Mul),
            // Integer division and remainder fail on a zero divisor, and division overflows
            // on MIN / -1: only by a literal that is neither.
            Operator::Divide | Operator::Modulo => {
                let safe = ldt.is_floating()
                    || matches!(&*r, Node::Literal { value: Some(Scalar::Int(d)), .. } if *d != 0 && *d != -1);
                if !safe {
                    return Err(format!("{op} of integers by a non-literal, 0 or -1"));
                }
                arith(match op {
                    Operator::Divide => ArithOp::Div,
                    _ => ArithOp::Rem,
                })
            }
            _ => Err(format!("the operator {op} on {ldt}")),
        }
    }

    /// `CASE [x] WHEN .. THEN .. [ELSE ..] END`: with `x`, a `WHEN v` is `x = v`.
    fn case(&mut self, c: &CaseExpr) -> Result<(Node, DataType), String> {
        let base = c.expr().map(|x| self.node(x)).transpose()?;
        let (mut whens, mut dt) = (vec![], None::<DataType>);
        let mut result = |this: &mut Self, e: &Arc<dyn PhysicalExpr>| {
            let (n, t) = this.node(e)?;
            // A null literal takes the type of the other results.
            let is_null = matches!(n, Node::Literal { value: None, .. });
            match &dt {
                Some(d) if *d != t && !is_null => Err(format!("CASE results of {d} and {t}")),
                Some(_) if is_null => Ok(None),
                Some(_) => Ok(Some(n)),
                None if is_null => Ok(None),
                None => {
                    dt = Some(t);
                    Ok(Some(n))
                }
            }
        };
        let mut thens = vec![];
        for (when, then) in c.when_then_expr() {
            let when = match &base {
                Some((x, xdt)) => {
                    let (v, vdt) = self.node(when)?;
                    if *xdt != vdt {
                        return Err(format!("CASE of {xdt} WHEN {vdt}"));
                    }
                    // DataFusion compares these with arrow's kernel, where -0.0 < 0.0.
                    if xdt.is_floating() {
                        return Err(format!("CASE of {xdt} WHEN values"));
                    }
                    Node::Cmp {
                        op: CmpOp::Eq,
                        l: Box::new(x.clone()),
                        r: Box::new(v),
                    }
                }
                None => self.boolean(when)?,
            };
            whens.push(when);
            thens.push(result(self, then)?);
        }
        let otherwise = c
            .else_expr()
            .map(|e| result(self, e))
            .transpose()?
            .flatten();
        let dt = dt.ok_or("a CASE of null results only")?;
        let ty = ty_of(&dt).ok_or_else(|| format!("CASE of {dt}"))?;
        let null = || Node::Literal { ty, value: None };
        let whens = whens
            .into_iter()
            .zip(thens)
            .map(|(w, t)| (w, t.unwrap_or_else(null)))
            .collect();
        Ok((
            Node::Case {
                ty,
                whens,
                otherwise: otherwise.map(Box::new),
            },
            dt,
        ))
    }

    /// `x [NOT] IN (a, b, ..)`: `x = a OR x = b OR ..` (three-valued), negated for `NOT IN`.
    fn in_list(&mut self, l: &InListExpr) -> Result<(Node, DataType), String> {
        let (x, dt) = self.node(l.expr())?;
        // DataFusion looks float lists up in a set, whose equality is not the comparison's.
        if dt.is_floating() {
            return Err(format!("IN lists of {dt}"));
        }
        let mut any: Option<Node> = None;
        for item in l.list() {
            let (v, vdt) = self.node(item)?;
            if vdt != dt {
                return Err(format!("{dt} IN a list of {vdt}"));
            }
            let eq = Node::Cmp {
                op: CmpOp::Eq,
                l: Box::new(x.clone()),
                r: Box::new(v),
            };
            any = Some(match any {
                Some(a) => Node::Or(Box::new(a), Box::new(eq)),
                None => eq,
            });
        }
        let any = any.ok_or("an empty IN list")?;
        let node = match l.negated() {
            true => Node::Not(Box::new(any)),
            false => any,
        };
        Ok((node, DataType::Boolean))
    }
}
