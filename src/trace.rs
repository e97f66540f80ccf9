//! `GPU_JOIN_TRACE=1`: a timeline on stderr of what the device lanes and the exchange do, one
//! line per step, in milliseconds since the first line. Off, a step costs one cached check.

use std::sync::OnceLock;
use std::time::Instant;

/// Whether `GPU_JOIN_TRACE=1`.
pub(crate) fn tracing() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("GPU_JOIN_TRACE").is_ok_and(|v| v == "1"))
}

/// Prints one line of the trace; call it through [`trace!`], which formats nothing unless
/// tracing.
pub(crate) fn trace_line(what: std::fmt::Arguments<'_>) {
    static START: OnceLock<Instant> = OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed();
    eprintln!("gpu_join {:>10.3} ms {what}", t.as_secs_f64() * 1e3);
}

/// `trace!("fmt", args..)`: one line of the trace if `GPU_JOIN_TRACE=1`; its arguments are
/// evaluated only then.
macro_rules! trace {
    ($($arg:tt)*) => {
        if $crate::trace::tracing() {
            $crate::trace::trace_line(format_args!($($arg)*));
        }
    };
}
pub(crate) use trace;
