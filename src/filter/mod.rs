//! [`PairFilter`]: a join's residual filter (`ON a.k = b.k AND <filter>`) compiled for the
//! bucket probe, so that the device decides each pair of equal keys itself.
//!
//! A filter whose expression lies in the compiled subset — columns of either side of fixed-width
//! numeric, temporal, decimal or boolean type, literals, `+ - * /` and `%` (integers divided by a
//! literal other than 0 and -1), comparisons, `IS [NOT] DISTINCT FROM`, `AND`/`OR`/`NOT`
//! (three-valued), `IS [NOT] NULL`,
//! `CASE`, widening `CAST`s, `BETWEEN` and `IN` lists — becomes a small expression tree
//! ([`Node`], built by [`compile`]), which has two evaluators kept equal: generated CUDA
//! ([`PairFilter::cuda`], appended to `kernels/bucket_probe.cu` and compiled by NVRTC per
//! filter) and its host twin ([`PairFilter::eval`]). The bucket probe counts a pair as a match
//! only where the keys are equal and the filter is true, so outer, semi, anti and mark joins
//! keep their meaning with no host step. Every other filter is evaluated on the host
//! (`exec::residual`); EXPLAIN says which (`filter=device` or `filter=host`).
//!
//! The semantics are DataFusion's: integer arithmetic wraps, floats compare with `-0.0` read as
//! `0.0` and then in IEEE 754's total order (as DataFusion's comparisons do: a NaN equals a NaN
//! of the same bits; positive NaNs are the greatest, negative ones the least; an operation's NaN
//! is the one the host CPU makes, `kernels/filter.cuh`), float arithmetic is rounded
//! per operation (never contracted into a fused multiply-add), a null operand makes a null,
//! `AND`/`OR` are Kleene's, and a null filter result drops the pair. Operations DataFusion may
//! fail on (division by zero, a narrowing or float-to-integer cast) are left to the host.

mod compile;
mod cuda;
mod eval;

pub use compile::compile;
pub use eval::FilterColumn;

/// The most columns a compiled filter reads of each side.
pub const MAX_FILTER_COLUMNS: usize = 8;

/// A value type of the compiled filter: how a column's bytes are read and how values compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ty {
    Bool,
    I8,
    I16,
    I32,
    I64,
    I128,
    U8,
    U16,
    U32,
    U64,
    F32,
    F64,
}

impl Ty {
    /// Bytes a value takes in a device column (booleans are unpacked to a byte).
    pub fn width(self) -> usize {
        match self {
            Ty::Bool | Ty::I8 | Ty::U8 => 1,
            Ty::I16 | Ty::U16 => 2,
            Ty::I32 | Ty::U32 | Ty::F32 => 4,
            Ty::I64 | Ty::U64 | Ty::F64 => 8,
            Ty::I128 => 16,
        }
    }
}

/// Which input a column comes from: the build (left) or the probe (right) side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Build,
    Probe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// A literal value: integers of every width (decimals as their unscaled integer) as `i128`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Int(i128),
    F32(f32),
    F64(f64),
    Bool(bool),
}

/// One node of a compiled filter; every node has a value type and may be null.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// The `slot`-th column the filter reads of `side`.
    Column {
        side: Side,
        slot: usize,
        ty: Ty,
    },
    /// `None`: a typed null.
    Literal {
        ty: Ty,
        value: Option<Scalar>,
    },
    Cmp {
        op: CmpOp,
        l: Box<Node>,
        r: Box<Node>,
    },
    /// `l IS DISTINCT FROM r` (never null: two nulls are not distinct, a null and a value are).
    Distinct {
        l: Box<Node>,
        r: Box<Node>,
    },
    /// Both operands and the result have type `ty`.
    Arith {
        op: ArithOp,
        ty: Ty,
        l: Box<Node>,
        r: Box<Node>,
    },
    Neg {
        ty: Ty,
        x: Box<Node>,
    },
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Not(Box<Node>),
    IsNull(Box<Node>),
    IsNotNull(Box<Node>),
    /// A widening cast (exact, or integer to float).
    Cast {
        to: Ty,
        x: Box<Node>,
    },
    /// The first `then` whose `when` is true, else `otherwise` (null if none).
    Case {
        ty: Ty,
        whens: Vec<(Node, Node)>,
        otherwise: Option<Box<Node>>,
    },
}

impl Node {
    /// The node's value type.
    pub fn ty(&self) -> Ty {
        match self {
            Node::Column { ty, .. }
            | Node::Literal { ty, .. }
            | Node::Arith { ty, .. }
            | Node::Neg { ty, .. }
            | Node::Case { ty, .. } => *ty,
            Node::Cast { to, .. } => *to,
            Node::Cmp { .. }
            | Node::Distinct { .. }
            | Node::And(..)
            | Node::Or(..)
            | Node::Not(..)
            | Node::IsNull(..)
            | Node::IsNotNull(..) => Ty::Bool,
        }
    }
}

/// A residual filter compiled for the bucket probe: its expression tree, the input columns it
/// reads of each side, and its CUDA source.
#[derive(Debug, Clone)]
pub struct PairFilter {
    root: Node,
    /// Per side, the input columns the filter reads (by index in that input's schema) and
    /// their value types, in slot order.
    pub build_columns: Vec<(usize, Ty)>,
    pub probe_columns: Vec<(usize, Ty)>,
    /// The CUDA code of this filter.
    cuda: String,
}

impl PairFilter {
    fn new(root: Node, build_columns: Vec<(usize, Ty)>, probe_columns: Vec<(usize, Ty)>) -> Self {
        let cuda = cuda::generate(&root);
        Self {
            root,
            build_columns,
            probe_columns,
            cuda,
        }
    }

    /// The CUDA code of this filter (the functor `CompiledFilter`), to append to
    /// `kernels/bucket_probe.cu`, whose `BUCKET_PROBE_FILTERED` then makes its kernels.
    pub fn cuda(&self) -> &str {
        &self.cuda
    }

    /// Whether the pair of build row `r` (of `build`, the columns in slot order) and probe row
    /// `s` (of `probe`) passes the filter: the host twin of the generated CUDA.
    pub fn eval(
        &self,
        build: &[FilterColumn<'_>],
        probe: &[FilterColumn<'_>],
        r: usize,
        s: usize,
    ) -> bool {
        eval::passes(&self.root, build, probe, r, s)
    }
}

#[cfg(test)]
mod tests;
