"""Names that say whose they are: no two methods define a class of one name, and each method's predicate, state
file, loss columns, loss metrics (``actor/<method>_...``) and rollout dump columns (``<method>_...``) carry its
name, so that one method's log, dump or checkpoint never reads as another's (``agpo`` and ``agpo_dual`` shared
theirs once). Read off the packages' source (``ast``) and their declarations."""

from __future__ import annotations

import ast
import inspect
import re
from collections import defaultdict
from pathlib import Path

from helpers.paths import ROOT

from recipe_apo.methods import catalog

METHODS = ROOT / "recipe_apo" / "methods"


def package_files(name: str) -> list[Path]:
    return sorted((METHODS / name).rglob("*.py"))


def module_classes(path: Path) -> set[str]:
    return {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)}


def shared_names(defined: dict[str, set[str]]) -> dict[str, list[str]]:
    """package -> names, as name -> the packages defining it, where more than one does."""
    owners = defaultdict(set)
    for package, names in defined.items():
        for name in names:
            owners[name].add(package)
    return {name: sorted(packages) for name, packages in owners.items() if len(packages) > 1}


def test_no_class_name_is_defined_by_two_methods():
    defined = {name: set().union(*map(module_classes, package_files(name))) for name in catalog.names()}
    assert all(defined.values())  # every package defines classes: the walk found them
    assert shared_names(defined) == {}


def test_the_rule_finds_a_shared_class_name():
    # agpo_dual's classes before they took its name
    assert shared_names({"agpo": {"AgpoSettings", "AgpoRuntime"}, "agpo_dual": {"AgpoSettings", "AgpoState"},
                         "apo": {"ApoSettings"}}) == {"AgpoSettings": ["agpo", "agpo_dual"]}


def test_each_methods_predicate_state_file_and_loss_columns_carry_its_name():
    for method in catalog.methods():
        assert method.active.__name__ == f"uses_{method.name}"
        assert method.state_file not in method.old_state_files  # (the state file's name derives from the name)
        for column in method.loss_columns:
            assert column.startswith(f"{method.name}_"), (method.name, column)
        for metric in method.loss_metrics:
            assert metric.startswith(f"actor/{method.name}_"), (method.name, metric)


def _constants(name: str) -> dict[str, str]:
    """The package's module-level string constants (``CLIP_COLUMN = "..."``), by name."""
    found = {}
    for path in package_files(name):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                    isinstance(node.value.value, str):
                found.update({target.id: node.value.value for target in node.targets if isinstance(target, ast.Name)})
    return found


def _dump_dicts(path: Path) -> list[ast.Dict]:
    """The dicts ``path`` hands back as a ``StepOutput``'s ``dump``: ``dump={...}``, or ``dump = {...}`` then
    ``dump=dump``; any other ``dump=`` fails the test (it could not be checked)."""
    dicts = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "dump":
            assert isinstance(node.value, ast.Dict) or (isinstance(node.value, ast.Name) and node.value.id == "dump"), \
                f"{path}:{node.value.lineno}: a dump this test cannot read"
            if isinstance(node.value, ast.Dict):
                dicts.append(node.value)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "dump" for t in node.targets):
            assert isinstance(node.value, ast.Dict), f"{path}:{node.lineno}: a dump this test cannot read"
            dicts.append(node.value)
    return dicts


def dump_columns(name: str) -> set[str]:
    """The keys of every dump the package's runtime hands back (names resolved to the package's constants); a key
    that is neither a string nor such a name fails the test: it could not be checked."""
    constants, columns = _constants(name), set()
    for path in package_files(name):
        for dump in _dump_dicts(path):
            for key in dump.keys:
                if isinstance(key, ast.Name) and key.id in constants:
                    columns.add(constants[key.id])
                else:
                    assert isinstance(key, ast.Constant) and isinstance(key.value, str), \
                        f"{path}:{key.lineno}: a dump column this test cannot read"
                    columns.add(key.value)
    return columns


def test_every_dump_column_carries_its_methods_name():
    seen = {name: dump_columns(name) for name in catalog.names()}
    assert seen["apo"] == {"apo_phi", "apo_anchor"}
    assert seen["agpo_dual"] == {"agpo_dual_temperature", "agpo_dual_clip_eps"}  # a literal and a constant
    for name, columns in seen.items():
        assert all(column.startswith(f"{name}_") for column in columns), (name, sorted(columns))


def verl_loss_metrics() -> set[str]:
    """The ``actor/...`` metrics verl's own policy losses log (a method's loss may give its own value of one)."""
    from verl.trainer.ppo import core_algos

    return set(re.findall(r'"(actor/[a-z_]+)"', inspect.getsource(core_algos)))


def test_every_loss_metric_carries_its_methods_name():
    verl_own = verl_loss_metrics()
    assert {"actor/ppo_kl", "actor/pg_clipfrac"} <= verl_own
    logged = defaultdict(set)
    for name in catalog.names():
        for path in package_files(name):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                        re.fullmatch(r"actor/[a-z0-9_]+", node.value):
                    logged[name].add(node.value)
    assert "actor/agpo_dual_clip_eps_mean" in logged["agpo_dual"] and "actor/r2po_head_kl" in logged["r2po"]
    for name, metrics in logged.items():
        foreign = sorted(m for m in metrics if not m.startswith(f"actor/{name}_") and m not in verl_own)
        assert foreign == [], f"{name} logs {foreign}"
