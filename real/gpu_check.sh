#!/usr/bin/env bash
# The GPU lane in one go, for a machine with CUDA GPUs (issue 5): calibrate a profile, compare the simulator with
# real NCCL on the scenarios that fit the visible GPUs (the seed scenarios with at most that many ranks, plus this
# check's own 1-2 rank worlds priced by the fresh profile), run the `gpu` tests, and write everything to OUT.
#
#   real/gpu_check.sh [OUT]          (default OUT: gpu-check-<date>; PYTHON=... to pick the interpreter)
#
# Exits 0 with a note when there is no CUDA device. Otherwise exits 1 if any step failed or disagreed.
# Budget: calibrate <= 7 min, each compare <= 5 min (one GPU: single-rank worlds only, well under 8 min total).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check-$(date +%Y%m%d-%H%M%S)}
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
mkdir -p "$OUT"
REPORT="$OUT/report.txt"
: > "$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }

GPUS=$("$PY" -c "from simnccl.real.lanes import visible_gpus; print(visible_gpus())" 2>/dev/null || echo 0)
if [ "$GPUS" = "0" ]; then
  say "gpu_check: no CUDA device: the GPU lane needs one; nothing to check (the gpu tests skip on this machine)"
  exit 0
fi
say "gpu_check: $GPUS visible GPU(s); output in $OUT"
STATUS=0
START=$(date +%s)

say "== calibrate"
if timeout 420 "$PY" -m simnccl.real calibrate --out "$OUT/profile.toml" --json "$OUT/calibration.json" 2>&1 | tee -a "$REPORT"; then
  say "calibrate: ok"
else
  say "calibrate: FAILED or not reproduced within 1% (see above)"; STATUS=1
fi

KIND=$("$PY" -c "import tomllib,sys; print(tomllib.load(open(sys.argv[1],'rb'))['gpu'])" "$OUT/profile.toml" 2>/dev/null || echo unknown)
SCEN=()
for s in scenarios/*.toml; do
  info=$("$PY" -c "import sys; from simnccl.scenario import load_scenario; s=load_scenario(sys.argv[1]); print(len(s.programs), s.cluster.gpu.key)" "$s" 2>/dev/null || echo "999 unknown")
  n=${info%% *}; kind=${info#* }
  if [ "$n" -gt "$GPUS" ]; then say "skip $s: $n ranks > $GPUS GPU(s)"
  elif [ "$kind" != "$KIND" ]; then say "skip $s: simulated on $kind, this machine is $KIND (memory not comparable)"
  else SCEN+=("$s"); fi
done
if [ -f "$OUT/profile.toml" ]; then
  while IFS= read -r p; do SCEN+=("$p"); done < <("$PY" -m simnccl.real gpu-scenarios --out "$OUT/scenarios" --profile "$OUT/profile.toml")
fi

for s in "${SCEN[@]}"; do
  name=$(basename "$s" .toml)
  say "== compare $s"
  timeout 300 "$PY" -m simnccl.real compare "$s" --lane gpu --json "$OUT/compare-$name.json" 2>&1 | tee -a "$REPORT"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then say "compare $name: exit $rc"; STATUS=1; fi
done

say "== pytest -m gpu"
timeout 300 "$PY" -m pytest -q -m gpu tests 2>&1 | tail -20 | tee -a "$REPORT"
if [ "${PIPESTATUS[0]}" -ne 0 ]; then STATUS=1; fi

say "gpu_check: done in $(( $(date +%s) - START ))s, status $STATUS"
exit $STATUS
