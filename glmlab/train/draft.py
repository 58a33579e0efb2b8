"""``train_draft``: a DFlash2 block drafter trained on a frozen target's own features.

Training matches what ``glmlab.speculative.dflash.DFlashDrafter`` does at inference. Per window
of T tokens the frozen target runs once (``target_forward``, sparse attention as served) and
yields its stream means after ``target_layer_ids``; the draft projects them into per-layer
context K/V (``context_kv``'s maths over the window). Then ``anchors_per_window`` random anchors n
each make one block [token n, MASK x (B-1)] at positions n .. n+B-1 that attends to the context
positions < n and, non-causally, to itself (``DraftLayer.forward`` as it is). Mask slot e goes
through the target's lm_head and is scored against token n+e, with weight exp(-(e-1)/decay):
early slots decide how much of a block is accepted.

The candidate selector learns beside it: for each slot the target head's top-K candidates are
re-ranked by ``unary + <A[pred] * P h_e, B[cand]>`` with the *true* predecessor (the anchor for
slot 1, token n+e-1 after it: teacher forcing), by cross entropy towards the true token when it is
among the K (its inputs are detached, so it does not steer the draft). Steps alternate over
``block_sizes`` so one draft serves B4 and B8.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from glmlab.checkpoint import load_model
from glmlab.model.backends import Backends
from glmlab.model.glm import GLM5Model
from glmlab.speculative.dflash import DFlashDraftModel
from glmlab.speculative.dflash_io import MASK_TOKEN, init_random_draft_, random_draft_config
from glmlab.tokenizer import Tokenizer
from glmlab.train.forward import target_forward
from glmlab.train.init import trainable_parameters
from glmlab.train.optim import MasterAdamW, Schedule
from glmlab.train.runlog import RunLog, StepBudget, provenance
from glmlab.train.tokens import WindowSampler
from glmlab.train.trainer import TrainConfig, load_data

DRAFT_DIR = "dflash2"  # a trained target keeps its draft in this sub-directory


@dataclass(frozen=True)
class DraftTrainConfig:
    target: str  # a trained checkpoint directory
    out: str = ""  # default: <target>/dflash2
    device: str = "cpu"
    dtype: str = "auto"
    kda_backend: str = "auto"
    num_layers: int = 2
    target_layer_ids: tuple[int, ...] = ()  # default: first, middle and last layer
    block_sizes: tuple[int, ...] = (8, 4)
    anchors_per_window: int = 16
    seq_len: int = 512
    batch_size: int = 16
    steps: int = 0
    time_budget_s: float = 90.0
    warmup_steps: int = 50
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    slot_decay: float = 4.0
    selector_rank: int = 16
    selector_top_k: int = 8
    max_train_files: int = 0
    log_every: int = 10
    seed: int = 0


def build_draft(target: GLM5Model, cfg: DraftTrainConfig, dtype: torch.dtype) -> DFlashDraftModel:
    n = target.cfg.num_layers
    layer_ids = cfg.target_layer_ids or tuple(sorted({1 % n, n // 2, n - 1}))
    mask_id = Tokenizer.from_dir(cfg.target).token_id(MASK_TOKEN)
    if mask_id is None:
        raise ValueError(f"the tokenizer of {cfg.target} has no {MASK_TOKEN} token")
    dcfg = random_draft_config(target.cfg, block_size=max(cfg.block_sizes),
                               num_layers=cfg.num_layers, target_layer_ids=layer_ids,
                               mask_token_id=mask_id, selector_rank=cfg.selector_rank,
                               selector_top_k=cfg.selector_top_k)
    with torch.device(target.embed_tokens.weight.device):
        draft = DFlashDraftModel(dcfg)
    return init_random_draft_(draft.float(), cfg.seed).to(dtype)


def block_hidden(draft: DFlashDraftModel, embed: torch.nn.Module, feats: torch.Tensor,
                 tokens: torch.Tensor, row: torch.Tensor, n: torch.Tensor, block: int
                 ) -> torch.Tensor:
    """Draft hidden states [BA, block, D] of blocks anchored at n (window ``row``), from the
    windows' captured target features ``feats`` [B, T, F] and ``tokens`` [B, T]."""
    t = tokens.shape[1]
    pos = torch.arange(t, device=tokens.device)
    ctx = draft.hidden_norm(draft.fc(feats.to(draft.fc.weight.dtype)))  # context_kv's maths
    kv = [layer.self_attn.kv(ctx, pos) for layer in draft.layers]  # [B, T, HKV, Dh] each
    positions = n[:, None] + torch.arange(block, device=tokens.device)
    ids = torch.full_like(positions, draft.cfg.mask_token_id)
    ids[:, 0] = tokens[row, n]
    x = embed(ids)
    valid = pos[None, :] < n[:, None]  # [BA, T]: the committed context of each block
    for i, layer in enumerate(draft.layers):
        x = layer(x, positions, kv[i][0][row], kv[i][1][row], valid)
    return draft.norm(x)


