#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md as runs bounded in time, from the repository root:
#
#   benchmarks/gpu_suite.sh MODE DATA RESULTS [SECONDS]
#
# MODE
#   measure   epoch.py per arm (eager, median of 2 epochs), epoch.py for topk4 under torch.compile (default,
#             then reduce-overhead; median of 3), then speed.py's step times (contiguous) and memory.py's
#             activation memory with and without activation checkpointing, with what time is left
#   rules     the gate rules (plain, centered, renormalized) over 5 epochs of phase 1 on a 5,000-image
#             validation split, then the drawn / undrawn split of their raw gate gradients
#   choose    the gate rules' payoff, to choose one: 30-epoch runs of random4, topk4-plain, topk4-centered and
#             topk4-renormalized, seeds 0 and 1, four at a time, on a 5,000-image validation split in
#             runs/choose30; then random4, topk4-plain and topk4-centered with phase 1's sampling
#             temperature annealed from 1 to 0.05 in runs/choose30_annealed (random4 draws nothing: it is
#             there so that the folder's table pairs the learned arms with it by seed)
#   sweep     the 30-epoch sweep: full, topk4, random4, topk1, its baseline random1 and real4, seeds 0 and 1,
#             five runs at a time (seed 0 first) in runs/sweep30; then, with time left, the 320-epoch protocol
#   protocol  the 320-epoch protocol only: full vs topk4, seed 0, in runs/sweep320
#   claim     the comparison the claim rests on, on the test set, for the seeds in SEEDS (default 0; a
#             space-separated list): the 30-epoch sweep's topk4 (the paper's rule) and random4, two at a
#             time, then full, in runs/sweep30; beside them, topk4 under the setting the CPU's validation
#             runs chose (row-centred gradient, sampling temperature annealed 1 -> 0.05) in
#             runs/sweep30_annealed. EXTRA reaches both folders: no gate options in it here. sweep joins
#             runs/sweep30 later
#   convinit  the claim's two gated arms with the inner convolutions at ResNeXt's starting scale
#             (--conv-init resnext): random4 and topk4 under the CPU's chosen setting, two at a time, for the
#             seeds in SEEDS, in runs/sweep30_resnext; its Fixed-Full is runs/sweep30's (ResNeXt's single
#             stream has no other start)
#   studies   the declared studies of the verdict (benchmarks/studies/*/FILE.toml, listed in STUDIES) for the
#             seeds in SEEDS, PARALLEL runs at a time (default 8) by connlearn compare, each into its study's
#             results/ (the verdict's and the budget's into results_NAME, NAME the file's);
#             RESULTS/studies.tar.gz then holds every finished run's summary.json (unpack it in the
#             repository root and commit: the same command skips those runs, here or on the CPU)
# Each step gets what is left of SECONDS (default 540); whatever the limit stops resumes when the same
# command runs again with runs/ kept. At the end, RESULTS/runs.tar.gz holds the state to carry on from
# (runs/sweep30, runs/sweep30_annealed, runs/sweep30_resnext, runs/sweep320, runs/choose30,
# runs/choose30_annealed, runs/gates without the previous.pt/best.pt copies): unpack it in the repository
# root of the next machine. EXTRA holds further accuracy.py options (e.g. "--compile reduce-overhead", or "--gate-grad
# centered" once choose has chosen a rule for the learned arms of sweep and protocol): keep its settings
# the same for every command of one folder (only --compile, --amp and --device may change), since a sweep
# folder refuses runs with other settings; DEVICE (default cuda) lets the suite run on a CPU for a trial.
# Python packages that connlearn needs and the machine lacks (graphviz, say) are installed from the wheels
# in .whl/ if there is one.
set -u
mode=$1 data=$2 results=$3 total=${4:-540}
device=${DEVICE:-cuda} extra=${EXTRA:-} seeds=${SEEDS:-0}
annealed=(--gate-temperature 1 --gate-temperature-end 0.05) # phase 1's annealed sampling temperature
case $mode in
measure | rules | choose | sweep | protocol | claim | convinit | studies) ;;
*) echo "unknown mode $mode: measure, rules, choose, sweep, protocol, claim, convinit or studies" >&2; exit 2 ;;
esac
mkdir -p "$results"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  site=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl &&
    export PYTHONPATH="$PYTHONPATH:$site"
fi
if ! python3 -c 'import connlearn.train.protocol' 2>"$results/import.log"; then
  cat "$results/import.log" >&2
  echo "connlearn does not import here; put wheels of the missing packages in .whl/, e.g." \
    "python -m pip download --no-deps --only-binary=:all: -d .whl graphviz" >&2
  exit 3
