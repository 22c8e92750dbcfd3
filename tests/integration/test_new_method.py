"""Adding a method that needs no new hand-off touches its package, its preset, its docs page and CHANGELOG, nothing
else: a throwaway method, written into a temporary folder as a package of ``recipe_apo.methods`` beside the
recipe's, and its preset beside ``conf/method/``, appears everywhere the recipe lists, registers, checks, runs and
reports methods (the catalog, verl's registries, the launch, the presets, the testbed, the rehearsal's table, the
league's and the report's rows), with no other file changed."""

from __future__ import annotations

import shutil
import sys
import textwrap

import pytest
from helpers.paths import ROOT
from helpers.testbed_tiny import TINY_RUN
from omegaconf import OmegaConf

from recipe_apo import methods as methods_package
from recipe_apo.integration import multi_output, presets, validation  # noqa: F401  (see NAME)
from recipe_apo.methods import catalog

# The throwaway method's name. multi_output and validation list the estimators when first imported (above: before
# the fixture adds one).

NAME = "throwaway"
PACKAGE = {
    "__init__.py": '''
        """A throwaway method: verl's GRPO advantages times ``algorithm.throwaway.scale``."""

        from dataclasses import dataclass
        from typing import Any

        from recipe_apo.methods.base import Method, Metric, setting
        from recipe_apo.methods.errors import MethodConfigError
        from recipe_apo.methods.settings import read_settings


        @dataclass(frozen=True)
        class ThrowawaySettings:
            scale: float = 1.0  # the advantages' factor

            @classmethod
            def from_algorithm_config(cls, algorithm_config: Any) -> "ThrowawaySettings":
                return read_settings(cls, algorithm_config, "throwaway", MethodConfigError)


        def uses_throwaway(config: Any) -> bool:
            return str(setting(config, "algorithm.adv_estimator")) == "throwaway"


        METHOD = Method(name="throwaway", title="Throwaway", active=uses_throwaway, presets=("throwaway",),
                        settings=ThrowawaySettings, metrics={"scale": Metric("the advantages' factor", headline=True,
                                                                             trust=True)})

        from recipe_apo.methods.throwaway import parts  # noqa: E402, F401
    ''',
    "parts.py": '''
        """The estimator, the launch check and the runtime, each declared where it is defined."""

        from recipe_apo.methods.base import MethodRuntime, StepOutput
        from recipe_apo.methods.errors import MethodConfigError
        from recipe_apo.methods.throwaway import METHOD, uses_throwaway


        @METHOD.estimator("throwaway", reads_std_norm=True)
        def throwaway_advantage(token_level_rewards, response_mask, config=None, index=None, **_):
            from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

            scale = METHOD.read_settings(config).scale
            advantages, _ = compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, config=config)
            return advantages * scale, advantages * scale


        @METHOD.launch_check
        def check_scale(launch):
            if uses_throwaway(launch.config) and METHOD.read_settings(launch.config.algorithm).scale <= 0:
                raise MethodConfigError("algorithm.throwaway.scale must be > 0")


        @METHOD.runtime
        class ThrowawayRuntime(MethodRuntime):
            def after_advantage(self, step, batch):
                scale = METHOD.read_settings(self.config.algorithm).scale
                return StepOutput(metrics={self.method.metric("scale"): scale})
    ''',
}
PRESET = """# @package _global_
# preset: {order: 8}
algorithm:
  adv_estimator: throwaway
  norm_adv_by_std_in_grpo: true
  use_kl_in_reward: false
actor_rollout_ref:
  actor:
    policy_loss:
      loss_mode: vanilla
    loss_agg_mode: token-mean
    loss_scale_factor: null
    use_kl_loss: false
"""


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """The method's package on ``recipe_apo.methods``' path, its preset in a copy of conf/method/ (for presets.py)
    and in Hydra's ConfigStore (``method=throwaway``), the methods' settings and the testbed's defaults stored again;
    all undone afterwards."""
    from hydra.core.config_store import ConfigStore

    import recipe_apo.conf
    from recipe_apo.integration import replay
    from recipe_apo.testbed import configs

    package = tmp_path / "methods" / NAME
    package.mkdir(parents=True)
    for name, text in PACKAGE.items():
        (package / name).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.setattr(methods_package, "__path__", [*methods_package.__path__, str(package.parent)])
    folder = tmp_path / "conf" / "method"
    folder.mkdir(parents=True)
    for path in (ROOT / "conf" / "method").glob("*.yaml"):
        shutil.copy(path, folder)
    (folder / f"{NAME}.yaml").write_text(PRESET)
    monkeypatch.setattr(presets, "_directory", lambda: folder)
    monkeypatch.setattr(replay, "_METHODS", None)
    store = ConfigStore.instance()

    def store_all() -> None:
        from recipe_apo.testbed import setting_check

        catalog.methods.cache_clear()
        presets.settings.cache_clear()
        setting_check.setting_rules.cache_clear()  # the testbed's keys: the methods' settings nodes among them
        store.store(name=recipe_apo.conf.METHOD_SETTINGS, node=recipe_apo.conf.method_settings())
        configs.store_settings()

    store.store(group="method", name=NAME, node=OmegaConf.create(PRESET), package="_global_")
    store_all()
    try:
        yield
    finally:
        from verl.trainer.ppo import core_algos

        store.repo["method"].pop(f"{NAME}.yaml", None)
        core_algos.ADV_ESTIMATOR_REGISTRY.pop(NAME, None)
        for module in [m for m in sys.modules if m == f"recipe_apo.methods.{NAME}" or
                       m.startswith(f"recipe_apo.methods.{NAME}.")]:
            del sys.modules[module]
        monkeypatch.undo()
        store_all()


