//! CUDA code generation for a compiled filter: one `__device__` functor whose body evaluates the
//! [`Node`] tree in SSA form over the value helpers of `kernels/filter.cuh` (the bucket probe
//! kernels are instantiated with it for one key width when compiled: `device::kernels`).
//!
//! ```text
//!  l.v < r.w + 1   ─►  struct CompiledFilter {
//!                        __device__ __noinline__ bool operator()(const FilterArgs& f, u32 r,
//!                                                                u64 s) const {
//!                          const auto t0 = col<i32>(f.build[0], f.build[1], r);
//!                          const auto t1 = col<i32>(f.probe[0], f.probe[1], s);
//!                          const auto t2 = lit<i32>(1);
//!                          const auto t3 = add(t1, t2);
//!                          const auto t4 = lt(t0, t3);
//!                          return t4.ok && t4.v; } };
//! ```

use std::fmt::Write as _;

use super::{ArithOp, CmpOp, Node, Scalar, Side, Ty};

/// The C type of `ty` (`kernels/common.cuh`'s names).
fn c_type(ty: Ty) -> &'static str {
    match ty {
        Ty::Bool => "bool",
        Ty::I8 => "i8",
        Ty::I16 => "i16",
        Ty::I32 => "i32",
        Ty::I64 => "i64",
        Ty::I128 => "__int128",
        Ty::U8 => "u8",
        Ty::U16 => "u16",
        Ty::U32 => "u32",
        Ty::U64 => "u64",
        Ty::F32 => "float",
        Ty::F64 => "double",
    }
}

/// A C expression of literal `v` of type `ty`, exactly.
fn c_literal(v: Scalar, ty: Ty) -> String {
    match v {
        Scalar::Bool(b) => b.to_string(),
        // Bit patterns, so that NaN, infinities and -0.0 come through.
        Scalar::F32(f) => format!("__int_as_float({}u)", f.to_bits()),
        Scalar::F64(f) => format!("__longlong_as_double({}ull)", f.to_bits()),
        Scalar::Int(i) if ty == Ty::I128 => {
            // Two 64-bit halves: CUDA has no 128-bit literal.
            let (hi, lo) = ((i >> 64) as u64, i as u64);
            format!("(__int128)(((unsigned __int128){hi}ull << 64) | {lo}ull)")
        }
        // Through u64 (wrapping back to `ty`), so that i64::MIN needs no special spelling.
        Scalar::Int(i) => format!("({})({}ull)", c_type(ty), i as i64 as u64),
    }
}

/// The functor of the filter `root`. Not inlined: the bucket probe calls it from several
/// places, and one copy compiles in half the time (NVRTC runs once per filter).
pub(super) fn generate(root: &Node) -> String {
    let mut g = Gen::default();
    let result = g.node(root);
    let mut out = String::from(
        "\n// The join's residual filter, compiled from its expression (src/filter/).\n\
         struct CompiledFilter {\n    \
         __device__ __noinline__ bool operator()(const FilterArgs& f, u32 r, u64 s) const {\n",
    );
    out.push_str(&g.body);
    let _ = write!(
        out,
        "        return {result}.ok && {result}.v;\n    }}\n}};\n"
    );
    out
}

#[derive(Default)]
struct Gen {
    body: String,
    next: usize,
}

impl Gen {
    /// Emits `const auto tN = <expr>;` and gives `tN`.
    fn emit(&mut self, expr: String) -> String {
        let name = format!("t{}", self.next);
        self.next += 1;
        let _ = writeln!(self.body, "        const auto {name} = {expr};");
        name
    }

    /// `f(a, b, ..)` over the variables of `args`, emitted first.
    fn call(&mut self, f: &str, args: &[&Node]) -> String {
        let args: Vec<String> = args.iter().map(|a| self.node(a)).collect();
        format!("{f}({})", args.join(", "))
    }

    /// Emits `node` (children first) and gives the variable holding its value.
    fn node(&mut self, node: &Node) -> String {
        let expr = match node {
            Node::Column { side, slot, ty } => {
                let (side, row) = match side {
                    Side::Build => ("build", "r"),
                    Side::Probe => ("probe", "s"),
                };
                format!(
                    "col<{}>(f.{side}[{}], f.{side}[{}], {row})",
                    c_type(*ty),
                    2 * slot,
                    2 * slot + 1
                )
            }
            Node::Literal { ty, value: None } => format!("null_of<{}>()", c_type(*ty)),
            Node::Literal { ty, value: Some(v) } => {
                format!("lit<{}>({})", c_type(*ty), c_literal(*v, *ty))
            }
            Node::Cmp { op, l, r } => {
                let f = match op {
                    CmpOp::Eq => "eq",
                    CmpOp::Ne => "ne",
                    CmpOp::Lt => "lt",
                    CmpOp::Le => "le",
                    CmpOp::Gt => "gt",
                    CmpOp::Ge => "ge",
                };
                self.call(f, &[l, r])
            }
            Node::Distinct { l, r } => self.call("distinct", &[l, r]),
            Node::Arith { op, l, r, .. } => {
                let f = match op {
                    ArithOp::Add => "add",
                    ArithOp::Sub => "sub",
                    ArithOp::Mul => "mul",
                    ArithOp::Div => "div",
                    ArithOp::Rem => "rem",
                };
                self.call(f, &[l, r])
            }
            Node::Neg { x, .. } => self.call("neg", &[x]),
            Node::And(l, r) => self.call("and3", &[l, r]),
            Node::Or(l, r) => self.call("or3", &[l, r]),
            Node::Not(x) => self.call("not3", &[x]),
            Node::IsNull(x) => self.call("is_null", &[x]),
            Node::IsNotNull(x) => format!("not3({})", self.call("is_null", &[x])),
            Node::Cast { to, x } => self.call(&format!("cast<{}>", c_type(*to)), &[x]),
            Node::Case {
                ty,
                whens,
                otherwise,
            } => {
                // Every branch is evaluated (none can fail); the first true WHEN picks.
                let mut expr = match otherwise {
                    Some(o) => self.node(o),
                    None => format!("null_of<{}>()", c_type(*ty)),
                };
                let branches: Vec<(String, String)> = whens
                    .iter()
                    .map(|(w, t)| (self.node(w), self.node(t)))
                    .collect();
                for (w, t) in branches.into_iter().rev() {
                    expr = format!("(({w}.ok && {w}.v) ? {t} : {expr})");
                }
                expr
            }
        };
        self.emit(expr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_exact() {
        assert_eq!(
            c_literal(Scalar::Int(i64::MIN as i128), Ty::I64),
            "(i64)(9223372036854775808ull)"
        );
        assert_eq!(
            c_literal(Scalar::Int(-1), Ty::I8),
            "(i8)(18446744073709551615ull)"
        );
        assert_eq!(
            c_literal(Scalar::F64(-0.0), Ty::F64),
            "__longlong_as_double(9223372036854775808ull)"
        );
        assert_eq!(
            c_literal(Scalar::Int(-2), Ty::I128),
            "(__int128)(((unsigned __int128)18446744073709551615ull << 64) | 18446744073709551614ull)"
        );
    }
}
