"""Environment knobs: the only reader of ``os.environ`` in glmlab, for toolchain and debug settings.

Never numerics, features or backend choices: those live in the config dataclasses.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where glmlab keeps the checkpoints it writes (GLMLAB_CACHE_DIR, default ~/.cache/glmlab)."""
    return Path(os.environ.get("GLMLAB_CACHE_DIR", Path.home() / ".cache" / "glmlab"))


def source_commit() -> tuple[str | None, bool | None]:
    """The commit (and dirty flag) a tree without ``.git`` was copied from, for benchmark rows.

    GLMLAB_GIT_COMMIT / GLMLAB_GIT_DIRTY (``0`` or ``1``): set by whoever copies the tree to a
    machine without the repository (the GPU machine gets the files, not ``.git``).
    """
    commit = os.environ.get("GLMLAB_GIT_COMMIT") or None
    dirty = os.environ.get("GLMLAB_GIT_DIRTY")
    return commit, (None if dirty is None else dirty not in ("0", "", "false"))
