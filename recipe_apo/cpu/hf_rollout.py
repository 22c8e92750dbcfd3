"""The ``hf`` rollout backend for verl: ``actor_rollout_ref.rollout.name=hf``.

verl 0.9.1 looks a rollout backend up in two registries, in two kinds of process:
- ``RolloutReplicaRegistry`` (driver and TaskRunner): the replica class that starts the generation servers;
  here ``HFRolloutReplica``, which starts one ``HFGenerationServer`` actor per replica.
- ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` (every actor/rollout worker): the adapter through which the
  trainer puts its weights into the server after each update; here ``HFServerAdapter``.

``register()`` fills both; ``recipe_apo.cpu.activate`` calls it in every process of a rehearsal.
"""

from __future__ import annotations

import os
from typing import Generator, Optional

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from recipe_apo.cpu.hf_server import HFGenerationServer, RehearsalUnsupported
from recipe_apo.integration.validation import REHEARSAL_ROLLOUT as NAME


def _replica_world_size(config) -> int:
    return config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size


def server_actor_name(replica_rank: int, role: str = "", suffix: str = "") -> str:
    """The server's Ray actor name, as verl's vLLM backend names its servers (``<backend>_server_...``)."""
    role = f"{role}_" if role else ""
    return f"{NAME}_server_{role}{replica_rank}_0{suffix}"


class HFRolloutReplica(RolloutReplica):
    """One replica = one server actor in CPU memory; tensor, data and pipeline parallel sizes must be 1.

    Standalone (``init_standalone``, as verl's ``main_generation_server`` starts it) the server also serves
    OpenAI chat completions over HTTP, and ``server_address`` is that endpoint's ``host:port``.
    """

    def __init__(self, replica_rank, config, model_config, gpus_per_node=8, is_reward_model=False,
                 is_teacher_model=False, name_suffix=""):
        super().__init__(replica_rank, config, model_config, gpus_per_node, is_reward_model, is_teacher_model,
                         name_suffix)
        if self.world_size != 1:
            raise RehearsalUnsupported(
                f"actor_rollout_ref.rollout tensor/data/pipeline parallel sizes multiply to {self.world_size}: the "
                "CPU rehearsal's hf rollout runs one process per replica; set each of them to 1"
            )

    def _role(self) -> str:
        return "reward" if self.is_reward_model else "teacher" if self.is_teacher_model else ""

    async def launch_servers(self):
        options = dict(name=server_actor_name(self.replica_rank, self._role(), self.name_suffix),
                       max_concurrency=self.max_concurrency, num_cpus=0)
        if self.workers:
            node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
            options["scheduling_strategy"] = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=node_id, soft=False)
        server = ray.remote(HFGenerationServer).options(**options).remote(
            config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        await server.__ray_ready__.remote()
        self.servers = [server]
        self._server_handle = server
        if self.rollout_mode == RolloutMode.STANDALONE:
            # Standalone clients (verl's main_generation_server) speak OpenAI HTTP to this address.
            self._server_address = await server.serve_http.remote()
        else:
            # Training calls the server's methods through Ray; verl routes by this address only as a key.
            self._server_address = f"{NAME}-replica-{self.replica_rank}"


class HFServerAdapter(BaseRollout):
    """The worker side: hands the trainer's weights to this replica's server after each update."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = _replica_world_size(self.config)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self.is_leader_rank = self.rollout_rank == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        pass  # weights and caches never leave CPU memory

    async def release(self):
        pass

    @torch.no_grad()
    async def update_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                             global_steps: Optional[int] = None, wire_format: str = "named_tensors",
                             peft_config=None, **kwargs):
        if wire_format != "named_tensors":
            raise RehearsalUnsupported(
                f"actor_rollout_ref.rollout.checkpoint_engine: weight format {wire_format!r} is not supported by "
                "the CPU rehearsal's hf rollout; use the naive backend"
            )
        if peft_config is not None:
            raise RehearsalUnsupported(
                "LoRA adapters are not supported by the CPU rehearsal's hf rollout; set "
                "actor_rollout_ref.model.lora.merge=true or train without LoRA"
            )
        # Drained on every rank: producing a full tensor from FSDP shards is a collective.
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        if self.is_leader_rank:
            await self._server_handle().update_weights.remote(state, global_steps)


def register() -> None:
    """Make ``rollout.name=hf`` known to verl in this process (both registries); idempotent."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(NAME, lambda: HFRolloutReplica)
    base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{HFServerAdapter.__module__}.{HFServerAdapter.__qualname__}"
