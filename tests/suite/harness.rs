//! A small test harness: named tests that pass, fail or are skipped (with a reason), a
//! filter, and a closing `N passed, N failed, N skipped` line.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use datafusion_gpu_join::GpuJoinConfig;

/// What a test ended with.
pub enum Outcome {
    Passed,
    Skipped(String),
}

pub type TestResult = Result<Outcome, String>;

/// Command-line and environment options.
#[derive(Clone, Debug)]
pub struct Options {
    pub filter: Option<String>,
    pub require_cuda: bool,
    pub cases: usize,
}

impl Options {
    pub fn from_env() -> Self {
        let mut filter = None;
        let mut require_cuda = std::env::var("GPU_JOIN_REQUIRE_CUDA").is_ok_and(|v| v == "1");
        let mut cases = 2000;
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--require-cuda" => require_cuda = true,
                "--cases" => cases = args.next().and_then(|n| n.parse().ok()).unwrap_or(cases),
                // Flags cargo and nextest pass to test binaries.
                "--include-ignored" | "--nocapture" | "--quiet" | "-q" | "--test-threads"
                | "--color" => {}
                s if s.starts_with('-') => {}
                s => filter = Some(s.to_string()),
            }
        }
        Self {
            filter,
            require_cuda,
            cases,
        }
    }

    /// Whether a CUDA device is usable here.
    pub fn cuda_present(&self) -> bool {
        datafusion_gpu_join::device::cuda_device(0).is_ok()
    }

    /// The `gpu_join.backend` the rule-on runs use: `cuda` if required or present, else `host`.
    pub fn backend(&self) -> &'static str {
        if self.require_cuda || self.cuda_present() {
            "cuda"
        } else {
            "host"
        }
    }

    /// `gpu_join` settings for rule-on runs: every join eligible, on [`Self::backend`].
    pub fn gpu_config(&self) -> GpuJoinConfig {
        let mut c = GpuJoinConfig::default();
        c.backend = self.backend().parse().expect("a backend name");
        c.min_build_rows = 0;
        c
    }
}

type TestFn = Box<dyn FnOnce() -> TestResult>;

/// The registered tests.
pub struct Suite {
    pub options: Options,
    tests: Vec<(String, TestFn)>,
}

impl Suite {
    pub fn new(options: &Options) -> Self {
        Self {
            options: options.clone(),
            tests: vec![],
        }
    }

    /// Adds a test that runs `body` on this machine's backend: it passes where `body` does,
    /// and fails under `--require-cuda` without a usable CUDA device.
    pub fn add_gpu(
        &mut self,
        name: impl Into<String>,
        body: impl FnOnce(&Options) -> Result<(), String> + 'static,
    ) {
        let options = self.options.clone();
        self.add(name, move || -> TestResult {
            if options.require_cuda && !options.cuda_present() {
                return Err("--require-cuda, but no usable CUDA device".into());
            }
            body(&options)?;
            Ok(Outcome::Passed)
        });
    }

    pub fn add(&mut self, name: impl Into<String>, f: impl FnOnce() -> TestResult + 'static) {
        self.tests.push((name.into(), Box::new(f)));
    }

    /// Runs the tests; returns the process exit code.
    pub fn run(self) -> i32 {
        let (mut passed, mut failed, mut skipped) = (0, 0, 0);
        let mut failures = vec![];
        println!("device: {}", device_line());
        for (name, f) in self.tests {
            if self
                .options
                .filter
                .as_ref()
                .is_some_and(|p| !name.contains(p.as_str()))
            {
                continue;
            }
            let start = Instant::now();
            let outcome = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
                Err(p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into()))
            });
            let secs = start.elapsed().as_secs_f64();
            match outcome {
                Ok(Outcome::Passed) => {
                    passed += 1;
                    println!("test {name} ... ok ({secs:.2}s)");
                }
                Ok(Outcome::Skipped(why)) => {
                    skipped += 1;
                    println!("test {name} ... skipped: {why}");
                }
                Err(msg) => {
                    failed += 1;
                    println!("test {name} ... FAILED ({secs:.2}s)\n{msg}");
                    failures.push(name);
                }
            }
        }
        if !failures.is_empty() {
            println!("\nfailures:\n    {}", failures.join("\n    "));
        }
        println!("\n{passed} passed, {failed} failed, {skipped} skipped");
        if failed > 0 { 1 } else { 0 }
    }
}

fn device_line() -> String {
    match datafusion_gpu_join::device::cuda_device(0) {
        Ok(d) => format!("{} ({})", d.name(), d.arch()),
        Err(e) => format!("no CUDA device ({e})"),
    }
}

/// Runs an async test body on a multi-threaded tokio runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(f)
}
