"""Checkpoints in the published GLM-5.3-Flash layout: load, write, and the tiny tokenizer."""

from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.store import CheckpointError
from glmlab.checkpoint.writer import save_checkpoint, write_random_checkpoint

__all__ = ["CheckpointError", "load_model", "save_checkpoint", "write_random_checkpoint"]
