"""Subcommands of the glmlab CLI."""
