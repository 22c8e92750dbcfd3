"""The methods' errors: a batch an estimator cannot use, and a method setting it refuses.

Each message is one line naming the data or the ``algorithm.<method>.<key>`` at fault. Both are ``ValueError``s
too, so code written against the plain ``ValueError`` keeps catching them.
"""

from __future__ import annotations

from recipe_apo.errors import RecipeError

__all__ = ["ApoInputError", "BatchInputError", "MethodConfigError"]


class BatchInputError(RecipeError, ValueError):
    """The batch handed to an estimator (APO, CoDaPO, the zero-variance scale) cannot be used; the message
    names the data or setting at fault."""


class MethodConfigError(RecipeError, ValueError):
    """A setting under ``algorithm.<method>`` is invalid; the message names the key. Each method subclasses it
    (``ApoConfigError``, ``CodapoConfigError``)."""


# The name users and tests catch since the first release; the same class.
ApoInputError = BatchInputError
