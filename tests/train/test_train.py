"""Training on a CPU: the optimiser, load balance and schedule, then a whole (tiny) run whose
checkpoint loads through the real loader and computes what the trained model computed."""

from __future__ import annotations

import json

import pytest
import torch

from glmlab.checkpoint.loader import load_model
from glmlab.model.session import Session
from glmlab.train.balance import LoadBalancer
from glmlab.train.configs import model_config
from glmlab.train.forward import LossWeights, training_losses
from glmlab.train.init import trainable_parameters
from glmlab.train.optim import MasterAdamW, Schedule
from glmlab.train.trainer import TrainConfig, build_model, train_target


def test_a_few_steps_fit_a_batch_and_balance_the_routers():
    model = build_model(model_config("micro"), torch.device("cpu"), torch.float32, "torch", 0)
    opt = MasterAdamW(trainable_parameters(model), weight_decay=0.0)
    balancer = LoadBalancer(model, gamma=0.01)
    tokens = torch.randint(0, 4096, (2, 18), generator=torch.Generator().manual_seed(0))
    first = None
    for _ in range(5):
        losses = training_losses(model, tokens, LossWeights(mtp_depth=1))
        losses["total"].backward()
        opt.step(3e-3)
        loads = {n: balancer.loads[n].clone() for n in balancer.routers}
        before = {n: r.e_score_correction_bias.clone() for n, r in balancer.routers.items()}
        balancer.update()
        for n, r in balancer.routers.items():  # overloaded experts down, underloaded up
            moved = r.e_score_correction_bias - before[n]
            want = 0.01 * torch.sign(loads[n].float().mean() - loads[n].float())
            torch.testing.assert_close(moved, want)
        first = first or float(losses["lm"].detach())
    assert float(losses["lm"].detach()) < first - 0.5
    balancer.close()


def test_bf16_parameters_keep_fp32_masters():
    p = torch.nn.Parameter(torch.ones(4, 4, dtype=torch.bfloat16))
    opt = MasterAdamW([("w", p)], weight_decay=0.0, grad_clip=1e9)
    for _ in range(4):  # each step moves by lr = 1e-3, below bf16's spacing at 1.0 (2^-7)
        p.grad = torch.ones_like(p)
        opt.step(1e-3)
    torch.testing.assert_close(opt.masters[0], torch.full((4, 4), 1 - 4e-3), rtol=0, atol=1e-5)
    assert p.dtype == torch.bfloat16
    assert float(p.detach()[0, 0]) == float(torch.tensor(0.996).bfloat16())


def test_schedule_warms_up_then_decays_to_the_floor():
    s = Schedule(peak_lr=1.0, warmup_steps=10, total_steps=110, min_ratio=0.1)
    assert s.lr(0) == pytest.approx(0.1) and s.lr(9) == pytest.approx(1.0)
    assert s.lr(60) == pytest.approx(0.55) and s.lr(109) == pytest.approx(0.1, abs=1e-3)
    assert all(s.lr(i) >= s.lr(i + 1) for i in range(10, 120))


def test_a_run_writes_a_checkpoint_that_serves_the_trained_weights(tmp_path):
    cfg = TrainConfig(preset="micro", out=str(tmp_path / "run"), seq_len=24, batch_size=2,
                      steps=3, warmup_steps=2, max_train_files=3, val_windows=2, log_every=1,
                      eval_every=2, mtp_depth=1)
    out = train_target(cfg, show_progress=False)
    rows = [json.loads(x) for x in (out / "loss.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "lm" in r] == [1, 2, 3]
    assert rows[-1]["val_lm"] > 0 and rows[-1]["val_bpb_approx"] > 0
    record = json.loads((out / "train.json").read_text())
    assert record["result"]["steps"] == 3 and record["train_config"]["preset"] == "micro"
    assert json.loads((out / "train-files.json").read_text())["count"] == 3
    model = load_model(out, dtype=torch.float32)
    assert model.mtp is not None and model.cfg.vocab_size == 4096
    biases = [m.gate.e_score_correction_bias for m in model.modules() if hasattr(m, "gate")]
    assert biases and any(b.abs().sum() > 0 for b in biases)  # the balance steps were saved
    ids = list(range(13, 40))
    logits = Session(model, max_len=64).logits({0: ids})[0]
    assert torch.isfinite(logits).all()
