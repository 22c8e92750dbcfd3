"""What the bias audit (``python -m recipe_apo.audit``) needs in verl's rollout dump and verl's dump lacks, for
every method: each response's ``response_length`` (tokens), ``advantage`` (the one the loss used),
``truncated`` and ``data_source`` (``recipe_apo.audit.dumps`` reads them); and how stale each response is, in
verl's own units (weight versions, from the ``min_global_steps``/``max_global_steps`` verl tags each trajectory
with): ``policy_lag`` = verl's ``trajectory_staleness`` (the step's policy minus the freshest weights that
generated the response; 0 on-policy) and ``policy_lag_worst`` (minus the oldest: a partial rollout resumed
across updates spans several)."""

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
        fields.update(policy_lags(batch.tags, self.trainer.global_steps))
        return fields


def policy_lags(tags: list[dict], global_steps: int) -> dict[str, list]:
    """verl's staleness of each row (its ``_compute_metrics``: the policy trained at step t is version t - 1);
    null for a row verl recorded no versions for (its padding rows), nothing when no row has them."""
    versioned = [t.get("min_global_steps") is not None and t.get("max_global_steps") is not None for t in tags]
    if not any(versioned):
        return {}
    current = global_steps - 1
    return {"policy_lag": [current - int(t["max_global_steps"]) if v else None for t, v in zip(tags, versioned)],
            "policy_lag_worst": [current - int(t["min_global_steps"]) if v else None
                                 for t, v in zip(tags, versioned)]}
