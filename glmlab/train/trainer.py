"""``train_target``: train a GLM-5.3-shaped model (and its MTP layer) on the stdlib corpus.

One step: B random windows of T + 2 tokens from the train stream -> ``training_losses`` (next
token + MTP depths + indexer KL) -> backward -> AdamW on fp32 masters (warm-up, cosine) ->
one load-balance step of every router's correction bias. The first ``dense_fraction`` of the
steps attend densely in the DSA layers while their indexers learn from the KL alone; after that
every DSA layer attends only to what its indexer selects, as at inference.

On CUDA the model is bf16 with fla's ``chunk_kda`` (forward and backward); on CPU fp32 with the
torch reference. The result is a checkpoint in the published layout (``save_checkpoint``) with
the corpus tokenizer, ``train.json`` (settings, provenance, final losses), ``loss.jsonl`` (the
curve) and ``train-files.json`` (which stdlib files, by hash, were read).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from glmlab.checkpoint.writer import save_checkpoint
from glmlab.config import ModelConfig
from glmlab.model.backends import Backends
from glmlab.model.glm import GLM5Model
from glmlab.train import corpus
from glmlab.train.balance import LoadBalancer
from glmlab.train.configs import model_config
from glmlab.train.forward import LossWeights, training_losses
from glmlab.train.init import init_for_training_, trainable_parameters
from glmlab.train.optim import MasterAdamW, Schedule
from glmlab.train.runlog import RunLog, StepBudget, provenance
from glmlab.train.tokenizer import TOKENIZER_FILE, write_tokenizer_files
from glmlab.train.tokens import WindowSampler, fixed_windows, token_stream

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class TrainConfig:
    preset: str = "small"  # a preset name, or a config.json / checkpoint directory
    out: str = "runs/small"
    device: str = "cpu"
    dtype: str = "auto"  # bf16 on CUDA, fp32 on CPU
    kda_backend: str = "auto"  # fla on CUDA, torch on CPU
    seq_len: int = 512
    batch_size: int = 32
    steps: int = 0  # 0: as many as time_budget_s allows
    time_budget_s: float = 300.0
    warmup_steps: int = 100
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    mtp_depth: int = 2
    mtp_weight: float = 0.3
    mtp_chain_weight: float = 0.15
    dense_fraction: float = 0.1
    balance_gamma: float = 1e-3
    log_every: int = 10
    eval_every: int = 100
    val_windows: int = 16
    max_train_files: int = 0  # 0: all; a few for rehearsals and tests
    corpus: str = str(corpus.CORPUS_DIR)
    seed: int = 0

    def resolved(self) -> tuple[torch.device, torch.dtype, str]:
        device = torch.device(self.device)
        cuda = device.type == "cuda"
        dtype = _DTYPES[self.dtype] if self.dtype != "auto" else (
            torch.bfloat16 if cuda else torch.float32)
        kda = self.kda_backend if self.kda_backend != "auto" else ("fla" if cuda else "torch")
        return device, dtype, kda


def build_model(mcfg: ModelConfig, device: torch.device, dtype: torch.dtype, kda: str,
                seed: int) -> GLM5Model:
    with torch.device(device):
        model = GLM5Model(mcfg)
    init_for_training_(model.float(), seed).to_dtype(dtype)
    return model.use_backends(Backends(kda=kda))


@dataclass
class Data:
    tokenizer_path: Path
    train: torch.Tensor  # the train stream
    val: torch.Tensor  # fixed validation windows [n, T + 2]
    val_bytes_per_token: float
    files: list


def load_data(cfg: TrainConfig, vocab_size: int) -> Data:
    from tokenizers import Tokenizer

    tok_path = Path(cfg.corpus) / TOKENIZER_FILE
    if not tok_path.is_file():
        raise FileNotFoundError(f"no {tok_path}: run `glmlab train corpus` first")
    tok = Tokenizer.from_file(str(tok_path))
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"the tokenizer has {tok.get_vocab_size()} ids, the model {vocab_size}")
    texts, files = corpus.train_texts()
    if cfg.max_train_files:
        texts, files = texts[: cfg.max_train_files], files[: cfg.max_train_files]
    val_texts = [corpus.read_text(p) for p in corpus.split_files("val", Path(cfg.corpus))]
    val = token_stream(tok, val_texts)
    n_bytes = sum(len(t.encode()) for t in val_texts)
    return Data(tok_path, token_stream(tok, texts),
                fixed_windows(val, cfg.seq_len + 2, cfg.val_windows),
                n_bytes / (val.numel() - len(val_texts)), files)


@torch.no_grad()
def validate(model: GLM5Model, windows: torch.Tensor, weights: LossWeights, batch: int,
             bytes_per_token: float) -> dict:
    device = model.embed_tokens.weight.device
    sums: dict[str, float] = {}
    for s in range(0, windows.shape[0], batch):
        part = windows[s:s + batch].to(device)
        for k, v in training_losses(model, part, weights).items():
            sums[k] = sums.get(k, 0.0) + float(v) * part.shape[0]
    out = {f"val_{k}": v / windows.shape[0] for k, v in sums.items() if k != "total"}
    out["val_bpb_approx"] = out["val_lm"] / math.log(2) / bytes_per_token
    return out


def train_target(cfg: TrainConfig, show_progress: bool = True) -> Path:
    device, dtype, kda = cfg.resolved()
    torch.manual_seed(cfg.seed)
    mcfg = model_config(cfg.preset)
    data = load_data(cfg, mcfg.vocab_size)
    model = build_model(mcfg, device, dtype, kda, cfg.seed)
    weights = LossWeights(cfg.mtp_depth if model.mtp is not None else 0, cfg.mtp_weight,
                          cfg.mtp_chain_weight)
    opt = MasterAdamW(trainable_parameters(model), cfg.weight_decay, grad_clip=cfg.grad_clip)
    balancer = LoadBalancer(model, cfg.balance_gamma)
    sampler = WindowSampler(data.train, cfg.seq_len + 2, cfg.batch_size, cfg.seed)
    out = Path(cfg.out)
    log = RunLog(out / "loss.jsonl", "train", show_progress)
    budget = StepBudget(cfg.steps, cfg.time_budget_s if cfg.steps <= 0 else 0.0)
    step, last = 0, {}
    while not budget.done(step):
        total = budget.planned()
        sched = Schedule(cfg.lr, cfg.warmup_steps, total, cfg.min_lr_ratio)
        dense = step < cfg.dense_fraction * total
        model.train()
        losses = training_losses(model, sampler().to(device), weights, dense)
        losses["total"].backward()
        grad_norm = opt.step(sched.lr(step))
        load_ratio = balancer.update()
        log.step(cfg.batch_size * cfg.seq_len, budget.total)
        budget.after_step(step)
        step += 1
        if step % cfg.log_every == 0 or step == 1:
            last = {k: float(v.detach()) for k, v in losses.items()}
            if not math.isfinite(last["total"]):
                raise FloatingPointError(f"step {step}: loss {last} is not finite (lower --lr, "
                                         "or try --kda-backend torch)")
            log.row({"step": step, "lr": sched.lr(step - 1), **last, "grad_norm": grad_norm,
                     "max_load_ratio": load_ratio, "dense": dense,
                     "tokens": log.tokens, "elapsed_s": budget.elapsed(),
                     "tok_per_s": log.tok_per_s()},
                    postfix={"loss": last["lm"], "tok/s": int(log.tok_per_s())})
        if step % cfg.eval_every == 0 and not budget.done(step):
            log.row({"step": step, **_val(model, data, weights, cfg, balancer)})
    final = {"step": step, **_val(model, data, weights, cfg, balancer)}
    log.row(final)
    log.close()
    balancer.close()
    _write(model, mcfg, cfg, data, out, {"steps": step, "tokens": log.tokens,
                                         "elapsed_s": budget.elapsed(), "last": last, **final})
    return out


def _val(model, data: Data, weights: LossWeights, cfg: TrainConfig, balancer) -> dict:
    model.eval()
    row = validate(model, data.val, weights, cfg.batch_size, data.val_bytes_per_token)
    balancer.reset()  # evaluation forwards must not steer the biases
    return row


def _write(model: GLM5Model, mcfg: ModelConfig, cfg: TrainConfig, data: Data, out: Path,
           result: dict) -> None:
    for p in model.parameters():
        p.requires_grad_(False)
    save_checkpoint(model, mcfg, out)
    pad = mcfg.pad_token_id if mcfg.pad_token_id is not None else mcfg.eos_token_ids[0]
    write_tokenizer_files(data.tokenizer_path, out, list(mcfg.eos_token_ids), pad)
    record = {"train_config": asdict(cfg), "provenance": provenance(), "result": result}
    (out / "train.json").write_text(json.dumps(record, indent=2) + "\n")
    files = [[f.path, f.sha256[:16]] for f in data.files]
    (out / "train-files.json").write_text(json.dumps(
        {"python": record["provenance"]["python"], "count": len(files), "files": files}) + "\n")
