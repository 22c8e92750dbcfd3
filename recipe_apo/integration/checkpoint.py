"""The anchor in verl's checkpoints: ``global_step_N/apo_state.json`` next to ``actor/`` and ``data.pt``.

verl saves no estimator state, so a resumed run would restart C_t from ``anchor_init`` and reweight its first
steps against the wrong capability. The recipe's trainer (``recipe_apo.integration.trainer``) writes the driver's
anchors into every checkpoint folder and reads them back on resume; ``AnchorCheckpointCallback`` does the same for
plain ``verl.trainer.main_ppo`` through ``trainer.checkpoint_callback_class``.

On resume, a missing or unreadable state file, or one of the other ``anchor_scope``, stops the resume with one
line naming the file and the cause: a long run must not lose its anchor unnoticed. ``algorithm.apo.
on_missing_state=fresh`` starts the anchor fresh instead (from ``anchor_init``, or the first batch's success
rate when that is null), with a warning; use it to switch a run from another method to APO mid-run, whose
checkpoints have no state file. Runs that do not use ``apo`` never read or write the file.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any, Optional

from verl.trainer.ppo.checkpoint_callback import CheckpointCallback

from recipe_apo.integration.errors import AnchorStateError, cause_of
from recipe_apo.methods.anchor import GLOBAL_SCOPE, AnchorBook
from recipe_apo.methods.apo_settings import ApoSettings
from recipe_apo.methods.driver_state import driver_anchors, install_driver_anchors, reset_driver_anchors

logger = logging.getLogger("recipe_apo")

STATE_FILE = "apo_state.json"


def save_anchor_state(checkpoint_dir: str, global_step: int) -> str:
    """Write the driver's anchors to ``checkpoint_dir/apo_state.json`` atomically; return the path."""
    return write_json_atomically(checkpoint_dir, STATE_FILE,
                                 {"global_step": int(global_step), **driver_anchors().state_dict()})


def write_json_atomically(checkpoint_dir: str, name: str, payload: dict) -> str:
    """Write ``payload`` to ``checkpoint_dir/name`` as JSON; return the path.

    Written to a temporary file in the same folder, flushed and fsynced, then renamed: a crash mid-write
    leaves the previous file (or none), never a truncated one.
    """
    os.makedirs(checkpoint_dir, exist_ok=True)
    path = os.path.join(checkpoint_dir, name)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=checkpoint_dir)
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), 0o644)  # mkstemp's 0600 would differ from verl's other checkpoint files
            json.dump(payload, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(checkpoint_dir)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _fsync_dir(folder: str) -> None:
    """Make the rename itself durable (POSIX: the directory entry lives in the folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_state(path: str, settings: ApoSettings) -> tuple[dict, AnchorBook]:
    """The state in ``path`` and the anchors it holds, checked against this run's settings; raises with the
    cause in one line."""
    if not os.path.exists(path):
        raise AnchorStateError("it is missing")
    book = AnchorBook(init=settings.anchor_init, history=settings.history)
    try:
        with open(path) as handle:
            state = json.load(handle)
        book.load_state_dict(state)
    except (OSError, ValueError, TypeError, RecursionError, OverflowError) as exc:
        # RecursionError: deeply nested JSON; OverflowError: numbers too large for what they stand for.
        raise AnchorStateError(f"it cannot be read ({cause_of(exc)})") from None
    scopes = sorted(state["anchors"])
    if scopes and (scopes == [GLOBAL_SCOPE]) != (settings.anchor_scope == "global"):
        held = "one global anchor" if scopes == [GLOBAL_SCOPE] else f"anchors per data source ({', '.join(scopes)})"
        raise AnchorStateError(f"it holds {held} but this run has algorithm.apo.anchor_scope={settings.anchor_scope}")
    return state, book


def load_anchor_state(checkpoint_dir: str, settings: Optional[ApoSettings] = None) -> bool:
    """Restore the driver's anchors from ``checkpoint_dir``: True if restored.

    A missing, unreadable or mismatched state file raises ``AnchorStateError``, or with
    ``algorithm.apo.on_missing_state=fresh`` warns, starts fresh anchors and returns False. The driver's
    anchors are only replaced once the whole file has been checked.
    """
    settings = settings or ApoSettings()
    path = os.path.join(checkpoint_dir, STATE_FILE)
    try:
        state, book = _read_state(path, settings)
    except AnchorStateError as exc:
        if settings.on_missing_state != "fresh":
            raise AnchorStateError(
                f"cannot resume the APO anchor from {path}: {exc}; set algorithm.apo.on_missing_state=fresh to "
                "start the anchor fresh instead"
            ) from None
        reset_driver_anchors()
        driver_anchors(init=settings.anchor_init, history=settings.history)
        start = settings.anchor_init if settings.anchor_init is not None else "null: first batch success rate"
        logger.warning("recipe-apo: %s: %s; the APO anchor restarts fresh (algorithm.apo.on_missing_state=fresh, "
                       "anchor_init=%s)", path, exc, start)
        return False
    install_driver_anchors(book)
    folder_step = os.path.basename(os.path.normpath(checkpoint_dir)).rpartition("global_step_")[2]
    if folder_step.isdigit() and state.get("global_step") != int(folder_step):
        logger.warning("recipe-apo: %s says step %s but sits in %s; restored it anyway", path,
                       state.get("global_step"), checkpoint_dir)
    logger.info("recipe-apo: restored the APO anchor from %s (scopes: %s)", path, ", ".join(book.anchors) or "none")
    return True


def resume_folder(trainer_config: Any) -> Optional[str]:
    """The ``global_step_N`` folder verl's trainer resumes from, by its own rules, or None for a fresh start."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    mode = trainer_config.get("resume_mode", "auto")
    if mode == "disable":
        return None
    if mode == "resume_path":
        folder = trainer_config.get("resume_from_path")
        return None if not folder else os.path.abspath(str(folder))
    base = trainer_config.get("default_local_dir")
    return None if base is None else find_latest_ckpt_path(os.path.abspath(str(base)))


_UNSET = object()


def restore_for_run(config: Any, folder: Any = _UNSET) -> bool:
    """Start a run's anchors: fresh, or restored from ``folder`` (by default the one verl will resume from)."""
    settings = ApoSettings.from_algorithm_config(config.algorithm)
    reset_driver_anchors()
    driver_anchors(init=settings.anchor_init, history=settings.history)
    if folder is _UNSET:
        folder = resume_folder(config.trainer)
    return False if folder is None else load_anchor_state(folder, settings)


def uses_apo(config: Any) -> bool:
    return str(config.algorithm.adv_estimator) == "apo"


class AnchorCheckpointCallback(CheckpointCallback):
    """For plain ``verl.trainer.main_ppo``:
    ``trainer.checkpoint_callback_class=recipe_apo.integration.checkpoint.AnchorCheckpointCallback``.

    verl builds the callback on the driver when the trainer starts, before it loads its checkpoint: the
    anchors are restored here from the folder verl will resume from, and saved after each checkpoint.
    """

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.active = config is not None and uses_apo(config)
        if self.active:
            restore_for_run(config)

    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False, **kwargs) -> None:
        if self.active:
            save_anchor_state(checkpoint_dir, global_step)
