"""A plain wheel works outside the source tree: bundled instances and models are found by name.

The wheel is built from a copy of the package's sources (so the shared checkout gets no build/ or
egg-info), installed with `--no-deps` into a fresh venv in a temporary folder, and run from there.
The dependencies come from the test's own environment, appended to the new venv's sys.path by a
.pth file (after its own site-packages, so chameleon_opt itself can only come from the wheel);
nothing is downloaded when this environment's setuptools can build without isolation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("chameleon_opt", "instances", "models", "setup.py", "pyproject.toml", "README.md")


def _run(args: list[str | Path], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert not check or done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def test_wheel_in_fresh_venv_runs_bundled_instances(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    isolation = [] if int(version("setuptools").split(".")[0]) < 68 else ["--no-build-isolation"]
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", tmp_path / "dist", source],
         cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("chameleon_opt-*.whl"))

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)  # this environment's pip installs into it (`--python`): no ensurepip, 4 s
    python = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
         cwd=tmp_path)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path).stdout.strip())
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = _run([python, "-c", "import chameleon_opt, chameleon_opt.bundled as b; print(chameleon_opt.__file__); "
                  "print(b.bundled_instance('runtime-cpu-6'))"], cwd=tmp_path).stdout.split()
    assert all(Path(p).is_relative_to(env_dir) for p in where), where  # package and demo default from the wheel
    assert (Path(where[0]).parent / "py.typed").is_file()
    # the catalogue's calibrations ship too (a torchtitan import is priced with calibration/torchtitan.json)
    shipped = Path(where[0]).parent / "_bundled" / "models"
    assert all((shipped / "calibration" / f"{name}.json").is_file() for name in ("torchtitan", "sailor"))

    cli = env_dir / "bin" / "chameleon-solve"
    from chameleon_opt import __version__

    assert _run([cli, "--version"], cwd=tmp_path).stdout.strip() == f"chameleon-solve {__version__}"
    assert "valid" in _run([cli, "validate", "paper-32"], cwd=tmp_path).stdout
    decision = json.loads(_run([cli, "plan", "paper-32", "--json", "--time-limit", "5"], cwd=tmp_path).stdout)
    assert decision["policy"] in ("reroute", "reconfigure", "hybrid") and decision["plan"]["pipelines"]
    missing = _run([cli, "validate", "no-such-instance"], cwd=tmp_path, check=False)
    assert missing.returncode == 2 and "paper-32" in missing.stderr
