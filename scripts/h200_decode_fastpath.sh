#!/usr/bin/env bash
# One H200 session for issue 15 (decode and verify steps without host overhead): the GPU tests of
# the block-FP8 GEMM, the fused small ops, the sync-free step and CUDA graphs, then the decode
# benchmark (slice:4 first, then slice:8), before vs new side by side.
#
#   OUT=/some/dir bash scripts/h200_decode_fastpath.sh        (~8 minutes on one H200)
#
# Needs .devpack/{fla,tilelang}.tar.xz (tools/devpack fla tilelang, carried with the tree).
# Every stage has its own time limit and writes its results under $OUT as it goes (rows are
# appended to decode.jsonl as they are measured), so a stage that dies leaves the earlier ones.
# Files in $OUT: log.txt, pytest_gpu.txt, decode.jsonl. Exit status: non-zero if any stage failed.
set -u
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=/tmp/glmcache FLA_TILELANG=0
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
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

stamp install
if ! ls .devpack/*.tar.xz >/dev/null 2>&1; then
  echo "!! no .devpack/*.tar.xz: carry .devpack (tools/devpack fla tilelang)"; exit 2
fi
SITE=$(mktemp -d); for p in .devpack/*.tar.xz; do tar -xJf "$p" -C "$SITE"; done
export PYTHONPATH=$SITE
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
python3 -c "import torch, triton, fla, tilelang; print(torch.__version__, triton.__version__)" \
  || { echo "!! imports failed"; exit 2; }

# Items 1-4 on the GPU: kernels in bf16 at real widths and fp32 against their references, the
# tiny model's sync-free decode step + kernels per layer, graphs == eager tokens (session and
# engine), and the real-width slice:4 fused step against the reference path.
stage gpu-tests 210 python3 -m pytest -q -p no:cacheprovider --durations=10 \
  tests/kernels/fused/test_decode_kernels_bf16_gpu.py tests/kernels/fp8/test_linear_fp8.py \
  tests/kernels/fused/test_fused_mhc.py tests/kernels/fused/test_fused_norm_router.py \
  tests/kernels/kda/test_kda_prep.py tests/kernels/decode \
  tests/model/test_cuda_graph.py tests/model/test_fast_path_slice_gpu.py \
  > "$OUT/pytest_gpu.txt" 2>&1
tail -30 "$OUT/pytest_gpu.txt"

# Item 5. slice:4 is the goal preset: every case. slice:8 next, with what time is left.
stage bench-slice4 170 python3 -m glmlab.bench.ops --op decode --out /tmp/bench \
  --presets slice:4 --stream "$OUT/decode.jsonl" --time-budget 150
stage bench-slice8 95 python3 -m glmlab.bench.ops --op decode --out /tmp/bench \
  --presets slice:8 --batches 1,128 --contexts 1024 --verify-batches 132 \
  --stream "$OUT/decode.jsonl" --time-budget 80

stamp summary
python3 - "$OUT/decode.jsonl" <<'EOF'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
except FileNotFoundError:
    rows = []
print(f"{len(rows)} rows")
for r in rows:
    print(f"{r['preset']:8} b{r['batch']:<4} ctx{r['context']:<5} w{r['width']} {r['path']:6} "
          f"step {r['step_ms']:8.2f} ms  roof {r['roofline_ms']:6.2f} ms  x{r['x_roofline']:<6} "
          f"busy {r['gpu_busy_frac']:.2f}  k/layer {r['kernels_per_layer']:6.1f}  "
          f"syncs {r['host_syncs']}")
EOF
stamp done
if [ ${#FAILED[@]} -ne 0 ]; then
  echo "!! FAILED STAGES: ${FAILED[*]}"
  exit 1
fi
