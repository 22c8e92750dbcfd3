"""A kept path: importing ``recipe_apo.trainer`` registers ``trainer.v1.trainer_mode=apo_sync`` with verl.

The trainer lives in ``recipe_apo.integration.trainer``; this module only keeps the old import path working.
"""

from recipe_apo.integration.trainer import TRAINER_NAME, ApoSyncTrainer

__all__ = ["TRAINER_NAME", "ApoSyncTrainer"]
