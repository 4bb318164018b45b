"""The one rule for every file the command line writes (plots, exported models, JSON).

- An existing file is never replaced unless the user passed `--force`; the check runs before any
  work, so a long command does not fail at its end, and again at the write itself (a file that
  appeared meanwhile is still not replaced: the final step is a hard link, which refuses to clobber).
- The file appears whole or not at all: the content goes to a temporary file in the same folder,
  which is then linked (or, with `--force`, renamed) over the target. A reader never sees half a PNG.
- Every failure is an InputError (exit 2) naming the file, the option and the fix.

Figures are drawn with matplotlib's object API (`Figure` + `FigureCanvasAgg`), never pyplot or
`matplotlib.use`: a library must not switch the backend of the program that imports it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from chameleon_opt.errors import InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def check_output(path: Path, option: str, force: bool) -> None:
    """Refuse early what write_output would refuse late: an existing file without `--force`, a
    folder that does not exist, a directory in the file's place."""
    if path.is_dir():
        raise InputError(path, option, "is a directory", "give a file path")
    if path.exists() and not force:
        raise InputError(path, option, "file exists", "choose another path or pass --force to overwrite it")
    if not path.parent.is_dir():
        raise InputError(path, option, f"folder {path.parent} does not exist", "create it or choose another path")


def write_output(path: Path, option: str, force: bool, write: Callable[[Path], None]) -> Path:
    """Call `write(temporary_path)`, then move the result to `path` under the rule above."""
    check_output(path, option, force)
    # hidden, in the same folder (so the final rename stays on one file system), same suffix (some
    # writers pick the format by it: CP-SAT's ExportToFile writes text for .txt)
    fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    temporary = Path(name)
    try:
        write(temporary)
        if not temporary.is_file() or temporary.stat().st_size == 0:
            raise InputError(path, option, "nothing was written", "check the folder is writable and has space")
        mask = os.umask(0)
        os.umask(mask)
        temporary.chmod(0o666 & ~mask)  # mkstemp's 0600 would make the result private
        if force:
            os.replace(temporary, path)
        else:
            _link_new(temporary, path, option)
    except OSError as err:
        raise InputError(path, option, f"could not be written ({err.strerror or type(err).__name__})",
                         "check the folder exists and is writable") from None
    finally:
        temporary.unlink(missing_ok=True)
    return path


def _link_new(temporary: Path, path: Path, option: str) -> None:
    """Move `temporary` to `path` only if `path` does not exist (atomic where hard links exist)."""
    try:
        os.link(temporary, path)
        return
    except FileExistsError:
        pass
    except OSError:  # a file system without hard links: check, then rename (a small race remains)
        if not path.exists():
            os.replace(temporary, path)
            return
    raise InputError(path, option, "file exists (created while this command ran)",
                     "choose another path or pass --force to overwrite it")


FIGURE_FORMATS = ("png", "svg", "pdf")


def check_figure_output(path: Path, option: str, force: bool) -> None:
    """check_output, and a file type the Agg canvas writes."""
    check_output(path, option, force)
    if path.suffix.lstrip(".").lower() not in FIGURE_FORMATS:
        raise InputError(path, option, f"unknown picture type {path.suffix or '(no suffix)'!r}",
                         f"end the name with .{', .'.join(FIGURE_FORMATS)}")


def save_figure(figure: "Figure", path: Path, option: str, force: bool, dpi: int = 120) -> Path:
    """Render a Figure with the Agg canvas (no global backend) and write it under the rule."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    check_figure_output(path, option, force)
    FigureCanvasAgg(figure)
    fmt = path.suffix.lstrip(".").lower()
    return write_output(path, option, force, lambda tmp: figure.savefig(tmp, format=fmt, dpi=dpi))
