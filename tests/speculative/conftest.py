"""Shared fixtures: the tiny model in fp32 (losslessness is checked token for token in fp32)."""

from __future__ import annotations

import pytest
import torch

from glmlab.checkpoint import load_model
from glmlab.checkpoint.presets_dir import preset_checkpoint


@pytest.fixture(scope="session")
def tiny_model():
    torch.set_num_threads(1)  # tiny shapes: threads only add overhead on a 2-core CI machine
    return load_model(preset_checkpoint("tiny"), dtype=torch.float32)
