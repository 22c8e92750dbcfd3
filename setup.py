"""The package list, found rather than written: every package under recipe_apo/ (a new method's package is one),
and conf/ installed as recipe_apo.conf (pyproject.toml's package-dir). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["recipe_apo", "recipe_apo.*"]), "recipe_apo.conf"])
