"""Run names that never meet for runs that train differently (recipe_apo/integration/naming.py): the training data
and the model count by their full resolved paths, spellings Hydra reads alike name a run alike, and a multirun two of
whose jobs would share a checkpoint folder is refused before any job starts.

Each of these named two runs alike, so the second resumed the first's checkpoints (verl's ``resume_mode=auto``):
data in another folder, paths that differ past the name's 96 characters, a list of files, a ``${oc.env:...}``
path; and a quoted ``trainer.v1.trainer_mode='sync'`` got another name than the same run unquoted."""

from __future__ import annotations

import pytest
from helpers.composing import LAUNCHABLE
from helpers.in_process import run_recipe_main
from omegaconf import OmegaConf

from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.integration.naming import check_the_sweep, experiment_name, job_name

DATA = "data.train_files=/data/{}/train.parquet"
DRY = ("dry_run=true", "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.name=vllm", *LAUNCHABLE)


def name(*overrides, **kwargs):
    return experiment_name("apo", list(overrides), **kwargs)


def lines(text, start):
    return [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith(start)]


def test_data_in_another_folder_is_another_run_with_the_same_readable_name():
    first, second = name(DATA.format("v1")), name(DATA.format("v2"))
    assert first != second
    assert first.startswith("apo-train_files=train.parquet-") and second.startswith("apo-train_files=train.parquet-")
    assert name(DATA.format("v1")) == first  # deterministic: a rerun resumes its own checkpoints
    # A script's data (counted through the hash) moves the same way.
    script = [DATA.format("v1"), "data.max_response_length=3000"]
    moved = [DATA.format("v2"), "data.max_response_length=3000"]
    assert name(*script, prefix="p", script_overrides=2) != name(*moved, prefix="p", script_overrides=2)


def test_paths_that_differ_only_past_60_characters_are_different_runs():
    deep = "/mnt/shared/datasets/" + "a-rather-long-folder-name/" * 3
    assert len(deep) > 60
    assert name(f"data.train_files={deep}v1/train.parquet") != name(f"data.train_files={deep}v2/train.parquet")
    model = "actor_rollout_ref.model.path=" + deep + "{}/checkpoint/actor/huggingface"
    assert name(model.format("run1")) != name(model.format("run2"))
    # a file name long enough to be cut from the readable part still counts in full
    long_file = "data.train_files=/d/" + "x" * 90 + "{}.parquet"
    assert name(long_file.format(1)) != name(long_file.format(2))


def test_lists_of_files_count_by_their_paths():
    files = "data.train_files=[/data/{0}/math.parquet,/data/{0}/gsm8k.parquet]"
    first, second = name(files.format("v1")), name(files.format("v2"))
    assert first != second and first.startswith("apo-train_files=math.parquet,gsm8k.parquet-")
    assert name("data.train_files=[/data/v1/gsm8k.parquet,/data/v1/math.parquet]") != first  # another order
    # verl reads one path as a list of one: the same data, the same run
    assert name("data.train_files=[/data/v1/train.parquet]") == name(DATA.format("v1"))
    # files without a folder are named in full, without a hash
    assert name("data.train_files=[a.parquet,b.parquet]") == "apo-train_files=a.parquet,b.parquet"


def test_an_environment_path_counts_by_the_path_it_names(monkeypatch):
    def config(**overrides):
        return OmegaConf.create({"algorithm": {"adv_estimator": "apo"}, "run_name": {"prefix": None},
                                 "data": {"train_files": "${oc.env:APO_DATA}/train.parquet", **overrides}})

    task = ["data.train_files=${oc.env:APO_DATA}/train.parquet"]
    monkeypatch.setenv("APO_DATA", "/data/v1")
    first = job_name(config(), {"method": "apo"}, task)
    assert first == name(DATA.format("v1"))  # as the resolved path would be named
    monkeypatch.setenv("APO_DATA", "/data/v2")
    assert job_name(config(), {"method": "apo"}, task) == name(DATA.format("v2")) != first


@pytest.mark.parametrize("same, other", [
    # quoted or not, the config holds the string sync: the default trainer
    (["trainer.v1.trainer_mode='sync'", 'trainer.v1.trainer_mode="sync"', "trainer.v1.trainer_mode=sync"], []),
    (["data.prompt_key='prompt'", 'data.prompt_key="prompt"'], ["data.prompt_key=prompt"]),
    (["actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.optim.lr=0.000001"],
     ["actor_rollout_ref.actor.optim.lr=1e-06"]),
    (["algorithm.apo.reweight=FALSE", "algorithm.apo.reweight=false"], ["algorithm.apo.reweight=False"]),
    (["trainer.logger=[console, file]"], []),
])
def test_spellings_hydra_reads_alike_name_a_run_alike(same, other):
    assert {name(override) for override in same} == {name(*other)}


