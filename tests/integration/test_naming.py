"""recipe_apo.integration.naming: the run names of the recipe's entry point and of the launch scripts (one rule
for both)."""

import hashlib

import pytest

from recipe_apo.integration.naming import experiment_name
from recipe_apo.integration.validation import RecipeConfigError

SCRIPT = ["method=apo", "data.train_files=/d/math.parquet", "data.max_response_length=3000",
          "actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B", "trainer.logger=[console,file]"]


def fingerprint(prefix, method, items):
    """The hash the name ends in, computed from the spec: sha1 of prefix, method and the sorted key=text lines."""
    text = "\n".join([prefix, method, *sorted(items)])
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def test_a_scripts_settings_count_through_a_hash_and_the_users_are_spelled_out():
    user = ["algorithm.apo.eta=0.5", "trainer.total_training_steps=10"]
    name = experiment_name("apo", SCRIPT + user, prefix="paper", script_overrides=len(SCRIPT))
    # In the hash: full keys, the full model id, the training data by its full paths (a list, as verl reads one
    # path), sorted by key. (It once held the data's file names only: moving the data kept the name, so a run on
    # other data resumed the first; tests/integration/test_run_names.py.)
    items = ["algorithm.apo.eta=0.5", "data.max_response_length=3000",
             "actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B", "data.train_files=[/d/math.parquet]"]
    assert name == f"paper-apo-apo.eta=0.5-{fingerprint('paper', 'apo', items)}"


def test_the_last_value_of_a_key_counts_and_repeating_the_scripts_value_changes_nothing():
    base = experiment_name("apo", SCRIPT, prefix="paper", script_overrides=len(SCRIPT))
    same = experiment_name("apo", SCRIPT + ["data.max_response_length=3000"], prefix="paper",
                           script_overrides=len(SCRIPT))
    changed = experiment_name("apo", SCRIPT + ["data.max_response_length=2048"], prefix="paper",
                              script_overrides=len(SCRIPT))
    assert same == base and changed != base and changed.startswith("paper-apo-data.max_response_length=2048-")
    # The data's folder counts as its file names do: this test once said moving the data kept the name, the
    # defect by which /data/v1/train.parquet and /data/v2/train.parquet shared a checkpoint folder.
    moved = [item.replace("/d/", "/elsewhere/") for item in SCRIPT]
    other = [item.replace("math.parquet", "gsm8k.parquet") for item in SCRIPT]
    assert experiment_name("apo", moved, prefix="paper", script_overrides=len(SCRIPT)) != base
    assert experiment_name("apo", other, prefix="paper", script_overrides=len(SCRIPT)) != base


def test_without_a_script_the_name_spells_everything_and_has_no_hash():
    assert experiment_name("grpo", ["actor_rollout_ref.rollout.n=4", "dry_run=true", "hydra.x=1"]) == "grpo-rollout.n=4"


def test_validation_sampling_is_not_a_training_setting():
    validation = ["actor_rollout_ref.rollout.val_kwargs.n=4", "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                  "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"]
    base = experiment_name("apo", SCRIPT, prefix="paper", script_overrides=len(SCRIPT))
    assert experiment_name("apo", SCRIPT + validation, prefix="paper", script_overrides=len(SCRIPT)) == base
    assert experiment_name("apo", [*SCRIPT[:1], *validation, *SCRIPT[1:]], prefix="paper",
                           script_overrides=len(SCRIPT) + 3) == base


@pytest.mark.parametrize("count", [-1, 6])
def test_a_script_count_beyond_the_command_line_is_refused(count):
    with pytest.raises(RecipeConfigError, match="run_name.script_overrides"):
        experiment_name("apo", SCRIPT, script_overrides=count)


def test_values_are_spelled_as_hydra_hands_them_to_multirun_jobs():
    # Hydra rewrites a multirun job's overrides (1e-6 -> 1e-06, true -> True); a single run must get the same name.
    assert experiment_name("apo", ["actor_rollout_ref.actor.optim.lr=1e-6", "algorithm.apo.reweight=false"]) == \
        experiment_name("apo", ["actor_rollout_ref.actor.optim.lr=1e-06", "algorithm.apo.reweight=False"]) == \
        "apo-apo.reweight=False-actor.optim.lr=1e-06"
    assert experiment_name("apo", ["~data.seed"]) == "apo-data.seed=deleted"


def test_models_with_the_same_folder_name_and_values_that_clean_up_alike_stay_apart():
    merged = "actor_rollout_ref.model.path=/ckpt/run/global_step_{}/actor/huggingface"
    first, second = (experiment_name("apo", [merged.format(step)]) for step in (100, 200))
    assert first.startswith("apo-model=huggingface-") and first != second
    assert experiment_name("apo", ["data.prompt_key=a/b"]) != experiment_name("apo", ["data.prompt_key=a_b"])
    # a hub id keeps its readable name and gains the hash of its full id
    assert experiment_name("apo", ["actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B"]).startswith(
        "apo-model=Qwen2.5-Math-1.5B-")


def test_a_multiruns_swept_keys_name_its_jobs_apart_even_when_they_do_not_change_training():
    from recipe_apo.integration.naming import swept_keys

    command = ["-m", "method=apo,grpo", "trainer.n_gpus_per_node=2,1", "actor_rollout_ref.rollout.n=8",
               "trainer.total_training_steps=range(1,3)", "data.seed=choice(1,2)", "trainer.logger=[console]",
               "--cfg", "job"]
    swept = swept_keys(command)
    assert swept == {"method", "trainer.n_gpus_per_node", "trainer.total_training_steps", "data.seed"}
    jobs = [["actor_rollout_ref.rollout.n=8", f"trainer.n_gpus_per_node={n}"] for n in (2, 1)]
    names = [experiment_name("apo", job, swept=swept) for job in jobs]
    assert names == ["apo-trainer.n_gpus_per_node=2-rollout.n=8", "apo-trainer.n_gpus_per_node=1-rollout.n=8"]
    # A single run (nothing swept) keeps plumbing out of its name: rerunning it on 8 GPUs resumes it.
    assert experiment_name("apo", jobs[0]) == experiment_name("apo", jobs[1]) == "apo-rollout.n=8"
    # The method names the job already: a sweep over it adds nothing more.
    assert experiment_name("grpo", ["method=grpo"], swept=swept) == "grpo"


def test_a_cut_name_still_shows_what_the_sweep_varies():
    long = ["actor_rollout_ref.model.path=/models/a-rather-long-model-folder-name-for-the-test",
            "algorithm.apo.anchor_scope=data_source", "algorithm.apo.lambda_scale=1.1"]
    names = [experiment_name("apo", [*long, f"trainer.n_gpus_per_node={n}"], swept={"trainer.n_gpus_per_node"})
             for n in (2, 1)]
    assert [name.split("-model=")[0] for name in names] == ["apo-trainer.n_gpus_per_node=2",
                                                            "apo-trainer.n_gpus_per_node=1"]
    assert all(len(name) == 96 for name in names)


def test_an_asynchronous_trainer_mode_and_its_settings_count_the_default_mode_does_not():
    assert experiment_name("apo", ["trainer.v1.trainer_mode=sync"]) == experiment_name("apo", []) == "apo"
    assert experiment_name("apo", ["trainer.v1.trainer_mode=colocate_async"]) == \
        "apo-trainer.v1.trainer_mode=colocate_async"
    assert experiment_name("apo", ["trainer.v1.separate_async.parameter_sync_step=2"]) == \
        "apo-trainer.v1.separate_async.parameter_sync_step=2"
    assert experiment_name("apo", ["trainer.save_freq=5"]) == "apo"
