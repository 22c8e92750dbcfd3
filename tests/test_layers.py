"""The package's layers, read off the import statements: the methods' maths (``recipe_apo.methods``) imports
nothing of the verl integration, the rehearsal or the tools, and no Ray, Hydra or TransferQueue; the
integration does not import the testbed or the audit (the tools sit on it, not under it)."""

from __future__ import annotations

import ast
from pathlib import Path
from repo_paths import ROOT

PACKAGE = ROOT / "recipe_apo"
FORBIDDEN = ("ray", "hydra", "transfer_queue", "tensordict")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "recipe_apo":
                names.update(f"recipe_apo.{alias.name}" for alias in node.names)
    return names


def test_the_maths_imports_only_the_maths():
    files = sorted((PACKAGE / "methods").glob("*.py"))
    assert {f.stem for f in files} >= {"apo", "anchor", "apo_loss", "apo_settings", "codapo", "success", "zero_variance"}
    for path in files:
        for name in imported_modules(path):
            top = name.split(".")[0]
            assert top not in FORBIDDEN, f"{path.name} imports {name}"
            if top == "recipe_apo":
                assert name.startswith("recipe_apo.methods"), f"{path.name} imports {name} outside the maths"


def test_the_integration_does_not_import_the_testbed_or_the_audit():
    integration = [p for p in PACKAGE.glob("*.py")]
    for path in integration:
        for name in imported_modules(path):
            assert not name.startswith(("recipe_apo.testbed", "recipe_apo.audit")), f"{path.name} imports {name}"
