#!/usr/bin/env bash
# The whole GPU check in one command, for a GPU host without a Rust toolchain.
#
# Here (build machine):   ../shared/tools/bundle --out .bundle -- build --release --tests --examples --benches
# There (GPU host):       bash scripts/gpu-check.sh [--quick]
#
# Unpacks the bundle, runs the integration suite with the CUDA backend required, the TPC-H
# example, and joinbench (standard wide workload, kernel level and end to end), then prints a
# summary last. Logs go to $OUT (or ./gpu-check-logs) when set.
set -uo pipefail
out=${OUT:-gpu-check-logs}; mkdir -p "$out"
quick=${1:-}
export GPU_JOIN_CUDA_INCLUDE=${GPU_JOIN_CUDA_INCLUDE:-/usr/local/cuda/include/cccl:/usr/local/cuda/include}
python3 .bundle/unpack.py /tmp/bundle >/dev/null || exit 1
nvidia-smi -L | tee "$out/device.txt"
git_rev=$(cat .bundle/COMMIT 2>/dev/null || echo unknown)

cases=2000; [ "$quick" = "--quick" ] && cases=300
/tmp/bundle/test-suite --require-cuda --cases "$cases" > "$out/suite.log" 2>&1; suite_rc=$?
/tmp/bundle/example-tpch_join --scale 1 > "$out/example.log" 2>&1; example_rc=$?
GPU_JOIN_PROFILE=1 /tmp/bundle/bench-joinbench --runs 1 > "$out/profile.log" 2>&1
/tmp/bundle/bench-joinbench > "$out/bench.log" 2>&1; bench_rc=$?
/tmp/bundle/bench-joinbench --payloads 1 > "$out/bench-narrow.log" 2>&1

echo "=== kernel profile (one run, synchronized per kernel) ==="
grep "gpu_join kernel" "$out/profile.log" | awk '{t[$3]+=$(NF-1); n[$3]++} END {for (k in t) printf "%-28s %4d launches %9.3f ms\n", k, n[k], t[k]}' | sort -k4 -nr | head -20
echo "=== example (TPC-H SF1) ==="
grep -E "backend=|gpu_join o|results equal" "$out/example.log" | head -8
echo "=== joinbench wide ==="; tail -12 "$out/bench.log"
echo "=== joinbench narrow ==="; tail -12 "$out/bench-narrow.log"
echo "=== summary ==="
echo "device: $(head -1 "$out/device.txt"); commit: $git_rev"
grep -E "^test .*(FAILED|skipped)" "$out/suite.log" | head -20
echo "suite: $(tail -1 "$out/suite.log") (rc $suite_rc); example rc $example_rc; bench rc $bench_rc"
