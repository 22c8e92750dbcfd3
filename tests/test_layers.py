"""The package's layers, read off its import statements (module level and inside functions alike):

- the maths (``recipe_apo.methods``) imports only itself and ``recipe_apo.errors``, and no Ray, Hydra,
  TransferQueue or TensorDict: it is testable with torch, numpy and verl's ``core_algos`` alone;
- the verl integration (``recipe_apo.integration``) and the rewards (``recipe_apo.reward``) sit on the maths and
  import none of the tools;
- the tools (``cpu``, ``testbed``, ``audit``) sit on the maths and the integration, never on each other;
- the top of the package holds the entry points and the kept paths, nothing else;
- no module-level import circles.
"""

from __future__ import annotations

import ast
from pathlib import Path

from repo_paths import ROOT

PACKAGE = ROOT / "recipe_apo"
FORBIDDEN_IN_MATHS = ("ray", "hydra", "transfer_queue", "tensordict")
TOOLS = ("cpu", "testbed", "audit")
TOP_LEVEL = {"__init__", "__main__", "plugin", "main", "errors", "checkpoint", "trainer", "reward_manager"}


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
    assert {f.stem for f in files} >= {"apo", "anchor", "apo_loss", "apo_settings", "codapo", "success",
                                       "zero_variance"}
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


def test_the_top_of_the_package_holds_entry_points_and_kept_paths_only():
    assert {p.stem for p in PACKAGE.glob("*.py")} == TOP_LEVEL
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__")} == {
        "conf", "methods", "integration", "reward", *TOOLS}


def test_no_module_level_import_circles():
    modules = {module_name(p): p for p in sources()}
    graph = {name: {m for m in own(imports(path, module_level_only=True)) if m in modules and m != name}
             for name, path in modules.items()}
    # A module's own packages are imported before it anyway (``from recipe_apo.reward import worker`` in
    # recipe_apo.reward.pool names its package and the sibling module): only the sibling is an edge.
    for name, edges in graph.items():
        edges -= {name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)}
    done, stack = set(), []

    def visit(name: str) -> None:
        if name in stack:
            raise AssertionError("import circle: " + " -> ".join(stack[stack.index(name):] + [name]))
        if name in done:
            return
        stack.append(name)
        for target in sorted(graph[name]):
            visit(target)
        stack.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
