"""scripts/r2po_head.py: a plain model gains R2PO's rollout head and loses it again; what it refuses, in one line
with exit status 2 (arguments) or 1 (the model)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from subprocess import CompletedProcess

from helpers.paths import ROOT

SPEC = importlib.util.spec_from_file_location("r2po_head", ROOT / "scripts" / "r2po_head.py")
SCRIPT = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(SCRIPT)


def run(*args):
    """The script's main, in this process (a subprocess would import torch and transformers again)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = SCRIPT.main([str(a) for a in args])
    return CompletedProcess(args, code, out.getvalue(), err.getvalue())


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
