#!/usr/bin/env bash
# One H200 session for kernels/moe: GPU tests, routing capture + tuning, benchmark.
# Usage (repository root, on the GPU machine): OUT=/some/dir bash kernels/moe/h200_session.sh
# Writes under $OUT: log.txt, pytest_gpu.txt, slice4-layer3.safetensors (routing samples),
# moe_tune.jsonl, moe.jsonl, configs.tar (the tuned tables). Every stage has its own time limit so
# a slow stage cannot take the later ones with it; what finished is kept.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}
mkdir -p "$OUT/configs"
exec > >(tee -a "$OUT/log.txt") 2>&1
stamp() { echo "== $(date +%T) $*"; }

stamp install
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"

stamp gpu-tests
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/moe/test_moe_gpu.py \
  2>&1 | tail -25 | tee "$OUT/pytest_gpu.txt"

stamp capture-and-tune
SAMPLES="$OUT/slice4-layer3.safetensors"
timeout 150 python3 -m glmlab.cli tune moe --model slice:4 --capture-out "$SAMPLES" \
  --prompts 16 --chunk 256 --prefill-steps 4 --decode-steps 4 --experts 288,72 --space reduced \
  --routes 3 --heldout-routes 2 --tokens 1024,8192,1,128,768,4096,16,256,64 --time-budget-s 35 \
  --out "$OUT/configs" --report "$OUT/moe_tune.jsonl" --no-progress
if [ ! -f "$SAMPLES" ]; then  # no real routing: tune and benchmark on random gating instead
  stamp "capture failed: uniform routes"
  timeout 80 python3 -m glmlab.cli tune moe --samples uniform:288:8 --experts 288,72 \
    --space reduced --tokens 1024,8192,1,128,768,4096,16,256,64 --time-budget-s 25 \
    --out "$OUT/configs" --report "$OUT/moe_tune.jsonl" --no-progress
fi

stamp bench
timeout 100 python3 -m glmlab.bench.ops --op moe --out "$OUT" --samples "$SAMPLES" \
  --configs "$OUT/configs" --tokens 1024,8192,1,128,768,4096,16,256,64 --time-budget 55

stamp pack
tar cf "$OUT/configs.tar" -C "$OUT" configs && rm -r "$OUT/configs"
stamp done
