"""The testbed refuses what the recipe's launch refuses, through the methods' own launch checks
(``launch_refusal.check_launch``), before any work: R2PO with stale rounds (a stale round samples from the head of the
phase before a switch, as an asynchronous mode's rollout does) or without its model classes; a league entry with
staleness; the default league leaves R2PO out of its scenarios, saying so, where the launch refuses it on one."""

from __future__ import annotations

import pytest
from helpers.in_process import run_entry
from helpers.testbed_tiny import TINY_RUN
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from recipe_apo.integration import presets
from recipe_apo.methods.base import Launch
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.launch_refusal import LaunchRefusal, check_launch, launch_of

ERROR = "recipe-apo: error: "
PHASE = ("with algorithm.adv_estimator=r2po: a rollout of an asynchronous mode spans weight updates, so at a phase "
         "switch it samples from the other phase's head; ")
STALE = PHASE + "the testbed's stale rounds sample as such a mode does: set staleness=0"
NO_LIB = ("actor_rollout_ref.model.external_lib=None with algorithm.adv_estimator=r2po: verl must import "
          "recipe_apo.integration.model_classes where it builds the model (the rollout-head classes); the r2po preset "
          "sets it")


@pytest.fixture
def hydra_ctx():
    import recipe_apo.testbed.configs  # noqa: F401  (stores the settings' defaults that testbed.yaml composes)

    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        yield


def run_cli(*args: str, cwd):
    from recipe_apo.testbed.__main__ import cli

    return run_entry(lambda: cli(list(args)), "recipe_apo.testbed", *args, cwd=cwd)


