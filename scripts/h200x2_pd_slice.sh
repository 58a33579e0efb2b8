#!/usr/bin/env bash
# 1P1D on two H200s (kind nvidia-h200-x2) with speculation on decode: a real-width slice:4 FP8
# checkpoint, prefill on cuda:0, decode on cuda:1, NIXL WRITE over UCX cuda_ipc between the two
# worker processes; FP8 weights kept, backends fla / tilelang / triton (as h200_serve_fast.sh).
# For each drafter (MTP: the checkpoint's MTP layer; DFlash2: a random block-8 draft written by
# `glmlab init-checkpoint --draft dflash2`) the service is started with --speculative-* flags
# (prefill's drafter learns each prompt, decode adopts the hand-off rows and verifies from its
# first step), and for every prompt the script checks:
#   - greedy tokens equal `glmlab generate` on one GPU without speculation and with it;
#   - decode's acceptance per cycle for that prompt (from /server_info: spec_accept_length x
#     spec_verified_requests before and after) equals what `glmlab generate` measured for it
#     (same drafts, so the drafter state crossed whole);
#   - both workers' leak check is "ok" afterwards.
# Requests are paired the way sglang-router pairs them (one bootstrap_room to both workers), so no
# router wheel is needed on the GPU machine.
#
#   OUT=/dir bash scripts/h200x2_pd_slice.sh            carry .devpack: fla, tilelang, nixl and
#                                                       serve (fastapi, uvicorn, httpx, pydantic,
#                                                       prometheus_client, ...), as h200_serve_fast
#   REHEARSE=1 OUT=/dir bash scripts/h200x2_pd_slice.sh the same steps on the CPU (tiny model,
#                                                       torch ops, UCX over TCP)
# Stages skip when their result is already in $WORK, so a run cut by the 10-minute limit continues
# where it stopped when started again; $WORK is copied to $OUT when the script exits.
set -u
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=/tmp/glmcache FLA_TILELANG=0
OUT=${OUT:?set OUT}; mkdir -p "$OUT"
REHEARSE=${REHEARSE:-0}
WORK=${WORK:-/tmp/glmlab-pd-spec$([ "$REHEARSE" = 1 ] && echo -rehearsal)}; mkdir -p "$WORK"
save() { cp -r "$WORK/." "$OUT/" 2>/dev/null || true; }
trap save EXIT
trap 'save; exit 143' TERM INT
exec > >(tee -a "$WORK/log.txt") 2>&1
stamp() { save; echo "== $(date +%T) $*"; }

if [ "$REHEARSE" = 1 ]; then
  PY=${PY:-.venv/bin/python}; P_DEV=cpu; D_DEV=cpu; CKPT=/tmp/glmlab-pd-spec-tiny
  ENGINE="--page-size 16 --context-len 1024 --cache-bytes 64000000"
  UCX="tcp,self"; N_NEW=8; LENS=${LENS:-"37 90"}; START_S=240; BLOCK=4; STEPS=3
else
  PY=python3; P_DEV=cuda:0; D_DEV=cuda:1; CKPT=/tmp/slice4
  ENGINE="--dtype bf16 --fp8-weights keep --backends-kda fla --backends-sparse-mla tilelang
          --backends-moe triton --context-len 4096 --cache-bytes 8000000000"
  UCX="cuda_copy,cuda_ipc,self,sm,tcp"; N_NEW=16; LENS=${LENS:-"37 300 1200"}; START_S=280
  BLOCK=8; STEPS=7  # the reference deployment's DFlash2 block 8; MTP718
fi
ENGINE=$(echo $ENGINE)
DRAFT="$CKPT-dflash2-b$BLOCK"
GLMLAB="$PY -m glmlab.cli"
declare -A SPEC=(
  [mtp]="--speculative-algorithm mtp --speculative-num-steps $STEPS"
  [dflash2]="--speculative-algorithm dflash2 --speculative-block-size $BLOCK --speculative-draft-path $DRAFT"
)

