"""Turns the CPU rehearsal on in this process; importing it is enough (``VERL_USE_EXTERNAL_MODULES`` target).

verl imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` at the start of ``import verl``, in the driver
and in every Ray worker. The rehearsal config (``conf/rehearsal/cpu.yaml``) puts this module there, with
``VERL_PLATFORM=cpu``, through Ray's runtime env, so every process of the run gets the CPU platform, the ``hf``
rollout backend and the patches, and no process of any other run does.
"""

from __future__ import annotations

import os

from recipe_apo.cpu import hf_rollout, patches, vllm_engine
from recipe_apo.cpu.platform import NAME, PlatformCPU

# What a process needs in its environment to be a rehearsal process; the rehearsal config sets the same for
# Ray's workers (conf/rehearsal/cpu.yaml, ray_kwargs.ray_init.runtime_env.env_vars).
ENV = {"VERL_PLATFORM": NAME, "VERL_USE_EXTERNAL_MODULES": __name__, **patches.ENGINE_DEVICE_ENV}
# Read by the local Ray cluster the driver starts: by default Ray prestarts one idle Python worker per CPU it
# is told of (16 here), which on 2 cores only slows the start of the processes verl actually needs.
DRIVER_ENV = {"RAY_prestart_worker_first_driver": "0"}


def install() -> None:
    """Register the CPU platform and the ``hf`` rollout, apply the patches; idempotent."""
    from verl.plugin.platform import PlatformRegistry, platform_manager

    for key, value in {**ENV, **DRIVER_ENV}.items():
        os.environ.setdefault(key, value)
    PlatformRegistry.register(NAME)(PlatformCPU)
    current = platform_manager._current_platform
    if current is not None and not isinstance(current, PlatformCPU):
        # Something asked for the platform before this module ran and got the "nvidia" fallback.
        platform_manager.set_platform(PlatformCPU())
    hf_rollout.register()
    patches.apply_all()
    if vllm_engine.installed():
        vllm_engine.vllm_distribution_alias()


install()
