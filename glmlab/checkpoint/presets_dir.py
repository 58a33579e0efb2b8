"""Checkpoints of the named presets, written once into glmlab's cache directory and reused."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from glmlab import presets
from glmlab.checkpoint.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS
from glmlab.checkpoint.writer import write_random_checkpoint
from glmlab.env import cache_dir

_TOK = hashlib.sha1((CHAT_TEMPLATE + "".join(SPECIAL_TOKENS)).encode()).hexdigest()[:8]


def preset_checkpoint(name: str, seed: int = 0, fp8: bool = False) -> Path:
    """Directory of the random ``name`` checkpoint (``tiny``, ``slice:N``), written on first use.
    The directory's name carries a digest of the tokenizer files glmlab writes, so a copy
    cached before they changed (a new chat template) is not served in their place."""
    tag = preset_tag(name, seed, fp8)
    out = cache_dir() / "checkpoints" / tag
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{tag}-", dir=out.parent))
    try:
        write_random_checkpoint(presets.preset(name), tmp, seed=seed, fp8=fp8)
        tmp.rename(out)  # atomic: a concurrent writer's copy wins, ours is dropped below
    except OSError:
        if not (out / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def preset_tag(name: str, seed: int = 0, fp8: bool = False) -> str:
    """The cache directory name of a preset's checkpoint (``tiny-seed0-tok<digest>``)."""
    return name.replace(":", "-") + f"-seed{seed}" + ("-fp8" if fp8 else "") + f"-tok{_TOK}"


# ``small`` is trained, not drawn: its checkpoint is committed (glmlab train wrote it).
SMALL_CHECKPOINT = Path(__file__).resolve().parents[2] / "data" / "checkpoints" / "small"


def resolve_model(spec: str) -> Path:
    """A checkpoint directory, a preset name (``tiny``, ``slice:N``) written on demand, or
    ``small`` (the committed trained checkpoint)."""
    path = Path(spec)
    if path.is_dir():
        return path
    if spec == "tiny" or spec.startswith("slice"):
        return preset_checkpoint(spec)
    if spec == "small":
        if not (SMALL_CHECKPOINT / "config.json").is_file():
            raise FileNotFoundError(f"no trained small checkpoint at {SMALL_CHECKPOINT}")
        return SMALL_CHECKPOINT
    raise FileNotFoundError(
        f"{spec} is neither a checkpoint directory nor a preset (tiny, small, slice:N)"
    )
