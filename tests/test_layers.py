"""The package's layers, read off its import statements (module level and inside functions alike):

- the maths (``recipe_apo.methods``) imports only itself and ``recipe_apo.errors``, and no Ray, Hydra,
  TransferQueue or TensorDict: it is testable with torch, numpy and verl's ``core_algos`` alone;
- the verl integration (``recipe_apo.integration``) and the rewards (``recipe_apo.reward``) sit on the maths and
  import none of the tools;
- the tools (``cpu``, ``testbed``, ``audit``) sit on the maths and the integration, never on each other;
- the top of the package holds the entry points, the plugin and the errors, nothing else;
- no import circles, through module-level imports or imports inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.paths import ROOT

PACKAGE = ROOT / "recipe_apo"
FORBIDDEN_IN_MATHS = ("ray", "hydra", "transfer_queue", "tensordict")
TOOLS = ("cpu", "testbed", "audit")
TOP_LEVEL = {"__init__", "__main__", "plugin", "main", "errors"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, module_level_only: bool = False) -> set[str]:
    """The modules ``path`` imports (``from a import b`` also counts ``a.b``, which may be a module)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else ast.walk(tree)
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def sources(folder: str = "") -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


def own(names: set[str]) -> set[str]:
    return {n for n in names if n == "recipe_apo" or n.startswith("recipe_apo.")}


def test_the_maths_imports_only_the_maths():
    files = sources("methods")
    # One package per method (the catalog's list), each with its runtime.
    from recipe_apo.methods import catalog

    packages = {p.name for p in (PACKAGE / "methods").iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(catalog.PACKAGES)
    assert all((PACKAGE / "methods" / name / "runtime.py").is_file() for name in catalog.PACKAGES)
    for path in files:
        for name in imports(path):
            assert name.split(".")[0] not in FORBIDDEN_IN_MATHS, f"{path.name} imports {name}"
        for name in own(imports(path)):
            assert name == "recipe_apo" or name.startswith(("recipe_apo.methods", "recipe_apo.errors")), \
                f"{path.name} imports {name} outside the maths"


def test_the_integration_and_the_rewards_import_none_of_the_tools():
    for path in sources("integration") + sources("reward"):
        for name in own(imports(path)):
            assert not name.startswith(tuple(f"recipe_apo.{tool}" for tool in TOOLS)), f"{path} imports {name}"


def test_the_tools_never_import_each_other():
    for tool in TOOLS:
        others = tuple(f"recipe_apo.{other}" for other in TOOLS if other != tool)
        for path in sources(tool):
            for name in own(imports(path)):
                assert not name.startswith(others), f"{path.relative_to(PACKAGE)} imports {name}"


def test_the_top_of_the_package_holds_the_entry_points_the_plugin_and_the_errors_only():
    assert {p.stem for p in PACKAGE.glob("*.py")} == TOP_LEVEL
    # The configs sit at the top of the repository (conf/), installed as recipe_apo.conf (pyproject.toml).
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__")} == {
        "methods", "integration", "reward", *TOOLS}


def import_graph(module_level_only: bool) -> dict[str, set[str]]:
    """module -> the package's modules it imports (module level only, or also inside functions)."""
    modules = {module_name(p): p for p in sources()}
    graph = {name: {m for m in own(imports(path, module_level_only)) if m in modules and m != name}
             for name, path in modules.items()}
    # A module's own packages are imported before it anyway (``from recipe_apo.reward import worker`` in
    # recipe_apo.reward.pool names its package and the sibling module): only the sibling is an edge.
    for name, edges in graph.items():
        edges -= {name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each group of modules that import each other (a strongly connected component of more
    than one module), as ``[a, b, ..., a]``; none in a package without circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(graph[name]):
            if target not in index:
                connect(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            group = set(stack[stack.index(name):])
            del stack[stack.index(name):]
            if len(group) > 1:
                groups.append(group)

    for name in sorted(graph):
        if name not in index:
            connect(name)
    return [_circle_in(graph, group) for group in groups]


def _circle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest circle from the group's first module back to it, through the group only."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for name in frontier:
            for target in sorted(graph[name] & group):
                if target == start:
                    return paths[name] + [start]
                if target not in paths:
                    paths[target] = paths[name] + [target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no circle in {sorted(group)}")


def test_the_circle_finder_finds_each_circle_once():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"a"}}
    assert sorted(circles(graph)) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_level_import_circles():
    assert circles(import_graph(module_level_only=True)) == []


def test_no_import_circles_through_imports_inside_functions_either():
    # An import inside a function runs later, but a circle through it still loads a module that is half
    # initialised, or (``python -m``) the entry module a second time under its own name.
    found = circles(import_graph(module_level_only=False))
    assert found == [], "import circles: " + "; ".join(" -> ".join(circle) for circle in found)


# The adapters of the methods' runtimes: they drive whatever the catalog activates and name no method.
ADAPTERS = ("testbed/train.py", "testbed/update.py", "testbed/rollout.py", "integration/trainer.py",
            "integration/verl_access.py", "integration/checkpoint.py", "integration/rollout_dump.py")


def _names_in_code(path: Path) -> list[str]:
    """Identifiers, attribute names and string constants of a module, its docstrings and comments left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append(node.id)
        elif isinstance(node, ast.Attribute):
            out.append(node.attr)
        elif isinstance(node, ast.alias):
            out.append(node.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append(node.value)
    return out


def test_the_adapters_name_no_method():
    import re

    from recipe_apo.methods import catalog

    words = {*catalog.PACKAGES, "anchor", "agpo", "codapo", "pairing", "kept", "zv"}
    for relative in ADAPTERS:
        found = []
        for name in _names_in_code(PACKAGE / relative):
            parts = set(re.split(r"[^a-z0-9]+", name.lower().replace("recipe_apo", "").replace("recipe-apo", "")))
            if parts & words or any(word in name.lower() for word in ("zero_variance", "agpo_dual")):
                found.append(name)
        assert found == [], f"{relative} names {sorted(set(found))}"