@pytest.mark.parametrize("args, line", [
    (["method=r2po", "staleness=2"], "staleness=2 " + STALE),
    (["method=r2po", "staleness=1"], "staleness=1 " + STALE),
    (["method=r2po", "scenario=stale"], "staleness=2 " + STALE),
    (["method=r2po", "scenario=stale", "staleness=4"], "staleness=4 " + STALE),
    # R2PO by its estimator under another preset: its launch checks all the same (the model classes first).
    (["method=grpo", "algorithm.adv_estimator=r2po", "staleness=3"], NO_LIB),
    (["method=r2po", "actor_rollout_ref.model.external_lib=null"], NO_LIB),
    # The rest of R2PO's launch checks hold in the testbed too.
    (["method=r2po", "actor_rollout_ref.actor.strategy=fsdp"], "actor_rollout_ref.actor.strategy=fsdp with "
     "algorithm.adv_estimator=r2po: each phase trains part of the model"),
    # Another method's launch checks, the same way.
    (["method=apo", "algorithm.norm_adv_by_std_in_grpo=true"], "algorithm.norm_adv_by_std_in_grpo=true is not read "
     "by algorithm.adv_estimator=apo"),
    # An entry of methods that is refused on its own overrides.
    (['+methods.r2po_s=["method=r2po","staleness=2"]', "~methods.grpo"],
     "staleness=2 " + STALE + " (in methods.r2po_s: [method=r2po,staleness=2])"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_the_testbed_refuses_in_one_line_what_the_launch_refuses(tmp_path, args, line):
    out = tmp_path / "out"
    result = run_cli(*TINY_RUN, *args, f"hydra.run.dir={out}", cwd=tmp_path)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(ERROR + line), lines[0]
    assert result.stdout == "" and not out.exists() and not (tmp_path / "outputs").exists()


def test_the_refusals_are_the_launchs_own(hydra_ctx):
    """The testbed's line is what the recipe's launch check says of the same keys; in the recipe's trainer the
    asynchronous mode is named instead of the testbed's staleness."""
    from recipe_apo.methods.r2po.launch import check_launch as r2po_check

    cfg = compose(config_name="testbed", overrides=["method=r2po", "staleness=2"])
    with pytest.raises(LaunchRefusal) as info:
        check_launch(cfg)
    launch = launch_of(cfg)
    assert (launch.testbed, launch.staleness, launch.verl_mode, launch.recipe_trainer) == (True, 2, "sync", True)
    with pytest.raises(MethodConfigError) as direct:
        r2po_check(launch)
    assert str(info.value) == str(direct.value) == "staleness=2 " + STALE
    recipe = Launch(launch.config, recipe_trainer=True, verl_mode="colocate_async", testbed=True)
    with pytest.raises(MethodConfigError, match="^trainer.v1.trainer_mode=colocate_async " + PHASE.replace(
            "(", r"\(").replace(")", r"\)") + "run R2PO in sync mode$"):
        r2po_check(recipe)


@pytest.mark.parametrize("args", [
    ["method=r2po"],
    ["method=r2po", "staleness=0"],
    # What the testbed runs on purpose where the recipe cannot: its exact zero-variance reference; AGPO's probe
    # and CoDaPO's pairs with stale rounds (the testbed draws each round's prompts at the round, probes them with
    # the sampling policy: the launch's reasons, prompts drawn ahead of their step, do not hold).
    ["method=grpo", "algorithm.zero_variance=exact", "actor_rollout_ref.actor.loss_agg_mode=token-mean"],
    ["method=agpo_dual", "scenario=stale"],
    ["method=codapo", "scenario=stale"],
    ["method=apo", "scenario=stale"],
], ids=lambda v: " ".join(v))
def test_what_the_testbed_runs_on_purpose_passes(hydra_ctx, args):
    from recipe_apo.testbed.runner import checked_configs

    assert len(checked_configs([*TINY_RUN, *args])) == 1


def test_a_run_of_every_method_with_stale_rounds_leaves_r2po_out_with_one_line(hydra_ctx, capsys):
    from recipe_apo.testbed.runner import checked_configs

    cfgs = checked_configs([*TINY_RUN, "scenario=stale"])
    assert list(cfgs) == [name for name in presets.names() if name != "r2po"]
    assert capsys.readouterr().err.splitlines() == [
        "recipe-apo: note: methods.r2po is left out of this run: staleness=2 " + STALE]
    # Nothing left to run: refused, naming the entry.
    only = [f"~methods.{name}" for name in cfgs]
    with pytest.raises(LaunchRefusal, match=r"^staleness=2 .* set staleness=0 \(in methods.r2po: \[method=r2po\]\)$"):
        checked_configs([*TINY_RUN, "scenario=stale", *only])


LEAGUE = [*TINY_RUN, "mode=league", "~league.extra", "~league.variant_of"]


@pytest.mark.parametrize("extra, line", [
    (['+league.extra.r2po_s=["method=r2po","staleness=2"]', "league.methods=[grpo]", "league.scenarios=[[]]"],
     "staleness=2 " + STALE + " (in methods.r2po_s: [method=r2po,staleness=2])"),
    (['+league.variants.st=["staleness=1"]', "league.methods=[grpo,r2po]", "league.scenarios=[[]]"],
     "staleness=1 " + STALE + " (in methods.r2po_st: [method=r2po,staleness=1])"),
    (["league.methods=[r2po]", 'league.scenarios=[[],["scenario=stale"]]'],
     "staleness=2 " + STALE + " (in methods.r2po: [method=r2po]) (in league.scenarios entry [scenario=stale])"),
], ids=["extra entry", "variant", "scenario leaves none"])
def test_a_league_entry_the_launch_refuses_is_refused_before_any_training(hydra_ctx, extra, line):
    from recipe_apo.testbed.league import plan_league

    with pytest.raises(LaunchRefusal) as info:
        plan_league([*LEAGUE, *extra])
    assert str(info.value) == line


def test_a_league_leaves_out_of_every_scenario_a_method_the_launch_refuses_on_one(hydra_ctx, capsys):
    from recipe_apo.testbed.league import plan_league

    plan = plan_league([*LEAGUE, "league.methods=[grpo,r2po]",
                        'league.scenarios=[[],["scenario=stale"],["task.max_len=3"]]'])
    # Every method has the zv variant here (~league.variant_of): r2po_zv is left out alike.
    assert plan.left_out == {"r2po": "on stale: staleness=2 " + STALE, "r2po_zv": "on stale: staleness=2 " + STALE}
    assert list(plan.entries) == ["grpo", "grpo_zv"]
    assert {name: list(cfgs) for name, cfgs in plan.cfgs.items()} == {
        "default": ["grpo", "grpo_zv"], "stale": ["grpo", "grpo_zv"], "task.max_len=3": ["grpo", "grpo_zv"]}
    assert capsys.readouterr().err.splitlines() == [
        f"recipe-apo: note: the league leaves {label} out of every scenario (the recipe's launch refuses it on stale: "
        "staleness=2 " + STALE + ")" for label in ("r2po", "r2po_zv")]


def test_the_default_league_plans_no_entry_it_would_refuse(hydra_ctx, capsys):
    """The default league (every preset, its extra methods and variants, on its seven scenarios) leaves R2PO out:
    the launch refuses it on the two stale scenarios. Everything else is planned on every scenario."""
    from recipe_apo.testbed.configs import league_entries
    from recipe_apo.testbed.league import plan_league

    every = league_entries(compose(config_name="testbed", overrides=["mode=league"]))
    plan = plan_league(["mode=league"])
    assert list(plan.left_out) == ["r2po"] and plan.left_out["r2po"].startswith("on stale: staleness=2 ")
    kept = [label for label in every if label != "r2po"]
    assert list(plan.entries) == kept
    assert all(list(cfgs) == kept for cfgs in plan.cfgs.values()) and len(plan.cfgs) == 7
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_league_md_says_which_method_was_left_out():
    from recipe_apo.testbed.report.league import _introduction

    league = {"metric": "success_final", "labels": ["grpo"], "left_out": {"r2po": "on stale: staleness=2 " + STALE},
              "scenarios": {"default": {"seeds": [0]}}, "wall_s": 1.0}
    text = " ".join(_introduction(league))
    assert ("`r2po` is left out (the recipe's launch refuses it on stale: staleness=2 " + STALE + "). ") in text


def test_a_testbed_config_holding_no_method_of_the_launch_passes(hydra_ctx):
    """grpo has no launch check; its config, with the testbed's own keys, goes through every other unchanged."""
    cfg = compose(config_name="testbed", overrides=["method=grpo", "staleness=3"])
    check_launch(cfg)
    check_launch(OmegaConf.to_container(cfg, resolve=True))  # a plain mapping too
    assert isinstance(LaunchRefusal("x"), TestbedSettingError)

