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
    assert packages == set(catalog.names())
    assert all((PACKAGE / "methods" / name / "runtime.py").is_file() for name in catalog.names())
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
            "integration/verl_access.py", "integration/verl_worker_access.py", "integration/checkpoint.py",
            "integration/rollout_dump.py", "methods/handoff.py")


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

    words = {*catalog.names(), "anchor", "agpo", "codapo", "pairing", "kept", "zv"}
    for relative in ADAPTERS:
        found = []
        for name in _names_in_code(PACKAGE / relative):
            parts = set(re.split(r"[^a-z0-9]+", name.lower().replace("recipe_apo", "").replace("recipe-apo", "")))
            if parts & words or any(word in name.lower() for word in ("zero_variance", "agpo_dual")):
                found.append(name)
        assert found == [], f"{relative} names {sorted(set(found))}"


# ---- the hand-offs: the adapters own them (issue 50, item 2) ---------------------------------------------------------
RUNTIMES = sorted((PACKAGE / "methods").glob("*/runtime.py"))
DRIVER_STATE = ("recipe_apo.methods.driver_state", "recipe_apo.methods.handoff")


def _declared_modules() -> set[str]:
    """The modules of the estimators and losses the methods register with verl (the plugin loads them, whoever else
    imports them)."""
    from recipe_apo.methods import catalog

    parts = [*catalog.estimators().values(), *catalog.losses().values()]
    return {part.partition(":")[0] if isinstance(part, str) else part.__module__ for part in parts}


def _runtime_only_modules(graph: dict[str, set[str]]) -> set[str]:
    """The methods' runtimes and the modules of ``recipe_apo.methods`` that only they import (directly or through
    other such modules; a module a declaration names is loaded by the plugin or the launch too)."""
    runtimes = {module_name(path) for path in RUNTIMES}
    declared = _declared_modules()
    only = set(runtimes)
    while True:
        more = {name for name in graph if name.startswith("recipe_apo.methods.") and name not in only | declared
                and (importers := {m for m, edges in graph.items() if name in edges}) and importers <= only}
        if not more:
            return only
        only |= more


def _reads_driver_state(module: str, name: str) -> bool:
    """Whether ``module``'s top-level function or class ``name`` refers to the driver's state in its body."""
    path = PACKAGE.parent / module.replace(".", "/")
    tree = ast.parse((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text())
    words = {"driver_state", "kept", "keep", "forget", "handed", "record_result", "last_result", "clear_results"}
    own = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
           and node.module == "recipe_apo.methods.driver_state" for alias in node.names}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            return bool(used & ({"driver_state"} | (own & words)))
    return False


def test_no_runtime_touches_the_driver_state():
    """A runtime sees arguments and return values only: neither it nor a module only runtimes use imports the
    driver's state (or the adapters' hand-off), and nothing it imports from a module shared with an estimator (APO's
    ``anchor``) reads that state (``driver_anchors`` would)."""
    graph = import_graph(module_level_only=False)
    # The runtimes that once read it themselves are among those checked.
    assert {path.parent.name for path in RUNTIMES} >= {"apo", "codapo", "agpo", "r2po"}
    for module in sorted(_runtime_only_modules(graph)):
        touched = sorted(graph[module] & set(DRIVER_STATE))
        assert touched == [], f"{module} imports {touched}: a runtime sees arguments and return values only"
    for path in RUNTIMES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("recipe_apo."):
                if node.module in DRIVER_STATE:
                    raise AssertionError(f"{path.relative_to(PACKAGE)} imports {node.module}")
                readers = [a.name for a in node.names if _reads_driver_state(node.module, a.name)]
                assert readers == [], f"{path.relative_to(PACKAGE)} imports {readers} from {node.module}, which read " \
                                      "the driver's state: a runtime's state is its own (``estimator_state``)"


# The modules that call a method's runtime: the adapters, the hand-off and the testbed's launch check.
RUNTIME_CALLERS = (*ADAPTERS, "testbed/runner.py")


