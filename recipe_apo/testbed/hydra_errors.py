"""An error Hydra or OmegaConf raises while reading a testbed command line or composing its config, said in one line
naming the override at fault (``hydra_line``).
"""

from __future__ import annotations

from typing import Optional, Sequence

from recipe_apo.testbed.setting_check import unknown_setting


def _override_of(key: str, overrides: Sequence[str]) -> Optional[str]:
    """The override among ``overrides`` that sets ``key`` (``+``/``++``/``~`` prefixes allowed), if any."""
    for override in reversed(list(overrides)):
        if override.split("=", 1)[0].lstrip("+~") == key:
            return override
    return None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _task_of(overrides: Sequence[str]) -> Optional[str]:
    choice = _override_of("task", overrides)
    return choice.split("=", 1)[1] if choice and "=" in choice else None


def _lines(message: str) -> list[str]:
    """A Hydra message's lines without its links and its config search path."""
    out = []
    for line in message.splitlines():
        line = line.strip()
        if line.startswith("Config search path") or line.startswith("provider="):
            break
        if line and not line.startswith("See https://") and line != "^":
            out.append(line)
    return out


def hydra_line(exc: BaseException, overrides: Sequence[str] = ()) -> str:
    """One line for an error Hydra or OmegaConf raised while reading the command line or composing the config
    (``overrides``: the command line, to name the override at fault): ``<override>: <what is wrong>``."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, OverrideParseException):
        reason = " ".join(_lines(str(exc))[:1]) or "a syntax error"
        if reason.startswith("LexerNoViableAltException"):
            reason = "a character Hydra's grammar does not take"
        return (f"{exc.override}: not an override Hydra can read ({reason}); see "
                "https://hydra.cc/docs/advanced/override_grammar/basic/")
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and "/" in exc.missing_cfg_file:
        group, name = exc.missing_cfg_file.rsplit("/", 1)
        if exc.options:
            return f"{group}={name}: no such {group}; one of {', '.join(exc.options)}"
        return f"{group}={name}: no such {group}"
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else None
    source = cause if cause is not None else exc if isinstance(exc, OmegaConfBaseException) else None
    full_key = str(getattr(source, "full_key", "") or "")
    if source is not None and full_key and "not in struct" in str(source):
        said = unknown_setting(full_key, _task_of(overrides))
        override = _override_of(full_key, overrides)
        if override is not None:
            return f"{override}: {said}"
        # A key under a node the testbed's config leaves out (critic.ppo_epochs=3: verl's critic): the override's.
        inner = next((o for o in reversed(list(overrides)) if _key(o).startswith(f"{full_key}.")), None)
        if inner is not None:
            return f"{inner}: {unknown_setting(_key(inner), _task_of(overrides))}"
        # A mapping set whole (policy={a:1}): the override names the node, the message the key inside it.
        node = next((o for o in overrides if full_key.startswith(o.split("=", 1)[0].lstrip("+~") + ".")), None)
        return f"{node}: {full_key} is {said}" if node else f"{full_key}: {said}"
    lines = _lines(str(exc))
    if cause is not None:
        lines += _lines(str(cause))[:1]
    message = " ".join(lines) or type(exc).__name__
    if full_key and full_key not in message:
        message = f"{full_key}: {message}"
    return message
