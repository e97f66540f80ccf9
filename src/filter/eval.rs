//! The host twin of a compiled filter: evaluates a [`Node`] for one pair of rows, with the
//! semantics of the generated CUDA (`cuda.rs`, `kernels/filter.cuh`) and of DataFusion.

use std::cmp::Ordering;
use std::ops::{Add, Div, Mul, Rem, Sub};

use super::{ArithOp, CmpOp, Node, Scalar, Side, Ty};

/// One column a filter reads, as the device holds it: `width` bytes a value (booleans one
/// byte), and a byte per row (1 = valid) if some row is null.
#[derive(Debug, Clone, Copy)]
pub struct FilterColumn<'a> {
    pub values: &'a [u8],
    pub validity: Option<&'a [u8]>,
}

/// Whether the pair (build row `r`, probe row `s`) passes: the root is true (not false, not
/// null).
pub(super) fn passes(
    root: &Node,
    build: &[FilterColumn<'_>],
    probe: &[FilterColumn<'_>],
    r: usize,
    s: usize,
) -> bool {
    let rows = Rows { build, probe, r, s };
    rows.eval(root) == Some(Scalar::Bool(true))
}

struct Rows<'a, 'b> {
    build: &'a [FilterColumn<'b>],
    probe: &'a [FilterColumn<'b>],
    r: usize,
    s: usize,
}

/// A value, `None` for null.
type Val = Option<Scalar>;

impl Rows<'_, '_> {
    fn eval(&self, node: &Node) -> Val {
        match node {
            Node::Column { side, slot, ty } => {
                let (col, row) = match side {
                    Side::Build => (&self.build[*slot], self.r),
                    Side::Probe => (&self.probe[*slot], self.s),
                };
                read(col, row, *ty)
            }
            Node::Literal { value, .. } => *value,
            Node::Cmp { op, l, r } => {
                let (l, r) = (self.eval(l)?, self.eval(r)?);
                let o = order(l, r);
                Some(Scalar::Bool(match op {
                    CmpOp::Eq => o == Ordering::Equal,
                    CmpOp::Ne => o != Ordering::Equal,
                    CmpOp::Lt => o == Ordering::Less,
                    CmpOp::Le => o != Ordering::Greater,
                    CmpOp::Gt => o == Ordering::Greater,
                    CmpOp::Ge => o != Ordering::Less,
                }))
            }
            Node::Distinct { l, r } => Some(Scalar::Bool(match (self.eval(l), self.eval(r)) {
                (Some(l), Some(r)) => order(l, r) != Ordering::Equal,
                (l, r) => l.is_some() != r.is_some(),
            })),
            Node::Arith { op, ty, l, r } => arith(*op, *ty, self.eval(l)?, self.eval(r)?),
            Node::Neg { ty, x } => match self.eval(x)? {
                Scalar::Int(v) => Some(Scalar::Int(wrap(*ty, v.wrapping_neg()))),
                Scalar::F32(v) => Some(Scalar::F32(-v)),
                Scalar::F64(v) => Some(Scalar::F64(-v)),
                Scalar::Bool(_) => None,
            },
            Node::And(l, r) => {
                let (l, r) = (boolean(self.eval(l)), boolean(self.eval(r)));
                match (l, r) {
                    (Some(false), _) | (_, Some(false)) => Some(Scalar::Bool(false)),
                    (Some(true), Some(true)) => Some(Scalar::Bool(true)),
                    _ => None,
                }
            }
            Node::Or(l, r) => {
                let (l, r) = (boolean(self.eval(l)), boolean(self.eval(r)));
                match (l, r) {
                    (Some(true), _) | (_, Some(true)) => Some(Scalar::Bool(true)),
                    (Some(false), Some(false)) => Some(Scalar::Bool(false)),
                    _ => None,
                }
            }
            Node::Not(x) => boolean(self.eval(x)).map(|b| Scalar::Bool(!b)),
            Node::IsNull(x) => Some(Scalar::Bool(self.eval(x).is_none())),
            Node::IsNotNull(x) => Some(Scalar::Bool(self.eval(x).is_some())),
            Node::Cast { to, x } => cast(self.eval(x)?, *to),
            Node::Case {
                whens, otherwise, ..
            } => {
                for (when, then) in whens {
                    if boolean(self.eval(when)) == Some(true) {
                        return self.eval(then);
                    }
                }
                otherwise.as_ref().and_then(|o| self.eval(o))
            }
        }
    }
}

