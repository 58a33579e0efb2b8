"""Optional dependencies: which pip extra brings which package; a one-line error for a missing one.

The base install (``pip install glmlab``) runs the model, checkpoints, engine and CLI on a CPU with
the torch reference ops. Fast kernels, the service and the notebooks need packages that only the
extras bring; code that needs one imports it late (when a backend or command names it), and this
module turns the ``ModuleNotFoundError`` into the pip command that fixes it. It knows package
names only, not which code uses them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Top-level import name -> the extra of pyproject.toml that installs it.
EXTRA_OF_PACKAGE = {
    "triton": "kernels",
    "tilelang": "kernels",
    "tvm_ffi": "kernels",
    "fla": "kernels",
    "einops": "kernels",
    "fastapi": "serve",
    "uvicorn": "serve",
    "httpx": "serve",
    "aiohttp": "serve",
    "prometheus_client": "serve",
    "nixl_cu13": "serve",
    "nixl": "serve",
    "sglang_router": "serve",
    "plotly": "notebooks",
    "ipywidgets": "notebooks",
    "anywidget": "notebooks",
    "nbclient": "notebooks",
    "nbformat": "notebooks",
    "transformers": "test",
    "accelerate": "test",
}


class MissingExtra(ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


def missing_extra(err: BaseException, needed_by: str = "") -> MissingExtra | None:
    """The MissingExtra for ``err`` when it is a missing optional package, else None."""
    if isinstance(err, MissingExtra):
        return err
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return None
    package = err.name.split(".")[0]
    extra = EXTRA_OF_PACKAGE.get(package)
    if extra is None:
        return None
    who = f" (needed by {needed_by})" if needed_by else ""
    return MissingExtra(f"the '{package}' package is not installed{who}: "
                        f"pip install 'glmlab[{extra}]'", name=err.name)


def import_optional(module: str) -> ModuleType:
    """``importlib.import_module(module)``; a missing optional package raises MissingExtra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        err = missing_extra(e, needed_by=module)
        if err is None:
            raise
        raise err from e
