#!/usr/bin/env bash
# One H200 call for the decode fast path (issue 15) and the fast service (issue 13):
#   1. tune      glmlab tune linear-fp8 at slice:4's fused FP8 GEMM shapes (alone on the GPU)
#   2. bench     python -m glmlab.bench.ops --op decode: before vs new, slice:4 (alone), with the
#                table just tuned; then the KDA state in bf16 at batch 128 and verify 132
#   3. checks    side by side (neither is a timing): the fast path's GPU tests, and
#                scripts/h200_serve_fast.sh (glmlab serve on the fast path == glmlab generate)
#
#   GLMLAB_GIT_COMMIT=$(git rev-parse HEAD) OUT=/dir bash scripts/h200_decode_fastpath.sh
#   STAGES=tests,serve,profile ...     a subset of tune,bench,state,kdawin,profile,tests,serve
#                                      (default: tune,bench,tests,serve); state: the bench with a
#                                      bf16 KDA state; kdawin: the verify window's two kernels;
#                                      profile: the decode and verify steps' kernels
#
# Carry .devpack/{fla,tilelang,nixl,serve}.tar.xz (bash scripts/devpack.sh fla tilelang nixl serve).
# Every stage has a time limit cut to what is left of LIMIT_S and writes as it goes. $OUT gets:
# decode.jsonl, linear_fp8_tune.jsonl, linear-fp8-NVIDIA_H200.json, results.tar.gz (logs, test
# output, the service check's files), summary.txt. Then, here:
#   cp $OUT/decode.jsonl $OUT/linear_fp8_tune.jsonl data/bench/ (append) and the table to
#   kernels/fp8/configs/.
set -u
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=/tmp/glmcache FLA_TILELANG=0
OUT=${OUT:?set OUT}; mkdir -p "$OUT"
WORK=$(mktemp -d)
LIMIT=${LIMIT_S:-560}
START=$SECONDS
left() { echo $(( LIMIT - (SECONDS - START) )); }
STAGES=",${STAGES:-tune,bench,tests,serve},"
stage() {  # stage NAME LIMIT_S CMD...: cut to what is left, logged, status recorded
  local name=$1 limit=$2 have rc; shift 2
  case "$STAGES" in *",${name%%-*},"*) ;; *) return ;; esac
  have=$(( $(left) - 5 )); [ "$limit" -gt "$have" ] && limit=$have
  if [ "$limit" -lt 15 ]; then echo "$name skipped: no time left" >> "$WORK/status.txt"; return; fi
  echo "== $(date +%T) (+$((SECONDS - START))s) $name, limit ${limit}s"
  timeout --kill-after=5 "$limit" "$@" > "$WORK/$name.log" 2>&1
  rc=$?; echo "$name rc=$rc" >> "$WORK/status.txt"
  grep -v "TileLang\|_warn\|UserWarning" "$WORK/$name.log" | tail -n 12
}

SITE=$(mktemp -d); for p in .devpack/*.tar.xz; do tar -xJf "$p" -C "$SITE"; done
export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH GLMLAB_INSTALLED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv

stage tune "${TUNE_S:-150}" python3 -m glmlab.cli tune linear-fp8 --preset slice:4 \
  --update --tokens "${TOKENS:-1,32,128,256,1056}" --report "$OUT/linear_fp8_tune.jsonl"
cp kernels/fp8/configs/linear-fp8-*.json "$OUT/" 2>/dev/null
stage bench 150 python3 -m glmlab.bench.ops --op decode --out "$WORK/bench" --presets slice:4 \
  --batches 1,32,128 --contexts 1024 --verify-batches 16,132 --stream "$OUT/decode.jsonl"
stage state-bf16 60 python3 -m glmlab.bench.ops --op decode --out "$WORK/bench" \
  --presets slice:4 --batches 128 --contexts 1024 --verify-batches 132 --state-dtype bf16 \
  --paths new --stream "$OUT/decode.jsonl"

stage kdawin 60 python3 -m glmlab.bench.ops --op kda-window --out "$OUT" \
  --chunk-block-v 32,64,128 --recurrent-block-v "${RECURRENT_BV:-auto,16,32,64}"
stage profile 100 python3 scripts/profile_decode_step.py --preset slice:4 --cases 128x1,132x8

( stage tests 240 python3 -m pytest -q -p no:cacheprovider -rfE --durations=10 \
    tests/kernels/decode tests/kernels/fp8/test_linear_fp8.py \
    tests/kernels/fused/test_decode_kernels_bf16_gpu.py tests/model/test_cuda_graph.py \
    tests/model/test_fast_path_slice_gpu.py tests/engine/test_isolation.py \
    tests/kernels/sampling/test_race.py ) &
tests_pid=$!
stage serve $(( $(left) - 10 )) env LENS="${LENS:-37 300}" OUT="$WORK/serve" \
  WORK="$WORK/serve-work" bash scripts/h200_serve_fast.sh
wait $tests_pid

{
  echo "elapsed $((SECONDS - START)) s"; cat "$WORK/status.txt"
  echo "--- tests"; grep -E "passed|failed|FAILED|Error" "$WORK/tests.log" 2>/dev/null | tail -n 15
  echo "--- serve"; cat "$WORK/serve/summary.json" 2>/dev/null
  echo; echo "--- decode"
  python3 - "$OUT/decode.jsonl" <<'EOF'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
except FileNotFoundError:
    rows = []
for r in rows:
    print(f"b{r['batch']:<4} w{r['width']} {r['state_dtype']} {r['path']:6} step {r['step_ms']:8.2f} "
          f"ms roof {r['roofline_ms']:6.2f} x{r['x_roofline']:<6} busy {r['gpu_busy_frac']:.2f} "
          f"k/layer {r['kernels_per_layer']:6.1f} syncs {r['host_syncs']} graph {r.get('graph_mb')}")
EOF
} > "$OUT/summary.txt" 2>&1
tar -czf "$OUT/results.tar.gz" -C "$WORK" --exclude=bench .
cat "$OUT/summary.txt"
