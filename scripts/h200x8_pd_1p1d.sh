#!/usr/bin/env bash
# Issue 9 on eight H200s (kind nvidia-h200-x8): 1P1D, one prefill instance on cuda:0-3 (TP4) and one
# decode instance on cuda:4-7 (TP4/EP4), NIXL WRITE between them (UCX cuda_ipc), sglang-router in
# front; glmlab bench drives 64K/1K generated-shared-prefix workloads at 0%, 50% and 93.75% shared
# prefix under the reference deployment's limits (mean TTFT < 6 s, TPOT < 25 ms).
#
#   OUT=/dir bash scripts/h200x8_pd_1p1d.sh     (carry .pdpack (nixl devpack), .whl (serving wheels),
#                                                .devpack (fla, tilelang))
#
# NOT RUNNABLE YET, and on purpose exact about why: `glmlab serve` refuses tp/ep sizes > 1 at start
# (serve/supervisor.py), because a TP instance needs (1) one process per rank with the worker as
# rank 0 driving glmlab.distributed.engine_tp.LeaderEngine and the others `follow`ing it, and (2) a NIXL
# agent per rank: prefill rank r writes its own KDA-state shard (and its copy of the replicated
# latent rows) into decode rank r, and decode rank 0 may complete an import only when every rank's
# transfer has landed. Full size also needs serve to draw random shards in place (weights ~320 GB:
# no disk here holds them, see glmlab.distributed.random_shard); until then MODEL is a slice checkpoint
# (slice:12, ~80 GB FP8, loaded whole by each rank before sharding). serve also does not yet offer
# backend choice (workers run the torch ops) or speculation on PD decode (draft state is not
# shipped over NIXL): the flags for those are the ones marked "(not offered yet)" below.
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

ENGINE="--prefill-context-len 66560 --decode-context-len 66560 --prefill-page-size 64 \
  --decode-page-size 64 --prefill-kv-dtype fp8 --decode-kv-dtype fp8 --prefill-index-dtype fp8 \
  --decode-index-dtype fp8 --prefill-state-dtype bf16 --decode-state-dtype bf16 \
  --prefill-radix kv_and_state --decode-radix kv_only --prefill-chunk-size 32768 \
  --prefill-max-prefill-tokens 32768 --prefill-max-num-batched-tokens 32768 \
  --prefill-mem-fraction 0.92 --decode-mem-fraction 0.92"
# (not offered yet) --prefill-backends-kda fla --prefill-backends-sparse-mla tilelang
#   --prefill-backends-moe triton, the same for --decode-*, and --decode-speculative-algorithm
#   dflash2 --decode-speculative-block-size 8 --decode-speculative-simulate-accept-len 7.03

stamp serve-1p1d
# shellcheck disable=SC2086
python3 -m glmlab.cli serve --model "$MODEL" --num-prefill 1 --num-decode 1 \
  --prefill-devices cuda:0 --prefill-tp-size 4 --prefill-ep-size 1 \
  --decode-devices cuda:4 --decode-tp-size 4 --decode-ep-size 4 \
  --transfer-ucx-tls cuda_copy,cuda_ipc,self,sm,tcp --transfer-transfer-timeout-s 300 \
  --startup-timeout-s 500 --request-timeout-s 1800 --log-dir "$OUT/serve_logs" $ENGINE &
SERVE=$!
for i in $(seq 1 260); do
  curl -sf http://127.0.0.1:30000/readiness >/dev/null 2>&1 && break
  kill -0 $SERVE 2>/dev/null || break; sleep 2
done
curl -s http://127.0.0.1:30000/readiness; echo

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
