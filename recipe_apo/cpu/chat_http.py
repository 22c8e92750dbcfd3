"""The hf rollout's OpenAI chat-completions endpoint, for verl's standalone generation.

verl's ``python -m verl.trainer.main_generation_server`` starts each replica standalone and POSTs one
``{"model", "messages", "temperature", "top_p", "max_tokens"}`` request per prompt to
``http://<replica._server_address>/v1/chat/completions``, then reads ``ChatCompletion(**json).choices[0]``.
vLLM's OpenAI server answers that on GPUs; this module is the same HTTP contract for the CPU rehearsal's server
(``HFGenerationServer.chat_completion`` does the generating, through its batching queue):

- ``parse_request``: the keys this endpoint honours; any other key is refused with HTTP 400 naming it, as the
  server refuses sampling parameters it does not know, so a setting is never silently ignored;
- ``completion``: OpenAI's ChatCompletion shape;
- ``serve``: an ``aiohttp`` app in the calling (actor's) event loop, on a free port.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from aiohttp import web

from recipe_apo.integration.validation import RecipeConfigError

ROUTE = "/v1/chat/completions"

# The request's sampling keys and the server's names for them (hf_server.SAMPLING_KEYS).
SAMPLING_FROM_REQUEST = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",  # OpenAI's newer name for max_tokens
    "top_k": "top_k",  # vLLM's extensions of OpenAI's request
    "repetition_penalty": "repetition_penalty",
}
REQUEST_KEYS = frozenset({"model", "messages", *SAMPLING_FROM_REQUEST})


class BadChatRequest(ValueError):
    """A request this endpoint refuses (HTTP 400); ``param`` names the offending key when there is one."""

    def __init__(self, message: str, param: Optional[str] = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict]
    sampling_params: dict[str, Any]  # in the server's names, as verl's token-in, token-out calls pass them


def parse_request(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise BadChatRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - REQUEST_KEYS)
    if unknown:
        raise BadChatRequest(
            f"the CPU rehearsal's hf rollout does not support request parameter(s) {', '.join(unknown)}",
            param=unknown[0],
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise BadChatRequest("messages must be a non-empty list of {role, content} with text content",
                             param="messages")
    sampling: dict[str, Any] = {}
    for key, name in SAMPLING_FROM_REQUEST.items():
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadChatRequest(f"{key} must be a number, got {value!r}", param=key)
        if name in sampling:
            raise BadChatRequest("give max_tokens or max_completion_tokens, not both", param=key)
        sampling[name] = value
    return ChatRequest(model=str(body.get("model") or ""), messages=messages, sampling_params=sampling)


def completion(model: str, content: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
    """An OpenAI ChatCompletion with one choice."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def error_response(status: int, message: str, param: Optional[str] = None) -> web.Response:
    """OpenAI's error body, so OpenAI clients raise an error carrying the message."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                             status=status)


Complete = Callable[[Any], Awaitable[dict]]


def make_app(complete: Complete) -> web.Application:
    """The app: POST ``ROUTE`` -> ``complete(json body)``; refusals (``BadChatRequest``, the rehearsal's
    ``RecipeConfigError``, e.g. a prompt too long) are 400, anything else 500, each with its message."""

    async def handle(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "the request body is not JSON")
        try:
            return web.json_response(await complete(body))
        except BadChatRequest as exc:
            return error_response(400, str(exc), exc.param)
        except RecipeConfigError as exc:
            return error_response(400, str(exc))
        except Exception as exc:  # the client gets the cause instead of a dropped connection
            return error_response(500, f"{type(exc).__name__}: {exc}")

    app = web.Application()
    app.router.add_post(ROUTE, handle)
    return app


async def serve(complete: Complete, host: str) -> tuple[web.AppRunner, str]:
    """Serve ``make_app(complete)`` on ``host`` in the running event loop; ``(runner, "host:port")``.
    ``runner.cleanup()`` stops it."""
    runner = web.AppRunner(make_app(complete), access_log=None)
    await runner.setup()
    # Port 0: the OS picks a free port when binding, so replicas on one node cannot race for the same one.
    await web.TCPSite(runner, host, 0).start()
    port = runner.addresses[0][1]
    return runner, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
