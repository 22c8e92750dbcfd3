"""The adapters' side of the estimators' hand-offs: what passes between the methods' runtimes and the estimators that
verl calls on the driver, through the driver process (``recipe_apo.methods.driver_state``).

A runtime sees arguments and return values only (``recipe_apo.methods.base``); an estimator is a plain function
verl calls with its own arguments, so what else it reads or leaves lives in the process. The adapters that drive
the runtimes (verl's trainer, ``recipe_apo.integration.trainer``; the CPU testbed, ``recipe_apo.testbed.train``;
the checkpoint code and plain verl's callback, ``recipe_apo.integration.checkpoint``) carry it across with the two
calls below, and nothing else does:

- ``keep_estimator_states``: each runtime's ``estimator_state()`` (APO's anchors, R2PO's phase) kept under its
  method's name, at a run's start, after a restore and after ``begin_step``;
- ``advantage_step``: held around verl's ``compute_advantage``: the states kept again, earlier results cleared,
  each runtime's ``estimator_inputs`` handed; on leaving, what the estimators left is ``batch.estimator_results``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

from recipe_apo.methods import driver_state
from recipe_apo.methods.base import MethodRuntime, StepBatch

__all__ = ["advantage_step", "keep_estimator_states"]


def keep_estimator_states(runtimes: Sequence[MethodRuntime]) -> None:
    """Keep each runtime's ``estimator_state()`` in the driver process under its method's name, where its estimator
    reads it; a runtime with none drops what a previous run kept there."""
    for runtime in runtimes:
        state = runtime.estimator_state()
        if state is None:
            driver_state.forget(runtime.method.name)
        else:
            driver_state.keep(runtime.method.name, state)


@contextlib.contextmanager
def advantage_step(runtimes: Sequence[MethodRuntime], batch: StepBatch) -> Iterator[None]:
    """Held while verl computes ``batch``'s advantages: the estimators read the runtimes' states and inputs, and
    ``batch.estimator_results`` is what they left once verl is done (a step whose estimator did not run leaves
    nothing: the results of the step before are cleared first)."""
    keep_estimator_states(runtimes)
    driver_state.clear_results()
    with contextlib.ExitStack() as stack:
        for runtime in runtimes:
            inputs = runtime.estimator_inputs(batch)
            if inputs is not None:
                stack.enter_context(driver_state.handed(scopes=inputs.scopes, old_log_probs=inputs.old_log_probs))
        yield
    batch.estimator_results = driver_state.results()
