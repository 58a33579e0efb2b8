#!/usr/bin/env bash
# One H200 call that does three things side by side, none of which is a timing (so they may
# share the GPU; the benchmarks run alone in other calls):
#   train   scripts/h200_train_small.sh STAGES=train  (issue 19: the `small` target + MTP, then the
#           DFlash2 draft; its loss curve says how many steps the shared GPU allowed)
#   tests   the decode fast path's GPU tests (issue 15: block-FP8 GEMM, fused small ops, the
#           sync-free step, CUDA graphs == eager)
#   serve   scripts/h200_serve_fast.sh (issue 13: glmlab serve with FP8 weights kept and the
#           fla / tilelang / triton backends, greedy tokens == glmlab generate; mixed and 1P1D)
#
#   GLMLAB_GIT_COMMIT=$(git rev-parse HEAD) OUT=/dir bash scripts/h200_train_and_check.sh
#
# Carry .devpack/{fla,tilelang,nixl,serve}.tar.xz (bash scripts/devpack.sh fla tilelang nixl serve).
# $OUT gets at most five files (the device tool returns eight): model.safetensors and
# dflash2.safetensors (the trained checkpoint), small-run.tar.gz (its config, tokenizer, loss
# curves, laid out from the repository root), results.tar.gz (every log and JSON of the three
# parts) and summary.txt.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}; mkdir -p "$OUT"
WORK=$(mktemp -d)
LIMIT=${LIMIT_S:-560}  # the whole call stays inside the device tool's 10 minutes
START=$SECONDS

SITE=$(mktemp -d); for p in .devpack/*.tar.xz; do tar -xJf "$p" -C "$SITE"; done
export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH GLMLAB_CACHE_DIR=/tmp/glmcache FLA_TILELANG=0 \
  GLMLAB_INSTALLED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv

left() { echo $(( LIMIT - (SECONDS - START) )); }

( TRAIN_S=${TRAIN_S:-300} DRAFT_S=${DRAFT_S:-60} TRAIN_TIMEOUT=$(( $(left) - 25 )) STAGES=train \
    OUT="$WORK/train" timeout $(( $(left) - 10 )) bash scripts/h200_train_small.sh \
    > "$WORK/train.out" 2>&1; echo "train exit $?" >> "$WORK/status.txt" ) &

( timeout 300 python3 -m pytest -q -p no:cacheprovider --durations=15 -rfE \
    tests/kernels/fused/test_decode_kernels_bf16_gpu.py tests/kernels/fp8/test_linear_fp8.py \
    tests/kernels/fp8/test_linear_fp8_sm90.py tests/kernels/fused/test_decode_kernels_sm90.py \
    tests/kernels/fused/test_fused_mhc.py tests/kernels/fused/test_fused_norm_router.py \
    tests/kernels/kda/test_kda_prep.py tests/kernels/decode \
    tests/model/test_cuda_graph.py tests/model/test_fast_path_slice_gpu.py \
    > "$WORK/pytest_gpu.txt" 2>&1; echo "tests exit $?" >> "$WORK/status.txt" ) &

( LENS=${LENS:-"37 300"} OUT="$WORK/serve" WORK="$WORK/serve-work" \
    timeout $(( $(left) - 15 )) bash scripts/h200_serve_fast.sh > "$WORK/serve.out" 2>&1
  echo "serve exit $?" >> "$WORK/status.txt" ) &

while [ "$(jobs -r | wc -l)" -gt 0 ] && [ "$(left)" -gt 5 ]; do sleep 5; done
kill $(jobs -p) 2>/dev/null

for f in model.safetensors dflash2.safetensors small-run.tar.gz; do
  [ -f "$WORK/train/$f" ] && mv "$WORK/train/$f" "$OUT/$f"
done
{
  echo "elapsed $((SECONDS - START)) s"; cat "$WORK/status.txt" 2>/dev/null
  echo "--- tests"; tail -n 40 "$WORK/pytest_gpu.txt" 2>/dev/null
  echo "--- serve"; cat "$WORK/serve/summary.json" 2>/dev/null; grep -E "^== |equal|NOT OK|failed" \
    "$WORK/serve.out" 2>/dev/null | tail -n 30
  echo "--- train"; grep -E "^== |exit|step|loss" "$WORK/train.out" 2>/dev/null | tail -n 25
} > "$OUT/summary.txt"
tar -czf "$OUT/results.tar.gz" -C "$WORK" .
cat "$OUT/summary.txt"
