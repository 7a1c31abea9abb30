#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md as one run bounded in time, from the repository root:
#
#   benchmarks/gpu_suite.sh MODE DATA RESULTS [SECONDS]
#
# MODE
#   measure   epoch.py per arm (eager, median of 2 epochs) and topk4 under torch.compile (reduce-overhead), then
#             speed.py's step times and memory, each into RESULTS/*.json
#   studies   connlearn compare on each arms file in STUDIES (benchmarks/studies/NAME/FILE.toml) for the seeds in
#             SEEDS (default 0), PARALLEL runs at a time (default 8), into the study's results/ (a study of one
#             report per file, as the budget's and the verdict's, into results_FILE/); the time
#             limit stops the runs with a checkpoint and the same command resumes them; RESULTS/studies.tar.gz
#             then holds every finished run's summary.json (unpack it in the repository root and commit)
# DEVICE (default cuda) lets the suite run on a CPU for a trial. Python packages that connlearn needs and the
# machine lacks are installed from the wheels in .whl/ if there is one.
set -u
mode=$1 data=$2 results=$3 total=${4:-540}
device=${DEVICE:-cuda}
case $mode in
measure | studies) ;;
*) echo "unknown mode $mode: measure or studies" >&2; exit 2 ;;
esac
mkdir -p "$results"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  site=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl && export PYTHONPATH="$PYTHONPATH:$site"
fi
if ! python3 -c 'import connlearn.train.protocol' 2>"$results/import.log"; then
  cat "$results/import.log" >&2
  echo "connlearn does not import here; put wheels of the missing packages in .whl/" >&2
  exit 3
fi
# step CAP COMMAND...: run COMMAND for at most CAP seconds (less if less is left), its output in RESULTS/suite.log
step() {
  local t=$((total - SECONDS))
  [ "$t" -gt "$1" ] && t=$1
  shift
  if [ "$t" -lt 20 ]; then echo "skipped (time): $*"; return; fi
  timeout -s TERM -k 30 "$t" "$@" 2>&1 | tee -a "$results/suite.log"
}
case $mode in
measure)
  step 150 python3 benchmarks/epoch.py --device "$device" --data "$data" --archs cifar-20-4-8 \
    --arms full topk4 random4 real4 topk1 --paths resident --repeats 2 --json "$results/epoch.json"
  step 180 python3 benchmarks/epoch.py --device "$device" --data "$data" --archs cifar-20-4-8 --arms topk4 \
    --paths resident --repeats 3 --compile reduce-overhead --json "$results/epoch_compile.json"
  step 120 python3 benchmarks/speed.py --device "$device" --json "$results/speed.json"
  step 90 python3 benchmarks/speed.py --device "$device" --memory --json "$results/memory.json"
  ;;
studies)
  for arms in ${STUDIES:?STUDIES lists the arms files to run}; do
    out="$(dirname "$arms")/results"
    case $arms in */verdict/* | */budget/*) out="${out}_$(basename "$arms" .toml)" ;; esac
    # shellcheck disable=SC2086
    step $((total - SECONDS)) python3 -m connlearn.cli compare --arms "$arms" --seeds ${SEEDS:-0} --data "$data" \
      --device "$device" --parallel "${PARALLEL:-8}" --threads 1 --out "$out"
  done
  summaries=$(ls benchmarks/studies/*/results*/*/summary.json 2>/dev/null)
  # shellcheck disable=SC2086
  [ -n "$summaries" ] && tar -czf "$results/studies.tar.gz" $summaries
  ;;
esac
echo "suite ended after ${SECONDS}s"
