"""Shared test setup.

- Triton kernels run under its interpreter on CPU machines; the switch is read when ``@triton.jit``
  runs, so it is set here, before any kernel module is imported.
- ``gpu`` tests skip without CUDA.
- ``torch.empty*`` calls made from glmlab code return NaN-filled tensors, so a kernel or cache path
  that reads memory it never wrote fails loudly instead of passing on lucky zeros.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_REAL = {name: getattr(torch, name) for name in ("empty", "empty_like")}


def _from_glmlab() -> bool:
    frame = sys._getframe(2)
    mod = frame.f_globals.get("__name__", "")
    return mod.startswith("glmlab")


def _poisoned(name):
    real = _REAL[name]

    def fn(*args, **kwargs):
        # NOTE: torch.device(...) context managers only redirect the original builtins, so the
        # wrapper must pass the context's device on explicitly.
        if name == "empty" and kwargs.get("device") is None:
            kwargs["device"] = torch.get_default_device()
        t = real(*args, **kwargs)
        if (_from_glmlab() and t.is_floating_point() and t.dtype != torch.float8_e4m3fn
                and t.device.type != "meta"):
            t.fill_(float("nan"))
        return t

    return fn


@pytest.fixture(autouse=True)
def nan_poison_empty(monkeypatch):
    for name in _REAL:
        monkeypatch.setattr(torch, name, _poisoned(name))
    yield


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random checkpoint written by glmlab (bf16 layout), shared by the whole session."""
    from glmlab import presets
    from glmlab.checkpoint.writer import write_random_checkpoint

    return write_random_checkpoint(presets.tiny(), tmp_path_factory.mktemp("tiny"), seed=0)
