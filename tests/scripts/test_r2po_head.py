"""scripts/r2po_head.py: a plain model gains R2PO's rollout head and loses it again; what it refuses, in one line
with exit status 2 (arguments) or 1 (the model)."""

from __future__ import annotations

import json

from helpers.scripts import load_script, run_main

SCRIPT = load_script("r2po_head")


def run(*args):
    return run_main(SCRIPT, *args)


def test_add_then_strip(tiny_task, tmp_path):
    import torch
    from safetensors.torch import load_file

    added = run("add", "--seed", "2", tiny_task["model"], tmp_path / "head")
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == f"r2po_head: wrote {tmp_path / 'head'}"
    assert json.loads((tmp_path / "head" / "config.json").read_text())["architectures"] == ["R2POQwen2ForCausalLM"]
    # --std's default is the launch's start, the released script's effective one: N(0, 0.02^2), layer1 drawn first
    assert SCRIPT.build_parser().parse_args(["add", "a", "b"]).std == SCRIPT.INIT_STD == 0.02
    weights, generator = load_file(tmp_path / "head" / "model.safetensors"), torch.Generator().manual_seed(2)
    for name in ("rollout_head.layer1.weight", "rollout_head.layer2.weight"):
        expected = torch.empty(weights[name].shape).normal_(0.0, 0.02, generator=generator)
        torch.testing.assert_close(weights[name].float(), expected)
    stripped = run("strip", tmp_path / "head", tmp_path / "kept")
    assert stripped.returncode == 0, stripped.stderr
    assert json.loads((tmp_path / "kept" / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]


def test_refusals(tiny_task, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    cases = [
        (("add", tiny_task["model"], tmp_path / "full"), 2, "exists and is not an empty folder; name a new one"),
        (("add", tmp_path / "nowhere", tmp_path / "out"), 2, "is not a model folder"),
        (("add", "--std", "0", tiny_task["model"], tmp_path / "out"), 2, "--std must be a finite number > 0, got 0.0"),
        (("strip", tiny_task["model"], tmp_path / "out"), 1, "has no rollout head (architectures ['Qwen2ForCausalLM']"),
    ]
    for args, code, message in cases:
        result = run(*args)
        assert result.returncode == code, (args, result.stderr)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine" and not (tmp_path / "out").exists()


def one_line_refusal(args, code, message, target):
    result = run(*args)
    assert result.returncode == code, (args, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("r2po_head: ") and message in lines[0], result.stderr
    assert not target.exists()  # refused before anything is written


def test_a_model_folder_that_cannot_be_read_is_refused_in_one_line(tiny_task, tmp_path):
    import shutil

    def broken(name, change):
        folder = tmp_path / name
        shutil.copytree(tiny_task["model"], folder)
        change(folder)
        return folder

    config = json.loads((tiny_task["model"] / "config.json").read_text())
    weights = (tiny_task["model"] / "model.safetensors").read_bytes()
    cases = [
        (broken("list", lambda f: (f / "config.json").write_text("[1, 2]")),
         "config.json holds a JSON list, not a model config (a JSON object)"),
        (broken("untyped", lambda f: (f / "config.json").write_text(json.dumps(
            {k: v for k, v in config.items() if k != "model_type"}))),
         "config.json names no model_type (got None); a model config names its family: llama, qwen2, qwen3"),
        (broken("garbage", lambda f: (f / "model.safetensors").write_bytes(b"\0" * 100)),
         "model.safetensors is not a readable weights file (SafetensorError: Error while deserializing header"),
        (broken("truncated", lambda f: (f / "model.safetensors").write_bytes(weights[: len(weights) // 2])),
         "model.safetensors is not a readable weights file (SafetensorError: Error while deserializing header: "
         "incomplete metadata, file not fully covered)"),
        (broken("empty", lambda f: (f / "model.safetensors").write_bytes(b"")),
         "model.safetensors is not a readable weights file"),
        (broken("pickle", lambda f: (f / "pytorch_model.bin").write_bytes(b"not a pickle")),
         "pytorch_model.bin is not a readable weights file"),
    ]
    for folder, message in cases:
        for command in ("add", "strip"):
            one_line_refusal((command, folder, tmp_path / "out"), 1, message, tmp_path / "out")


def test_a_folder_that_holds_a_head_is_refused_and_strip_takes_it(tiny_task, tmp_path):
    # what verl's model merger writes of a trained R2PO checkpoint: the head's weights under the family's own name
    assert run("add", "--seed", "3", tiny_task["model"], tmp_path / "head").returncode == 0
    merged = tmp_path / "head"
    config = json.loads((merged / "config.json").read_text())
    one_line_refusal(("add", merged, tmp_path / "out"), 1, f"{merged} has a rollout head already "
                     "(R2POQwen2ForCausalLM); train it as it is, or strip it first", tmp_path / "out")
    (merged / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2ForCausalLM"]}))
    trained = (merged / "model.safetensors").read_bytes()
    one_line_refusal(("add", merged, tmp_path / "out"), 1, f"{merged} holds a rollout head already "
                     "(rollout_head.layer1.weight, ... under architectures ['Qwen2ForCausalLM']: a merged R2PO "
                     "checkpoint); to train it on, make its config.json's architectures R2POQwen2ForCausalLM; to "
                     "start a fresh head, strip it first", tmp_path / "out")
    assert (merged / "model.safetensors").read_bytes() == trained
    stripped = run("strip", merged, tmp_path / "kept")
    assert stripped.returncode == 0, stripped.stderr
    one_line_refusal(("strip", tmp_path / "kept", tmp_path / "out"), 1, "has no rollout head", tmp_path / "out")


def test_a_std_whose_draw_is_not_finite_is_refused(tiny_task, tmp_path):
    for std in ("nan", "inf", "-inf", "-0.02", "0"):
        one_line_refusal(("add", f"--std={std}", tiny_task["model"], tmp_path / "out"), 2,
                         f"--std must be a finite number > 0, got {float(std)}", tmp_path / "out")
    for std in ("1e300", "1e39", "3e38"):  # finite stds whose N(0, std^2) draw overflows float32 (max 3.4e38)
        one_line_refusal(("add", f"--std={std}", tiny_task["model"], tmp_path / "out"), 1,
                         f"a head drawn with std {float(std):g} has non-finite weights in the model's float32 "
                         "(largest 3.4e+38); take a smaller std", tmp_path / "out")
