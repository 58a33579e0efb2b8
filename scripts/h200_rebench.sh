#!/usr/bin/env bash
# Regenerates every single-GPU row of data/bench/ in one H200 device call of at most 8 minutes,
# with the log of each stage next to the rows:
#
#   GLMLAB_GIT_COMMIT=<git rev-parse HEAD> GLMLAB_GIT_DIRTY=0 OUT=/dir bash scripts/h200_rebench.sh
#
# (the GPU machine gets the files, not .git: the commit comes from the environment, and every row
# is stamped with it; carry .devpack from `bash scripts/devpack.sh fla tilelang`). Then, here:
#   cp $OUT/*.jsonl data/bench/ && cp $OUT/logs/* data/bench/logs/
#
# Rows, in $OUT (file names as in data/bench/, see data/bench/README.md):
#   model-h200-slice4.jsonl          prefill / batched decode of a real-width 4-layer slice (FP8)
#   engine-h200-slice4.jsonl         offline engine throughput, BF16 KV
#   engine-h200-slice4-fp8kv.jsonl   the same, FP8 KV
#   spec-h200.jsonl                  MTP718 vs DFlash2 block 8 cycle phases (notebook 02)
#   dsa.jsonl                        sparse-MLA Partial schedules and tiles (notebook 04)
#   moe.jsonl                        block-FP8 MoE kernels at M 1024 / 8192 (notebook 03)
#   moe_tune.jsonl                   MoE tiles tuned on real routing, held-out check (notebook 03)
# and logs/h200-<stage>.log, logs/h200-status.txt. Every stage has its own time limit, cut to what
# is left of the 8 minutes, so a slow stage cannot take the later ones with it.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}
mkdir -p "$OUT/logs"
if [ ! -d .git ] && [ -z "${GLMLAB_GIT_COMMIT:-}" ]; then
  echo "set GLMLAB_GIT_COMMIT (and GLMLAB_GIT_DIRTY) to the commit this tree was copied from" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=/tmp/glmcache FLA_TILELANG=0
TOTAL=${TOTAL_S:-470}  # 7 min 50 s of stages
START=$SECONDS
SLICE=/tmp/slice4
FAILED=0
left() { echo $(( TOTAL - (SECONDS - START) )); }
stage() {  # stage NAME LIMIT_S command...: one stage, its log, its status
  local name=$1 limit=$2 rc; shift 2
  local have; have=$(left)
  [ "$limit" -gt "$have" ] && limit=$have
  if [ "$limit" -lt 10 ]; then
    echo "$name skipped (no time left)" | tee -a "$OUT/logs/h200-status.txt"; FAILED=1; return
  fi
  echo "== $(date +%T) (+$((SECONDS - START))s) $name, limit ${limit}s"
  timeout "$limit" "$@" > "$OUT/logs/h200-$name.log" 2>&1
  rc=$?
  tail -3 "$OUT/logs/h200-$name.log"
  echo "$name rc=$rc" >> "$OUT/logs/h200-status.txt"
  [ $rc = 0 ] || FAILED=1
}

install() {
  SITE=$(mktemp -d)
  for p in .devpack/*.tar.xz; do [ -f "$p" ] && tar -xJf "$p" -C "$SITE"; done
  export PYTHONPATH=$SITE
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
}
install > "$OUT/logs/h200-install.log" 2>&1

stage slice 60 python3 -m glmlab.cli init-checkpoint --preset slice:4 --fp8 --device cuda \
  --out $SLICE --max-shard-gb 4
stage model 45 python3 -m glmlab.bench.ops --op model --tag h200-slice4 --out "$OUT" \
  --model $SLICE --device cuda --dtype bf16 --backends torch --prefill-lens 1024,4096 \
  --decode-batches 1,16,64 --decode-steps 5
ENGINE="--model $SLICE --device cuda --dtype bf16 --fp8-weights keep --num-prompts 32 \
  --input-len 1024 --output-len 32 --warmup 2 --backends-sparse-mla tilelang --backends-moe triton"
stage engine 50 python3 -m glmlab.bench.engine $ENGINE --tag h200-slice4 --out "$OUT"
stage engine-fp8kv 40 python3 -m glmlab.bench.engine $ENGINE --kv-dtype fp8 \
  --tag h200-slice4-fp8kv --out "$OUT"
stage spec 60 python3 -m glmlab.bench.spec --preset $SLICE --fp8-weights keep --device cuda \
  --dtype bf16 --batch 32 --context 512 --width 8 --cycles 8 --warmup 2 --passes 2 \
  --backends-sparse-mla tilelang --backends-moe triton --tag h200 --out "$OUT" --quiet
rm -f "$OUT/dsa.jsonl"
stage dsa 80 python3 -m glmlab.bench.ops_dsa --quick --shapes 1056x16,8192x16,8192x64 \
  --layouts bf16,fp8_raw --out "$OUT"
rm -f "$OUT/moe.jsonl"
stage moe 75 python3 -m glmlab.bench.ops_moe --stream "$OUT/moe.jsonl" --tokens 1024,8192 \
  --ws without --time-budget 65
rm -f "$OUT/moe_tune.jsonl"
stage moe-tune 55 python3 -m glmlab.cli tune moe --samples data/routing/slice4-layer3.safetensors \
  --experts 72 --tokens 1024 --space reduced --out "$OUT/moe-configs" \
  --report "$OUT/moe_tune.jsonl" \
  --no-progress
echo "== done in $((SECONDS - START))s; $(tr '\n' ' ' < "$OUT/logs/h200-status.txt")"
exit $FAILED
