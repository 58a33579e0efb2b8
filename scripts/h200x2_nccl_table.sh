#!/usr/bin/env bash
# The comm model's table measured on two H200s (kind nvidia-h200-x2, NVLink multicast off): NCCL
# all-reduce / all-gather / reduce-scatter from 4 KiB to 1 GiB, eager and replayed from a CUDA
# graph (how a decode step issues them). ~2 minutes.
#
#   GLMLAB_GIT_COMMIT=$(git rev-parse HEAD) GLMLAB_GIT_DIRTY=0 OUT=/dir bash scripts/h200x2_nccl_table.sh
#   REHEARSE=1 OUT=/dir bash scripts/h200x2_nccl_table.sh      # 2 gloo ranks on the CPU, 3 sizes
#
# Rows: $OUT/comm-h200x2.jsonl (copy to data/bench/; glmlab.distributed.comm_table.CommTable.from_file
# puts its 2-rank curves over the published ones). Log: $OUT/log-nccl.txt. Nothing to carry: the
# benchmark needs torch only.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log-nccl.txt") 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
PY=${PY:-python3}
if [ "${REHEARSE:-0}" = 1 ]; then
  ARGS="--backend gloo --min-bytes 4096 --max-bytes 16384 --reps 3 --tag cpu-rehearsal"
else
  if [ ! -d .git ] && [ -z "${GLMLAB_GIT_COMMIT:-}" ]; then
    echo "set GLMLAB_GIT_COMMIT (and GLMLAB_GIT_DIRTY) to the commit this tree was copied from"
    exit 2
  fi
  $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
  ARGS="--ranks 2 --graph --min-bytes 4096 --max-bytes 1073741824 --tag h200x2"
fi
timeout 300 $PY -m glmlab.bench.ops --op comm --out "$OUT" $ARGS