fn boolean(v: Val) -> Option<bool> {
    match v {
        Some(Scalar::Bool(b)) => Some(b),
        _ => None,
    }
}

/// Row `row` of `col` as a value of type `ty`.
fn read(col: &FilterColumn<'_>, row: usize, ty: Ty) -> Val {
    if col.validity.is_some_and(|v| v[row] == 0) {
        return None;
    }
    let w = ty.width();
    let b = &col.values[row * w..(row + 1) * w];
    let mut le = [0u8; 16];
    le[..w].copy_from_slice(b);
    // Sign-extends a `w`-byte integer.
    let signed = |le: [u8; 16]| {
        let shift = 128 - 8 * w as u32;
        (i128::from_le_bytes(le) << shift) >> shift
    };
    Some(match ty {
        Ty::Bool => Scalar::Bool(b[0] != 0),
        Ty::I8 | Ty::I16 | Ty::I32 | Ty::I64 | Ty::I128 => Scalar::Int(signed(le)),
        Ty::U8 | Ty::U16 | Ty::U32 | Ty::U64 => Scalar::Int(i128::from_le_bytes(le)),
        Ty::F32 => Scalar::F32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        Ty::F64 => Scalar::F64(f64::from_le_bytes(le[..8].try_into().unwrap_or_default())),
    })
}

/// Two values of one type in DataFusion's order: integers by value, floats in total order
/// after `-0.0` is read as `0.0` (DataFusion's `apply_cmp`), `false < true`.
fn order(l: Scalar, r: Scalar) -> Ordering {
    let z32 = |x: f32| if x == 0.0 { 0.0 } else { x };
    let z64 = |x: f64| if x == 0.0 { 0.0 } else { x };
    match (l, r) {
        (Scalar::Int(a), Scalar::Int(b)) => a.cmp(&b),
        (Scalar::F32(a), Scalar::F32(b)) => z32(a).total_cmp(&z32(b)),
        (Scalar::F64(a), Scalar::F64(b)) => z64(a).total_cmp(&z64(b)),
        (Scalar::Bool(a), Scalar::Bool(b)) => a.cmp(&b),
        // Compilation gives both operands one type.
        _ => Ordering::Less,
    }
}

/// `v` wrapped to the range of integer type `ty`.
fn wrap(ty: Ty, v: i128) -> i128 {
    match ty {
        Ty::I8 => v as i8 as i128,
        Ty::I16 => v as i16 as i128,
        Ty::I32 => v as i32 as i128,
        Ty::I64 => v as i64 as i128,
        Ty::U8 => v as u8 as i128,
        Ty::U16 => v as u16 as i128,
        Ty::U32 => v as u32 as i128,
        Ty::U64 => v as u64 as i128,
        _ => v,
    }
}

fn arith(op: ArithOp, ty: Ty, l: Scalar, r: Scalar) -> Val {
    Some(match (l, r) {
        (Scalar::Int(a), Scalar::Int(b)) => Scalar::Int(wrap(
            ty,
            match op {
                ArithOp::Add => a.wrapping_add(b),
                ArithOp::Sub => a.wrapping_sub(b),
                ArithOp::Mul => a.wrapping_mul(b),
                // Compilation allows only literal divisors other than 0 and -1.
                ArithOp::Div => a.checked_div(b)?,
                ArithOp::Rem => a.checked_rem(b)?,
            },
        )),
        (Scalar::F32(a), Scalar::F32(b)) => Scalar::F32(float(op, a, b)),
        (Scalar::F64(a), Scalar::F64(b)) => Scalar::F64(float(op, a, b)),
        _ => return None,
    })
}

/// `a op b` for floats, rounded once (the host CPU's own operation, NaNs included).
fn float<T>(op: ArithOp, a: T, b: T) -> T
where
    T: Add<Output = T> + Sub<Output = T> + Mul<Output = T> + Div<Output = T> + Rem<Output = T>,
{
    match op {
        ArithOp::Add => a + b,
        ArithOp::Sub => a - b,
        ArithOp::Mul => a * b,
        ArithOp::Div => a / b,
        ArithOp::Rem => a % b,
    }
}

/// A widening cast (compilation allows no other).
fn cast(v: Scalar, to: Ty) -> Val {
    Some(match (v, to) {
        (Scalar::Int(a), Ty::F32) => Scalar::F32(a as f32),
        (Scalar::Int(a), Ty::F64) => Scalar::F64(a as f64),
        (Scalar::F32(a), Ty::F64) => Scalar::F64(a as f64),
        (v, _) => v,
    })
}
