"""The repository's root, for tests that read its files (README, scripts, the package's sources)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
