"""A kept path: ``trainer.checkpoint_callback_class=recipe_apo.checkpoint.AnchorCheckpointCallback`` for plain verl.

The anchor's checkpointing lives in ``recipe_apo.integration.checkpoint``; this module only keeps the old
import path working.
"""

from recipe_apo.integration.checkpoint import (
    STATE_FILE,
    AnchorCheckpointCallback,
    AnchorStateError,
    load_anchor_state,
    restore_for_run,
    save_anchor_state,
    uses_apo,
)

__all__ = ["STATE_FILE", "AnchorCheckpointCallback", "AnchorStateError", "load_anchor_state", "restore_for_run",
           "save_anchor_state", "uses_apo"]
