#!/usr/bin/env bash
# Issue 9 on eight H200s (kind nvidia-h200-x8): 1P1D, one prefill instance on cuda:0-3 (TP4) and one
# decode instance on cuda:4-7 (TP4/EP4), NIXL WRITE between them (UCX cuda_ipc), sglang-router in
# front; glmlab bench drives 64K/1K generated-shared-prefix workloads at 0%, 50% and 93.75% shared
# prefix under the reference deployment's limits (mean TTFT < 6 s, TPOT < 25 ms).
#
#   OUT=/dir bash scripts/h200x8_pd_1p1d.sh     (carry .pdpack (nixl devpack), .whl (serving wheels),
#                                                .devpack (fla, tilelang))
#
# Each worker is one process per rank: rank 0 owns the HTTP endpoint and the scheduler, ranks 1-3
# follow it in lockstep (glmlab.serve.ranks), NCCL between a worker's ranks. Prefill rank r
# WRITEs its own KV / KDA-state shard (and its copy of the replicated latent rows) into decode rank
# r; decode's leader admits a request only when every rank's transfer has landed. Decode
# speculates with DFlash2 block 8 (a random draft, so acceptance is simulated at the reference
# deployment's 7.03; prefill's drafter learns each prompt and its draft KV crosses with the pages).
# FP8 weights are kept (TP4 splits them on 128-wide blocks) with the fast backends. Each rank loads
# the whole slice checkpoint (slice:12, ~80 GB FP8) before sharding; full size needs serve to draw
# random shards in place (glmlab.distributed.random_shard), not offered yet.
set -u
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=/tmp/glmcache FLA_TILELANG=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:?set OUT}
MODEL=${MODEL:-/tmp/slice12}
NUM_PROMPTS=${NUM_PROMPTS:-64}
exec > >(tee -a "$OUT/log.txt") 2>&1
stamp() { echo "== $(date +%T) $*"; }

stamp install
SITE=$(mktemp -d); tar -xJf .pdpack/nixl.tar.xz -C "$SITE"
for p in .devpack/*.tar.xz; do tar -xJf "$p" -C "$SITE"; done
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
python3 -c "import nixl_cu13, fastapi, uvicorn, sglang_router, torch; print(torch.cuda.device_count(), 'GPUs')"
df -h /tmp | tail -1

stamp write-checkpoint
[ -f "$MODEL/config.json" ] || timeout 400 python3 -m glmlab.cli init-checkpoint --preset slice:12 \
  --fp8 --device cuda --out "$MODEL" --max-shard-gb 4 | tail -1
du -sh "$MODEL"

DRAFT=${DRAFT:-$MODEL-dflash2-b8}
[ -f "$DRAFT/config.json" ] || python3 -m glmlab.cli init-checkpoint --draft dflash2 \
  --target "$MODEL" --out "$DRAFT" --block-size 8 | tail -1
# every role: bf16 compute on FP8 weights kept, fast kernels; then per-role pools and chunking
ENGINE="--dtype bf16 --fp8-weights keep --backends-kda fla --backends-sparse-mla tilelang \
  --backends-moe triton --context-len 66560 --page-size 64 --kv-dtype fp8 --index-dtype fp8 \
  --state-dtype bf16 --mem-fraction 0.92 \
  --prefill-radix kv_and_state --decode-radix kv_only --prefill-chunk-size 32768 \
  --prefill-max-prefill-tokens 32768 --prefill-max-num-batched-tokens 32768"
SPEC="--decode-speculative-algorithm dflash2 --decode-speculative-block-size 8 \
  --decode-speculative-draft-path $DRAFT --decode-speculative-simulate-accept-len 7.03"

stamp serve-1p1d
# shellcheck disable=SC2086
python3 -m glmlab.cli serve --model "$MODEL" --num-prefill 1 --num-decode 1 \
  --prefill-devices cuda:0 --prefill-tp 4 --prefill-ep 1 \
  --decode-devices cuda:4 --decode-tp 4 --decode-ep 4 $SPEC \
  --transfer-ucx-tls cuda_copy,cuda_ipc,self,sm,tcp --transfer-transfer-timeout-s 300 \
  --startup-timeout-s 500 --request-timeout-s 1800 --log-dir "$OUT/serve_logs" $ENGINE &
SERVE=$!
for i in $(seq 1 260); do
  curl -sf http://127.0.0.1:30000/readiness >/dev/null 2>&1 && break
  kill -0 $SERVE 2>/dev/null || break; sleep 2
done
curl -s http://127.0.0.1:30000/readiness; echo
for W in 31000 31500; do  # tp/ep, speculation, backends and pools as each leader serves them
  curl -s -m 60 "http://127.0.0.1:$W/server_info" > "$OUT/server_info-$W.json" || true
  python3 -c "import json,sys; i=json.load(open(sys.argv[1])); print(i['role'], 'tp', \
i['tp_size'], 'ep', i['ep_size'], i['engine']['backends'], i['engine']['speculative'], \
i['leak_check'])" "$OUT/server_info-$W.json" || true
done

# The reference deployment's three 3P1D workloads, one prefill instance here: 64K/1K, shared prefix 0%, 50%,
# 93.75% (system prompt 0 / 32,768 / 61,440 tokens + question), concurrency from the SLO search.
for SHARE in 0 32768 61440; do
  stamp "bench shared prefix $SHARE"
  timeout 900 python3 -m glmlab.cli bench --port 30000 --dataset-name generated-shared-prefix \
    --gsp-num-groups 1 --gsp-prompts-per-group "$NUM_PROMPTS" --gsp-system-prompt-len "$SHARE" \
    --gsp-question-len $((65536 - SHARE)) --gsp-output-len 1024 --tokenize-prompt \
    --warmup-requests 2 --seed 42 --slo-ttft-ms 6000 --slo-tpot-ms 25 --slo-max-concurrency 256 \
    --tag "h200x8-1p1d-share$SHARE" --output-file "$OUT/serve-h200x8-1p1d.jsonl"
  for W in 31000 31500; do  # per-request bootstrap / transfer / first-token timelines
    curl -s -m 30 "http://127.0.0.1:$W/pd_trace" > "$OUT/pd_trace-$W-share$SHARE.json" || true
  done
done

stamp stop
kill -INT $SERVE; wait $SERVE; echo "serve exit $?"
tail -5 "$OUT"/serve_logs/*.log 2>/dev/null
stamp done
