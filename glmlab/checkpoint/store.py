"""Read-only access to the safetensors files of a checkpoint directory (single file or sharded).

It answers "which tensors exist, with which dtype and shape" from the file headers alone, and reads
one tensor at a time. Broken files or indexes raise ``CheckpointError`` naming the file and a
tensor it should hold. It knows nothing about what the tensors mean.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is; the message names the tensor or file."""


INDEX_FILE = "model.safetensors.index.json"


class TensorStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._handles: dict[str, object] = {}
        self.location = self._index()  # tensor name -> file name

    def _index(self) -> dict[str, str]:
        index = self.path / INDEX_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index} is not a valid safetensors index: {e}") from e
            for name, file in weight_map.items():
                if not (self.path / file).is_file():
                    raise CheckpointError(
                        f"shard {file} (holding {name}) is missing from {self.path}"
                    )
            return dict(weight_map)
        files = sorted(p.name for p in self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"no *.safetensors files in {self.path}")
        return {name: f for f in files for name in self._open(f).keys()}  # noqa: SIM118 (safe_open has no __iter__)

    def _open(self, file: str):
        if file not in self._handles:
            try:
                self._handles[file] = safe_open(str(self.path / file), framework="pt")
            except Exception as e:  # safetensors raises SafetensorError / OSError
                held = next(
                    (n for n, f in getattr(self, "location", {}).items() if f == file), None
                )
                what = f" (holding {held})" if held else ""
                raise CheckpointError(f"cannot read {self.path / file}{what}: {e}") from e
        return self._handles[file]

    def names(self) -> list[str]:
        return list(self.location)

    def info(self, name: str) -> tuple[str, tuple[int, ...]]:
        """(safetensors dtype string, shape) without reading the data."""
        sl = self._open(self.location[name]).get_slice(name)
        return sl.get_dtype(), tuple(sl.get_shape())

    def read(self, name: str) -> torch.Tensor:
        try:
            return self._open(self.location[name]).get_tensor(name)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(
                f"cannot read tensor {name} from {self.location[name]}: {e}"
            ) from e
