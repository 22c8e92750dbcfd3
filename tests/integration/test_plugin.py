"""Registration through verl's plugin entry point: fresh interpreters and loud failures. (In a Ray worker, by the
entry point alone: the node check's test, tests/integration/test_trainer.py.)"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from recipe_apo import plugin


def run_python(code, timeout=180, env=None):
    """Run `code` in a fresh interpreter with no APO-specific environment, from a neutral directory."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    child_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env,
        cwd="/",
    )


def last_json_line(stdout):
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


@pytest.mark.fresh_process
def test_plain_import_verl_registers_both_in_a_fresh_interpreter():
    result = run_python(
        """
        import json, sys
        import verl
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
        print(json.dumps({
            "estimator": get_adv_estimator_fn("apo").__module__,
            "loss": get_policy_loss_fn("apo").__module__,
            "loaded_by_verl": "recipe_apo.plugin" in sys.modules,
        }))
        """
    )
    assert result.returncode == 0, result.stderr
    assert last_json_line(result.stdout) == {
        "estimator": "recipe_apo.methods.apo.estimator",
        "loss": "recipe_apo.methods.apo.loss",
        "loaded_by_verl": True,
    }
    assert "recipe-apo" not in result.stderr  # no error and no version warning with the pinned verl


@pytest.mark.fresh_process
def test_a_broken_plugin_import_is_reported_as_an_error():
    # verl logs a failing plugin at DEBUG only; the plugin must say so itself, naming the cause.
    result = run_python(
        """
        import sys
        sys.modules["recipe_apo.methods.apo.loss"] = None  # makes `import recipe_apo.methods.apo.loss` fail
        import verl
        from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
        print("apo registered:", "apo" in ADV_ESTIMATOR_REGISTRY)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "apo registered: False" in result.stdout
    assert "ERROR" in result.stderr
    assert "recipe-apo: registering the methods' advantage estimators and policy losses with verl failed" in \
        result.stderr
    assert "recipe_apo.methods.apo.loss" in result.stderr


def test_version_check_warns_only_off_the_pin():
    assert plugin.verl_version_warning(plugin.PINNED_VERL_VERSION) is None
    message = plugin.verl_version_warning("0.8.0")
    assert "verl==0.9.1" in message and "verl 0.8.0" in message


def test_register_is_idempotent_and_never_shadows_another_apo():
    from verl.trainer.ppo import core_algos

    plugin.register()
    plugin.register()
    original = core_algos.POLICY_LOSS_REGISTRY["apo"]

    def impostor(**_):
        raise AssertionError("never called")

    core_algos.POLICY_LOSS_REGISTRY["apo"] = impostor
    try:
        plugin.register()  # the others register; "apo" is left to its holder, and recorded
        assert core_algos.POLICY_LOSS_REGISTRY["apo"] is impostor
        assert plugin.taken_message("policy loss", "loss_mode", "apo").startswith(
            "loss_mode=apo: this verl registers a policy loss of its own under that name (")
    finally:
        core_algos.POLICY_LOSS_REGISTRY["apo"] = original
        plugin.TAKEN.clear()


@pytest.mark.fresh_process
def test_a_name_verl_already_holds_leaves_the_others_registered_and_its_run_refused():
    """verl pull request #7497 registers a ``codapo`` of its own when verl is imported: the recipe's other
    estimators and losses still register, and a run of ``method=codapo`` is refused in one line rather than run
    verl's different CoDaPO under the recipe's name."""
    result = run_python(
        """
        import verl
        from verl.trainer.ppo import core_algos

        @core_algos.register_adv_est("codapo")
        def verls_own_codapo(**kwargs):
            raise AssertionError("never called")

        import recipe_apo.plugin as plugin
        from omegaconf import OmegaConf
        from recipe_apo.errors import RecipeError
        from recipe_apo.integration.validation import _check_registered_names

        print("registered:", sorted(n for n in ("apo", "agpo") if n in core_algos.ADV_ESTIMATOR_REGISTRY),
              sorted(n for n in ("apo", "apo_one_sided", "agpo", "agpo_clip") if n in core_algos.POLICY_LOSS_REGISTRY))
        print("codapo holder:", core_algos.ADV_ESTIMATOR_REGISTRY["codapo"].__name__)
        config = OmegaConf.create({"algorithm": {"adv_estimator": "codapo"},
                                   "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "vanilla"}}}})
        try:
            _check_registered_names(config, False)
        except RecipeError as exc:
            print("refused:", exc)
        """,
        env={"VERL_USE_EXTERNAL_PLUGINS": "none"},
    )
    assert result.returncode == 0, result.stderr
    assert "registered: ['agpo', 'apo'] ['agpo', 'agpo_clip', 'apo', 'apo_one_sided']" in result.stdout
    assert "codapo holder: verls_own_codapo" in result.stdout
    refused = next(line for line in result.stdout.splitlines() if line.startswith("refused:"))
    assert refused.startswith("refused: algorithm.adv_estimator=codapo: this verl registers an advantage estimator "
                              "of its own under that name (__main__.verls_own_codapo)")
