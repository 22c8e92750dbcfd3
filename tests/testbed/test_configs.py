"""The testbed composes in two stages (``recipe_apo.integration.hydra_stages``: Hydra's defaults tree once per set
of group choices, the key overrides applied to a copy): the config and the refusals must be those of Hydra's own
``compose``."""

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from recipe_apo.integration import hydra_stages
from recipe_apo.testbed import configs
from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.hydra_errors import hydra_line


@pytest.fixture(scope="module")
def hydra_ctx():
    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        yield


def _hydra(overrides):
    return compose(config_name=configs.CONFIG_NAME, overrides=list(overrides))


def _same(a, b):
    assert OmegaConf.to_container(a, resolve=False) == OmegaConf.to_container(b, resolve=False)
    assert OmegaConf.is_struct(a) and OmegaConf.is_struct(b)


OVERRIDE_SETS = [
    [],
    ["method=grpo"],
    ["method=apo", "scenario=stale", "staleness=4"],
    ["method=agpo_dual", "task=modsum", "seeds=[0,1]"],
    ["scenario=many_updates", "method=drgrpo", "task.max_len=6", "algorithm.zero_variance=exclude"],
    ["mode=league", "~league.extra", '+league.extra.apo_x=["method=apo","algorithm.apo.eta=0.5"]'],
    ["method=r2po", "++rounds=7", "actor_rollout_ref.actor.optim.lr=2.5e-4", "hydra.run.dir=/tmp/x"],
    ["task=modsum", "task.moduli=[2,4]", "method=codapo", "scenario=long_response"],
]


@pytest.mark.parametrize("overrides", OVERRIDE_SETS, ids=lambda o: " ".join(o) or "defaults")
def test_two_stages_give_hydras_config(hydra_ctx, overrides):
    _same(configs.compose_testbed(overrides), _hydra(overrides))


def test_the_first_stage_is_composed_once_per_group_choice_and_never_shared_between_configs(hydra_ctx):
    configs.store_settings()
    a = configs.compose_testbed(["method=apo", "rounds=3"])
    b = configs.compose_testbed(["method=apo", "rounds=5", "scenario=default"])
    c = configs.compose_testbed(["rounds=9", "method=apo"])
    assert (a.rounds, b.rounds, c.rounds) == (3, 5, 9)
    # method=apo alone and method=apo with scenario=default are two choices; the key overrides are not part of one
    assert hydra_stages.first_stages() == 2
    a.rounds = 11  # a config handed out is the caller's: the next one does not see its change
    assert configs.compose_testbed(["method=apo"]).rounds == _hydra(["method=apo"]).rounds
    configs.store_settings()
    assert hydra_stages.first_stages() == 0


@pytest.mark.parametrize("overrides", [
    ["task.K=7"],
    ["+rounds=3"],
    ["~nothing_here"],
    ["method=nope"],
    ["rounds=${oops"],
    ["task=modsum", "task.max_len=6"],
    ["+league.extra.apo_x=[method=apo,algorithm.apo.eta=0.5]"],
])
def test_a_refusal_is_hydras_own_line(hydra_ctx, overrides):
    with pytest.raises(Exception) as hydra_error:
        _hydra(overrides)
    with pytest.raises(TestbedSettingError) as ours:
        configs.compose_testbed(overrides)
    assert str(ours.value) == hydra_line(hydra_error.value, overrides)
