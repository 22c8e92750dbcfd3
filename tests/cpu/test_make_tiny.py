"""recipe_apo.cpu.make_tiny and recipe_apo.cpu.reward: the tiny model, tokenizer and toy dataset of the CPU rehearsal.

The default model is made once per module (a few seconds); a second default build checks determinism and a
``warmup_steps=0`` build the random-weight model.
"""

import ast
import json
import re
import sys

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from recipe_apo.cpu import make_tiny as mt
from recipe_apo.cpu import reward

VERL_COLUMNS = {"data_source", "prompt", "ability", "reward_model", "extra_info"}


@pytest.fixture(scope="module")
def tiny(tiny_task):
    return tiny_task


@pytest.fixture(scope="module")
def random_tiny(tmp_path_factory):
    return mt.make_tiny(tmp_path_factory.mktemp("random"), warmup_steps=0, progress=None)


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return AutoTokenizer.from_pretrained(tiny["model"])


def rows(path):
    return pd.read_parquet(path).to_dict("records")


def chatml(messages, add_generation_prompt):
    # Qwen2's ChatML for plain messages (no default system prompt), written out independently of make_tiny.
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def weights(paths):
    return load_file(paths["model"] / "model.safetensors")


# ----------------------------------------------------------------------------------------------------------------
# Layout
# ----------------------------------------------------------------------------------------------------------------


def test_returned_paths_and_files(tiny):
    assert set(tiny) == {"model", "train", "val", "reward"}
    model_files = {p.name for p in tiny["model"].iterdir()}
    expected = {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
    assert expected <= model_files
    assert tiny["train"] == tiny["model"].parent / "data" / "train.parquet" and tiny["train"].is_file()
    assert tiny["val"] == tiny["model"].parent / "data" / "val.parquet" and tiny["val"].is_file()
    assert tiny["reward"].samefile(reward.__file__)
    assert not (tiny["model"].parent / ".make_tiny.partial").exists()
    # Each folder it made holds its mark: what a later make_tiny (or rehearsal) may replace.
    assert (tiny["model"] / mt.MADE_MARK).is_file() and (tiny["train"].parent / mt.MADE_MARK).is_file()


# ----------------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------------


def test_special_tokens_and_newline(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token is not None and tokenizer.pad_token_id != tokenizer.eos_token_id
    for token in ("<|im_start|>", "<|im_end|>", tokenizer.pad_token):
        assert token in tokenizer.all_special_tokens
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1
    assert len(tokenizer.encode("\n", add_special_tokens=False)) == 1  # verl's ChatML boundary logic needs it
    assert 256 < len(tokenizer) < 400
    # Nothing is added around encoded text (no BOS), as with Qwen2.
    assert tokenizer.encode("7", add_special_tokens=True) == tokenizer.encode("7", add_special_tokens=False)


def test_chat_template_round_trip(tiny, tokenizer):
    for row in rows(tiny["val"]):
        messages = list(row["prompt"])
        for add_generation_prompt in (True, False):
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
            assert text == chatml(messages, add_generation_prompt)
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
            ids = ids["input_ids"] if not isinstance(ids, list) else ids  # transformers 5 returns a BatchEncoding
            assert ids == tokenizer.encode(text, add_special_tokens=False)
            assert tokenizer.decode(ids) == text
        answer = row["reward_model"]["ground_truth"] + "<|im_end|>"
        answer_ids = tokenizer.encode(answer, add_special_tokens=False)
        assert answer_ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(answer_ids, skip_special_tokens=True) == row["reward_model"]["ground_truth"]


def test_transformers_loader_matches_the_saved_tokenizer(tiny, tokenizer):
    # transformers 5 loads a qwen2 folder with Qwen2Tokenizer, which rebuilds the pre-tokenizer; make_tiny
    # trains with the same one, so the class transformers picks and tokenizer.json itself agree.
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tiny["model"] / "tokenizer.json"))
    texts = [chatml(list(r["prompt"]), True) + r["reward_model"]["ground_truth"] for r in rows(tiny["val"])]
    texts += ["héllo wörld 123 +-= \t\n\n  x", "reverse\nabcd", "12+7=19"]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == raw.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids) == text
    # Letters stay single tokens, so a reversal is a reversal of token sequences.
    assert [len(tokenizer.encode(c, add_special_tokens=False)) for c in "abcxyz"] == [1] * 6
    assert len(tokenizer.encode("abcd", add_special_tokens=False)) == 4


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------


