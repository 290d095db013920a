"""The packages the wheel ships, found rather than listed: every package under xlt/, and
configs/ as xlt.configs (xlt/io/config_files.py finds it there in an install). pyproject.toml
holds everything else; its [tool.setuptools] cannot add a mapped package to found ones."""

import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = {"xlt.configs": "configs"}
PACKAGES = sorted(find_packages(where=HERE, include=["xlt", "xlt.*"]) + list(PACKAGE_DIR))
# files besides modules that a package reads at run time (task definitions, templates, tables)
DATA = ["*.yaml", "*.yml", "*.json", "*.jinja", "*.txt"]

if __name__ == "__main__":  # as setuptools runs it
  setup(packages=PACKAGES, package_dir=PACKAGE_DIR, package_data={"": DATA})