def test_a_quoted_number_is_a_string_and_another_run():
    number = name("actor_rollout_ref.actor.optim.lr=1e-06")
    for quoted in ("actor_rollout_ref.actor.optim.lr='1e-6'", "actor_rollout_ref.actor.optim.lr='1e-06'"):
        assert name(quoted) != number and name(quoted).startswith("apo-actor.optim.lr=_1e-")
    assert name("data.seed='1'") != name("data.seed=1")


def test_a_multirun_over_data_folders_names_its_jobs_apart_and_reads_environment_paths(tmp_path, monkeypatch):
    # The command: both jobs were named apo-train_files=train.parquet and the second resumed the first.
    monkeypatch.setenv("APO_DATA", "/data/v1")
    result = run_recipe_main("-m", "data.train_files=${oc.env:APO_DATA}/train.parquet,/data/v2/train.parquet",
                             "trainer.v1.trainer_mode='sync'", *DRY, f"hydra.sweep.dir={tmp_path / 'sweep'}",
                             cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    names = [experiment.split("/", 1)[1] for experiment in lines(result.stdout, "experiment:")]
    # Each job as a single run of its resolved path would be named (the quoted default mode counting for nothing).
    swept = {"data.train_files"}
    assert names == [name(DATA.format(v), "actor_rollout_ref.rollout.n=8", *LAUNCHABLE, swept=swept)
                     for v in ("v1", "v2")]
    assert names[0] != names[1] and all(
        n.startswith("apo-train_files=train.parquet-actor.use_dynamic_bsz=True-rollout.n=8-") for n in names)
    assert len(set(lines(result.stdout, "checkpoints:"))) == 2


def test_a_multirun_whose_jobs_would_share_a_checkpoint_folder_is_refused_before_any_job_starts(tmp_path):
    result = run_recipe_main("-m", "method=apo,apo", *DRY, f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert result.returncode == 2
    assert "experiment:" not in result.stdout and "dry run:" not in result.stdout  # job #0 did not start either
    (error,) = [line for line in result.stderr.splitlines() if "error" in line]
    assert error.startswith("recipe-apo: error: jobs #0 (method=apo) and #1 (method=apo) of this multirun would share "
                            "the checkpoint folder checkpoints/recipe_apo/apo-actor.use_dynamic_bsz=True-rollout.n=8 "
                            "(run name apo-actor.use_dynamic_bsz=True-rollout.n=8)")


def test_a_multirun_with_a_seed_torch_cannot_take_is_refused_before_any_job_starts(tmp_path):
    result = run_recipe_main("-m", "method=apo", "data.seed=1,01", *DRY, f"hydra.sweep.dir={tmp_path / 'sweep'}",
                             cwd=tmp_path)
    assert result.returncode == 2
    assert "dry run:" not in result.stdout  # job #0 did not start either
    (error,) = [line for line in result.stderr.splitlines() if "error" in line]
    assert error.startswith("recipe-apo: error: job #1 of this multirun: data.seed='01': null or a whole number")


def sweep_hydra(tmp_path):
    """What check_the_sweep reads of a job's HydraConfig."""
    return OmegaConf.create({"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"},
                             "sweep": {"dir": str(tmp_path)}, "runtime": {"choices": {"method": "apo"}}})


def sweep_config(**trainer):
    return OmegaConf.create({
        "algorithm": {"adv_estimator": "apo"}, "run_name": {"prefix": None, "script_overrides": 0},
        "data": {"seed": 1, "train_files": "/data/v1/train.parquet"},
        "trainer": {"project_name": "p", "experiment_name": None,
                    "default_local_dir": "checkpoints/${trainer.project_name}/${trainer.experiment_name}", **trainer},
    })


@pytest.mark.parametrize("arguments, trainer, clash", [
    # one explicit name, or one explicit folder, for every job
    (["data.seed=1,2", "trainer.experiment_name=mine"], {}, "checkpoints/p/mine (run name mine)"),
    (["data.seed=1,2"], {"default_local_dir": "/ckpt/shared"}, "/ckpt/shared (run names "),
    (["trainer.experiment_name=a,b,a"], {}, "checkpoints/p/a (run name a)"),
    # two spellings of one path
    (["data.train_files=${oc.env:APO_DATA}/train.parquet,/data/v1/train.parquet"], {}, "checkpoints/p/apo-train_files"),
])
def test_jobs_with_one_explicit_or_resolved_folder_clash(tmp_path, monkeypatch, arguments, trainer, clash):
    monkeypatch.setenv("APO_DATA", "/data/v1")
    config = sweep_config(**trainer)
    if "trainer.experiment_name=mine" in arguments:
        config.trainer.experiment_name = "mine"
    with pytest.raises(RecipeConfigError, match=r"^jobs #0 \(.*\) and #(1|2) \(.*\) of this multirun would share "
                                                r"the checkpoint folder ") as refused:
        check_the_sweep(config, sweep_hydra(tmp_path), arguments)
    assert clash in str(refused.value) and "\n" not in str(refused.value)
    # the same sweep with distinct folders passes
    check_the_sweep(sweep_config(), sweep_hydra(tmp_path), ["data.seed=1,2", "data.train_files=/a/x.parquet"])