def draft_losses(target: GLM5Model, draft: DFlashDraftModel, tokens: torch.Tensor,
                 block: int, anchors: int, slot_decay: float, gen: torch.Generator
                 ) -> dict[str, torch.Tensor]:
    """tokens [B, T] -> block cross entropy (slot-weighted) and the selector's loss."""
    b, t = tokens.shape
    device = tokens.device
    with torch.no_grad():
        _, feats, _ = target_forward(target, tokens, capture_layers=draft.cfg.target_layer_ids)
    n = torch.randint(1, t - block + 1, (b * anchors,), generator=gen).to(device)
    row = torch.arange(b, device=device).repeat_interleave(anchors)
    truth = tokens[row[:, None], n[:, None] + torch.arange(block, device=device)]  # anchor, then
    hidden = block_hidden(draft, target.embed_tokens, torch.cat(feats, dim=-1), tokens, row, n,
                          block)[:, 1:]  # [BA, block-1, D]: the mask slots
    logits = target.logits(hidden)  # fp32 [BA, E, V]
    w = torch.exp(-torch.arange(block - 1, device=device, dtype=torch.float32) / slot_decay)
    ce = F.cross_entropy(logits.flatten(0, 1), truth[:, 1:].flatten(), reduction="none")
    out = {"draft_ce": (ce.view(-1, block - 1) * w).sum(-1).mean() / w.sum(),
           "slot1_acc": (logits[:, 0].argmax(-1) == truth[:, 1]).float().mean()}
    out["selector"] = _selector_loss(draft, logits.detach(), hidden.detach(), truth)
    out["total"] = out["draft_ce"] + out["selector"]
    return out


def _selector_loss(draft: DFlashDraftModel, logits, hidden, truth) -> torch.Tensor:
    sel = draft.selector
    unary, cand = logits.topk(sel.top_k, dim=-1)  # [BA, E, K]
    ph = sel.proj(hidden).float()  # [BA, E, r]
    pred = truth[:, :-1]  # the true predecessor of each slot (the anchor for the first)
    edge = torch.einsum("ner,nekr->nek", sel.pred_codebook.float()[pred] * ph,
                        sel.succ_codebook.float()[cand])
    hit = cand == truth[:, 1:, None]  # [BA, E, K]
    label = torch.where(hit.any(-1), hit.float().argmax(-1), -100).flatten()
    loss = F.cross_entropy((unary + edge).flatten(0, 1), label, ignore_index=-100,
                           reduction="sum")
    return loss / (label >= 0).sum().clamp(min=1)  # 0 (not NaN) when no true token is a candidate


def train_draft(cfg: DraftTrainConfig, show_progress: bool = True) -> Path:
    tcfg = TrainConfig(device=cfg.device, dtype=cfg.dtype, kda_backend=cfg.kda_backend,
                       seq_len=cfg.seq_len, max_train_files=cfg.max_train_files)
    device, dtype, kda = tcfg.resolved()
    torch.manual_seed(cfg.seed)
    target = load_model(cfg.target, dtype=dtype, device=str(device)).use_backends(
        Backends(kda=kda))
    data = load_data(replace(tcfg, val_windows=1), target.cfg.vocab_size)
    draft = build_draft(target, cfg, dtype)
    opt = MasterAdamW(trainable_parameters(draft), cfg.weight_decay)
    sampler = WindowSampler(data.train, cfg.seq_len, cfg.batch_size, cfg.seed + 1)
    gen = torch.Generator().manual_seed(cfg.seed + 2)
    out = Path(cfg.out or Path(cfg.target) / DRAFT_DIR)
    log = RunLog(out / "loss.jsonl", "draft", show_progress)
    budget = StepBudget(cfg.steps, cfg.time_budget_s if cfg.steps <= 0 else 0.0)
    step, last = 0, {}
    while not budget.done(step):
        sched = Schedule(cfg.lr, cfg.warmup_steps, budget.planned(), cfg.min_lr_ratio)
        block = cfg.block_sizes[step % len(cfg.block_sizes)]
        losses = draft_losses(target, draft, sampler().to(device), block,
                              cfg.anchors_per_window, cfg.slot_decay, gen)
        losses["total"].backward()
        grad_norm = opt.step(sched.lr(step))
        log.step(cfg.batch_size * cfg.anchors_per_window * (block - 1), budget.total)
        budget.after_step(step)
        step += 1
        if step % cfg.log_every == 0 or step == 1:
            last = {k: float(v.detach()) for k, v in losses.items()}
            log.row({"step": step, "block": block, "lr": sched.lr(step - 1), **last,
                     "grad_norm": grad_norm, "elapsed_s": budget.elapsed()},
                    postfix={"ce": last["draft_ce"], "acc1": last["slot1_acc"]})
    log.close()
    _write(draft, out, cfg, {"steps": step, "elapsed_s": budget.elapsed(), "last": last})
    return out


def _write(draft: DFlashDraftModel, out: Path, cfg: DraftTrainConfig, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(draft.cfg.to_dict(MASK_TOKEN), indent=2) + "\n")
    tensors = {n: p.detach().to(torch.bfloat16).contiguous().cpu()
               for n, p in draft.named_parameters()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    record = {"train_config": asdict(cfg), "provenance": provenance(), "result": result,
              "slot_weights": [math.exp(-e / cfg.slot_decay) for e in range(max(cfg.block_sizes)
                                                                         - 1)]}
    (out / "train.json").write_text(json.dumps(record, indent=2) + "\n")
