#!/usr/bin/env bash
# DSA kernels on one H200 (issue 17), round 3: GPU tests of the third-generation sparse-MLA
# kernels (ws1c: 16 heads, wspv: 64 heads; bf16, raw FP8 and 528 B FP8 rows) and of everything
# else against the torch references, the rule's pick at full width, then one benchmark: ours (the
# rule's pick and each ws1c form) vs the previous version (v2: the round-2 rule's pick; v1: the
# first generation) vs SGLang 0.5.23's TileLang kernels, and the indexer (new (row, head)-M
# scores kernel vs the round-2 kernel), beside a bf16 / fp8 matmul and a device copy measured in
# the same run.
#
#   OUT=/some/dir bash scripts/h200_dsa.sh
#
# Needs .devpack/tilelang.tar.xz (shared tools: devpack tilelang) and, for the SGLang peer, its
# kernel file .whl/sglang-0.5.23/tilelang_kernel.py (55 KB; from the sglang 0.5.23 wheel:
# unzip -j sglang-0.5.23-*.whl sglang/kernels/ops/attention/dsa/tilelang_kernel.py).
# Budget ~4 min; every stage has its own limit and writes as it goes. Each new schedule is tested
# in its own process (a hang costs only that stage); a schedule whose tests failed is left out
# of the benchmark and the rule falls back to the round-2 rule for it (--disable). Files in $OUT:
# log.txt, status.txt, pytest_gpu.txt, dsa.jsonl (stamped rows). Exit status: non-zero if any
# stage failed.
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
stamp build  # our kernels (run + test grid) and SGLang's, in parallel, into TileLang's disk cache
timeout 130 $BENCH --precompile-only --shapes 1056x16,128x16,8192x16,8192x64 &
P1=$!
timeout 130 $BENCH --warm-sglang-only --shapes 1056x16,128x16,8192x16,8192x64 \
  > "$OUT/sglang_warm.txt" 2>&1 &
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
  cat "$OUT/pytest_$1.txt" >> "$OUT/pytest_gpu.txt"; tail -4 "$OUT/pytest_$1.txt"
  rm -f "$OUT/pytest_$1.txt"; status "tests-$1" "$2"
}
T=tests/kernels/dsa
stamp "tests: ws1c (16 heads) | wspv (64 heads) | the rest, side by side"
# Test ids start with the schedule's name (the rule-pick tests carry the pick's name), so -k
# puts every run of a new kernel into its own process.
gpu_tests ws1c 70 $T/test_sparse_mla_tilelang.py -k "ws1c" & P1=$!
gpu_tests wspv 70 $T/test_sparse_mla_tilelang.py -k "wspv" & P2=$!
gpu_tests others 110 $T/test_sparse_mla_tilelang.py $T/test_indexer_triton.py \
  $T/test_backend_parity.py -k "not ws1c and not wspv" & P3=$!
wait $P1; WS1C=$?; wait $P2; WSPV=$?; wait $P3; OTHERS=$?
collect ws1c $WS1C; collect wspv $WSPV; collect others $OTHERS

# A schedule whose tests failed is left out of the benchmark and of the rule (a hang would take
# the run with it).
DISABLE=""
[ "$WS1C" != 0 ] && DISABLE="$DISABLE,ws1c"
[ "$WSPV" != 0 ] && DISABLE="$DISABLE,wspv"
DISABLE=${DISABLE#,}
variants() {  # extra...
  local v="rule,v2,sglang"
  [ "$WS1C" = 0 ] && v="$v,ws1c-s2,ws1c-s3,ws1c-s2-q4"
  echo "$v${1:+,$1}"
}
echo "disabled schedules: ${DISABLE:-none}"
bench() {  # name limit args...
  local name=$1 limit=$2; shift 2
  stamp "bench $name"
  timeout "$limit" $BENCH --out "$OUT" --disable "$DISABLE" "$@"
  status "bench-$name" $?
}
bench decode-and-indexer 80 --shapes 1056x16,128x16 --variants "$(variants v1)"
bench prefill-64-heads 90 --shapes 8192x64,32768x64 --variants "$(variants)" --skip-indexer
bench prefill-16-heads 50 --shapes 8192x16 --variants "$(variants)" --skip-indexer
stamp "done; stages: $(tr '\n' ' ' < "$OUT/status.txt")"
exit $FAILED
