"""Package layout that pyproject.toml cannot express: the bundled instances and workload catalogue.

`instances/` and `models/` stay at the top of the source tree (tests, benches and docs name them
there) and are mapped into the wheel as `chameleon_opt/_bundled/{instances,models}`, so that a
plain `pip install` finds them by name (chameleon_opt/bundled.py looks in both places).
"""

from setuptools import find_packages, setup

BUNDLED = {"chameleon_opt._bundled.instances": "instances", "chameleon_opt._bundled.models": "models"}

setup(
    packages=find_packages(include=["chameleon_opt", "chameleon_opt.*"]) + list(BUNDLED),
    package_dir=BUNDLED,
    package_data={"chameleon_opt": ["py.typed"], **{name: ["*.json", "*.md", "calibration/*.json", "hf/*/*.json"]
                                                for name in BUNDLED}},
)
