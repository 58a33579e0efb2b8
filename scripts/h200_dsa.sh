#!/usr/bin/env bash
# DSA kernels on one H200 (issue 17): GPU tests of every sparse-MLA variant (serial v1, ws 64
# heads, pipelined with 128/256 threads) and of the indexer against the torch references, the dispatch rule's pick,
# then one benchmark: ours (rule pick and each schedule) vs the first generation (v1) vs SGLang
# 0.5.23's TileLang kernels, beside a bf16 matmul and a device copy measured in the same run.
#
#   OUT=/some/dir bash scripts/h200_dsa.sh
#
# Needs .devpack/tilelang.tar.xz and .devpack/fla.tar.xz (shared tools: devpack tilelang fla) and,
# for the SGLang peer, its kernel file .whl/sglang-0.5.23/tilelang_kernel.py (from the sglang
# 0.5.23 wheel: unzip -j sglang-0.5.23-*.whl sglang/kernels/ops/attention/dsa/tilelang_kernel.py).
# Budget ~4.5 min; every stage has its own limit, writes as it goes, and a failure or hang of one
# kernel variant costs only its own stage: the ws and 256-thread kernels are tested in their own
# processes and the benchmark drops a schedule whose tests failed. Files in $OUT: log.txt, status.txt,
# pytest_gpu.txt, dsa.jsonl (stamped rows). Exit status: non-zero if any stage failed.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
stamp() { echo "== $(date +%T) (+$((SECONDS))s) $*"; }
FAILED=0
status() {  # stage rc
  echo "$1 rc=$2" >> "$OUT/status.txt"
  if [ "$2" != 0 ]; then FAILED=1; echo "!! STAGE $1 FAILED rc=$2 (124 = time limit)"; fi
}

stamp install
SITE=$(mktemp -d)
for p in .devpack/tilelang*.tar.xz .devpack/fla*.tar.xz; do
  [ -f "$p" ] && tar -xJf "$p" -C "$SITE"
done
export PYTHONPATH=$SITE
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
if ! python3 -c "import torch, triton, tilelang; print(torch.__version__, triton.__version__,
tilelang.__version__, torch.cuda.get_device_name())"; then
  echo "FATAL: torch/triton/tilelang do not import (is .devpack/tilelang.tar.xz carried?)"
  status install 1; exit 1
fi
SGL=.whl/sglang-0.5.23/tilelang_kernel.py
if [ ! -f "$SGL" ]; then echo "WARNING: no $SGL: SGLang peer rows will carry an error"; fi

BENCH="python3 -m glmlab.bench.ops_dsa --quick --sglang $SGL"
stamp build  # our kernels and SGLang's, in parallel, into TileLang's disk cache
timeout 150 $BENCH --precompile-only --shapes 1056x16,128x16,8192x16,8192x64 &
P1=$!
timeout 150 $BENCH --warm-sglang-only --shapes 1056x16,128x16,8192x64 > "$OUT/sglang_warm.txt" 2>&1 &
P2=$!
wait $P1; status build $?
wait $P2; status build-sglang $?
cat "$OUT/sglang_warm.txt"; rm -f "$OUT/sglang_warm.txt"

gpu_tests() {  # name limit pytest-args...: one pytest process, its own log, its own limit
  local name=$1 limit=$2; shift 2
  echo "### $name: $*" > "$OUT/pytest_$name.txt"
  timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider "$@" >> "$OUT/pytest_$name.txt" 2>&1
}
collect() {  # name rc: append that process's log to pytest_gpu.txt, record its status
  cat "$OUT/pytest_$1.txt" >> "$OUT/pytest_gpu.txt"; tail -3 "$OUT/pytest_$1.txt"
  rm -f "$OUT/pytest_$1.txt"; status "tests-$1" "$2"
}
T=tests/kernels/dsa
stamp "tests: ws 64 heads | pipelined 16 heads 256 threads | the rest, side by side"
# The two round-2 variants run in their own processes with short limits: a hang (round 1's ws
# kernels hung) costs only its own stage. The rule's pick runs only measured, tested schedules.
gpu_tests ws64 50 $T/test_sparse_mla_tilelang.py -k "ws-b64-h64" & P1=$!
gpu_tests t256 50 $T/test_sparse_mla_tilelang.py -k "t256" & P2=$!
gpu_tests others 120 $T/test_sparse_mla_tilelang.py $T/test_indexer_triton.py \
  $T/test_backend_parity.py -k "not ws-b64 and not t256" & P3=$!
wait $P1; WS64=$?; wait $P2; T256=$?; wait $P3; OTHERS=$?
collect ws64 $WS64; collect t256 $T256; collect others $OTHERS

# A schedule whose tests failed is left out of the benchmark (a hang would take the run with it).
variants() {
  local v="rule,pipelined,v1,sglang"
  [ "$WS64" = 0 ] && v="$v,ws"
  [ "$T256" = 0 ] && v="$v,pipelined-t256"
  echo "$v"
}
bench() {  # name limit args...
  local name=$1 limit=$2; shift 2
  stamp "bench $name"
  timeout "$limit" $BENCH --out "$OUT" "$@"
  status "bench-$name" $?
}
bench decode-and-indexer 75 --shapes 1056x16,128x16 --variants "$(variants)"
bench prefill-64-heads 110 --shapes 8192x64,32768x64 --variants "$(variants)" --skip-indexer
bench prefill-16-heads 60 --shapes 8192x16 --variants "$(variants)" --skip-indexer
stamp "done; stages: $(tr '\n' ' ' < "$OUT/status.txt")"
exit $FAILED
