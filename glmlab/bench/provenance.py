"""Provenance of a benchmark row: which code, which command, which machine, how it was timed.

``stamp()`` is the one place that says where a number in ``data/bench/`` came from: the git
commit and whether the tree had uncommitted changes, the full command line, the versions of
torch / triton / tilelang / fla / nixl (null when absent: versions are read from package
metadata, nothing is imported), the GPU (name, driver, SM / memory clocks and power limit from
``nvidia-smi`` when it exists), the host and CPU, and the warm-up and repetition counts the caller
used. It measures nothing and knows no benchmark.

A tree copied without ``.git`` (the GPU machine) takes the commit from ``GLMLAB_GIT_COMMIT`` /
``GLMLAB_GIT_DIRTY`` (``glmlab.env.source_commit``); otherwise the commit is null.
"""

from __future__ import annotations

import datetime
import functools
import os
import platform
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from glmlab.env import source_commit

REPO = Path(__file__).resolve().parents[2]
# row key -> distributions that provide it (the first installed one is reported)
PACKAGES = {
    "triton": ("triton",),
    "tilelang": ("tilelang",),
    "fla": ("flash-linear-attention", "fla-core"),
    "nixl": ("nixl-cu13", "nixl-cu12", "nixl"),
    "transformers": ("transformers",),
}
_SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm",
               "clocks.max.mem", "power.limit")


def stamp(warmup: int | str | None = None, repetitions: int | str | None = None) -> dict:
    """The provenance fields of one row (a new dict each call; the date and clocks are now)."""
    commit, dirty = git_state()
    return {
        "commit": commit,
        "dirty": dirty,
        "command": command_line(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": _cpu(),
        **_versions(),
        **gpu_state(),
        "warmup": warmup,
        "repetitions": repetitions,
    }


def command_line() -> str:
    """The process's full command line as a shell would take it (``python -m glmlab.bench ...``)."""
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return shlex.join(argv)


@functools.lru_cache(maxsize=1)
def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout glmlab runs from; the environment's when it names one.

    NOTE: the GPU machine receives a copy of the working tree whose ``.git`` may be an older
    snapshot, so GLMLAB_GIT_COMMIT (set by whoever sends the tree) wins over ``.git``."""
    if source_commit()[0] is not None:
        return source_commit()
    if (REPO / ".git").exists() and shutil.which("git"):
        try:
            commit = _git("rev-parse", "HEAD")
            dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
            return commit, dirty
        except (OSError, subprocess.CalledProcessError):
            pass
    return source_commit()


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


@functools.lru_cache(maxsize=1)
def _versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda}
    for key, dists in PACKAGES.items():
        out[key] = next((v for v in map(_dist_version, dists) if v is not None), None)
    return out


def _dist_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _cpu() -> str:
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} x{os.cpu_count()}"


def gpu_state() -> dict:
    """GPU name, driver, clocks (MHz) and power limit (W) of device 0; nulls without a GPU."""
    info = dict.fromkeys(("gpu", "gpu_driver", "sm_clock_mhz", "mem_clock_mhz",
                          "max_sm_clock_mhz", "max_mem_clock_mhz", "power_limit_w"))
    if not torch.cuda.is_available():
        return info
    props = torch.cuda.get_device_properties(0)
    info.update(gpu=props.name, sm=f"{props.major}{props.minor}",
                gpu_mem_gb=round(props.total_memory / 2**30, 1))
    uuid = getattr(props, "uuid", None)  # torch's device 0 as nvidia-smi names it
    smi = (_nvidia_smi(f"GPU-{uuid}") if uuid else None) or _nvidia_smi(None)
    if smi:
        keys = ("gpu", "gpu_driver", "sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz",
                "max_mem_clock_mhz", "power_limit_w")
        info.update({k: v for k, v in zip(keys, smi, strict=True) if v is not None})
    return info


def _nvidia_smi(gpu_id: str | None) -> list | None:
    """The query fields of GPU ``gpu_id`` (None: the first GPU nvidia-smi lists)."""
    if not shutil.which("nvidia-smi"):
        return None
    cmd = ["nvidia-smi", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    if gpu_id:
        cmd.append(f"--id={gpu_id}")
    try:
        line = subprocess.run(cmd, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(_SMI_FIELDS):
        return None
    return [values[0], values[1], *(_number(v) for v in values[2:])]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None
