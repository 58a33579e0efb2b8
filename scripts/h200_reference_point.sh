#!/usr/bin/env bash
# Issue 16 in one H200 device call of at most 6 minutes: the reference deployment's decode point
# (rank 0 of TP4/EP4, full depth, 132 requests over a 64K shared prefix; DFlash2 block 8 at
# simulated acceptance 7.03, MTP718 at 7.37, plain decode; batch sweep) and its prefill point
# (rank 0 of CP4, one 64K prompt, FP8 MoE packets), each rank emulated on the one GPU with its
# collectives recorded and priced (glmlab.bench.reference_point; docs/reference-point.md).
#
#   GLMLAB_GIT_COMMIT=$(git rev-parse HEAD) GLMLAB_GIT_DIRTY=0 OUT=/dir \
#       bash scripts/h200_reference_point.sh                  (carry .devpack: fla tilelang)
#   REHEARSE=1 OUT=/dir bash scripts/h200_reference_point.sh  (CPU: tiny model, TP2, torch ops;
#                                                              rows labelled cpu_rehearsal)
#
# The GPU machine gets the files, not .git: every row is stamped with GLMLAB_GIT_COMMIT. Build the
# packs here first: bash scripts/devpack.sh fla tilelang. Then, back here:
#   cp $OUT/reference_point.jsonl data/bench/reference_point.jsonl && cp $OUT/log.txt \
#       data/bench/logs/h200-reference-point.log
# Files in $OUT: log.txt, reference_point.jsonl (rows appended as each point is measured, so a
# run cut short keeps what it measured), status.txt, profile-*.txt with PROFILE=1. Stages have their own limits, cut to what is
# left of TOTAL_S (default 345 s); a stage that dies leaves the rows before it. STAGES="decode" or
# STAGES="prefill" runs one stage (two device calls, each with the whole budget, if one is short).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=/tmp/glmcache FLA_TILELANG=0
PY=${PY:-python3}
TOTAL=${TOTAL_S:-345}
START=$SECONDS
ROWS=$OUT/reference_point.jsonl
STAGES=${STAGES:-decode prefill}
has() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
FAILED=0
left() { echo $(( TOTAL - (SECONDS - START) )); }
stage() {  # stage NAME LIMIT_S command...: one stage with its own limit, its status recorded
  local name=$1 limit=$2 rc have; shift 2
  have=$(left)
  [ "$limit" -gt "$have" ] && limit=$have
  if [ "$limit" -lt 15 ]; then echo "$name skipped: no time left" | tee -a "$OUT/status.txt"
    FAILED=1; return; fi
  echo "== $(date +%T) (+$((SECONDS - START))s) $name, limit ${limit}s"
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  echo "$name rc=$rc (+$((SECONDS - START))s)" | tee -a "$OUT/status.txt"
  [ $rc = 0 ] || FAILED=1
}

BENCH="$PY -m glmlab.bench.ops --op reference_point --out /tmp/reference-point --stream $ROWS"
# PROFILE=1: also the kernels of one eager cycle per algorithm (profile-ALGORITHM.txt in $OUT)
[ "${PROFILE:-0}" = 1 ] && BENCH="$BENCH --profile-dir $OUT"
# ALGORITHMS / BATCHES: a subset (default: every algorithm, the whole sweep)
[ -n "${ALGORITHMS:-}" ] && BENCH="$BENCH --algorithms $ALGORITHMS"
[ -n "${BATCHES:-}" ] && BENCH="$BENCH --batches $BATCHES"
if [ "${REHEARSE:-0}" = 1 ]; then
  has decode && stage decode 300 $BENCH --rehearsal --phases decode
  has prefill && stage prefill 120 $BENCH --rehearsal --phases prefill
else
  if [ ! -d .git ] && [ -z "${GLMLAB_GIT_COMMIT:-}" ]; then
    echo "set GLMLAB_GIT_COMMIT (and GLMLAB_GIT_DIRTY) to the commit this tree was copied from"
    exit 2
  fi
  if ! ls .devpack/*.tar.xz >/dev/null 2>&1; then
    echo "!! no .devpack/*.tar.xz: carry .devpack (bash scripts/devpack.sh fla tilelang)"; exit 2
  fi
  SITE=$(mktemp -d); for p in .devpack/*.tar.xz; do tar -xJf "$p" -C "$SITE"; done
  export PYTHONPATH=$SITE
  $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
  $PY -c "import torch, triton, fla, tilelang; print(torch.__version__, triton.__version__)" \
    || { echo "!! imports failed"; exit 2; }
  # decode: DFlash2 at 132 first (the reference point), then its sweep, MTP718 at 132, plain
  # decode; points past --time-budget are skipped so that the prefill stage keeps its share
  DECODE=$(left); has prefill && DECODE=$(( DECODE - 100 ))
  has decode && stage decode $DECODE $BENCH --phases decode --time-budget $(( DECODE - 40 ))
  has prefill && stage prefill $(left) $BENCH --phases prefill
fi
echo "== done in $((SECONDS - START))s: $(tr '\n' ' ' < "$OUT/status.txt")"
$PY - "$ROWS" <<'EOF'
import json, sys
try:
    rows = [json.loads(line) for line in open(sys.argv[1])]
except FileNotFoundError:
    rows = []
print(f"{len(rows)} rows (EMULATED: rank 0 compute measured, communication modelled)")
for r in rows:
    rate = r.get("per_gpu_output_tok_s", r.get("per_gpu_input_tok_s"))
    print(f"{r['phase']:7} {r['algorithm']:10} b{r['batch']:<4} cycle {r['cycle_ms']:9.2f} ms = "
          f"compute {r['compute_ms']:9.2f} + comm {r['comm_ms']:6.2f}  per GPU {rate:9.1f} tok/s"
          f"  {'goal met' if r.get('goal', {}).get('met') else ''}")
EOF
exit $FAILED
