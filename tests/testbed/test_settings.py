"""The testbed's settings, output folder and league folder: every setting typed and bounded, refused before any
work starts with the recipe's one line (``recipe-apo: error: <key>=<value>: <what is allowed>``, exit status 2, no
traceback, nothing written), Hydra's own errors included; a league rerun into the same folder replaces the earlier
league's own results and nothing else."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from helpers.in_process import run_entry
from helpers.paths import ROOT
from helpers.testbed_tiny import TINY_RUN
from omegaconf import DictConfig, ListConfig, OmegaConf

from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.setting_check import check_settings, setting_rules, task_rules
from recipe_apo.testbed.setting_rules import Rule
from recipe_apo.testbed.settings import TASKS
from recipe_apo.testbed.verl_config import verl_reference

ERROR = "recipe-apo: error: "


def run_cli(*args: str, cwd: Path) -> CompletedProcess:
    """``python -m recipe_apo.testbed ARGS`` in this process (the entry's ``cli``: Hydra's real parsing, callbacks
    and exits): what it printed and its exit status. Only for refused runs: a valid one would train."""
    from recipe_apo.testbed.__main__ import cli

    return run_entry(lambda: cli(list(args)), "recipe_apo.testbed", *args, cwd=cwd)


def assert_refused(result: CompletedProcess, start: str) -> str:
    """Exit status 2 and exactly one line on stderr, the recipe's, starting with ``start``; nothing on stdout."""
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result
    assert len(lines) == 1 and lines[0].startswith(ERROR + start), result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    return lines[0]


# --- every setting that settings.py declares ---------------------------------------------------------------------

def _leaves(node: dict, rules: dict, path: str = ""):
    for key, value in node.items():
        full = f"{path}.{key}" if path else key
        if isinstance(value, dict) and full not in rules:
            yield from _leaves(value, rules, full)
        else:
            yield full, value


def declared_settings() -> list[tuple[str, str]]:
    """(key, task) for every setting settings.py declares but the methods' own nodes (algorithm.apo ...: their
    classes check them, test_the_method_settings_are_checked_by_their_own_classes)."""
    out = [(key, "reverse") for key, rule in setting_rules().items() if isinstance(rule, Rule)]
    for task in TASKS:
        out += [(key, task) for key in task_rules(task)]
    return out


@pytest.fixture(scope="module")
def bases() -> dict[str, dict]:
    """The composed testbed config of each task, as written (interpolations kept, as verl's are: a key the testbed
    does not read is compared with verl's as written); Hydra's context closed again: the entry's tests start their
    own."""
    from hydra import compose, initialize_config_module

    import recipe_apo.testbed.configs  # noqa: F401  (stores the settings' defaults that testbed.yaml composes)

    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        return {task: OmegaConf.to_container(compose(config_name="testbed", overrides=[f"task={task}"]),
                                             resolve=False) for task in TASKS}


def _has(tree: dict, key: str) -> bool:
    *parents, last = key.split(".")
    for part in parents:
        tree = tree.get(part, {}) if isinstance(tree, dict) else {}
    return isinstance(tree, dict) and last in tree


def test_the_composed_config_is_verls_with_the_declared_settings_and_they_pass(bases, configs):
    # The declarations (settings.py) give testbed.yaml its own keys and the check its rules: every declared key is
    # composed, every other key composed is verl's own (verl_reference), and every default passes.
    verl = verl_reference()
    for task in TASKS:
        rules = {**setting_rules(), **task_rules(task)}
        composed = {key for key, _ in _leaves(bases[task], rules)}
        assert set(rules) <= composed, task
        assert all(_has(verl, key) for key in composed - set(rules)), task
        check_settings(bases[task])
        check_settings(configs[task])
    for scenario in ("many_updates", "long_response", "stale"):
        scenario_yaml = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "scenario" / f"{scenario}.yaml"))
        # A scenario's task.* keys are the default task's (reverse) settings.
        rules = {**setting_rules(), **task_rules("reverse")}
        assert all(key in rules for key, _ in _leaves(scenario_yaml, rules)), scenario


