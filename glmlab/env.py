"""Environment knobs: the only reader of ``os.environ`` in glmlab, for toolchain and debug settings.

Never numerics, features or backend choices: those live in the config dataclasses.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where glmlab keeps the checkpoints it writes (GLMLAB_CACHE_DIR, default ~/.cache/glmlab)."""
    return Path(os.environ.get("GLMLAB_CACHE_DIR", Path.home() / ".cache" / "glmlab"))
