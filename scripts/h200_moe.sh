#!/usr/bin/env bash
# One H200 session for issue 18 (block-FP8 MoE kernels, compared kernel to kernel), <= 5 minutes:
#   install -> parallel JIT warm-up of every kernel variant -> GPU correctness tests of every
#   kernel against kernels/moe/ref.py -> benchmark (glmlab.bench.ops_moe) -> warp-specialised
#   variants in their own process (a Triton compiler abort there cannot take the rest with it).
#
#   OUT=/some/dir bash scripts/h200_moe.sh
#
# Needs .whl/sglang-0.5.23-*.whl (git-ignored, carried) for the SGLang peer; without it the
# benchmark records the peer as missing and measures the rest. Writes under $OUT as it goes:
# log.txt, pytest_gpu.txt, moe_h200.jsonl, moe_h200_ws.jsonl (4 files). Every stage has its own
# time limit, so a slow stage cannot take the later ones with it.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
stamp() { echo "== $(date +%T) $*"; }
T0=$(date +%s)
left() { echo $(( 290 - ($(date +%s) - T0) )); }  # seconds of the 5 minutes still unspent

stamp install
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
ls -la .whl 2>/dev/null | tail -2

stamp warm-up "(compile every variant in 12 processes)"
timeout 75 python3 -c "
from glmlab.kernels.moe.warm import warm
print('workers ok:', warm(12, 2048, (8192, 1024, 64, 8, 1), (288, 72), 70))
" 2>&1 | grep -v '^$' | tail -30

stamp gpu-tests
timeout 75 python3 -m pytest -q -m gpu -p no:cacheprovider -rA \
  tests/kernels/moe/test_moe_gpu.py tests/kernels/moe/test_moe_grouped_gpu.py \
  > "$OUT/pytest_gpu.txt" 2>&1
tail -25 "$OUT/pytest_gpu.txt"

stamp "bench ($(left) s left)"
B=$(( $(left) - 45 )); [ "$B" -lt 40 ] && B=40
timeout $(( B + 40 )) python3 -m glmlab.bench.ops_moe --stream "$OUT/moe_h200.jsonl" \
  --ws without --time-budget "$B"
echo "rows: $(wc -l < "$OUT/moe_h200.jsonl" 2>/dev/null)"

stamp "bench warp-specialised ($(left) s left)"
W=$(left); [ "$W" -gt 10 ] && timeout "$W" python3 -m glmlab.bench.ops_moe \
  --stream "$OUT/moe_h200_ws.jsonl" --ws only --tokens 8192,1024 --time-budget $(( W - 10 ))
stamp done