def test_the_rules_come_from_the_declaration():
    """What a setting takes, as the check reads it from its field: by hand, for each kind of field."""
    said = {key: rule.allowed for key, rule in {**setting_rules(), **task_rules("modsum")}.items()}
    assert said["rounds"] == "a whole number in [1, 100000]"
    assert said["early_fraction"] == "a finite number in (0, 1]"
    assert said["mode"] == "one of train, signal, league"
    assert said["actor_rollout_ref.actor.shuffle"] == "true or false"
    assert said["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "null or a whole number in [1, 10000000]"
    assert said["actor_rollout_ref.actor.optim.betas"] == "a list of two finite numbers in [0, 1), e.g. [0.9,0.999]"
    assert said["actor_rollout_ref.actor.entropy_coeff"] == "must be 0: the testbed has no entropy bonus"
    # verl's keys are typed as verl declares them: its dataclass's annotation, or its default's type.
    assert said["actor_rollout_ref.actor.loss_scale_factor"] == "null or a whole number in [1.0, 10000000.0]"
    assert said["data.train_batch_size"] == "a whole number in [1, 65536]"
    assert said["scenario_name"] == "a non-empty string"
    assert said["task.moduli"] == "a non-empty list of distinct whole numbers in [2, 1000], e.g. [2,4,8,16,32]"
    assert said["league.methods"] == "a list of labels of methods, e.g. [grpo,apo]"
    assert said["league.scenarios"] == "a non-empty list of override lists, e.g. [[],[task.max_len=6],[scenario=stale]]"
    assert said["league.variant_of"] == "a mapping of label -> a list of labels, e.g. league.variant_of.zv=[grpo,apo]"
    assert said["methods"] == ("a mapping of label -> a list of overrides, e.g. "
                               "+methods.sapo=[method=grpo,actor_rollout_ref.actor.policy_loss.loss_mode=sapo]")
    assert said["algorithm.apo"] == "a mapping of algorithm.apo's settings"


# Wrong type, not finite, out of range, by the default's type; lists and mappings by hand.
SPECIAL = {
    "seeds": [[1.5], [], 0, ["a"], [2**70], [0, 0], [-1], [True], [2**32]],
    "methods": [5, ["method=grpo"], {"x": "method=apo"}, {"x": [5]}, {"x": [""]}],
    "league.methods": ["grpo", [5], ["grpo", "grpo"], {"grpo": 1}],
    "league.scenarios": [[], "x", [["task.max_len=6", 5]], ["task.max_len=6"]],
    "league.extra": [5, {"x": "method=apo"}, {"x": [5]}],
    "league.variants": [5, {"zv": "algorithm.zero_variance=exclude"}, {"zv": [math.nan]}],
    "league.variant_of": [5, {"zv": "grpo"}, {"zv": [1]}],
    "actor_rollout_ref.actor.optim.betas": [[0.9], [0.9, 1.0], "x", [math.nan, 0.9], [0.9, -0.1]],
    "signal.group_sizes": [[], [1], [4.5], 4, [4, 4]],
    "task.moduli": [[], [1], [2, 2], [2.5], 5, [2, 1001]],
}


def bad_values(key: str, default) -> list:
    if key in SPECIAL:
        return SPECIAL[key]
    if isinstance(default, bool):
        return ["true", 1, math.nan, None]
    if isinstance(default, int):
        return [1.5, "7", math.nan, math.inf, -1, 10**30, True]
    if isinstance(default, float):
        return ["0.5", math.nan, math.inf, -math.inf, -1e30, 1e30, True]
    if isinstance(default, str):
        return [5, "", ["x"], None]
    assert default is None or str(default).startswith("${"), (key, default)
    return ["x", math.nan, -1.0, True]


def _set(tree: dict, key: str, value) -> dict:
    out = copy.deepcopy(tree)
    *parents, last = key.split(".")
    node = out
    for part in parents:
        node = node[part]
    node[last] = value
    return out


@pytest.fixture(scope="module")
def configs(bases) -> dict[str, DictConfig]:
    """``bases`` as DictConfigs, changed in place one key at a time by ``checked``: copying verl's whole tree for
    each of a thousand refused values cost minutes."""
    out = {task: OmegaConf.create(tree) for task, tree in bases.items()}
    for cfg in out.values():
        OmegaConf.set_struct(cfg, False)
    return out


def checked(cfg: DictConfig, key: str, value) -> None:
    """``check_settings`` of ``cfg`` with ``key`` set to ``value``; ``cfg`` as it was afterwards."""
    before = OmegaConf.to_container(cfg, resolve=False)
    OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    try:
        check_settings(cfg)
    finally:
        *parents, last = key.split(".")
        node, was = cfg, before
        for part in parents:
            node, was = node[part], was[part]
        if last in was:
            node[last] = was[last]
        else:
            del node[last]


@pytest.mark.parametrize("key, task", declared_settings(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_setting_refuses_a_wrong_type_a_non_finite_number_and_an_out_of_range_value(configs, key, task):
    default = OmegaConf.select(configs[task], key)
    default = OmegaConf.to_container(default) if isinstance(default, (DictConfig, ListConfig)) else default
    for value in bad_values(key, default):
        with pytest.raises(TestbedSettingError) as refused:
            checked(configs[task], key, value)
        message = str(refused.value)
        assert message.startswith(f"{key}=") or message.startswith(f"{key}."), (value, message)
        assert "\n" not in message, message


@pytest.mark.parametrize("node", ["algorithm.apo", "algorithm.codapo", "algorithm.agpo_dual"])
def test_the_method_settings_are_checked_by_their_own_classes(configs, node):
    import dataclasses

    from recipe_apo.methods import catalog

    (method,) = [m for m in catalog.methods() if m.settings_key == node.split(".")[1]]
    for value in (5, "x", [1], None):
        with pytest.raises(TestbedSettingError, match=f"^{node}="):
            checked(configs["reverse"], node, value)
    for key in [*(f.name for f in dataclasses.fields(method.settings)), "K"]:
        with pytest.raises(ValueError, match=f"{node}.{key}"):
            checked(configs["reverse"], f"{node}.{key}", [1])


@pytest.mark.parametrize("key, value, said", [
    ("task.K", 7, "task.K=7: not a setting the testbed reads; task=reverse's settings: name, alphabet, min_len, "
                  "max_len, filler_mean"),
    ("task.moduli", [2], "task.moduli=[2]: not a setting the testbed reads (task.moduli is task=modsum's)"),
    ("foo", 1, "foo=1: not a setting the testbed reads; the testbed's settings: mode, league, methods, seeds"),
    ("actor_rollout_ref.actor.kl_loss_coeff", 1, "actor_rollout_ref.actor.kl_loss_coeff=1: not a setting"),
    ("actor_rollout_ref.actor.optim.warmup", 5, "actor_rollout_ref.actor.optim.warmup=5: not a setting the testbed "
                                               "reads; actor_rollout_ref.actor.optim's settings: lr, betas, "
                                               "weight_decay"),
    ("data.path", "x", "data.path=x: not a setting the testbed reads; data's settings: train_batch_size, "
                       "max_response_length"),
    # verl's own keys that the testbed does not read keep verl's values: it would not honour another.
    ("actor_rollout_ref.rollout.top_p", 0.5, "actor_rollout_ref.rollout.top_p=0.5: verl's setting, which the testbed "
                                             "does not read: keep verl's 1; actor_rollout_ref.rollout's settings: "
                                             "n, temperature, calculate_log_probs"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", 5, "actor_rollout_ref.actor.optim.lr_warmup_steps=5: verl's "
                                                         "setting, which the testbed does not read: keep verl's -1; "
                                                         "actor_rollout_ref.actor.optim's settings: lr, betas"),
    ("trainer", {"total_epochs": 3}, "trainer.total_epochs=3: verl's setting, which the testbed does not read: "
                                     "keep verl's 30; the testbed's settings: mode, league, methods"),
])
def test_an_unknown_key_is_refused_naming_it_and_the_known_ones(configs, key, value, said):
    with pytest.raises(TestbedSettingError) as refused:
        checked(configs["reverse"], key, value)
    assert str(refused.value).startswith(said)


def test_verls_own_actor_fields_are_typed_as_verl_declares_them(configs):
    checked(configs["reverse"], "actor_rollout_ref.actor.kl_loss_coef", 0.01)  # passed on to verl's actor config
    for key, value in (("kl_loss_coef", math.nan), ("use_dynamic_bsz", "yes"), ("ppo_micro_batch_size", 1.5),
                       ("policy_loss.clip_cov_ratio", "x")):
        with pytest.raises(TestbedSettingError, match=f"actor_rollout_ref.actor.{key}="):
            checked(configs["reverse"], f"actor_rollout_ref.actor.{key}", value)


def test_a_deleted_or_unset_setting_is_refused(bases):
    missing = copy.deepcopy(bases["reverse"])
    del missing["rounds"]
    with pytest.raises(TestbedSettingError, match=r"^rounds: missing \(deleted with ~rounds\?\)"):
        check_settings(missing)
    unset = OmegaConf.create(_set(bases["reverse"], "rounds", "???"))
    with pytest.raises(TestbedSettingError, match=r"^rounds=\?\?\?: not set; a whole number in \[1, 100000\]"):
        check_settings(unset)
    optional = copy.deepcopy(bases["reverse"])
    del optional["league"]["extra"], optional["league"]["variant_of"]  # ~league.extra, ~league.variant_of
    check_settings(optional)


# --- through the entry: the examples, Hydra's own errors ------------------------------------------------------

@pytest.mark.parametrize("args, start", [
    (["seeds=[1.5]"], "seeds=[1.5]: a non-empty list of distinct whole numbers in [0, 4294967295]"),
    (["task.filler_mean=nan"], "task.filler_mean=nan: a finite number in [0, 100]"),
    (["+task.K=7"], "task.K=7: not a setting the testbed reads; task=reverse's settings: name, alphabet"),
    (["seeds=[]"], "seeds=[]: a non-empty list"),  # and the other seeds: test_each_setting_refuses_...[seeds]
    # Hydra's own: a value its grammar does not read, a key not in the config, a config group option it lacks.
    (["seeds=[2^70]"], "seeds=[2^70]: not an override Hydra can read"),
    (["task.K=7"], "task.K=7: not a setting the testbed reads; task=reverse's settings: name, alphabet"),
    (["task=nope"], "task=nope: no such task; one of modsum, reverse"),
    (["critic.ppo_epochs=3"], "critic.ppo_epochs=3: verl's setting, which the testbed does not read: keep verl's "
                              "1; the testbed's settings: mode"),
    (["data.max_prompt_length=64"], "data.max_prompt_length=64: verl's setting, which the testbed does not read: keep "
                                    "verl's 512; data's settings: train_batch_size, max_response_length"),
    (["mode=league", 'league.scenarios=[["task.max_len=0"],[]]'],
     "task.max_len=0: a whole number in [1, 100] (in league.scenarios entry [task.max_len=0])"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_bad_setting_is_one_line_before_anything_is_written(tmp_path, args, start):
    out = tmp_path / "out"
    assert_refused(run_cli(*args, f"hydra.run.dir={out}", cwd=tmp_path), start)
    assert not out.exists() and not (tmp_path / "outputs").exists()


def test_a_sweep_is_refused_before_its_first_job_when_any_job_would_be(tmp_path):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "mode=signal", "signal.p_points=3,1.5", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert_refused(result, "signal.p_points=1.5: a whole number in [2, 1001]")
    assert not sweep.exists()


@pytest.mark.fresh_process
def test_the_process_exits_2_with_one_line_on_stderr(tmp_path):
    """The one test of a real process: its exit status and its whole stderr."""
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "recipe_apo.testbed", "seeds=[1.5]", f"hydra.run.dir={out}"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"{ERROR}seeds=[1.5]: a non-empty list of distinct whole numbers in [0, 4294967295], e.g. [0,1,2,3]"]
    assert not out.exists()


# --- the output folder ------------------------------------------------------------------------------------------

ROOT_USER = os.geteuid() == 0


@pytest.mark.parametrize("case", [
    "a file", "under a file", "sweep folder a file",
    pytest.param("read-only", marks=pytest.mark.skipif(ROOT_USER, reason="root writes a read-only folder")),
    pytest.param("under read-only", marks=pytest.mark.skipif(ROOT_USER, reason="root writes a read-only folder")),
])
def test_an_output_folder_the_run_cannot_write_is_one_line_before_any_training(tmp_path, case):
    place = tmp_path / "place"
    if case in ("a file", "under a file", "sweep folder a file"):
        place.write_text("a file of the user's")
    else:
        place.mkdir()
        place.chmod(0o555)
    folder = {"a file": place, "under a file": place / "run", "sweep folder a file": place,
              "read-only": place, "under read-only": place / "run"}[case]
    try:
        if case == "sweep folder a file":
            result = run_cli("-m", "rounds=1,2", f"hydra.sweep.dir={folder}", cwd=tmp_path)
            line = assert_refused(result, f"hydra.sweep.dir={folder}: ")
        else:
            line = assert_refused(run_cli(f"hydra.run.dir={folder}", cwd=tmp_path), f"hydra.run.dir={folder}: ")
        said = {"a file": "a file, not a folder", "under a file": f"cannot be created: {place} is a file",
                "sweep folder a file": "a file, not a folder", "read-only": "a read-only folder",
                "under read-only": f"cannot be created: {place} is read-only"}[case]
        assert said in line
        if place.is_file():
            assert place.read_text() == "a file of the user's"
        else:
            assert list(place.iterdir()) == []
    finally:
        if place.is_dir():
            place.chmod(0o755)


# --- a league rerun into the same folder ---------------------------------------------------------------------

LEAGUE = [o for o in TINY_RUN if not o.startswith(("rounds=", "pretrain.steps="))] + [
    "rounds=1", "pretrain.steps=1", "mode=league", "seeds=[0]", "league.methods=[grpo]", "~league.extra",
    "league.variants={}", "~league.variant_of"]


def test_a_resumed_league_keeps_the_scenarios_finished_with_its_configs_and_runs_the_rest(tmp_path, monkeypatch):
    from hydra import initialize_config_module

    import recipe_apo.testbed.configs  # noqa: F401
    from recipe_apo.testbed import league as league_module
    from recipe_apo.testbed.report import plots

    monkeypatch.setattr(plots, "plot_runs", lambda *args, **kwargs: None)
    monkeypatch.setattr(plots, "plot_league", lambda *args, **kwargs: None)
    ran = []
    run_testbed = league_module.run_testbed

    def recording(overrides, out_dir, *args, **kwargs):
        ran.append(out_dir.name)
        return run_testbed(overrides, out_dir, *args, **kwargs)

    monkeypatch.setattr(league_module, "run_testbed", recording)
    out = tmp_path / "league"
    two = LEAGUE + ['league.scenarios=[[],["task.max_len=3"]]']
    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        first = league_module.run_league(two, out, show_progress=False)
        assert ran == ["default", "task.max_len=3"]
        # The run stopped in its second scenario: that scenario's summary was never written.
        (out / "task.max_len=3" / "summary.json").unlink()
        (out / "league.md").unlink()
        ran.clear()
        resumed = league_module.run_league(two + ["league.resume=true"], out, show_progress=False)
        assert ran == ["task.max_len=3"]  # the finished default kept, the other run again
        for name in ("default", "task.max_len=3"):  # the same figures (NaN as NaN: compared as JSON)
            assert json.dumps(resumed["scenarios"][name]["matrix"]) == json.dumps(first["scenarios"][name]["matrix"])
            assert json.dumps(resumed["scenarios"][name]["rows"]) == json.dumps(first["scenarios"][name]["rows"])
        ran.clear()
        # Another setting of the runs: nothing is kept; without league.resume nothing is either.
        league_module.run_league(two + ["league.resume=true", "eval.samples=1"], out, show_progress=False)
        assert ran == ["default", "task.max_len=3"]
        ran.clear()
        league_module.run_league(two + ["eval.samples=1"], out, show_progress=False)
        assert ran == ["default", "task.max_len=3"]
        # Another machine's kernels (its fingerprint): nothing is kept.
        ran.clear()
        monkeypatch.setattr("recipe_apo.testbed.kernels.fingerprint", lambda: {"matmul": "another"})
        league_module.run_league(two + ["league.resume=true", "eval.samples=1"], out, show_progress=False)
        assert ran == ["default", "task.max_len=3"]


def test_a_league_rerun_replaces_the_earlier_leagues_own_results_and_nothing_else(tmp_path, monkeypatch):
    from hydra import initialize_config_module

    import recipe_apo.testbed.configs  # noqa: F401
    from recipe_apo.testbed.league import MARKER, run_league
    from recipe_apo.testbed.report import plots

    # The plots cost seconds and change nothing here (report.summary.RUN_FILES lists them; test_testbed checks that).
    monkeypatch.setattr(plots, "plot_runs", lambda *args, **kwargs: None)
    monkeypatch.setattr(plots, "plot_league", lambda *args, **kwargs: None)
    out = tmp_path / "league"
    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        run_league(LEAGUE + ['league.scenarios=[[],["task.max_len=3"]]'], out, show_progress=False)
        old = out / "task.max_len=3"
        assert (old / "summary.json").exists() and (old / MARKER).exists()
        (out / "notes.txt").write_text("the user's")
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

        # A refused rerun changes nothing: every setting is checked before the earlier results are touched.
        with pytest.raises(TestbedSettingError, match=r"task.max_len=0: .* \(in league.scenarios entry"):
            run_league(LEAGUE + ['league.scenarios=[["task.max_len=0"],[]]'], out, show_progress=False)
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before

        # A rerun with fewer scenarios: the dropped scenario's results go, with the earlier league.md.
        (old / "mine.txt").write_text("the user's")
        run_league(LEAGUE + ["league.scenarios=[[]]"], out, show_progress=False)
    league = json.loads((out / "league.json").read_text())
    assert list(league["scenarios"]) == ["default"] and "task.max_len=3" not in (out / "league.md").read_text()
    assert sorted(p.name for p in old.iterdir()) == ["mine.txt"]  # only what the league wrote is gone
    assert (out / "notes.txt").read_text() == "the user's" and (out / "default" / "summary.json").exists()
