#!/usr/bin/env bash
# Train the `small` GLM-5.3-shaped model on one H200, then measure it:
#   train    target + MTP (bf16, fla chunk_kda fwd+bwd, TRAIN_S = 330 s including fla's first-call
#            autotuning), then the DFlash2 draft (DRAFT_S = 60 s), in one process (one fla import,
#            one autotune: every forward has the training batch's shape)
#   measure  bits per byte (val + test, every engine setting), next-line exact match, the
#            byte-unigram baseline, measured MTP 1..7 / DFlash2 B4, B8 acceptance (greedy and
#            T=0.7), routing samples
#
#   STAGES=train OUT=/dir bash scripts/h200_train_small.sh      # ~8.5 min: train, package
#   STAGES=measure MODEL=small OUT=/dir bash ...               # ~4 min: the checkpoint in the tree
#   OUT=/dir bash scripts/h200_train_small.sh                  # both (more than one 10-min call)
#   REHEARSE=1 OUT=/tmp/r bash scripts/h200_train_small.sh     # CPU, micro config, 20 steps
#
# Needs .devpack/fla.tar.xz on the GPU (docs/platform.md section 3.1). $OUT gets at most four files
# (each < 16 MiB): model.safetensors (target), dflash2.safetensors (draft), small-run.tar.gz
# (everything else, laid out from the repository root) and log.txt. To commit a run:
#   tar -xzf small-run.tar.gz && cp model.safetensors data/checkpoints/small/ &&
#   cp dflash2.safetensors data/checkpoints/small/dflash2/model.safetensors
set -u
export PYTHONUNBUFFERED=1 GLMLAB_CACHE_DIR=/tmp/glmcache FLA_TILELANG=0 TQDM_MININTERVAL=15
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
stamp() { echo "== $(date +%T) $*"; }
STAGES=${STAGES:-train measure}
RUN=${RUN:-/tmp/small-run}          # the checkpoint directory training writes
PKG=$(mktemp -d)                    # what small-run.tar.gz holds, from the repository root
CK=data/checkpoints/small
mkdir -p "$PKG/$CK/dflash2" "$PKG/data/bench" "$PKG/data/routing"

if [ "${REHEARSE:-0}" = 1 ]; then
  PY=${PY:-.venv/bin/python}; DEV=cpu; PRESET=micro; TAG=rehearsal-cpu
  TRAIN="--steps 20 --seq-len 64 --batch-size 4 --warmup-steps 5 --max-train-files 40
         --val-windows 4 --eval-every 10 --log-every 5"
  DRAFT="--draft-steps 6 --draft-batch-size 2 --draft-anchors-per-window 4 --draft-warmup-steps 2"
  EVAL="--window 64 --chunk 32 --batch 8"
  EVAL_FILES_VAL=$($PY -c "from glmlab.train.corpus import split_files as s; print(*s('val')[:2])")
  EVAL_FILES_TEST=$($PY -c "from glmlab.train.corpus import split_files as s; print(*s('test')[:2])")
  LINES=4; EVAL_TIMEOUT=${EVAL_TIMEOUT:-900}; ACC_TIMEOUT=${ACC_TIMEOUT:-900}  # a shared CPU
  ACC="--prompts 2 --prompt-len 32 --new-tokens 8 --mtp-steps 1,3 --blocks 4,8"
else
  stamp install
  if [ -z "${GLMLAB_INSTALLED:-}" ]; then  # a calling script may have installed already
    SITE=$(mktemp -d); for p in .devpack/*.tar.xz; do tar -xJf "$p" -C "$SITE"; done
    export PYTHONPATH=$SITE
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  fi
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, fla; print(torch.__version__, fla.__version__)"
  PY=python3; DEV=cuda; PRESET=small; TAG=small-h200
  # validation batches have the training batch's shape too: no second fla autotune mid-run
  TRAIN="--time-budget-s ${TRAIN_S:-330} --seq-len 512 --batch-size ${BATCH:-64}
         --val-windows ${BATCH:-64} --warmup-steps 100 --kda-backend ${KDA:-fla}"
  # the draft's target forward has the training batch's shapes: fla autotuned them already
  DRAFT="--draft-time-budget-s ${DRAFT_S:-60} --draft-batch-size ${BATCH:-64}
         --draft-anchors-per-window 8"
  EVAL="--window 512 --chunk 128 --batch 32"
  EVAL_FILES_VAL=""; EVAL_FILES_TEST=""
  LINES=64
  ACC="--prompts 8 --prompt-len 256 --new-tokens 64"
fi

package() {  # refresh $OUT from what exists so far (a timeout still returns the last state)
  for f in config.json generation_config.json tokenizer.json tokenizer_config.json train.json \
           train-files.json loss.jsonl dflash2/config.json dflash2/train.json dflash2/loss.jsonl; do
    [ -f "$RUN/$f" ] && cp "$RUN/$f" "$PKG/$CK/$f"
  done
  [ -f "$RUN/model.safetensors" ] && cp "$RUN/model.safetensors" "$OUT/model.safetensors"
  [ -f "$RUN/dflash2/model.safetensors" ] && cp "$RUN/dflash2/model.safetensors" \
    "$OUT/dflash2.safetensors"
  tar -czf "$OUT/small-run.tar.gz" -C "$PKG" data
  ls -la "$OUT"
}

case " $STAGES " in *" train "*)
  stamp train target + MTP, then the DFlash2 draft
  timeout ${TRAIN_TIMEOUT:-540} $PY -m glmlab.cli train model --preset $PRESET --out "$RUN" \
    --device $DEV $TRAIN --with-draft $DRAFT
  echo "train exit $?"
  package
  MODEL=${MODEL:-$RUN}
esac
MODEL=${MODEL:-small}

evaluate() {  # evaluate NAME SPLIT [flags]: one JSON row into eval-<tag>.jsonl
  local name=$1 split=$2; shift 2
  local files=$([ "$split" = val ] && echo "$EVAL_FILES_VAL" || echo "$EVAL_FILES_TEST")
  local sel=$([ -n "$files" ] && echo "--files $files" || echo "--split $split")
  timeout ${EVAL_TIMEOUT:-150} $PY -m glmlab.cli eval --model "$MODEL" $sel --device $DEV $EVAL --json "$@" \
    > /tmp/eval-row.json && $PY -c "import json,sys; r=json.load(open('/tmp/eval-row.json'));
r.update(setting='$name', split='$split', tag='$TAG'); print(json.dumps(r))" \
    >> "$PKG/data/bench/eval-$TAG.jsonl" && tail -1 "$PKG/data/bench/eval-$TAG.jsonl" | cut -c1-240
}

case " $STAGES " in *" measure "*)
  stamp measure "$MODEL"
  evaluate base val --baseline --completion-lines $LINES
  evaluate base test --baseline
  evaluate kv-fp8 test --kv-dtype fp8
  evaluate state-bf16 test --state-dtype bf16
  evaluate index-fp8 test --index-dtype fp8
  evaluate dense test --attention dense
  evaluate weights-fp8 test --weights fp8
  evaluate compute-fp32 test --dtype fp32
  stamp acceptance
  timeout ${ACC_TIMEOUT:-200} $PY -m glmlab.train.acceptance --model "$MODEL" --device $DEV $ACC \
    --out "$PKG/data/bench" --tag "$TAG" --routing-out "$PKG/data/routing/$PRESET.safetensors"
  package
esac
stamp done
