"""Where generated files (data sets written for a demo, profiler traces) go: the kit's git-ignored build/ folder."""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "EDL_BUILD_DIR"


def build_dir(*parts: str) -> Path:
    """``build/<parts>`` at the kit's root (or under $EDL_BUILD_DIR), created if missing, as an absolute path."""
    root = os.environ.get(ENV_VAR)
    if root:
        base = Path(root)
    else:
        kit = Path(__file__).resolve().parents[1]
        base = kit / "build" if (kit / "pyproject.toml").exists() else Path.cwd() / "build"
    path = base.joinpath(*parts).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path