fi
left() { echo $((total - SECONDS)); }
# step CAP LOG COMMAND...: run COMMAND for at most CAP seconds (less if less is left), output to LOG too
step() {
  local cap=$1 log=$2 t
  shift 2
  t=$(left)
  [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 20 ]; then echo "skipped (time): $*"; return; fi
  timeout -k 15 "$t" "$@" 2>&1 | tee -a "$results/$log"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'; } |
  tee "$results/device.txt"
if [ "$device" = cuda ]; then
  nvidia-smi dmon -s u -d 5 >"$results/dmon.txt" 2>&1 &
  dmon=$!
fi

sweep() {  # budget, arms, seeds, parallel, out, further accuracy.py options
  local limit=$(($(left) - 45))
  [ "$limit" -lt 60 ] && return
  # shellcheck disable=SC2086
  step $((limit + 40)) "$(basename "$5").log" env OMP_NUM_THREADS=2 python3 benchmarks/accuracy.py --data "$data" --budget "$1" \
    --arms $2 --seeds $3 --parallel "$4" --out "$5" --time-limit "$limit" --no-progress --device "$device" $extra "${@:6}"
}

case $mode in
measure)
  step 150 epoch.log python3 benchmarks/epoch.py --device "$device" --data "$data" --archs cifar-20-4-8 \
    --arms full topk4 random4 real4 topk1 --paths resident --repeats 2 --json "$results/epoch.json"
  step 200 epoch.log python3 benchmarks/epoch.py --device "$device" --data "$data" --archs cifar-20-4-8 --arms topk4 \
    --paths resident --repeats 3 --compile --json "$results/epoch_compile.json"
  step 180 epoch.log python3 benchmarks/epoch.py --device "$device" --data "$data" --archs cifar-20-4-8 --arms topk4 \
    --paths resident --repeats 3 --compile reduce-overhead --json "$results/epoch_compile_ro.json"
  step 120 speed.log python3 benchmarks/speed.py --device "$device" --json "$results/speed.json"
  step 90 memory.log python3 benchmarks/memory.py --device "$device" --archs cifar-20-4-8 cifar-29-8-8 --batch 128 \
    --json "$results/memory.json"
  ;;
rules)
  step $(($(left) - 60)) gates.log python3 benchmarks/gate_dynamics.py --data "$data" --net K=4 --train-subset 45000 \
    --epochs 5 --snapshot-every 50 --rules plain centered renormalized --out runs/gates
  step 60 gates.log python3 benchmarks/gate_dynamics.py --data "$data" --gradients runs/gates/plain \
    runs/gates/centered runs/gates/renormalized --out runs/gates
  ;;
choose)
  sweep 30 "random4 topk4-plain topk4-centered topk4-renormalized" "0 1" 4 runs/choose30 --val-split 5000
  sweep 30 "random4 topk4-plain topk4-centered" "0 1" 3 runs/choose30_annealed --val-split 5000 "${annealed[@]}"
  ;;
sweep)
  sweep 30 "full topk4 random4 topk1 random1 real4" "0 1" 5 runs/sweep30
  [ "$(left)" -gt 100 ] && sweep 320 "full topk4" 0 2 runs/sweep320
  ;;
protocol)
  sweep 320 "full topk4" 0 2 runs/sweep320
  ;;
claim)
  sweep 30 "topk4 random4 full" "$seeds" 2 runs/sweep30 &
  paper=$!
  sweep 30 topk4-centered "$seeds" 1 runs/sweep30_annealed "${annealed[@]}" &
  wait "$paper" $!
  ;;
convinit)
  sweep 30 "random4 topk4-centered" "$seeds" 2 runs/sweep30_resnext --conv-init resnext "${annealed[@]}"
  ;;
studies)
  for arms in ${STUDIES:?STUDIES lists the arms files to run}; do
    out="$(dirname "$arms")/results" # the verdict and the budget: a report per file, results_NAME
    case $arms in */verdict/* | */budget/*) out="${out}_$(basename "$arms" .toml)" ;; esac
    # shellcheck disable=SC2086
    step "$(left)" studies.log python3 -m connlearn.cli compare --arms "$arms" --seeds $seeds --data "$data" \
      --device "$device" --parallel "${PARALLEL:-8}" --threads 1 --out "$out"
  done
  summaries=$(ls benchmarks/studies/*/results*/*/summary.json 2>/dev/null)
  # shellcheck disable=SC2086
  [ -n "$summaries" ] && tar -czf "$results/studies.tar.gz" $summaries
  ;;
esac
[ -n "${dmon:-}" ] && kill "$dmon"
state=$(ls -d runs/sweep30 runs/sweep30_annealed runs/sweep30_resnext runs/sweep320 runs/choose30 \
  runs/choose30_annealed runs/gates 2>/dev/null)
# shellcheck disable=SC2086
[ -n "$state" ] && tar -czf "$results/runs.tar.gz" --exclude=previous.pt --exclude=best.pt --exclude='*.tmp' $state
echo "suite ended after ${SECONDS}s"
