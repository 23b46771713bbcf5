"""``make lab``: JupyterLab on the kit for live teaching, set up for lectures rather than for grading.

* Saving a lecture or an assignment's source notebook stores it without outputs (a pre-save hook), so
  what an instructor ran in class never lands in git; the notebook in the browser keeps its outputs.
* A stored notebook opens unmodified: stored notebooks carry the kernel's language_info without the Python
  version (it differs between machines), and this server's contents manager adds the version of the
  kernel it will start, so JupyterLab finds nothing to update (and asks nothing when the tab is closed).
* nbgrader's JupyterLab menu and server extensions are switched off on this server: the kit grades with
  ``make autograde`` (sandboxed, see assignments/README.md), and nbgrader's Formgrader would look for a
  course at the repository root and an exchange folder the kit does not use.

The settings live in a generated config folder (build/lab-config) put first on JUPYTER_CONFIG_PATH for
this server only; nothing in the environment is changed.

    python -m helpers.course.lab [--port 8888] [extra jupyter lab arguments]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

from helpers.core.paths import build_dir, kit_root
from helpers.course.notebooks import LANGUAGE_INFO, clean

CLEANED_FOLDERS = ("lectures", "assignments/source")
# Jupyter imports the hook and the contents manager by name; `python -m helpers.course.lab` runs this file as
# __main__, so the name is spelled out rather than taken from __name__.
MODULE = "helpers.course.lab"
NBGRADER_SERVER_EXTENSIONS = ("formgrader", "assignment_list", "course_list", "validate_assignment")


def strip_outputs_on_save(model: dict, path: str, **_):
    """Jupyter pre-save hook: a notebook under lectures/ or assignments/source/ is written without outputs."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict) and path.lstrip("/").startswith(CLEANED_FOLDERS):
        clean(model["content"])


def running_language_info() -> dict:
    """The language_info the kit's kernel (ipykernel on this interpreter) reports, version included."""
    from ipykernel.ipkernel import IPythonKernel

    return dict(IPythonKernel.language_info)


def with_running_version(model: dict) -> dict:
    """A notebook model whose stored language_info is the kit's versionless form gets the running version."""
    content = model.get("content")
    if model.get("type") == "notebook" and isinstance(content, dict):
        metadata = content.setdefault("metadata", {})
        if metadata.get("language_info") == LANGUAGE_INFO:
            metadata["language_info"] = running_language_info()
    return model


class KitContentsManager(AsyncLargeFileManager):
    """Jupyter's file contents manager; notebooks are served with the running kernel's language version."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        return with_running_version(await super().get(path, content=content, type=type, format=format, **kwargs))


def config_folder() -> Path:
    """Write the lab's config (hook, nbgrader off) into build/lab-config and return the folder."""
    folder = build_dir("lab-config")
    extensions = {f"nbgrader.server_extensions.{name}": False for name in NBGRADER_SERVER_EXTENSIONS}
    server = {"ServerApp": {"jpserver_extensions": extensions, "contents_manager_class": f"{MODULE}.KitContentsManager"},
              "ContentsManager": {"pre_save_hook": f"{MODULE}.strip_outputs_on_save"}}
    (folder / "jupyter_server_config.json").write_text(json.dumps(server, indent=2))
    (folder / "labconfig").mkdir(exist_ok=True)
    (folder / "labconfig" / "page_config.json").write_text(json.dumps({"disabledExtensions": {"@jupyter/nbgrader": True}}, indent=2))
    return folder


def lab_environment() -> dict[str, str]:
    """This process's environment with the kit's lab config first on JUPYTER_CONFIG_PATH."""
    paths = [str(config_folder())] + [p for p in os.environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep) if p]
    return {**os.environ, "JUPYTER_CONFIG_PATH": os.pathsep.join(paths)}


def lab_command(extra: list[str]) -> list[str]:
    """`jupyter lab` on the kit's folder, unless ``extra`` names another (--notebook-dir= or --ServerApp.root_dir=)."""
    command = [str(Path(sys.executable).parent / "jupyter"), "lab"]
    if not any(arg.startswith(("--notebook-dir", "--ServerApp.root_dir")) for arg in extra):
        command.append(f"--notebook-dir={kit_root() or Path.cwd()}")
    if os.geteuid() == 0:
        command.append("--allow-root")
    return command + extra


def main(argv: list[str] | None = None) -> None:
    command = lab_command(list(sys.argv[1:] if argv is None else argv))
    os.execve(command[0], command, lab_environment())


if __name__ == "__main__":
    main()
