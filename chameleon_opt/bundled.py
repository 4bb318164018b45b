"""Where the bundled instances (`instances/`) and workload catalogue (`models/`) live.

In a source tree or an editable install they are the top-level folders; a wheel carries them as
`chameleon_opt/_bundled/` (mapped by setup.py), because an installed package has no source tree
beside it. Both places are looked up here so that no caller needs to know which one it runs from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

PACKAGE_DIR = Path(__file__).resolve().parent


def bundled_dir(kind: Literal["instances", "models"]) -> Path:
    """The folder of bundled files of this kind (the wheel's copy first, else the source tree's)."""
    installed = PACKAGE_DIR / "_bundled" / kind
    return installed if installed.is_dir() else PACKAGE_DIR.parent / kind


def bundled_instance(name: str) -> Path | None:
    """The bundled instance file called `name` (`paper-32` or `paper-32.json`), if there is one.

    Only bare names are looked up: anything with a folder in it is a path the user meant."""
    if not name or Path(name).name != name:
        return None
    folder = bundled_dir("instances")
    for candidate in (folder / name, folder / f"{name}.json"):
        if candidate.is_file():
            return candidate
    return None


def bundled_instance_names() -> list[str]:
    return sorted(p.stem for p in bundled_dir("instances").glob("*.json"))
