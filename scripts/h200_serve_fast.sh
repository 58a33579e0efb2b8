#!/usr/bin/env bash
# glmlab serve on one H200 on the fast path: a real-width slice:4 FP8 checkpoint, FP8 weights kept
# for the block-FP8 kernels, backends fla (KDA) / tilelang (sparse MLA) / triton (MoE). Reads each
# worker's /server_info (it must show those), sends greedy prompts and compares their tokens with
# `glmlab generate` run with the same engine flags; then the same through 1P1D (prefill and decode
# workers on the one GPU, NIXL between them), paired by this script the way sglang-router pairs
# them (the router is not on the GPU machine: its wheel, ~30 MB, does not fit in the carry budget
# next to fla + tilelang + nixl).
#
#   OUT=/dir bash scripts/h200_serve_fast.sh            carry .devpack: fla, tilelang, nixl and
#                                                       serve (fastapi, uvicorn, httpx, pydantic,
#                                                       prometheus_client and their dependencies)
#   REHEARSE=1 OUT=/dir bash scripts/h200_serve_fast.sh the same steps on the CPU: a tiny FP8
#                                                       checkpoint (MoE width one FP8 block), torch
#                                                       ops, UCX over TCP; proves the script runs
# Every stage has its own time limit and skips when its result is already in $WORK (on the machine,
# kept while it stays warm), so a run cut short by the 10-minute limit continues where it stopped
# when started again; whatever is in $WORK is copied to $OUT when the script exits.
set -u
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=/tmp/glmcache FLA_TILELANG=0
# NOTE: a mixed or prefill worker's radix mode (kv_and_state) ends a prefill chunk at the prompt's
# last page boundary, so that the state there can be cached; `glmlab generate` (radix off) computes
# the prompt in one chunk. Other chunk boundaries are other fp32 summation orders, and on random
# real-width weights a logit near-tie then flips a greedy token some steps in (seen on the H200:
# 300 prompt tokens = 256 + 44 in the service, 300 in generate; 37 tokens, one chunk in both,
# matched). "The same flags" therefore includes --radix kv_and_state on both sides.
# NOTE: fla's Triton kernels pick their tile configs by timing them, so two processes can run
# different configs (other fp32 summation orders), and on random real-width weights a logit
# near-tie then flips a greedy token some steps in (seen on the H200 at 300 prompt tokens). With
# the autotuner's choices cached on disk, the first process's choice is every later one's.
export TRITON_CACHE_AUTOTUNING=1
OUT=${OUT:?set OUT}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/glmlab-serve-fast$([ "${REHEARSE:-0}" = 1 ] && echo -rehearsal)}; mkdir -p "$WORK"
save() { cp -r "$WORK/." "$OUT/" 2>/dev/null || true; }
trap save EXIT
trap 'save; exit 143' TERM INT
exec > >(tee -a "$WORK/log.txt") 2>&1
stamp() { save; echo "== $(date +%T) $*"; }
REHEARSE=${REHEARSE:-0}

if [ "$REHEARSE" = 1 ]; then
  PY=${PY:-.venv/bin/python}; DEV=cpu; CKPT=/tmp/glmlab-serve-fast-tiny-fp8
  ENGINE="--dtype bf16 --fp8-weights keep --page-size 16 --context-len 1024 --cache-bytes 64000000
          --radix kv_and_state"
  UCX="tcp,self"; N_NEW=8; LENS="37 90 200"; START_S=240
else
  PY=python3; DEV=cuda:0; CKPT=/tmp/slice4
  # every op on its GPU kernel (Backends.fast()): CUDA graphs of decode steps in both processes
  ENGINE="--dtype bf16 --fp8-weights keep --backends-kda fla --backends-sparse-mla tilelang
          --backends-moe triton --backends-linear-fp8 triton --backends-norm triton
          --backends-mhc triton --backends-router triton --backends-kda-step triton
          --backends-dsa-index triton --cuda-graph-max-bs 8 --context-len 4096
          --cache-bytes 8000000000 --radix kv_and_state"
  UCX="cuda_copy,cuda_ipc,self,sm,tcp"; N_NEW=16; LENS=${LENS:-"37 300 1200"}; START_S=280
fi
ENGINE=$(echo $ENGINE)  # one line, for the logs
GLMLAB="$PY -m glmlab.cli"