def test_model_loads_as_qwen2(tiny, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny["model"])
    config = model.config
    assert config.model_type == "qwen2" and type(model).__name__ == "Qwen2ForCausalLM"
    assert config.vocab_size == len(tokenizer) and config.tie_word_embeddings
    assert config.num_hidden_layers == 2 and config.max_position_embeddings == 256
    assert config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    gen = json.loads((tiny["model"] / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tokenizer.eos_token_id
    assert next(model.parameters()).dtype == torch.float32
    ids = torch.tensor([tokenizer.encode(chatml([{"role": "user", "content": "3+4="}], True))])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tokenizer))


def test_warm_up_gives_mixed_success(tiny, random_tiny):
    # The warm-up's purpose: sampled groups hold both successes and failures; random weights solve nothing.
    val = rows(tiny["val"])
    trained = mt.success_rates(
        AutoModelForCausalLM.from_pretrained(tiny["model"]), AutoTokenizer.from_pretrained(tiny["model"]), val, 8
    )
    assert 0.15 < trained["all"] < 0.85
    assert trained["solved_mostly"] > 0 and trained["failed_mostly"] > 0 and trained["mixed_group4"] > 0.2
    assert trained["tiny_add"] != trained["tiny_reverse"]
    untrained = mt.success_rates(
        AutoModelForCausalLM.from_pretrained(random_tiny["model"]),
        AutoTokenizer.from_pretrained(random_tiny["model"]),
        val,
        4,
    )
    assert untrained["all"] == 0.0


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def expected_answer(data_source, question):
    if data_source == "tiny_add":
        a, b = re.fullmatch(r"(\d)\+(\d)=", question).groups()
        return str(int(a) + int(b))
    assert data_source == "tiny_reverse"
    word = re.fullmatch(r"reverse\n([a-z]{2,4})", question).group(1)
    return "".join(reversed(word))


@pytest.mark.parametrize("split, n", [("train", 256), ("val", 32)])
def test_parquet_rows(tiny, split, n):
    df = pd.read_parquet(tiny[split])
    assert set(df.columns) == VERL_COLUMNS and len(df) == n
    assert df["data_source"].value_counts().to_dict() == {"tiny_add": n // 2, "tiny_reverse": n // 2}
    for index, row in enumerate(df.to_dict("records")):
        (message,) = row["prompt"]
        assert set(message) == {"role", "content"} and message["role"] == "user"
        assert row["reward_model"]["style"] == "rule"
        assert row["reward_model"]["ground_truth"] == expected_answer(row["data_source"], message["content"])
        assert row["extra_info"] == {"split": split, "index": index}
        assert isinstance(row["ability"], str) and row["ability"]


def test_prompts_and_answers_fit_verl_lengths(tiny, tokenizer):
    for row in rows(tiny["train"]) + rows(tiny["val"]):
        prompt = tokenizer.apply_chat_template(list(row["prompt"]), add_generation_prompt=True, tokenize=False)
        assert len(tokenizer.encode(prompt, add_special_tokens=False)) <= 40  # data.max_prompt_length=64
        answer = row["reward_model"]["ground_truth"] + "<|im_end|>"
        assert len(tokenizer.encode(answer, add_special_tokens=False)) <= 8  # data.max_response_length=16


def test_verl_rlhf_dataset_loads_it(tiny, tokenizer, tmp_path, monkeypatch):
    import datasets
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))
    config = OmegaConf.create(
        {
            "max_prompt_length": 64,
            "prompt_key": "prompt",
            "truncation": "error",
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "cache_dir": str(tmp_path / "verl"),
        }
    )
    dataset = RLHFDataset(str(tiny["val"]), tokenizer, config)
    assert len(dataset) == 32  # none filtered as over-long
    item = dataset[3]
    expected = rows(tiny["val"])[3]
    assert item["data_source"] == expected["data_source"] and item["index"] == 3
    assert item["raw_prompt"] == list(expected["prompt"])
    assert item["reward_model"]["ground_truth"] == expected["reward_model"]["ground_truth"]


