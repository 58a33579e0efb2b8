#!/usr/bin/env bash
# 1P1D on two H200s with a real-width slice: prefill on cuda:0, decode on cuda:1, NIXL WRITE over
# UCX cuda_ipc between the two worker processes, sglang-router in PD mode in front. Checks that the
# service returns the same greedy tokens as a one-GPU engine, then runs a small shared-prefix bench.
#
#   OUT=/dir bash scripts/h200x2_pd_slice.sh     (carry .pdpack (nixl devpack) and .whl (serving wheels))
set -u
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=/tmp/glmcache
OUT=${OUT:?set OUT}
exec > >(tee -a "$OUT/log.txt") 2>&1
stamp() { echo "== $(date +%T) $*"; }

stamp install
SITE=$(mktemp -d); tar -xJf .pdpack/nixl.tar.xz -C "$SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
python3 -c "import nixl_cu13, fastapi, uvicorn, sglang_router, torch; print(torch.cuda.device_count(), 'GPUs')"

stamp write-slice
[ -f /tmp/slice4/config.json ] || timeout 150 python3 -m glmlab.cli init-checkpoint --preset slice:4 --fp8 --device cuda \
  --out /tmp/slice4 --max-shard-gb 4 | tail -1
IDS=$(python3 -c "print(','.join(str((i * 37 + 11) % 256) for i in range(300)))")

stamp one-gpu-reference
[ -s "$OUT/reference.json" ] || timeout 150 python3 -m glmlab.cli generate --model /tmp/slice4 --device cuda:0 --dtype bf16 \
  --prompt-ids "$IDS" --max-new-tokens 16 --ignore-eos --json --context-len 4096 \
  --cache-bytes 8000000000 > "$OUT/reference.json"; cat "$OUT/reference.json"

stamp serve-1p1d
python3 -m glmlab.cli serve --model /tmp/slice4 --prefill-devices cuda:0 --decode-devices cuda:1 \
  --transfer-ucx-tls cuda_copy,cuda_ipc,self,sm,tcp --startup-timeout-s 280 \
  --log-dir "$OUT/serve_logs" --prefill-context-len 4096 --decode-context-len 4096 \
  --prefill-cache-bytes 8000000000 --decode-cache-bytes 8000000000 --decode-radix kv_only &
SERVE=$!
for i in $(seq 1 140); do
  curl -sf http://127.0.0.1:30000/readiness >/dev/null 2>&1 && break; sleep 2
done
curl -s http://127.0.0.1:30000/readiness; echo
stamp pd-generate
curl -s -m 120 http://127.0.0.1:30000/generate -H 'content-type: application/json' \
  -d "{\"input_ids\": [$IDS], \"sampling_params\": {\"max_new_tokens\": 16, \"temperature\": 0, \"ignore_eos\": true}}" \
  > "$OUT/pd.json"; head -c 600 "$OUT/pd.json"; echo
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
ref = json.load(open(f"{out}/reference.json"))["output_ids"]
pd = json.load(open(f"{out}/pd.json")).get("output_ids")
print({"reference": ref, "pd": pd, "identical": ref == pd})
PY
stamp bench
timeout 200 python3 -m glmlab.cli bench --port 30000 --dataset-name generated-shared-prefix \
  --gsp-num-groups 2 --gsp-prompts-per-group 8 --gsp-system-prompt-len 1024 \
  --gsp-question-len 256 --gsp-output-len 32 --max-concurrency 8 --warmup-requests 2 \
  --seed 42 --tag h200x2-slice4-1p1d --output-file "$OUT/serve-h200x2.jsonl"
stamp stop
kill -INT $SERVE; wait $SERVE; echo "serve exit $?"
tail -5 "$OUT"/serve_logs/*.log 2>/dev/null
stamp done
