"""The methods' runtime state in verl's checkpoint folders: ``global_step_N/<Method.state_file>`` next to ``actor/``
and ``data.pt`` (APO's ``apo_state.json``, AGPO (dual)'s ``agpo_dual_state.json``, CoDaPO's ``codapo_state.json``).
A folder without it is searched for the file's old names (``Method.old_state_files``: AGPO (dual)'s
``agpo_state.json``), so that a checkpoint written before a rename resumes; a file read so is said in one line.

verl saves no estimator state, so a resumed run would restart APO's anchor from ``anchor_init``, AGPO's averages
from zero and a CoDaPO pair without its kept prompts. The recipe's trainer (``recipe_apo.integration.trainer``)
writes each active runtime's ``state_dict`` into every checkpoint folder before verl marks it the latest, and
reads it back on resume, all in the one format of ``recipe_apo.methods.state_codec``. A missing, unreadable or
foreign file is the runtime's to judge (``MethodRuntime.state_unreadable``: APO stops the resume naming the file and
``algorithm.apo.on_missing_state=fresh``, or with that setting starts fresh with a warning). So is one that is not a
regular file (a FIFO, a device, a folder: refused before it is opened for reading, so a resume never blocks on it),
one larger than the runtime's bound (``state_max_bytes``, else the codec's ``MAX_STATE_BYTES``), and one whose
keys or numbers are not what the runtime writes (its ``load_state_dict`` refuses them).

``AnchorCheckpointCallback`` does the same for plain ``verl.trainer.main_ppo`` through
``trainer.checkpoint_callback_class``, for the methods whose estimator runs there (``Method.plain_verl``: APO).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from verl.trainer.ppo.checkpoint_callback import CheckpointCallback

from recipe_apo.integration.errors import cause_of
from recipe_apo.methods import catalog, handoff
from recipe_apo.methods.base import MethodRuntime
from recipe_apo.methods.errors import MethodStateError, StateMismatch
from recipe_apo.methods.state_codec import MAX_STATE_BYTES, StateFileError, read_state, write_state

logger = logging.getLogger("recipe_apo")


def state_path(runtime: MethodRuntime, folder: str) -> str:
    return os.path.join(folder, runtime.method.state_file)


def resume_path(runtime: MethodRuntime, folder: str) -> tuple[str, bool]:
    """(the file a resume from ``folder`` reads, whether it is under an old name): ``state_path``, or where the folder
    has nothing of that name, the first of ``Method.old_state_files`` it has."""
    path = state_path(runtime, folder)
    if os.path.lexists(path):  # a link, even a broken one, is the file: its reader says what is wrong with it
        return path, False
    for name in runtime.method.old_state_files:
        old = os.path.join(folder, name)
        if os.path.lexists(old):
            return old, True
    return path, False


def save_state(runtime: MethodRuntime, folder: str, step: int) -> Optional[str]:
    """Write the runtime's state after ``step`` into ``folder`` (atomically); the path, or None when the runtime
    has nothing to save."""
    state = runtime.state_dict(step)
    if state is None or runtime.method.state_file is None:
        return None
    return write_state(folder, runtime.method.state_file, runtime.method.name, step, state)


def restore_state(runtime: MethodRuntime, folder: str, step: int) -> bool:
    """Restore the runtime from ``folder``, the checkpoint of ``step``; True if restored. A file the runtime cannot
    restore goes to ``runtime.state_unreadable`` (which raises, or starts fresh and returns). Either way its
    estimator's state is then the driver's (``handoff.keep_estimator_states``: APO's restored or fresh anchors)."""
    restored = _read_back(runtime, folder, step)
    handoff.keep_estimator_states([runtime])
    return restored


def _read_back(runtime: MethodRuntime, folder: str, step: int) -> bool:
    """What ``restore_state`` does before the hand-off: the file read back into the runtime, or its judgement."""
    if runtime.method.state_file is None or not runtime.state_needed(step):
        return False
    path, old_name = resume_path(runtime, folder)
    try:
        state, saved_step = read_state(path, runtime.method.name, runtime.state_max_bytes or MAX_STATE_BYTES)
        runtime.load_state_dict(state, step)
    except StateFileError as exc:
        runtime.state_unreadable(path, str(exc), step)
        return False
    except StateMismatch as exc:
        runtime.state_unreadable(path, str(exc), step)
        return False
    except MethodStateError as exc:  # the method's kind, but content this code did not write
        runtime.state_unreadable(path, f"it cannot be read ({cause_of(exc)})", step)
        return False
    except (TypeError, ValueError, RecursionError, OverflowError) as exc:
        runtime.state_unreadable(path, f"it cannot be read ({cause_of(exc)})", step)
        return False
    folder_step = os.path.basename(os.path.normpath(folder)).rpartition("global_step_")[2]
    if folder_step.isdigit() and saved_step != int(folder_step):
        logger.warning("recipe-apo: %s says step %s but sits in %s; restored it anyway", path, saved_step, folder)
    if old_name:
        logger.warning("recipe-apo: restored %s's state from %s, its file's old name (the recipe now writes %s)",
                       runtime.method.title, path, runtime.method.state_file)
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


def folder_step(folder: str) -> int:
    """The step of a ``global_step_N`` folder (0 when its name says none)."""
    step = os.path.basename(os.path.normpath(folder)).rpartition("global_step_")[2]
    return int(step) if step.isdigit() else 0


class AnchorCheckpointCallback(CheckpointCallback):
    """For plain ``verl.trainer.main_ppo``:
    ``trainer.checkpoint_callback_class=recipe_apo.integration.checkpoint.AnchorCheckpointCallback``.

    verl builds the callback on the driver when the trainer starts, before it loads its checkpoint: the runtimes of
    the run's plain-verl methods (APO's anchor) start fresh here, are restored from the folder verl will resume
    from, and are saved after each checkpoint.
    """

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.runtimes = []
        if config is None:
            return
        self.runtimes = [m.build_runtime(config) for m in catalog.active(config) if m.plain_verl]
        handoff.keep_estimator_states(self.runtimes)
        folder = resume_folder(config.trainer)
        for runtime in self.runtimes:
            if folder is not None:
                restore_state(runtime, folder, folder_step(folder))

    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False, **kwargs) -> None:
        for runtime in self.runtimes:
            save_state(runtime, checkpoint_dir, global_step)
