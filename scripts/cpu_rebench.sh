#!/usr/bin/env bash
# Regenerates every CPU row of data/bench/ (tiny model, torch ops; small runs: a 2-core machine):
#
#   bash scripts/cpu_rebench.sh                # rows to data/bench/, logs to data/bench/logs/
#   OUT=/dir bash scripts/cpu_rebench.sh [STAGE ...]   # stages: engine spec tp reference serve
#                                                      # (default all)
#
# Each stage replaces its files (a rerun does not append to an older run) and tees its output to
# $OUT/logs/cpu-<stage>.log. Rows carry their provenance (glmlab.bench.provenance): run it from a
# clean checkout, or set GLMLAB_GIT_COMMIT / GLMLAB_GIT_DIRTY when the tree has no .git.
# These numbers show that the code runs and how the pieces compare on one CPU; they are not
# GPU performance (docs/platform.md section 2).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-data/bench}
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
STAGES=${*:-engine spec tp reference serve}
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=${GLMLAB_CACHE_DIR:-$(mktemp -d)}
T1="--cpu-threads 1"
fresh() { for f in "$@"; do rm -f "$OUT/$f"; done; }

stage_engine() {
  fresh engine-cpu-tiny.jsonl engine-cpu-tiny-shared.jsonl engine-kv-agreement.jsonl \
    engine-slots.jsonl
  # throughput: random prompts; then shared-prefix groups through the radix tree
  $PY -m glmlab.bench.engine --preset tiny $T1 --num-prompts 64 --input-len 128 --output-len 32 \
    --tag cpu-tiny --out "$OUT"
  $PY -m glmlab.bench.engine --preset tiny $T1 --num-prompts 64 --input-len 64 --output-len 32 \
    --num-groups 4 --shared-prefix-len 512 --tag cpu-tiny-shared --out "$OUT"
  # FP8 vs BF16 KV: greedy agreement; Lp + N x Ls token slots of requests sharing a prefix
  $PY -m glmlab.bench.engine --preset tiny $T1 --agreement --num-prompts 32 --input-len 96 \
    --output-len 32 --out "$OUT"
  $PY -m glmlab.bench.engine --preset tiny $T1 --slots --num-prompts 32 --shared-prefix-len 2048 \
    --input-len 129 --out "$OUT"
}

stage_spec() {
  fresh spec-tiny-cpu.jsonl spec-tiny-cpu-snapshot.jsonl
  # MTP718 / DFlash2 block 8 cycle phases at the reference deployment's acceptance (simulated)
  $PY -m glmlab.bench.spec --preset tiny --threads 1 --batch 8 --context 64 --width 8 \
    --cycles 16 --warmup 2 --tag tiny-cpu --out "$OUT" --quiet
  $PY -m glmlab.bench.spec --preset tiny --threads 1 --batch 8 --context 64 --width 8 \
    --cycles 16 --warmup 2 --commit snapshot --algorithms mtp,dflash2 --draft-kv bf16 \
    --tag tiny-cpu-snapshot --out "$OUT" --quiet
}

stage_tp() {
  # the H200x4 ladder's exact rung files, rehearsed on 2 gloo ranks with the tiny model
  local work; work=$(mktemp -d)
  for s in decode spec prefill; do
    fresh "tp-decode-cpu-rehearsal-$s.jsonl"
    REHEARSE=1 OUT=$work PY=$PY bash scripts/h200x4_decode_ladder.sh "$s"
    cp "$work/tp-decode-cpu-rehearsal-$s.jsonl" "$OUT/"
  done
  rm -rf "$work"
}

stage_reference() {
  # scripts/h200_reference_point.sh rehearsed: rank 0 of TP2 / CP2 of the tiny model, torch ops
  local work; work=$(mktemp -d)
  fresh reference_point-cpu-rehearsal.jsonl
  REHEARSE=1 OUT=$work PY=$PY bash scripts/h200_reference_point.sh || { rm -rf "$work"; return 1; }
  cp "$work/reference_point.jsonl" "$OUT/reference_point-cpu-rehearsal.jsonl"
  rm -rf "$work"
}

serve_bench() {  # $1 = tag prefix; the reference deployment's three shared-prefix ratios, scaled
  local sys q
  for ratio in 0:0:256 0.5:128:128 0.9375:240:16; do
    IFS=: read -r name sys q <<<"$ratio"
    $PY -m glmlab.cli bench --port 30000 --dataset-name generated-shared-prefix \
      --gsp-num-groups 2 --gsp-prompts-per-group 16 --gsp-system-prompt-len "$sys" \
      --gsp-question-len "$q" --gsp-output-len 32 --max-concurrency 8 --warmup-requests 4 \
      --seed 42 --flush-cache --output-file "$OUT/serve.jsonl" --tag "$1-prefix$name" \
      || return 1
  done
}

serve_with() {  # $1 = tag prefix, then glmlab serve flags
  local tag=$1; shift
  $PY -m glmlab.cli serve "$@" --log-dir "$OUT/logs/serve-$tag" &
  local pid=$! ok=1
  for _ in $(seq 1 120); do
    curl -sf http://127.0.0.1:30000/readiness >/dev/null 2>&1 && { ok=0; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 2
  done
  [ $ok = 0 ] && serve_bench "$tag"
  local rc=$?
  kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null
  return $rc
}

stage_serve() {
  fresh serve.jsonl
  serve_with 1p1d --mode pd || return 1
  serve_with mixed --mode mixed || return 1
  if [ "${THREE_PREFILL:-1}" = 1 ]; then
    serve_with 3p1d --mode pd --num-prefill 3
  fi
}

rc=0
for s in $STAGES; do
  echo "== $(date +%T) cpu $s"
  "stage_$s" > >(tee "$OUT/logs/cpu-$s.log") 2>&1 || { echo "stage $s failed"; rc=1; }
done
exit $rc
