"""Shared fixtures for engine tests: the tiny checkpoint loaded once, in fp32 (transformers parity),
and small helpers to build engines and run request lists to completion."""

from __future__ import annotations

import pytest
import torch

from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.testing.parity import prompt_ids
from glmlab.trace.tracer import NULL_TRACER


@pytest.fixture(scope="session")
def tiny_path():
    return preset_checkpoint("tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_path):
    return load_model(tiny_path, dtype=torch.float32)


@pytest.fixture
def make_engine(tiny_model):
    """A small engine over the tiny model: 512-token context, 96 pages, no budget print."""

    def make(model=None, tracer=NULL_TRACER, tokenizer=None, **options) -> Engine:
        options = {"context_len": 512, "max_pages": 96, "print_budget": False, **options}
        return Engine(model or tiny_model, EngineConfig(**options), tokenizer, tracer=tracer)

    return make


def run_all(engine: Engine, requests) -> list[list[int]]:
    """Queue (ids, params) pairs at once and step until every one is done."""
    rids = [engine.add_request(ids, params) for ids, params in requests]
    while engine.has_work:
        engine.step()
    return [engine.request(r).output_ids for r in rids]


@pytest.fixture
def run():
    return run_all


@pytest.fixture
def ids():
    return prompt_ids


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny model's ops are far too small to split across threads; on a loaded 2-core CI box,
    intra-op threads only add synchronisation. Restored afterwards for other test packages."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
