"""The one golden test of the methods: the whole catalog as the packages declare it (``recipe_apo.methods.catalog``),
and every list the recipe derives from it, pinned. A new method changes this file and no other test (adding one
that needs no new hand-off touches its package, its preset, its docs page and CHANGELOG: ``test_new_method.py``).
"""

from __future__ import annotations

from recipe_apo.methods import catalog


def _part(obj) -> str:
    """A declared part as ``module:name``, its method's package left out (``estimator:apo_outcome_advantage``)."""
    return f"{obj.__module__.split('.', 3)[-1]}:{obj.__qualname__}"


def _roles(metric) -> str:
    return " ".join(role for role in ("headline", "trust", "final") if getattr(metric, role))


def declared(method) -> dict:
    """Everything a method declares, as plain data."""
    models = method.models
    return {
        "title": method.title, "presets": method.presets, "place": (method.rescales_advantages, method.order),
        "settings": method.settings and method.settings.__name__,
        "estimators": {name: (_part(e.function), e.needs, e.reads_std_norm)
                       for name, e in method.parts.estimators.items()},
        "losses": {name: (_part(loss.function), loss.columns, {k: _roles(m) for k, m in loss.metrics.items()})
                   for name, loss in method.parts.losses.items()},
        "runtime": method.parts.runtime and _part(method.parts.runtime),
        "checks": [_part(check) for check in method.checks()], "warnings": [_part(w) for w in method.warnings()],
        "prompt_columns": method.prompt_columns, "plain_verl": method.plain_verl,
        "old_state_files": method.old_state_files,
        "models": ([_part(f) for f in models.hf], sorted(models.vllm), models.prepare and _part(models.prepare),
                   models.policy_head and _part(models.policy_head)),
        "metrics": {quantity: _roles(m) for quantity, m in method.metrics.items()},
    }


CATALOG = {
    "apo": {
        "title": "APO", "presets": ("apo",), "place": (False, 1), "settings": "ApoSettings",
        "estimators": {"apo": ("estimator:apo_outcome_advantage", None, False)},
        "losses": {"apo": ("loss:compute_policy_loss_apo", (), {"actor/apo_gate_weight": "headline trust"}),
                   "apo_one_sided": ("loss:compute_policy_loss_apo_one_sided", (),
                                     {"actor/apo_gate_weight": "headline trust"})},
        "runtime": "runtime:ApoRuntime",
        "checks": ["launch:check_rewards_and_scope", "launch:check_std_normalisation", "launch:check_temperatures"],
        "warnings": ["launch:warn_multi_output_loops"],
        "prompt_columns": (), "plain_verl": True, "old_state_files": (), "models": ([], [], None, None),
        "metrics": {"anchor": "headline", "anchor_rate": "", "anchor_rate_at_floor": "", "batch_success": "headline",
                    "harder_group_share": "", "uniform_group_share": "", "weight_pos_mean": "headline",
                    "weight_neg_mean": "headline"},
    },
    "codapo": {
        "title": "CoDaPO", "presets": ("codapo",), "place": (False, 2), "settings": "CodapoSettings",
        "estimators": {"codapo": ("estimator:codapo_outcome_advantage", "the old policy's log-probs", True)},
        "losses": {}, "runtime": "runtime:CodapoRuntime",
        "checks": ["launch:check_trainer", "launch:check_resampling", "launch:check_rewards"],
        "warnings": ["launch:warn_tiling", "launch:warn_overlong_penalty"],
        "prompt_columns": (), "plain_verl": False, "old_state_files": (), "models": ([], [], None, None),
        "metrics": {"weight_mean": "", "confidence_mean": "", "difficulty_weight_mean": "", "accuracy_mean": "",
                    "resampled": "", "kept_prompts": ""},
    },
    "agpo": {
        "title": "AGPO", "presets": ("agpo",), "place": (False, 3), "settings": "AgpoSettings",
        "estimators": {"agpo": ("estimator:agpo_outcome_advantage", None, True)},
        "losses": {"agpo": ("loss:compute_policy_loss_agpo", (), {"actor/agpo_loss_clipped": "headline"})},
        "runtime": "runtime:AgpoRuntime", "checks": ["launch:check_rewards"], "warnings": [],
        "prompt_columns": (), "plain_verl": False, "old_state_files": (), "models": ([], [], None, None),
        "metrics": {"shaped_reward_mean": "headline", "bonus_share": "", "saturated_share": ""},
    },
    "agpo_dual": {
        "title": "AGPO (dual)", "presets": ("agpo_dual",), "place": (False, 4), "settings": "AgpoDualSettings",
        "estimators": {},
        "losses": {"agpo_clip": ("loss:compute_policy_loss_agpo_clip", ("agpo_dual_clip_eps",), {})},
        "runtime": "runtime:AgpoDualRuntime", "checks": ["launch:check_agpo_dual_launch"], "warnings": [],
        "prompt_columns": ("temperature",), "plain_verl": False, "old_state_files": ("agpo_state.json",),
        "models": ([], [], None, None),
        "metrics": {"temperature_mean": "headline trust", "temperature_std": "trust", "uncertainty_mean": "",
                    "uncertainty_avg": "", "vote_entropy_mean": "", "dispersion_mean": "", "probe_success": "",
                    "probe_tokens": "", "clip_eps_mean": "headline trust", "clip_eps_std": "trust",
                    "entropy_mean": "", "entropy_ratio_mean": "", "entropy_ref": "", "step_kl": "",
                    "kl_avg": "headline trust final"},
    },
    "r2po": {
        "title": "R2PO", "presets": ("r2po",), "place": (False, 5), "settings": "R2poSettings",
        "estimators": {"rarity": ("estimator:rarity_outcome_advantage", None, False),
                       "r2po": ("estimator:r2po_outcome_advantage", "the step's phase, from R2PO's runtime", False)},
        "losses": {}, "runtime": "runtime:R2poRuntime", "checks": ["launch:check_launch"], "warnings": [],
        "prompt_columns": (), "plain_verl": False, "old_state_files": (),
        "models": (["model:register_hf_models"],
                   ["R2POLlamaForCausalLM", "R2POQwen2ForCausalLM", "R2POQwen3ForCausalLM"],
                   "model:model_for_run", "model:new_rollout_head"),
        "metrics": {"phase": "headline", "round": "", "rarity_skipped_share": "", "range_skipped_share": ""},
    },
    "zero_variance": {
        "title": "zero-variance denominator", "presets": (), "place": (True, None), "settings": None,
        "estimators": {}, "losses": {}, "runtime": "runtime:ZeroVarianceRuntime",
        "checks": ["launch:check_zero_variance"], "warnings": [],
        "prompt_columns": (), "plain_verl": False, "old_state_files": (), "models": ([], [], None, None),
        "metrics": {"scale": "", "live_share": "", "ratio_dev_mean": "", "ratio_dev_max": ""},
    },
}


