"""Where generated files (data sets written for a demo, profiler traces) go: the kit's git-ignored build/ folder."""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "EDL_BUILD_DIR"


def kit_root() -> Path | None:
    """The kit's checkout (the folder holding pyproject.toml), or None when the package is installed elsewhere."""
    checkout = Path(__file__).resolve().parents[2]  # helpers/core/paths.py -> the checkout
    return checkout if (checkout / "pyproject.toml").exists() else None


def build_dir(*parts: str) -> Path:
    """``build/<parts>`` at the kit's root (or under $EDL_BUILD_DIR), created if missing, as an absolute path."""
    root = os.environ.get(ENV_VAR)
    if root:
        base = Path(root)
    else:
        kit = kit_root()
        base = kit / "build" if kit else Path.cwd() / "build"
    path = base.joinpath(*parts).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


MODEL_CACHE_ENV = "EDL_MODEL_CACHE"  # a read-only folder of model caches, searched first (how a grading sandbox sees the kit's)


def shared_model_cache() -> Path | None:
    """The kit's build/models folder when it holds a model cache (safetensors) that a sandbox may read, else None."""
    folder = build_dir("models")
    return folder if any(folder.glob("*.safetensors")) else None
