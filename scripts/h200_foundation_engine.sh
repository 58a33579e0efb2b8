#!/usr/bin/env bash
# One H200 session for the model, engine and speculative pieces: GPU tests, a real-width slice
# (slice:4, FP8 layout) written and loaded through the real checkpoint code, model-level timings
# per backend, an offline engine run, and the speculative cycle benchmark.
#
#   OUT=/some/dir bash scripts/h200_foundation_engine.sh
#
# Needs .devpack/{fla,tilelang}.tar.xz (bash scripts/devpack.sh fla tilelang). Each stage has its own
# time limit so a slow stage cannot take the later ones with it; results land under $OUT.
set -u
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=/tmp/glmcache FLA_TILELANG=0
OUT=${OUT:?set OUT}
exec > >(tee -a "$OUT/log.txt") 2>&1
stamp() { echo "== $(date +%T) $*"; }

stamp install
SITE=$(mktemp -d); for p in .devpack/*.tar.xz; do tar -xJf "$p" -C "$SITE"; done
export PYTHONPATH=$SITE
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
python3 -c "import torch, triton, fla, tilelang; print(torch.__version__, triton.__version__)"

stamp gpu-tests
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/model tests/kernels/kda \
  tests/engine tests/speculative > "$OUT/pytest_gpu.txt" 2>&1
tail -25 "$OUT/pytest_gpu.txt"

stamp write-slice
timeout 150 python3 -m glmlab.cli init-checkpoint --preset slice:4 --fp8 --device cuda \
  --out /tmp/slice4 --max-shard-gb 4
du -sh /tmp/slice4

stamp model-bench
timeout 150 python3 -m glmlab.bench.ops --op model --out "$OUT" --model /tmp/slice4 \
  --device cuda --dtype bf16 --backends torch,fla --prefill-lens 1024,4096 \
  --decode-batches 1,16,64 --decode-steps 5

stamp engine-bench
timeout 150 python3 -m glmlab.bench.engine --model /tmp/slice4 --device cuda --dtype bf16 \
  --fp8-weights keep --num-prompts 32 --input-len 1024 --output-len 32 --warmup 2 \
  --backends-kda fla --backends-sparse-mla tilelang --backends-moe triton --out "$OUT"

stamp spec-bench
timeout 200 python3 -m glmlab.bench.spec --preset /tmp/slice4 --fp8-weights keep --device cuda \
  --dtype bf16 --batch 8 --context 1024 --tag h200-slice4 \
  --width 8 --cycles 6 --warmup 2 --passes 2 --backends-kda fla --backends-sparse-mla tilelang \
  --backends-moe triton --out "$OUT"
stamp done
