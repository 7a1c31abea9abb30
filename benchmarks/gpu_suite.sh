#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md as one run bounded in time, from the repository root:
#
#   benchmarks/gpu_suite.sh DATA RESULTS [SECONDS]
#
# 1. speed.py and epoch.py (per-arm epoch time of {20,4,8}), each alone on the device;
# 2. the 30-epoch sweep: full, topk4, random4, real4 and topk1, seeds 0 and 1, five runs at a time
#    (seed 0 first), in runs/sweep30, with the device's utilisation sampled every 5 s;
# 3. with time left, the 320-epoch protocol (full vs topk4, seed 0) in runs/sweep320.
# Whatever the time limit stops resumes when the same command runs again with runs/ kept.
# DEVICE (default cuda) and EXTRA (options for every accuracy.py call) are for trying it on a CPU.
set -u
data=$1 results=$2 total=${3:-540}
device=${DEVICE:-cuda} extra=${EXTRA:-}
mkdir -p "$results"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
left() { echo $((total - SECONDS)); }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'; } |
  tee "$results/device.txt"
if [ "$device" = cuda ]; then
  timeout 100 python3 benchmarks/speed.py --device cuda --json "$results/speed_gpu.json" 2>&1 | tee "$results/speed.log"
  timeout 100 python3 benchmarks/epoch.py --device cuda --data "$data" --archs cifar-20-4-8 \
    --arms full topk4 random4 real4 topk1 --paths resident --json "$results/epoch_gpu.json" 2>&1 |
    tee "$results/epoch.log"
  nvidia-smi dmon -s u -d 5 >"$results/dmon.txt" 2>&1 &
  dmon=$!
fi

limit=$(($(left) - 45))
# shellcheck disable=SC2086
OMP_NUM_THREADS=2 timeout $((limit + 40)) python3 benchmarks/accuracy.py --data "$data" --budget 30 --seeds 0 1 \
  --arms full topk4 random4 real4 topk1 --parallel 5 --out runs/sweep30 --time-limit "$limit" --no-progress \
  --device "$device" $extra 2>&1 | tee "$results/sweep30.log"

if [ "$(left)" -gt 100 ]; then
  limit=$(($(left) - 40))
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=2 timeout $((limit + 35)) python3 benchmarks/accuracy.py --data "$data" --budget 320 --seeds 0 \
    --arms full topk4 --parallel 2 --out runs/sweep320 --time-limit "$limit" --no-progress \
    --device "$device" $extra 2>&1 | tee "$results/sweep320.log"
fi
[ -n "${dmon:-}" ] && kill "$dmon"
echo "suite ended after ${SECONDS}s"