def test_a_throwaway_method_appears_everywhere(throwaway, tmp_path, monkeypatch):
    from verl.trainer.ppo import core_algos

    from recipe_apo import plugin
    from recipe_apo.cpu import rehearse
    from recipe_apo.integration.validation import RecipeConfigError, validate_recipe_config
    from recipe_apo.testbed.launch_refusal import LaunchRefusal
    from recipe_apo.testbed.report import markdown
    from recipe_apo.testbed.report.league import trust_columns
    from recipe_apo.testbed.runner import run_testbed

    # The catalog finds it and places it: no order declared, so after the ordered methods, before the rescaler.
    method = catalog.method(NAME)
    assert catalog.names()[-2:] == (NAME, "zero_variance")
    assert catalog.active(OmegaConf.create({"algorithm": {"adv_estimator": NAME}})) == (method,)
    assert (method.settings_key, method.state_file, method.changes_advantages) == (NAME, f"{NAME}_state.json", True)

    # verl's registry, through the plugin.
    plugin.register()
    assert core_algos.get_adv_estimator_fn(NAME) is method.estimators[NAME]

    # Its preset: in its place, titled by the method, with its settings' defaults composed in.
    assert presets.names()[-1] == NAME and presets.preset(NAME).title == "Throwaway"
    assert presets.settings(NAME) == presets.MethodSettings(NAME, True, "vanilla", "token-mean")
    config = presets.compose(NAME)
    assert config.algorithm.throwaway.scale == 1.0

    # The launch runs its check, in one line.
    with pytest.raises(RecipeConfigError, match=r"^algorithm\.throwaway\.scale must be > 0$"):
        validate_recipe_config(presets.compose(NAME, ["algorithm.throwaway.scale=-1",
                                                      "actor_rollout_ref.rollout.n=8"]))

    # The reports' lists: the rehearsal's table, the league's trust table, the testbed's report; the report's
    # std-norm column reads its setting.
    assert "throwaway/scale" in catalog.headline_metrics()
    assert "throwaway/scale_avg" in [key for key, _, _ in trust_columns()]
    assert ("throwaway/scale_avg", "throwaway/scale: the advantages' factor, mean over rounds", "{:.3f}", None) in \
        markdown.method_rows()
    summary = rehearse.MethodSummary(NAME, 2, {}, {"throwaway/scale": 2.0}, [])
    assert "throwaway/scale" in rehearse.format_table([summary]).splitlines()[0]

    # The testbed (an adapter): its runtime runs, its metric is recorded and reported; its launch check refuses.
    from hydra import initialize_config_module

    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        summary = run_testbed(["seeds=[0]", *TINY_RUN, "rounds=2"], tmp_path / "run", show_progress=False,
                              entries={NAME: [f"method={NAME}", "algorithm.throwaway.scale=2.0"]})
        assert summary["aggregate"][NAME]["throwaway/scale_avg"]["mean"] == 2.0
        assert summary["methods"][NAME]["active"] == {NAME: {"scale": 2.0}}
        report_text = (tmp_path / "run" / "report.md").read_text()
        assert "| throwaway/scale: the advantages' factor, mean over rounds | 2.000 (one seed) |" in report_text
        assert f"| {NAME} | `{NAME}` | True | `vanilla` |" in report_text
        with pytest.raises(LaunchRefusal, match="algorithm.throwaway.scale must be > 0"):
            run_testbed(["seeds=[0]", *TINY_RUN], tmp_path / "refused", show_progress=False,
                        entries={NAME: [f"method={NAME}", "algorithm.throwaway.scale=-1"]})
