"""The methods' errors: a batch an estimator cannot use, a method setting it refuses, a saved state it cannot
restore.

Each message is one line naming the data or the ``algorithm.<method>.<key>`` at fault. Each is a ``ValueError``
too: a bad value is what it reports.
"""

from __future__ import annotations

from recipe_apo.errors import RecipeError

__all__ = ["BatchInputError", "MethodConfigError", "MethodStateError", "StateMismatch"]


class BatchInputError(RecipeError, ValueError):
    """The batch handed to an estimator (APO, CoDaPO, the zero-variance scale) cannot be used; the message
    names the data or setting at fault."""


class MethodConfigError(RecipeError, ValueError):
    """A setting under ``algorithm.<method>`` is invalid; the message names the key. Each method subclasses it
    (``ApoConfigError``, ``CodapoConfigError``)."""


class MethodStateError(RecipeError, ValueError):
    """A method's saved state (the APO anchor's ``state_dict``) is not what this code writes; the message says
    which part. The file that held it is named by the caller (``integration.checkpoint``)."""


class StateMismatch(MethodStateError):
    """A saved state that is the method's own but does not fit this run's settings; the message is the reason, as
    a clause (``it holds ... but this run has ...``)."""
