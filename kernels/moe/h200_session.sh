#!/usr/bin/env bash
# H200 session for kernels/moe: GPU tests, routing capture + tuning, benchmark.
#
#   OUT=/some/dir bash kernels/moe/h200_session.sh full    # capture slice:4 routing, tune, bench
#   OUT=/some/dir bash kernels/moe/h200_session.sh rerun   # committed samples + tables, bench
#
# full: capture routing from a real-width slice (1 MoE layer, 288 experts), tune E=288 and E=72
# (EP4 rank 0) over the reduced space for 9 token counts, refine M=1024 and M=8192 of E=288 over the
# wide space, benchmark. rerun: the same refinement on the committed samples/tables, then the
# benchmark. Writes under $OUT: log.txt, pytest_gpu.txt, moe_tune.jsonl, moe.jsonl, configs.tar
# (+ slice4-layer3.safetensors in full mode). Each stage has its own time limit, so a slow stage
# cannot take the later ones with it; what finished is kept.
set -u
export PYTHONUNBUFFERED=1
MODE=${1:-full}
OUT=${OUT:?set OUT}
mkdir -p "$OUT/configs"
exec > >(tee -a "$OUT/log.txt") 2>&1
stamp() { echo "== $(date +%T) $*"; }
TOKENS=1024,8192,1,128,768,4096,16,256,64

stamp "install ($MODE)"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"

stamp gpu-tests
timeout 75 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/moe/test_moe_gpu.py \
  > "$OUT/pytest_gpu.txt" 2>&1
tail -40 "$OUT/pytest_gpu.txt"

if [ "$MODE" = full ]; then
  stamp capture-and-tune
  SAMPLES="$OUT/slice4-layer3.safetensors"
  timeout 150 python3 -m glmlab.cli tune moe --model slice:4 --capture-out "$SAMPLES" \
    --prompts 16 --chunk 256 --prefill-steps 4 --decode-steps 4 --experts 288,72 \
    --space reduced --routes 3 --heldout-routes 2 --tokens $TOKENS --time-budget-s 35 \
    --out "$OUT/configs" --report "$OUT/moe_tune.jsonl" --no-progress
  if [ ! -f "$SAMPLES" ]; then  # no real routing: tune and benchmark on random gating instead
    stamp "capture failed: uniform routes"
    SAMPLES=uniform:288:8
    timeout 80 python3 -m glmlab.cli tune moe --samples $SAMPLES --experts 288,72 \
      --space reduced --tokens $TOKENS --time-budget-s 25 \
      --out "$OUT/configs" --report "$OUT/moe_tune.jsonl" --no-progress
  fi
else
  SAMPLES=data/routing/slice4-layer3.safetensors
  cp kernels/moe/configs/moe-*-NVIDIA_H200.json "$OUT/configs/"
fi

stamp refine-wide
timeout 110 python3 -m glmlab.cli tune moe --samples "$SAMPLES" --experts 288 --space wide \
  --routes 3 --heldout-routes 2 --tokens 1024,8192 --time-budget-s 60 --update --out "$OUT/configs" \
  --report "$OUT/moe_tune.jsonl" --no-progress

stamp bench
timeout 100 python3 -m glmlab.bench.ops --op moe --out "$OUT" --samples "$SAMPLES" \
  --configs "$OUT/configs" --tokens $TOKENS --time-budget 55

stamp pack
tar cf "$OUT/configs.tar" -C "$OUT" configs && rm -r "$OUT/configs"
stamp done
