"""Progress and records of a training run: a tqdm bar with loss and tokens/s, a JSONL loss curve,
and a step budget that a wall-clock budget can set after a few measured steps.

``StepBudget``: with a fixed ``steps`` it is that; with a time budget it runs ``probe`` steps
(after ``skip`` warm-up steps that pay for kernel compilation and autotuning), measures their mean
time, and fixes the total so the run ends inside the budget. The cosine schedule reads the total
from then on (the probe lies inside the linear warm-up, which does not depend on the total).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from glmlab.env import source_commit
from glmlab.train.corpus import REPO_ROOT


class StepBudget:
    def __init__(self, steps: int, time_budget_s: float, skip: int = 5, probe: int = 20):
        if steps <= 0 and time_budget_s <= 0:
            raise ValueError("give a number of steps or a positive time budget")
        self.total = steps if steps > 0 else None
        self.budget, self.skip, self.probe = time_budget_s, skip, probe
        self.start = time.perf_counter()
        self._probe_start: float | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def after_step(self, step: int) -> None:
        """Call after 0-based ``step`` finished."""
        if self.total is not None:
            return
        if step + 1 == self.skip:
            self._probe_start = time.perf_counter()
        elif step + 1 == self.skip + self.probe:
            per_step = (time.perf_counter() - self._probe_start) / self.probe
            left = max(0.0, self.budget - self.elapsed())
            self.total = step + 1 + int(0.95 * left / per_step)

    def planned(self) -> int:
        """The total if known, else a placeholder for the schedule (only warm-up runs before)."""
        return self.total if self.total is not None else 10**9

    def done(self, steps_run: int) -> bool:
        over_time = self.budget > 0 and self.elapsed() > 1.1 * self.budget
        return over_time or (self.total is not None and steps_run >= self.total)


class RunLog:
    def __init__(self, path: Path, desc: str, show: bool = True):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.show = path, show
        self.file = path.open("w")
        self.bar = tqdm(desc=desc, unit="step", disable=not show, dynamic_ncols=True)
        self.tokens, self.t0 = 0, time.perf_counter()

    def step(self, tokens: int, total: int | None) -> None:
        self.tokens += tokens
        if total is not None and self.bar.total != total:
            self.bar.total = total
            self.bar.refresh()
        self.bar.update(1)

    def tok_per_s(self) -> float:
        return self.tokens / max(1e-9, time.perf_counter() - self.t0)

    def row(self, row: dict, postfix: dict | None = None) -> None:
        row = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if postfix:
            self.bar.set_postfix({k: f"{v:.3f}" if isinstance(v, float) else v
                                  for k, v in postfix.items()}, refresh=False)

    def close(self) -> None:
        self.bar.close()
        self.file.close()


def provenance() -> dict:
    """Where a run happened: command line, git commit, versions, device.

    NOTE: the GPU machine gets a copy of the tree whose ``.git`` may be an older snapshot, so
    the commit named by GLMLAB_GIT_COMMIT wins (as for benchmark rows)."""
    commit = source_commit()[0]
    if commit is None:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT,
                                    capture_output=True, text=True,
                                    timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"command": " ".join(sys.argv), "commit": commit, "python": sys.version.split()[0],
            "torch": torch.__version__, "gpu": gpu, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
