"""The recipe's entry point: ``python -m recipe_apo.main method=<a preset of conf/method/> [Hydra overrides]``.

The config is verl's own ``ppo_trainer`` (from the installed verl) with one method preset from
``conf/method/`` and the ``algorithm.apo`` settings on top (``conf/apo_trainer.yaml``). Before Ray starts, the
config is checked here and a bad setting ends the run with one line naming the key. Training then runs in
verl's ``main_ppo`` machinery with the recipe's trainer (``recipe_apo.integration.trainer``): verl's V1 trainer of
the mode asked for, driving the active methods' runtimes (state in checkpoints, ``<method>/`` metrics).

``--cfg job`` prints the composed config and starts nothing; ``-m`` runs a Hydra multirun sweep, each job with
its own experiment name, checkpoint folder and logs.
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from recipe_apo.errors import RecipeError, recipe_error
from recipe_apo.integration.engine_watch import EngineWatch
from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.integration.modes import is_recipe_trainer, recipe_mode, verl_mode
from recipe_apo.integration.naming import (  # experiment_name: the naming rule, from the entry point too
    check_the_sweep,
    experiment_name,  # noqa: F401
    job_name,
    sweep_arguments,
    swept_keys,
)
from recipe_apo.integration.validation import (
    check_preset_runs,
    config_warnings,
    route_agent_loops,
    validate_recipe_config,
)
from recipe_apo.integration.verl_settings import check_with_verl


def name_the_run(config: DictConfig) -> None:
    """Fill ``trainer.experiment_name`` from Hydra's view of this job, when the user has not set it; in a multirun,
    first refuse a sweep two of whose jobs would share a checkpoint folder (``naming.check_the_sweep``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_config = HydraConfig.get()
    swept: frozenset[str] = frozenset()
    if hydra_config.mode == RunMode.MULTIRUN:
        # The sweep is on the multirun's command line; Hydra hands each job only its own values.
        arguments = sweep_arguments(hydra_config, sys.argv[1:])
        swept = swept_keys(arguments)
        check_the_sweep(config, hydra_config, arguments)
    if config.trainer.get("experiment_name"):
        return
    name = job_name(config, hydra_config.runtime.choices, list(hydra_config.overrides.task), swept)
    with open_dict(config):
        config.trainer.experiment_name = name


def method_choice() -> str | None:
    """The preset this Hydra job runs (``method=<name>``)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.choices.get("method")


def rehearsal_choice() -> str | None:
    """The rehearsal this Hydra job runs (``rehearsal=cpu``), or None for a real run."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.choices.get("rehearsal")


def prepare(config: DictConfig, rehearsal: str | None = None) -> DictConfig:
    """Name the run, resolve every interpolation here (Ray actors do not know Hydra's resolvers), pick the
    recipe's trainer for verl's mode and validate."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        name_the_run(config)
        OmegaConf.resolve(config)
    except OmegaConfBaseException as exc:
        # A setting that does not resolve (algorithm.agpo_dual=null under a preset that reads it), as one line.
        key = str(getattr(exc, "full_key", "") or "a setting")
        reason = " ".join(str(exc).splitlines()[0].split()) if str(exc) else type(exc).__name__
        raise RecipeConfigError(f"{key} does not resolve: {reason}") from None
    with open_dict(config):
        # not str(): a null or a number must reach the mode check as itself, not as the text "None" or "1"
        config.trainer.v1.trainer_mode = recipe_mode(config.trainer.v1.get("trainer_mode", "sync"))
    on_cpu = rehearsal == "cpu"
    if on_cpu:
        from recipe_apo.cpu.checks import check_rehearsal_config
        from recipe_apo.cpu.local_cluster import for_existing_cluster

        check_rehearsal_config(config)
        for_existing_cluster(config)  # trainer.nnodes>1: the run joins the local cluster at ray_init.address
    route_agent_loops(config)  # a method that samples prompts at their own settings: its agent loop file
    check_preset_runs(config, method_choice())
    validate_recipe_config(config, rehearsal=on_cpu)
    check_with_verl(config)
    for warning in config_warnings(config, on_cpu):
        print(f"recipe-apo: warning: {warning}", file=sys.stderr)
    return config


def describe(config: DictConfig, rehearsal: str | None = None) -> str:
    """Where this run writes, for a dry run and for the start of a real one."""
    from hydra.core.hydra_config import HydraConfig

    trainer = config.trainer
    return "\n".join([
        f"experiment: {trainer.project_name}/{trainer.experiment_name}",
        f"method: {HydraConfig.get().runtime.choices.get('method')} (estimator {config.algorithm.adv_estimator}, "
        f"loss {config.actor_rollout_ref.actor.policy_loss.loss_mode}, "
        f"aggregation {config.actor_rollout_ref.actor.loss_agg_mode})",
        f"trainer: {trainer.v1.trainer_mode}"
        + (f" (verl's {verl_mode(trainer.v1.trainer_mode)} with the recipe's hooks)"
           if is_recipe_trainer(str(trainer.v1.trainer_mode)) else " (not the recipe's: no method runtimes, state "
           "files, method metrics or dump fields)"),
        f"checkpoints: {trainer.default_local_dir}",
        f"hydra output: {HydraConfig.get().runtime.output_dir}",
        f"loggers: {', '.join(trainer.logger) if not isinstance(trainer.logger, str) else trainer.logger}",
        *([f"rollouts: {trainer.rollout_data_dir}"] if trainer.get("rollout_data_dir") else []),
        *([f"validation generations: {trainer.validation_data_dir}"] if trainer.get("validation_data_dir") else []),
        *([f"rehearsal: {rehearsal} (rollout {config.actor_rollout_ref.rollout.name})"] if rehearsal else []),
    ])


def one_line(error: BaseException) -> str:
    """What ``recipe-apo: error:`` is followed by: the error's message, without a prefix of its own."""
    return str(error).removeprefix("recipe-apo: ")


def prepare_models(config: DictConfig) -> None:
    """A method whose model carries parts of its own (``ModelParts.prepare``: R2PO's rollout head) trains the
    model its preparer gives: the run's own, or a copy made once in the run's checkpoint folder (said in one line).
    Before Ray starts, and not in a dry run (it writes)."""
    from pathlib import Path

    from recipe_apo.methods import catalog

    for method in catalog.active(config):
        if method.models.prepare is None:
            continue
        source = str(config.actor_rollout_ref.model.path)
        folder = Path(str(config.trainer.default_local_dir)).expanduser().resolve() / f"{method.name}_model"
        try:
            model = method.models.prepare(source, folder)
        except (ValueError, OSError) as exc:
            raise RecipeConfigError(f"actor_rollout_ref.model.path={source}: {exc}") from None
        if Path(model) != Path(source).expanduser().resolve():
            print(f"recipe-apo: {method.title} trains {model}, a copy of {source} with what its model adds",
                  flush=True)
            with open_dict(config):
                config.actor_rollout_ref.model.path = str(model)


def run(config: DictConfig, rehearsal: str | None = None) -> None:
    if rehearsal == "cpu":
        # This process (the driver) needs the CPU platform before verl's device detection below; Ray's workers
        # get it from the runtime env the rehearsal config sets.
        import recipe_apo.cpu.activate  # noqa: F401
    import ray
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    from recipe_apo.integration.task_runner import RecipeTaskRunner

    auto_set_device(config)
    started_ray = not ray.is_initialized()
    watch = EngineWatch.from_config(config)
    error = None
    try:
        with watch:
            run_ppo(config, task_runner_class=RecipeTaskRunner)
    except KeyboardInterrupt:
        if watch.failure is None:
            raise
        error = watch.failure
    except Exception as exc:
        # The estimator, the loss and the rehearsal name the data or setting at fault in one line; Ray buries
        # that line in remote tracebacks, so it is said again, last. A dead engine can also surface as a
        # generation error before the watch's next look: then the engine is named.
        cause = recipe_error(exc)
        error = one_line(cause) if cause is not None else watch.last_look()
        if error is None:
            raise
    finally:
        # Each job of a multirun gets its own Ray session, runtime env and driver (hence its own anchor).
        if started_ray and ray.is_initialized():
            ray.shutdown()
    if error is not None:
        print(f"recipe-apo: error: {error}", file=sys.stderr, flush=True)
        sys.exit(1)


@hydra.main(config_path="pkg://recipe_apo.conf", config_name="apo_trainer", version_base=None)
def main(config: DictConfig) -> Any:
    rehearsal = rehearsal_choice()
    try:
        prepare(config, rehearsal)
    except RecipeError as exc:  # any refused setting, whichever layer's checks refused it
        print(f"recipe-apo: error: {one_line(exc)}", file=sys.stderr)
        sys.exit(2)
    print(describe(config, rehearsal), flush=True)
    if config.get("dry_run", False):
        print("dry run: stopping before Ray starts", flush=True)
        return
    try:
        prepare_models(config)
    except RecipeError as exc:
        print(f"recipe-apo: error: {one_line(exc)}", file=sys.stderr)
        sys.exit(2)
    run(config, rehearsal)


if __name__ == "__main__":
    main()
