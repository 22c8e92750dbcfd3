"""What the bias audit (``python -m recipe_apo.audit``) needs in verl's rollout dump and verl's dump lacks, for
every method: each response's ``response_length`` (tokens), ``advantage`` (the one the loss used),
``truncated`` and ``data_source`` (``recipe_apo.audit.dumps`` reads them)."""

from __future__ import annotations

import functools
from typing import Any

from recipe_apo.integration import batch_fields
from recipe_apo.integration.hooks.base import TrainerHook
from recipe_apo.methods.errors import BatchInputError
from recipe_apo.reward.truncation import end_token_ids, generation_config_of, truncated_rows


class AuditDumpHook(TrainerHook):
    @functools.cached_property
    def end_ids(self) -> frozenset[int]:
        return end_token_ids(self.trainer.tokenizer,
                             generation_config_of(self.config.actor_rollout_ref.model.get("path")))

    def dump_fields(self, batch: Any) -> dict[str, list]:
        data = batch_fields.read(batch, ["responses", "response_mask", "advantages"])
        responses = data["responses"].to_padded_tensor(padding=0)
        lengths = data["response_mask"].to_padded_tensor(padding=0).sum(dim=-1)
        # Outcome advantages are one value on every token of a response: its first token's.
        advantages = data["advantages"].to_padded_tensor(padding=0.0)[:, 0]
        cap = int(self.config.actor_rollout_ref.rollout.response_length)
        fields = {
            "response_length": lengths.tolist(),
            "advantage": advantages.float().tolist(),
            "truncated": truncated_rows(responses, lengths, cap, self.end_ids).float().tolist(),
        }
        try:
            fields["data_source"] = batch_fields.data_sources(batch).tolist()
        except BatchInputError:
            pass  # a dataset without data_source: the dump goes without it
        return fields
