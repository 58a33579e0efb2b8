"""glmlab: study and serve GLM-5.3-Flash.

    from glmlab import LLM, SamplingParams
    LLM().generate("def add(a, b):", SamplingParams(max_new_tokens=32))  # the trained small

The names below are imported on first use, so ``import glmlab`` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "LLM": "glmlab.engine.llm",
    "Engine": "glmlab.engine.engine",
    "SamplingParams": "glmlab.core",
    "ModelConfig": "glmlab.config",
    "EngineConfig": "glmlab.engine.config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'glmlab' has no attribute {name!r}")
