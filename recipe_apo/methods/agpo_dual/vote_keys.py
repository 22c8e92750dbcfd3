"""The answer a response votes for in AGPO's vote entropy H_v (``method=agpo_dual``): its *key*, a string.

``math_vote_key`` is AGPO's own rule (``wandugu/paper_agpo`` at 11e5596, ``_extract_vote_key``, trainer.py
T:370-384), on the stripped text:

1. the content of the last ``\\boxed{...}`` without nested braces, stripped and lower-cased (so
   ``\\boxed{\\frac{1}{2}}`` is not a box here: it falls through to rule 3 and votes ``2``, as in the source);
2. else the text after the last ``####``, stripped and lower-cased (commas kept: ``1,000``);
3. else the last number (commas removed first; signs, decimals and ``a/b`` fractions);
4. else the whole text, whitespace runs made one space, lower-cased: a response without an answer votes for
   its own text, so H_v is always defined (distinct such texts are distinct votes; empty texts vote alike).

Another task gives its own rule with ``algorithm.agpo_dual.vote_key=module:function`` (a function of the response
text returning its key); ``load_vote_key`` resolves it once, with a one-line error naming the setting.
"""

from __future__ import annotations

import importlib
import re
from typing import Callable, Optional

from recipe_apo.errors import RecipeError

_BOXED = re.compile(r"\\boxed\{([^{}]+)\}")
_NUMBER = re.compile(r"[-+]?\d*\.?\d+(?:/[1-9]\d*)?")
_SPACES = re.compile(r"\s+")
# A key is compared, not read: a bounded prefix of a runaway text votes the same as the text.
MAX_TEXT = 100_000


class VoteKeyError(RecipeError, ValueError):
    """``algorithm.agpo_dual.vote_key`` cannot be loaded, or its function does not return a string."""


def math_vote_key(text: str) -> str:
    """AGPO's answer key of a math response (the module's rules 1-4)."""
    s = str(text)[:MAX_TEXT].strip()
    boxed = _BOXED.findall(s)
    if boxed:
        return boxed[-1].strip().lower()
    if "####" in s:
        return s.rsplit("####", 1)[-1].strip().lower()
    numbers = _NUMBER.findall(s.replace(",", ""))
    if numbers:
        return numbers[-1]
    return _SPACES.sub(" ", s).lower()


# What the launch hands a user's key function once, so that one that raises or takes other arguments is refused
# before Ray starts, not at the first probe.
SAMPLE_RESPONSE = "The sum is 3 + 4 = 7, so the answer is \\boxed{7}."


def load_vote_key(spec: Optional[str]) -> Callable[[str], str]:
    """The key function of ``algorithm.agpo_dual.vote_key``: ``math_vote_key`` for None, else ``module:function``,
    imported and called once on ``SAMPLE_RESPONSE``: anything that goes wrong is one ``VoteKeyError`` line."""
    if spec is None:
        return math_vote_key
    module_name, _, attribute = str(spec).partition(":")
    if not module_name.strip() or not attribute.strip():
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r}: 'module:function', both named")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:  # a module may raise anything while it is imported (a SyntaxError too)
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} cannot be loaded "
                           f"({type(exc).__name__}: {first})") from None
    if not callable(function):
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} is not a function")

    def checked(text: str) -> str:
        key = function(text)
        if not isinstance(key, str):
            raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} returned {type(key).__name__}, not a string")
        return key

    try:
        checked(SAMPLE_RESPONSE)
    except VoteKeyError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} fails on a sample response "
                           f"({type(exc).__name__}: {first}): it must take one response's text and return its "
                           "answer as a string") from None
    return checked
