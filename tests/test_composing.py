"""tests/helpers/composing.py's cached compose gives the config Hydra's compose gives, for the kinds of overrides the
suite uses (group choices, appended groups, plain keys, added and deleted keys, lists), and refuses what Hydra
refuses."""

import pytest
from helpers.composing import compose_recipe, hydra_compose
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

CASES = [
    (),
    ("method=drgrpo", "data.max_response_length=1024"),
    ("actor_rollout_ref.rollout.name=vllm", "method=codapo", "algorithm.codapo.repeat_count=2"),
    ("method=apo", "rehearsal=cpu", "actor_rollout_ref.rollout.n=2", "trainer.nnodes=2"),
    ("method=grpo", "truncation=zero", "+algorithm.apo.lambda=2", "trainer.logger=[console,file]"),
    ("~algorithm.apo.history", "actor_rollout_ref.actor.tau_neg=2.0", "method=apo"),
]


@pytest.mark.parametrize("overrides", CASES)
def test_the_same_config_as_hydras_compose(overrides):
    reference = hydra_compose(overrides)
    OmegaConf.resolve(reference)
    cached = compose_recipe(*overrides)
    assert OmegaConf.to_container(cached) == OmegaConf.to_container(reference)
    assert OmegaConf.is_struct(cached) == OmegaConf.is_struct(reference)
    again = compose_recipe(*overrides)  # the cache hands out copies: changing one leaves the next alike
    again.trainer.project_name = "changed"
    assert compose_recipe(*overrides).trainer.project_name == reference.trainer.project_name


def test_unresolved_on_request_and_what_hydra_refuses_is_refused():
    assert "${" in OmegaConf.to_yaml(compose_recipe("method=drgrpo", resolve=False))
    for bad in ("algorithm.apo.no_such_key=1", "method=no_such_method"):
        with pytest.raises(ConfigCompositionException):
            hydra_compose([bad])
        with pytest.raises(ConfigCompositionException):
            compose_recipe(bad)