def test_the_catalog_as_declared_in_its_order():
    assert catalog.names() == tuple(CATALOG)
    assert {m.name: declared(m) for m in catalog.methods()} == CATALOG


def test_every_list_derived_from_the_declarations():
    from recipe_apo.integration import presets
    from recipe_apo.testbed.report.league import TRUST_COLUMNS, trust_columns

    assert list(catalog.estimators()) == ["apo", "codapo", "agpo", "rarity", "r2po"]
    assert list(catalog.losses()) == ["apo", "apo_one_sided", "agpo", "agpo_clip"]
    assert catalog.std_norm_estimators() == ("codapo", "agpo")
    # The CPU rehearsal's table, the league's trust table.
    assert catalog.headline_metrics() == (
        "apo/anchor", "apo/batch_success", "apo/weight_pos_mean", "apo/weight_neg_mean", "actor/apo_gate_weight",
        "agpo/shaped_reward_mean", "actor/agpo_loss_clipped", "agpo_dual/temperature_mean", "agpo_dual/clip_eps_mean",
        "agpo_dual/kl_avg", "r2po/phase")
    assert [key for key, _, _ in trust_columns()[len(TRUST_COLUMNS):]] == [
        "actor/apo_gate_weight_avg", "agpo_dual/temperature_mean_avg", "agpo_dual/temperature_std_avg",
        "agpo_dual/clip_eps_mean_avg", "agpo_dual/clip_eps_std_avg", "agpo_dual/kl_avg_final"]
    # The league's table of each method at work; the method the verdict sentences are about.
    assert list(catalog.league_metrics()) == ["codapo/resampled", "codapo/kept_prompts", "zero_variance/ratio_dev_mean",
                                              "zero_variance/ratio_dev_max"]
    assert [name for name, m in catalog.league_metrics().items() if m.peak] == ["zero_variance/ratio_dev_max"]
    assert [m.name for m in catalog.featured()] == ["apo"]
    # The presets (conf/method/), in their declared order, titled by their method where their header names none.
    assert [(p.name, p.title) for p in presets.presets()] == [
        ("grpo", "GRPO"), ("drgrpo", "Dr. GRPO"), ("apo", "APO"), ("codapo", "CoDaPO"), ("agpo_dual", "AGPO (dual)"),
        ("agpo", "AGPO"), ("r2po", "R2PO")]
