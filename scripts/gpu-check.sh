#!/usr/bin/env bash
# The whole GPU check in one command, for a GPU host without a Rust toolchain.
#
# Here (build machine):
#   ../shared/tools/bundle --out .bundle -- build --release --test suite --example tpch_join --bench joinbench
#   git rev-parse --short HEAD > .bundle/COMMIT
#   cp -r ~/.cargo/registry/src/*/datafusion-sqllogictest-55.2.0/test_files .bundle/datafusion-test-files
# There (GPU host), from the repository root:
#   bash scripts/gpu-check.sh [--quick] [STEP...]   steps: suite sanitize kernel e2e devices
#                                                   strings selective scale tpch (default: all
#                                                   but sanitize and devices)
#
# suite:    the integration suite with the CUDA backend required (the .slt files from this
#           checkout), and the TPC-H join example.
# sanitize: compute-sanitizer memcheck (with leak check), racecheck and initcheck on the CUDA
#           primitives, the .slt files, the cancellation test, the two-device test and 20
#           differential cases, the exchange tests; each must report 0 errors.
# kernel:   joinbench's kernel-level sweeps, plus one run of the standard wide workload with
#           per-kernel timing (GPU_JOIN_PROFILE=1).
# e2e:      joinbench end to end (rule on vs off, PCIe floor, host peak memory), the largest wide
#           case also with chunks of 2^20, 2^22 and 2^24 rows.
# devices:  joinbench end to end on one GPU and on all of them (gpu_join.devices = all), in the
#           same run, and the kernel-level join on one GPU and dealt out over all of them
#           (--parts devices): a machine with several GPUs.
# strings:  joinbench strings: 16-byte string keys and string payloads against integer keys.
# selective: joinbench selective: 1/1 to 1/256 of probe rows matched, probe columns staged or
#           taken on the host (gpu_join.probe_columns).
# scale:    joinbench scale: output 8x the memory limit, and a 2^32-row probe side.
# tpch:     joinbench TPC-H, all 22 queries on and off (SF 10; --quick: SF 0.1), with the default
#           settings and again with gpu_join.min_build_rows = 0 (every eligible join on the GPU).
# Logs, JSON records and SVG plots go to $OUT (or ./gpu-check-logs); the summary is printed last.
set -uo pipefail
out=${OUT:-gpu-check-logs}; mkdir -p "$out"
quick=""; [ "${1:-}" = "--quick" ] && { quick="--quick"; shift; }
steps=${*:-suite kernel e2e strings selective scale tpch}
export GPU_JOIN_CUDA_INCLUDE=${GPU_JOIN_CUDA_INCLUDE:-/usr/local/cuda/include/cccl:/usr/local/cuda/include}
export GPU_JOIN_SLT_DIR=$PWD/sqllogictests
# DataFusion's own .slt files, copied into the bundle (see README, "Tests").
export GPU_JOIN_DF_SLT_DIR=${GPU_JOIN_DF_SLT_DIR:-$PWD/.bundle/datafusion-test-files}
export JOINBENCH_COMMIT=$(cat .bundle/COMMIT 2>/dev/null || echo unknown)
python3 .bundle/unpack.py /tmp/bundle >/dev/null || exit 1
nvidia-smi -L | tee "$out/device.txt"
bench() { /tmp/bundle/bench-joinbench $quick --out "$out/joinbench" "$@"; }
declare -A rc

for step in $steps; do
  case $step in
    suite)
      cases=2000; [ -n "$quick" ] && cases=300
      /tmp/bundle/test-suite --require-cuda --cases "$cases" > "$out/suite.log" 2>&1; rc[suite]=$?
      /tmp/bundle/example-tpch_join --scale 1 > "$out/example.log" 2>&1; rc[example]=$? ;;
    sanitize)
      for tool in memcheck racecheck initcheck; do
        extra=""; [ $tool = memcheck ] && extra="--leak-check full"
        for filter in primitives:: exchange:: ::gpu engine::cancelled devices:: differential; do
          compute-sanitizer --tool $tool $extra --error-exitcode 1 \
            /tmp/bundle/test-suite "$filter" --require-cuda --cases 20 \
            >> "$out/sanitize-$tool.log" 2>&1
          r=$?; [ $r -gt "${rc[sanitize-$tool]:-0}" ] && rc[sanitize-$tool]=$r
        done
      done ;;
    kernel)
      GPU_JOIN_PROFILE=1 bench --parts kernel --sweeps standard --runs 1 > "$out/profile.log" 2>&1
      bench --parts kernel > "$out/kernel.log" 2>&1; rc[kernel]=$? ;;
    e2e)
      bench --parts e2e --e2e-chunks 20,22,24 > "$out/e2e.log" 2>&1; rc[e2e]=$? ;;
    devices)
      log2=26; [ -n "$quick" ] && log2=14
      bench --parts e2e --e2e-log2-r $log2 --e2e-devices all > "$out/devices.log" 2>&1
      rc[devices]=$?
      log2=27; [ -n "$quick" ] && log2=16
      bench --parts devices --devices-log2-r $log2 > "$out/devices-kernel.log" 2>&1
      rc[devices-kernel]=$? ;;
    strings)
      bench --parts strings > "$out/strings.log" 2>&1; rc[strings]=$? ;;
    selective)
      bench --parts selective > "$out/selective.log" 2>&1; rc[selective]=$? ;;
    scale)
      bench --parts scale > "$out/scale.log" 2>&1; rc[scale]=$? ;;
    tpch)
      scale=10; [ -n "$quick" ] && scale=0.1
      bench --parts tpch --scale "$scale" --tpch-runs 5 --tpch-min-build-rows default > "$out/tpch.log" 2>&1; rc[tpch]=$?
      bench --parts tpch --scale "$scale" --tpch-runs 3 --tpch-min-build-rows 0 > "$out/tpch-gpu.log" 2>&1; rc[tpch-gpu]=$? ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done

if [ -f "$out/profile.log" ]; then
  echo "=== kernel profile: standard wide workload, one run, synchronized per kernel ==="
  grep "gpu_join kernel" "$out/profile.log" | awk '{t[$3]+=$(NF-1); n[$3]++} END {for (k in t) printf "%-28s %4d launches %9.3f ms\n", k, n[k], t[k]}' | sort -k4 -nr | head -20
fi
[ -f "$out/example.log" ] && { echo "=== example (TPC-H SF1) ==="; grep -E "backend=|gpu_join o|results equal" "$out/example.log" | head -8; }
for step in kernel e2e strings selective scale tpch tpch-gpu; do
  [ -f "$out/$step.log" ] && { echo "=== joinbench $step ==="; sed -n '/^## joinbench/,$p' "$out/$step.log"; grep -E "^Error|FAILED" "$out/$step.log"; }
done
for tool in memcheck racecheck initcheck; do
  [ -f "$out/sanitize-$tool.log" ] && { echo "=== compute-sanitizer $tool ==="; grep -E "ERROR SUMMARY|LEAK SUMMARY|passed, .* failed|Program hit|Leaked" "$out/sanitize-$tool.log" | sort | uniq -c | head -12; }
done
echo "=== summary ==="
echo "device: $(head -1 "$out/device.txt"); commit: $JOINBENCH_COMMIT"
if [ -f "$out/suite.log" ]; then
  grep -E "^test .*(FAILED|skipped)" "$out/suite.log" | head -20
  echo "suite: $(tail -1 "$out/suite.log")"
fi
worst=0
for k in "${!rc[@]}"; do echo "rc $k: ${rc[$k]}"; [ "${rc[$k]}" -gt "$worst" ] && worst=${rc[$k]}; done
exit "$worst"