# ----------------------------------------------------------------------------------------------------------------
# Reward
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, response, truth, score",
    [
        ("tiny_add", "7", "7", 1.0),
        ("tiny_add", "8", "7", 0.0),
        ("tiny_add", "17", "7", 0.0),
        ("tiny_add", "", "7", 0.0),
        ("tiny_add", "  12\n", "12", 1.0),
        ("tiny_add", "12<|im_end|>", "12", 1.0),
        ("tiny_add", "12<|im_end|>\n<|im_start|>user\n5", "12", 1.0),
        ("tiny_add", "1 2", "12", 0.0),
        ("tiny_reverse", "cba", "cba", 1.0),
        ("tiny_reverse", "abc", "cba", 0.0),
        ("tiny_reverse", "CBA", "cba", 0.0),
        ("tiny_reverse", "cba cba", "cba", 0.0),
        ("tiny_reverse", "\tdc <|im_end|><|endoftext|>", "dc", 1.0),
    ],
)
def test_reward_scores(source, response, truth, score):
    assert reward.compute_score(source, response, truth) == score
    # As verl's reward manager calls it: keywords, extra_info, and extra keywords it passes along.
    kwargs = dict(data_source=source, solution_str=response, ground_truth=truth, extra_info={},
                  reward_router_address=None)
    assert reward.compute_score(**kwargs) == score


def test_reward_rejects_unknown_source():
    with pytest.raises(ValueError, match="openai/gsm8k"):
        reward.compute_score("openai/gsm8k", "7", "7")


def test_reward_imports_only_the_standard_library():
    modules = set()
    for node in ast.walk(ast.parse(open(reward.__file__).read())):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules <= set(sys.stdlib_module_names)


def test_verl_loads_the_reward_by_pkg_and_by_path(tiny):
    from verl.utils.import_utils import load_extern_object

    for path in ("pkg://recipe_apo.cpu.reward", str(tiny["reward"])):
        fn = load_extern_object(module_path=path, object_name="compute_score")
        assert fn(data_source="tiny_add", solution_str="9", ground_truth="9", extra_info=None) == 1.0


# ----------------------------------------------------------------------------------------------------------------
# Determinism, warm-up off, re-runs, arguments
# ----------------------------------------------------------------------------------------------------------------


def test_same_seed_same_files(tiny, tmp_path):
    again = mt.make_tiny(tmp_path, progress=None)
    assert (again["model"] / "tokenizer.json").read_text() == (tiny["model"] / "tokenizer.json").read_text()
    first, second = weights(tiny), weights(again)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    for split in ("train", "val"):
        assert pd.read_parquet(again[split]).equals(pd.read_parquet(tiny[split]))


def test_other_seed_other_data(tmp_path):
    assert mt.task_rows("train", 16, 1) != mt.task_rows("train", 16, 0)
    assert mt.task_rows("train", 16, 0) == mt.task_rows("train", 16, 0)


def test_no_warm_up_keeps_the_random_init(tiny, random_tiny):
    trained, untrained = weights(tiny), weights(random_tiny)
    assert trained.keys() == untrained.keys()
    assert all(not torch.equal(trained[k], untrained[k]) for k in trained if not k.endswith("norm.weight"))
    # The same init make_tiny starts from (same seed, same tokenizer).
    tokenizer = AutoTokenizer.from_pretrained(random_tiny["model"])
    fresh = mt.build_model(tokenizer, seed=0).state_dict()
    assert all(torch.equal(untrained[k], fresh[k]) for k in untrained)