def _runtime_attributes(path: Path) -> set[str]:
    """The attributes a module reads of a runtime: of a name ``runtime``, or of a comprehension's or loop's variable
    over something named ``runtimes``."""
    tree = ast.parse(path.read_text())
    variables = {"runtime"}
    for node in ast.walk(tree):
        loops = [(g.target, g.iter) for g in getattr(node, "generators", ())]
        if isinstance(node, ast.For):
            loops.append((node.target, node.iter))
        for target, source in loops:
            if isinstance(target, ast.Name) and ast.unparse(source).endswith("runtimes"):
                variables.add(target.id)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in variables:
            found.add(node.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr") \
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in variables:
            raise AssertionError(f"{path.relative_to(PACKAGE)} asks a runtime for a hook by name "
                                 f"({ast.unparse(node)}): declare it on MethodRuntime and call it")
    return found


def test_every_hook_the_adapters_call_is_declared_on_the_runtime_base():
    from recipe_apo.methods.base import MethodRuntime

    declared = set(dir(MethodRuntime)) | set(MethodRuntime.__annotations__)
    called = {name: _runtime_attributes(PACKAGE / name) for name in RUNTIME_CALLERS}
    hooks = {"estimator_state", "estimator_inputs", "after_advantage", "loss_denominators"}
    assert hooks <= set().union(*called.values())  # the rule sees the calls it is meant to
    for module, attributes in called.items():
        undeclared = sorted(attributes - declared)
        assert undeclared == [], f"{module} calls {undeclared} on a runtime, which MethodRuntime does not declare"
        for attribute in attributes:
            value = getattr(MethodRuntime, attribute, None)
            if callable(value):
                assert (value.__doc__ or "").strip(), f"MethodRuntime.{attribute} ({module} calls it) has no docstring"


# The modules through which the recipe reaches into verl's internals, on the driver and in verl's workers. The CPU
# rehearsal (``recipe_apo.cpu``) patches verl on purpose, in a rehearsal only (``cpu/patches.py``, ``cpu/activate.py``).
VERL_ACCESS = ("integration/verl_access.py", "integration/verl_worker_access.py")


def _verl_names(tree: ast.AST) -> set[str]:
    """The names a module binds to verl's modules or objects (``import verl.x as y``, ``from verl.x import y``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name.split(".")[0]) for a in node.names if a.name.split(".")[0] == "verl")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "verl":
            names.update(a.asname or a.name for a in node.names)
    return names


def verl_internals(path: Path) -> list[str]:
    """What a module touches of verl's internals: a private verl name imported or read, an attribute of verl's set,
    or one swapped (``setattr``, ``driver_state.swapped``)."""
    tree = ast.parse(path.read_text())
    verl = _verl_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "verl":
            found += [f"imports {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            found += [f"imports {node.module}" for part in node.module.split(".") if part.startswith("_")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in verl:
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append(f"reads {node.value.id}.{node.attr}")
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                found.append(f"sets {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name) \
                and node.args[0].id in verl:
            function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if function in ("setattr", "delattr", "swapped"):
                found.append(f"{function}({node.args[0].id}, ...)")
    return found


def test_verls_internals_are_touched_in_the_access_modules_only():
    checked = [p for p in sources() if p.relative_to(PACKAGE).parts[0] != "cpu"
               and str(p.relative_to(PACKAGE)) not in VERL_ACCESS]
    touching = {str(p.relative_to(PACKAGE)): verl_internals(p) for p in checked}
    assert {name: found for name, found in touching.items() if found} == {}
    # The rule sees what it is meant to: the access modules and the rehearsal's patches do each of these.
    seen = " ".join(f for p in VERL_ACCESS for f in verl_internals(PACKAGE / p))
    assert "imports verl.experimental.agent_loop.agent_loop._agent_loop_registry" in seen
    assert "sets FSDPEngineWithLMHead.forward_step" in seen and "swapped(trainer_base, ...)" in seen
    assert "sets distributed.initialize_global_process_group_ray" in verl_internals(PACKAGE / "cpu/patches.py")


# ---- the testbed's reports (issue 50, item 4) -----------------------------------------------------------------------
# The testbed's modules that may import its reports (``testbed/report/``): the drivers that write a run's or a
# league's files and the sweep's entry point. The adapter and the tasks record a run's rounds; the reports read them.
REPORT_READERS = ("testbed/runner.py", "testbed/league.py", "testbed/collect.py")


def test_only_the_testbeds_drivers_import_its_reports():
    outside = [p for p in sources("testbed") if "report" not in p.relative_to(PACKAGE / "testbed").parts[:-1]]
    importers = {str(p.relative_to(PACKAGE)) for p in outside
                 if any(n.startswith("recipe_apo.testbed.report") for n in imports(p))}
    assert importers == set(REPORT_READERS)
    # And the reports sit on the adapter, never the other way round: they import neither a driver nor the modes.
    for path in sources("testbed/report"):
        drivers = {n for n in own(imports(path)) if n.startswith("recipe_apo.testbed.")
                   and n.split(".")[2] in ("runner", "league", "collect", "signal", "__main__", "preflight")}
        assert drivers == set(), f"{path.relative_to(PACKAGE)} imports {sorted(drivers)}"


# What the reports may still say though it names a method, each with why (the text is left out before the search;
# an exception that no longer occurs fails the test, so the list does not outlive its reason).
REPORT_EXCEPTIONS = {
    "recipe_apo": "the package's name",
    "norm_adv_by_std_in_grpo": "verl's setting, which the method table shows",
    "AdvantageEstimator.GRPO": "verl's own estimator that reads norm_adv_by_std_in_grpo (verl's, not a method's)",
    '"zero_variance": cfg["algorithm"].get("zero_variance", "keep")': "summary.json's methods block keeps the "
    "key its readers read (tests, results); the report itself shows the active methods by their titles",
}


def _phrase(text: str) -> str:
    import re

    return re.sub(r"[\s_\-./()]+", " ", text.lower()).strip()


def method_words() -> set[str]:
    """Every method's name, title, estimators, losses and presets, the presets' titles, and the words the reports
    held for APO's, CoDaPO's and the zero-variance denominator's (anchor, gate, zv, kept, resample); as phrases
    (``_phrase``: "zero_variance" and "zero-variance" alike)."""
    from recipe_apo.integration import presets
    from recipe_apo.methods import catalog

    words = {"anchor", "gate", "zv", "kept", "resample"}
    for m in catalog.methods():
        words |= {m.name, m.title, *m.estimators, *m.losses, *m.presets}
    words |= set(presets.names()) | {p.title for p in presets.presets()}
    return {_phrase(w) for w in words}


def method_words_in(text: str, words: set[str]) -> set[str]:
    import re

    spaced = f" {_phrase(text)} "
    return {w for w in words if re.search(rf"(?<![a-z0-9]){re.escape(w)}(?![a-z0-9])", spaced)}


def test_the_method_word_finder_finds_each_word():
    words = method_words()
    assert {"apo", "codapo", "agpo dual", "zero variance", "dr grpo", "r2po"} <= words
    assert method_words_in("APO's anchor C_t; algorithm.zero_variance=exclude", words) == {
        "apo", "anchor", "zero variance"}
    assert method_words_in("agpo_dual/kl_avg", words) == {"agpo", "agpo dual"}
    assert method_words_in("the paired differences over seeds, the probe's tokens", words) == set()


def test_the_testbeds_reports_name_no_method():
    """Every row, column and plot of a method's own comes from its declaration (``Metric``'s roles, ``Method.
    featured``); the reports' code, docstrings and comments name no method, but for ``REPORT_EXCEPTIONS``."""
    words = method_words()
    found, unused = [], set(REPORT_EXCEPTIONS)
    for path in sources("testbed/report"):
        text = path.read_text()
        for exception in REPORT_EXCEPTIONS:
            if exception in text:
                unused.discard(exception)
                text = text.replace(exception, " ")
        for number, line in enumerate(text.splitlines(), 1):
            if hits := method_words_in(line, words):
                found.append(f"{path.relative_to(PACKAGE)}:{number} {sorted(hits)}: {line.strip()}")
    assert found == [], "\n".join(found)
    assert unused == set(), f"exceptions that no longer occur: {sorted(unused)}"
