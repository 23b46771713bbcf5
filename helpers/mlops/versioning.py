"""Running git and DVC for lecture 9's cells: by absolute path from the kit's environment, quiet, with errors that show.

The lecture writes the commands (``git init``, ``dvc add``, ``dvc push``, ``dvc repro``, ``dvc checkout``);
``Shell`` only runs them in one folder. ``dvc`` is the one installed beside this Python (the kit's pinned
version), never whatever a folder or PATH may hold; ``git`` is found once on PATH and used by its full path.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

QUIET_ENV = {"DVC_NO_ANALYTICS": "1", "DVC_NO_UPDATER": "1", "GIT_AUTHOR_NAME": "kit", "GIT_AUTHOR_EMAIL": "kit@localhost",
             "GIT_COMMITTER_NAME": "kit", "GIT_COMMITTER_EMAIL": "kit@localhost", "GIT_CONFIG_NOSYSTEM": "1"}


def tool_path(name: str) -> str:
    """The absolute path of ``git`` or ``dvc``: DVC from this Python's environment, git from PATH."""
    if name == "dvc":
        found = Path(sys.executable).with_name("dvc")
        if found.exists():
            return str(found)
        raise FileNotFoundError(f"no dvc beside {sys.executable}: install the kit's environment (make setup)")
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} is not installed (Debian/Ubuntu: sudo apt install {name})")
    return str(Path(found).resolve())


class Shell:
    """``shell("dvc", "add", "data")`` runs in ``folder``; its output, or a RuntimeError that shows it."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, tool: str, *args: str, check: bool = True) -> str:
        command = [tool_path(tool), *map(str, args)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        done = subprocess.run(command, cwd=self.folder, capture_output=True, text=True, env={**env, **QUIET_ENV}, timeout=300)
        if check and done.returncode:
            raise RuntimeError(f"{tool} {' '.join(map(str, args))} failed ({done.returncode}) in {self.folder}:\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return (done.stdout + done.stderr).strip()