def test_rerun_overwrites_cleanly(tmp_path):
    mt.make_tiny(tmp_path, n_train=8, n_val=4, warmup_steps=0, progress=None)
    (tmp_path / "model" / "stale.bin").write_text("old")
    (tmp_path / "notes.txt").write_text("mine")
    lines = []
    paths = mt.make_tiny(tmp_path, n_train=6, n_val=2, warmup_steps=1, progress=lines.append)
    assert not (tmp_path / "model" / "stale.bin").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert len(pd.read_parquet(paths["train"])) == 6 and len(pd.read_parquet(paths["val"])) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "model", "notes.txt"]
    assert lines and all(line.startswith("make_tiny:") for line in lines)
    # A folder make_tiny created is marked as its own; one that was there is left unmarked.
    assert (tmp_path / "model" / mt.MADE_MARK).is_file() and (tmp_path / "data" / mt.MADE_MARK).is_file()
    fresh = tmp_path / "new" / "tiny"
    mt.make_tiny(fresh, n_train=2, n_val=2, warmup_steps=0, progress=None)
    assert sorted(p.name for p in fresh.iterdir()) == [mt.MADE_MARK, "data", "model"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_train": -1}, "n_train must be an integer >= 2, got -1"),
        ({"n_val": 1}, "n_val must be an integer >= 2, got 1"),
        ({"warmup_steps": -5}, "warmup_steps must be an integer >= 0, got -5"),
        ({"seed": 1.5}, "seed must be an integer >= 0, got 1.5"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        mt.make_tiny(tmp_path / "out", progress=None, **kwargs)
    assert not (tmp_path / "out").exists()


def test_out_dir_that_is_a_file_or_under_one(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(mt.OutDirError, match=f"^{re.escape(str(tmp_path / 'f'))} is a file, not a folder; give "
                                             f"make_tiny a folder you can write$"):
        mt.make_tiny(tmp_path / "f", progress=None)
    with pytest.raises(ValueError, match=f"/sub: {re.escape(str(tmp_path / 'f'))} is a file, not a folder; "):
        mt.make_tiny(tmp_path / "f" / "sub", progress=None)


@pytest.mark.parametrize("kind", ["a folder with files", "a file", "a link"])
@pytest.mark.parametrize("name", ["model", "data", ".make_tiny.partial"])
def test_a_folder_make_tiny_did_not_make_is_refused_and_kept(tmp_path, name, kind):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "model.safetensors").write_text("my weights")
    out = tmp_path / "out"
    out.mkdir()
    target = out / name
    if kind == "a folder with files":
        target.mkdir()
        (target / "model.safetensors").write_text("my weights")
    elif kind == "a file":
        target.write_text("my notes")
    else:
        target.symlink_to(mine, target_is_directory=True)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    # Small sizes: were it not refused at once, the build would take a second, not the module's default model.
    with pytest.raises(mt.OutDirError) as error:
        mt.make_tiny(out, n_train=2, n_val=2, warmup_steps=0, progress=None)
    assert str(error.value) == (f"{target} is {kind} that recipe-apo did not make (no .recipe-apo-made in it), and "
                                f"make_tiny would replace it: write the tiny model elsewhere, or remove {target} "
                                f"yourself")
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert (mine / "model.safetensors").read_text() == "my weights"


def test_cli_says_a_refused_folder_in_one_line(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert mt.main([str(tmp_path), "--warmup-steps", "0", "--n-train", "2", "--n-val", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"recipe-apo: error: {tmp_path / 'model'} is a folder with files that recipe-apo did "
                            f"not make (no .recipe-apo-made in it), and make_tiny would replace it: write the tiny "
                            f"model elsewhere, or remove {tmp_path / 'model'} yourself\n")


def test_cli_rejects_negative_count(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        mt.main([str(tmp_path), "--n-train", "-3"])
    assert exit_info.value.code == 2
    assert "argument --n-train: must be >= 2, got -3" in capsys.readouterr().err


def test_cli_prints_paths_and_overrides(tmp_path, capsys):
    assert mt.main([str(tmp_path), "--n-train", "4", "--n-val", "2", "--warmup-steps", "0"]) == 0
    out = capsys.readouterr().out
    for key in ("model", "train", "val", "reward"):
        assert f"{key}: " in out
    overrides = next(line for line in out.splitlines() if line.startswith("overrides: "))
    assert f"actor_rollout_ref.model.path={tmp_path / 'model'}" in overrides
    assert f"data.train_files={tmp_path / 'data' / 'train.parquet'}" in overrides
    assert f"data.val_files={tmp_path / 'data' / 'val.parquet'}" in overrides
