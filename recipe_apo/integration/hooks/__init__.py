"""The recipe trainer's features, one hook each (``base.TrainerHook`` lists what a hook can do).

``HOOKS`` is the order the trainer calls them in: the audit's dump fields first (the dump's columns keep
that order), then the APO anchor, CoDaPO's hand-off, CoDaPO's resampling (it reads the weights the hand-off
produced), AGPO's controllers (the probe, the per-prompt clip, the step KL), and last the zero-variance
rescale, which changes the advantages every other hook has seen. A new feature is a new module here and one entry
in ``HOOKS``.
"""

from recipe_apo.integration.hooks.agpo import AgpoHook
from recipe_apo.integration.hooks.anchor import AnchorHook
from recipe_apo.integration.hooks.audit_dump import AuditDumpHook
from recipe_apo.integration.hooks.base import TrainerHook
from recipe_apo.integration.hooks.codapo import CodapoHook, ResamplingHook
from recipe_apo.integration.hooks.zero_variance import ZeroVarianceHook

HOOKS = (AuditDumpHook, AnchorHook, CodapoHook, ResamplingHook, AgpoHook, ZeroVarianceHook)

__all__ = ["HOOKS", "AgpoHook", "AnchorHook", "AuditDumpHook", "CodapoHook", "ResamplingHook", "TrainerHook",
           "ZeroVarianceHook"]