stamp install
if [ "$REHEARSE" != 1 ] && [ -z "${GLMLAB_INSTALLED:-}" ]; then  # a caller may have installed
  SITE=$(mktemp -d); for p in .devpack/*.tar.xz; do tar -xJf "$p" -C "$SITE"; done
  export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
fi
if [ "$REHEARSE" != 1 ]; then
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
fi
$PY - <<'PY'
import importlib
need = ["torch", "fastapi", "uvicorn", "httpx", "pydantic", "prometheus_client", "tokenizers"]
optional = ["fla", "tilelang", "nixl_cu13", "sglang_router"]
missing = []
for name in need + optional:
    try:
        importlib.import_module(name)
        print(f"  {name}: ok")
    except Exception as e:  # noqa: BLE001 - report every missing piece at once
        print(f"  {name}: MISSING ({type(e).__name__}: {e})")
        missing += [name] if name in need else []
if missing:
    raise SystemExit(f"cannot serve without {missing}: carry them in .devpack/serve.tar.xz")
PY
[ $? -eq 0 ] || exit 1

stamp write-checkpoint "$CKPT"
if [ ! -f "$CKPT/config.json" ]; then
  if [ "$REHEARSE" = 1 ]; then
    $PY - "$CKPT" <<'PY'
import sys
from glmlab import presets
from glmlab.checkpoint.writer import write_random_checkpoint
cfg = presets.tiny(fp8=True)
cfg["text_config"]["moe_intermediate_size"] = 128  # FP8 weights kept stack gate|up: whole blocks
print(write_random_checkpoint(cfg, sys.argv[1], seed=0, fp8=True))
PY
  else
    timeout 150 $GLMLAB init-checkpoint --preset slice:4 --fp8 --device cuda --out "$CKPT" \
      --max-shard-gb 4 | tail -1
  fi
fi
du -sh "$CKPT"

prompt_ids() { $PY -c "import sys; n=int(sys.argv[1]); print(','.join(str((i*37+n*11) % 251) for i in range(n)))" "$1"; }

stamp generate-reference "flags: $ENGINE"
reference() {  # $1: prompt length; one `glmlab generate` process (they run side by side)
  local n=$1 f="$WORK/generate_$1.json"
  [ -s "$f" ] && return
  timeout 200 $GLMLAB generate --model "$CKPT" --device "$DEV" $ENGINE --prompt-ids "$(prompt_ids $n)" \
    --max-new-tokens $N_NEW --ignore-eos --json > "$f.raw" || return
  # NOTE: TileLang logs its JIT progress on stdout: keep the one JSON line generate prints
  grep '^{' "$f.raw" | tail -n 1 > "$f" && rm -f "$f.raw"
  cat "$f"
}
# The first length alone (it fills the autotune cache the others then read), the rest side by
# side, with a second process on the last length: equal tokens there say the run is
# reproducible across processes, the premise of comparing the service with generate at all.
# NOTE: a bare `wait` would also wait for the log's tee (a process substitution): name the jobs
set -- $LENS; reference $1; shift
pids=(); for n in "$@"; do reference $n & pids+=($!); done
last=${@: -1}; (reference_again() { local f="$WORK/generate_${last}_again.json"; [ -s "$f" ] && return
  timeout 200 $GLMLAB generate --model "$CKPT" --device "$DEV" $ENGINE --prompt-ids \
    "$(prompt_ids $last)" --max-new-tokens $N_NEW --ignore-eos --json 2>/dev/null | grep '^{' |
    tail -n 1 > "$f"; }; [ -n "$last" ] && reference_again) & pids+=($!)
wait "${pids[@]}"

# $1: pd or mixed. Starts `glmlab serve` without the router, waits for every worker, runs check.py
serve_and_check() {
  local mode=$1 logs="$WORK/serve_$1_logs"
  [ -s "$WORK/check_$mode.json" ] && { echo "check_$mode.json exists"; return; }
  local URLS  # the two modes run side by side: ports of their own
  if [ "$mode" = mixed ]; then
    $GLMLAB serve --model "$CKPT" --mode mixed --no-launch-router --mixed-ports 31000 \
      --prefill-devices "$DEV" $ENGINE --log-dir "$logs" --startup-timeout-s $START_S &
    URLS="http://127.0.0.1:31000"
  else
    $GLMLAB serve --model "$CKPT" --mode pd --no-launch-router --prefill-ports 31100 \
      --bootstrap-ports 8998 --decode-ports 31500 --prefill-devices "$DEV" --decode-devices "$DEV" \
      --transfer-ucx-tls "$UCX" $ENGINE --log-dir "$logs" --startup-timeout-s $START_S &
    URLS="http://127.0.0.1:31100 http://127.0.0.1:31500"
  fi
  local pid=$!
  for u in $URLS; do
    for _ in $(seq 1 $START_S); do curl -sf "$u/health" >/dev/null 2>&1 && break; sleep 1; done
  done
  EXPECT=$([ "$REHEARSE" = 1 ] && echo torch,torch,torch || echo fla,tilelang,triton)
  timeout 240 $PY - "$mode" "$WORK" "$LENS" "$N_NEW" "$EXPECT" $URLS <<'PY' || echo "check $mode failed"
import json, random, sys, threading, urllib.request
mode, out, lens, n_new, expect, *urls = sys.argv[1:]
lens, n_new, out = [int(x) for x in lens.split()], int(n_new), __import__("pathlib").Path(out)
kda, mla, moe = expect.split(",")

def call(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=200) as r:
        return json.loads(r.read())

infos, info_ok = {}, True
for url in urls:
    info = call(f"{url}/server_info")
    infos[info["role"]] = info
    w, e = info["weights"], info["engine"]
    ok = (e["backends"].startswith(f"kda={kda}, sparse_mla={mla}, moe={moe}")
          and e["fp8_weights"] == "keep" and w["fp8_tensors"] > 0)
    info_ok &= ok
    print(info["role"], "backends:", e["backends"], "| fp8_weights:", e["fp8_weights"],
          "| FP8 tensors:", w["fp8_tensors"], "| dtype:", e["model_dtype"], "| kv:",
          e["kv_dtype"], "ok" if ok else "NOT OK")
    (out / f"server_info_{mode}_{info['role']}.json").write_text(json.dumps(info, indent=1))

def served(ids):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n_new, "temperature": 0,
                                                  "ignore_eos": True}}
    if mode == "mixed":
        return call(f"{urls[0]}/generate", body)
    # what sglang-router does in PD mode: the same request, with one room, to both sides
    boot = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998,
            "bootstrap_room": random.getrandbits(63)}
    got = {}
    side = threading.Thread(target=lambda: got.update(p=call(f"{urls[0]}/generate",
                                                             {**body, **boot})))
    side.start()
    got["d"] = call(f"{urls[1]}/generate", {**body, **boot})
    side.join()
    return got["d"]

rows = []
for n in lens:
    ids = [(i * 37 + n * 11) % 251 for i in range(n)]
    ref = json.loads((out / f"generate_{n}.json").read_text())
    res = served(ids)
    rows.append({"prompt_len": n, "reference": ref["output_ids"], "served": res["output_ids"],
                 "equal": ref["output_ids"] == res["output_ids"], "meta": res["meta_info"]})
    print(n, "tokens equal:", rows[-1]["equal"], res["output_ids"])
if mode == "mixed":  # the OpenAI route renders the same tokens as text
    ids = [(i * 37 + lens[0] * 11) % 251 for i in range(lens[0])]
    c = call(f"{urls[0]}/v1/completions", {"prompt": ids, "max_tokens": n_new, "temperature": 0,
                                           "ignore_eos": True})
    ref = json.loads((out / f"generate_{lens[0]}.json").read_text())
    rows.append({"route": "/v1/completions", "equal": c["choices"][0]["text"] == ref["text"]})
result = {"mode": mode, "server_info_ok": bool(info_ok),
          "identical": all(r["equal"] for r in rows), "prompts": rows}
(out / f"check_{mode}.json").write_text(json.dumps(result, indent=1))
print(json.dumps({k: result[k] for k in ("mode", "server_info_ok", "identical")}))
PY
  kill -INT $pid; wait $pid; echo "serve $mode exit $?"
  tail -n 5 "$logs"/*.log 2>/dev/null
}

stamp serve-mixed-and-pd
serve_and_check mixed & mixed_pid=$!
if $PY -c "import nixl_cu13" 2>/dev/null; then serve_and_check pd; else echo "no nixl: PD skipped"; fi
wait $mixed_pid

stamp summary
$PY - "$WORK" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("check_*.json"))}
summary = {k: {"identical": v["identical"], "server_info": v["server_info_ok"]}
           for k, v in rows.items()}
for again in sorted(out.glob("generate_*_again.json")):  # two generate processes, one prompt
    first = out / again.name.replace("_again", "")
    if first.is_file() and again.stat().st_size:
        summary[f"generate_twice_{again.name.split('_')[1]}"] = (
            json.loads(first.read_text())["output_ids"] == json.loads(again.read_text())["output_ids"])
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary))
PY
stamp done