stamp install
if [ "$REHEARSE" != 1 ]; then
  SITE=$(mktemp -d); for p in .devpack/*.tar.xz; do tar -xJf "$p" -C "$SITE"; done
  export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
fi
$PY -c "import torch, fastapi, uvicorn, httpx, nixl_cu13; print('torch', torch.__version__, \
  torch.cuda.device_count(), 'GPUs')" || exit 1

stamp write-checkpoints
if [ ! -f "$CKPT/config.json" ]; then
  if [ "$REHEARSE" = 1 ]; then
    $GLMLAB init-checkpoint --preset tiny --out "$CKPT" | tail -1
  else
    timeout 150 $GLMLAB init-checkpoint --preset slice:4 --fp8 --device cuda --out "$CKPT" \
      --max-shard-gb 4 | tail -1
  fi
fi
[ -f "$DRAFT/config.json" ] || $GLMLAB init-checkpoint --draft dflash2 --target "$CKPT" \
  --out "$DRAFT" --block-size $BLOCK | tail -1
du -sh "$CKPT" "$DRAFT"

prompt_ids() { $PY -c "import sys; n=int(sys.argv[1]); print(','.join(str((i*37+n*11) % 251) for i in range(n)))" "$1"; }

stamp generate-reference "flags: $ENGINE"
for algo in plain mtp dflash2; do
  for n in $LENS; do
    f="$WORK/generate_${algo}_$n.json"
    [ -s "$f" ] && continue
    extra=$([ $algo = plain ] || echo "${SPEC[$algo]}")
    # shellcheck disable=SC2086
    timeout 240 $GLMLAB generate --model "$CKPT" --device "$P_DEV" $ENGINE $extra \
      --prompt-ids "$(prompt_ids $n)" --max-new-tokens $N_NEW --ignore-eos --json > "$f.raw" \
      || { echo "generate $algo $n failed"; continue; }
    grep '^{' "$f.raw" | tail -n 1 > "$f" && rm -f "$f.raw"  # TileLang logs on stdout too
    head -c 400 "$f"; echo
  done
done

# $1: mtp or dflash2. 1P1D without the router, speculation on decode; check.py pairs requests.
serve_and_check() {
  local algo=$1 logs="$WORK/serve_$1_logs"
  [ -s "$WORK/check_$algo.json" ] && { echo "check_$algo.json exists"; return; }
  # shellcheck disable=SC2086
  $GLMLAB serve --model "$CKPT" --mode pd --no-launch-router --prefill-ports 31000 \
    --bootstrap-ports 8998 --decode-ports 31500 --prefill-devices "$P_DEV" \
    --decode-devices "$D_DEV" --transfer-ucx-tls "$UCX" $ENGINE ${SPEC[$algo]} \
    --log-dir "$logs" --startup-timeout-s $START_S &
  local pid=$!
  for u in http://127.0.0.1:31000 http://127.0.0.1:31500; do
    for _ in $(seq 1 $START_S); do curl -sf "$u/health" >/dev/null 2>&1 && break; sleep 1; done
  done
  timeout 300 $PY - "$algo" "$WORK" "$LENS" "$N_NEW" <<'PY' || echo "check $algo failed"
import json, pathlib, random, sys, threading, urllib.request
algo, out, lens, n_new = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4])
P, D = "http://127.0.0.1:31000", "http://127.0.0.1:31500"

def call(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=250) as r:
        return json.loads(r.read())

def decode_state():
    s = call(f"{D}/server_info")["internal_states"][0]
    return s.get("spec_accept_length", 0.0) * s.get("spec_verified_requests", 0), \
        s.get("spec_verified_requests", 0), s.get("spec_cycles", 0)

def served(ids):  # what sglang-router does in PD mode: one room, the same request to both
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n_new, "temperature": 0,
                                                  "ignore_eos": True},
            "bootstrap_host": "127.0.0.1", "bootstrap_port": 8998,
            "bootstrap_room": random.getrandbits(63)}
    got = {}
    side = threading.Thread(target=lambda: got.update(p=call(f"{P}/generate", body)))
    side.start()
    got["d"] = call(f"{D}/generate", body)
    side.join()
    return got["d"]

rows = []
for n in lens:
    ids = [(i * 37 + int(n) * 11) % 251 for i in range(int(n))]
    plain = json.loads((out / f"generate_plain_{n}.json").read_text())
    spec = json.loads((out / f"generate_{algo}_{n}.json").read_text())
    c0, v0, k0 = decode_state()
    res = served(ids)
    c1, v1, k1 = decode_state()
    accept = (c1 - c0) / max(1, v1 - v0)
    ref_accept = spec["spec"]["accepted_per_cycle"]
    rows.append({"prompt_len": int(n), "served": res["output_ids"],
                 "equal_plain": res["output_ids"] == plain["output_ids"],
                 "equal_spec_generate": res["output_ids"] == spec["output_ids"],
                 "cycles": k1 - k0, "generate_cycles": spec["spec"]["cycles"],
                 "accept_len": accept, "generate_accept_len": ref_accept,
                 "accept_equal": abs(accept - ref_accept) < 1e-6 and k1 - k0 == spec["spec"]["cycles"],
                 "pd_transfer": res["meta_info"].get("pd_transfer")})
    print(json.dumps(rows[-1]))
leaks = {u: call(f"{u}/server_info")["leak_check"] for u in (P, D)}
info = call(f"{D}/server_info")
result = {"algo": algo, "identical": all(r["equal_plain"] and r["equal_spec_generate"] for r in rows),
          "acceptance_matches_generate": all(r["accept_equal"] for r in rows),
          "leak_check": leaks, "decode_speculative": info["engine"]["speculative"],
          "decode_backends": info["engine"]["backends"], "prompts": rows}
(out / f"check_{algo}.json").write_text(json.dumps(result, indent=1))
print(json.dumps({k: result[k] for k in ("algo", "identical", "acceptance_matches_generate",
                                         "leak_check")}))
PY
  kill -INT $pid; wait $pid; echo "serve $algo exit $?"
  tail -n 5 "$logs"/*.log 2>/dev/null
}

for algo in mtp dflash2; do
  stamp "serve-pd-$algo"
  serve_and_check $algo
done

stamp summary
$PY - "$WORK" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("check_*.json"))}
summary = {k: {key: v[key] for key in ("identical", "acceptance_matches_generate", "leak_check")}
           for k, v in rows.items()}
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary))
PY
stamp done
