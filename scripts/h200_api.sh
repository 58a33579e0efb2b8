#!/usr/bin/env bash
# One H200 session for issue 24 (the serving API's options and what they cost the engine):
# glmlab.bench.api on the real-width slice:4 model (block-FP8 weights drawn in place on the GPU),
# side by side in one process:
#   penalties  a decode step of 128 requests with frequency / presence / repetition penalties and
#              top-20 logprobs on every one vs the same batch plain (goal <= 5% slower)
#   grammar    64 of the 128 under a json_schema grammar (xgrammar masks) vs plain (goal <= 10%)
#   samples    n = 8 from one 4096-token prompt: the prompt computed once and its KV pages
#              allocated once (the engines' own counts), in one engine and across a prefill +
#              decode engine pair (LocalPD), next to the same 8 as separate requests
#
#   GLMLAB_GIT_COMMIT=<sha> GLMLAB_GIT_DIRTY=0 OUT=/dir bash scripts/h200_api.sh     (~3-4 min)
#   BACKENDS=issue|reference [SAMPLING=triton|torch] OUT=/dir bash scripts/h200_api.sh
#                                            another op set than fast (and sampler ops)
#   REHEARSE=1 OUT=/dir bash scripts/h200_api.sh                   the same on the CPU, tiny model
#
# Carry .devpack with fla, tilelang, serve and xgrammar (bash scripts/devpack.sh fla tilelang serve
# xgrammar: ~43 MB). Rows are appended to $OUT/api.jsonl as each case ends (stamped: commit,
# command, versions, GPU and clocks), so a stage cut short keeps what it measured. Files in $OUT:
# log.txt, api.jsonl. Exit status: non-zero if a stage failed or a case missed what it must show
# (the counts of "samples"; the ratios are measurements, not failures).
set -u
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=/tmp/glmcache FLA_TILELANG=0
OUT=${OUT:?set OUT}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
REHEARSE=${REHEARSE:-0}
FAILED=()
stamp() { echo "== $(date +%T) $*"; }
stage() {  # stage NAME SECONDS CMD...: run with a limit, record a failure loudly
  local name=$1 limit=$2; shift 2
  stamp "$name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "!! STAGE FAILED: $name (exit $rc)"
    FAILED+=("$name:$rc")
  fi
}

if [ "$REHEARSE" = 1 ]; then
  PY=${PY:-.venv/bin/python}
  ARGS="--preset tiny --device cpu --backends ${BACKENDS:-reference} --batch 8 --context 64
        --constrained 4 --warmup 2 --steps 5 --reps 2 --samples 4 --prompt-len 300
        --new-tokens 8 --page-size 16"
  LIMIT=${LIMIT:-240}
else
  PY=python3
  if [ ! -d .git ] && [ -z "${GLMLAB_GIT_COMMIT:-}" ]; then
    echo "!! set GLMLAB_GIT_COMMIT (and GLMLAB_GIT_DIRTY) to the commit this tree was copied from"
    exit 2
  fi
  ARGS="--preset slice:4 --device cuda --backends ${BACKENDS:-fast} --batch 128 --context 1024
        --constrained 64 --warmup 5 --steps 20 --reps 2 --samples 8 --prompt-len 4096
        --new-tokens 16 --page-size 64 --cache-gb 16 --time-budget 120"
  LIMIT=${LIMIT:-200}
fi
[ -n "${SAMPLING:-}" ] && ARGS="$ARGS --sampling $SAMPLING"
# TIME_BUDGET: seconds after which later cases are skipped (default 120 on the GPU)
[ -n "${TIME_BUDGET:-}" ] && ARGS="$ARGS --time-budget $TIME_BUDGET"
# EXTRA: more bench options, after the defaults (e.g. EXTRA="--reps 1" when device time is short)
[ -n "${EXTRA:-}" ] && ARGS="$ARGS $EXTRA"
# PROFILE=1: the kernels of one sampler call per variant, profile-sampler-*.txt in $OUT
[ "${PROFILE:-0}" = 1 ] && ARGS="$ARGS --profile-dir $OUT"
ARGS=$(echo $ARGS)  # one line, for the logs

stamp install
if [ "$REHEARSE" != 1 ]; then
  if ! ls .devpack/*.tar.xz >/dev/null 2>&1; then
    echo "!! no .devpack/*.tar.xz: carry .devpack (scripts/devpack.sh fla tilelang serve xgrammar)"
    exit 2
  fi
  SITE=$(mktemp -d); for p in .devpack/*.tar.xz; do tar -xJf "$p" -C "$SITE"; done
  export PYTHONPATH=$SITE
  $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
fi
$PY - <<'PY'
import importlib.util
from importlib import metadata
# found, not imported (fla alone takes ~15 s to import): the bench imports what it uses
for name, dist in (("torch", "torch"), ("triton", "triton"), ("fla", "fla-core"),
                   ("tilelang", "tilelang"), ("xgrammar", "xgrammar"), ("pydantic", "pydantic")):
    try:
        found = importlib.util.find_spec(name) is not None
        print(f"  {name}: {metadata.version(dist) if found else 'MISSING'}")
    except metadata.PackageNotFoundError:
        print(f"  {name}: found, no metadata")
PY
CASES=${CASES:-penalties,grammar,samples}
if ! $PY -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('xgrammar') is None)"
then
  echo "!! xgrammar is missing: the grammar case is skipped (carry .devpack/xgrammar.tar.xz)"
  CASES=penalties,samples
  FAILED+=("xgrammar-missing")
fi
echo "commit: ${GLMLAB_GIT_COMMIT:-from .git} dirty: ${GLMLAB_GIT_DIRTY:-?}"

stage bench "$LIMIT" $PY -m glmlab.bench.ops --op api --out /tmp/glmlab-api-bench \
  --stream "$OUT/api.jsonl" --cases "$CASES" $ARGS

stamp summary
$PY - "$OUT/api.jsonl" <<'EOF' || FAILED+=("summary")
import json, sys
try:
    rows = [json.loads(line) for line in open(sys.argv[1])]
except FileNotFoundError:
    rows = []
print(f"{len(rows)} rows")
bad = []
for r in rows:
    if "error" in r:
        print(f"{r['case']:10} FAILED: {r['error'][:300]}")
        bad.append(r["case"])
    elif r["case"] == "samples":
        print(f"samples {r['mode']:18} n={r['samples']} prompt {r['prompt_len']}: prefill "
              f"tokens {r['prefill_compute_tokens']}, pages {r['pages_allocated']} (expected "
              f"{r['expected']}) {'ok' if r['as_expected'] else 'NOT AS EXPECTED'}"
              + (f"; prefill side {r['prefill_side']}, bytes {r['bytes_moved']} of one prompt "
                 f"{r['bytes_one_prompt']}" if "prefill_side" in r else ""))
        bad += [] if r["as_expected"] else [r["mode"]]
    else:
        print(f"{r['case']:10} batch {r['batch']} ctx {r['context']} [{r['backends']}, graphs "
              f"{r['cuda_graphs']}]: plain {r['plain_step_ms']:.3f} ms, with it "
              f"{r['step_ms']:.3f} ms, x{r['ratio']:.3f} (goal x{r['goal_ratio']}: "
              f"{'met' if r['meets_goal'] else 'missed'}); sampler alone "
              f"{r['plain_sampler_ms']:.3f} -> {r['sampler_ms']:.3f} ms")
sys.exit(1 if bad or not rows else 0)
EOF
stamp done
if [ ${#FAILED[@]} -ne 0 ]; then
  echo "!! FAILED: ${FAILED[*]}"
  exit 1
fi
