"""The simulated engine's OpenAI-compatible HTTP face: what a router or a rollout client
talks to when the fleet is simulated.

The same routes a vLLM engine serves (``/v1/models``, ``/v1/completions``,
``/v1/chat/completions`` with or without ``stream``, ``/tokenize``, ``/health``), with the
same shapes where clients read them, answered by the shard's own generation — so its
faults show over HTTP as they would on a real engine: a transport failure drops the
connection, a data failure is vLLM's 400 "maximum context length", a wedge never
answers while ``/health`` still does.
"""

from __future__ import annotations

import json
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web

from fleetledger.events.attestation import attestation_headers, end_comment
from fleetledger.shards.contract import Generation, GenerationRequest, RolloutDataFailure

if TYPE_CHECKING:
    from fleetledger.engines.simulated import Token  # it loads Ray: only for the old call

__all__ = ["MODEL_NAME", "simulated_app"]

MODEL_NAME = "fleetledger-sim"

Generate = Callable[[GenerationRequest], Awaitable[Generation]]
Tokens = Callable[[GenerationRequest], AsyncIterator["Token"]]


def _completion(kind: str, generation: Generation, *, chunk: bool) -> dict[str, Any]:
    created = int(time.time())
    if kind == "chat":
        body: dict[str, Any] = (
            {"delta": {"role": "assistant", "content": generation.text}}
            if chunk
            else {"message": {"role": "assistant", "content": generation.text}}
        )
        obj = "chat.completion.chunk" if chunk else "chat.completion"
    else:
        body = {"text": generation.text, "logprobs": None}
        obj = "text_completion"
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": obj,
        "created": created,
        "model": MODEL_NAME,
        "choices": [{"index": 0, "finish_reason": "length", **body}],
        "usage": {
            "prompt_tokens": 1,
            "completion_tokens": generation.tokens,
            "total_tokens": 1 + generation.tokens,
        },
    }


def _prompt_of(kind: str, body: dict[str, Any]) -> str:
    if kind == "chat":
        messages = body.get("messages") or []
        return " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


async def _stream(
    request: web.Request, kind: str, gen_request: GenerationRequest, tokens: Tokens
) -> web.StreamResponse:
    """An event stream, one event per token as the engine generates it. The head leaves
    with the first token, stamped with the version it came from; the last line before
    ``[DONE]`` names the version of the last (a refit may land in between). A fault
    raises before the first token, while an error status can still be sent."""
    stream = aiter(tokens(gen_request))
    first = await anext(stream)
    headers = {"Content-Type": "text/event-stream"}
    headers.update(attestation_headers(first.version, None, first.partial))
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    last = first
    token: Token | None = first
    while token is not None:
        piece = Generation(gen_request.prompt_id, gen_request.group_id, 0, 0, token.text, 1)
        payload = json.dumps(_completion(kind, piece, chunk=True))
        await response.write(f"data: {payload}\n\n".encode())
        last = token
        token = await anext(stream, None)
    await response.write(end_comment(last.version))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _one_token(generate: Generate) -> Tokens:
    """A token stream of one piece made from a whole generation (the old signature)."""
    from fleetledger.engines.simulated import Token  # it loads Ray: only for the old call

    async def tokens(request: GenerationRequest) -> AsyncIterator[Token]:
        generation = await generate(request)
        yield Token(generation.text, generation.weight_version, generation.weights_partial)

    return tokens


def simulated_app(
    generate: Generate | int, tokens: Tokens | Generate | None = None
) -> web.Application:
    """The routes, answered by ``generate`` (the shard's own generation) and ``tokens``
    (the same, token by token, for streams). Every answer carries the engine's
    attestation of its weights (``fleetledger.events.attestation``).

    ``simulated_app(shard, generate)``, the signature before attestation, still works
    and warns: its streams are one event, the whole generation."""
    if isinstance(generate, int):
        warnings.warn(
            "simulated_app(shard, generate) is deprecated: call simulated_app(generate, "
            "tokens) (streams token by token); the shard index is no longer used",
            DeprecationWarning,
            stacklevel=2,
        )
        generate = cast(Generate, tokens)
        tokens = None
    if tokens is None:
        tokens = _one_token(generate)
    tokens = cast(Tokens, tokens)

    async def models(_request: web.Request) -> web.Response:
        model = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "fleetledger"}
        return web.json_response({"object": "list", "data": [model]})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        tokens = [ord(c) for c in str(body.get("prompt", ""))]
        return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": 512})

    def completions(kind: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                body = await request.json()
            except json.JSONDecodeError:
                return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
            gen_request = GenerationRequest(
                prompt_id=str(body.get("user") or uuid.uuid4().hex),
                group_id="http",
                prompt=_prompt_of(kind, body),
                max_tokens=max_tokens,
            )
            try:
                if body.get("stream"):
                    return await _stream(request, kind, gen_request, tokens)
                generation = await generate(gen_request)
            except RolloutDataFailure as exc:
                return web.json_response(
                    {"error": {"message": str(exc), "type": "BadRequestError", "code": 400}},
                    status=400,
                )
            except ConnectionError:
                # A transport failure: the client sees its connection dropped, as with a
                # dying engine, not a tidy error status.
                if request.transport is not None:
                    request.transport.abort()
                raise
            attested = attestation_headers(
                generation.weight_version, generation.version_end, generation.weights_partial
            )
            return web.json_response(
                _completion(kind, generation, chunk=False), headers=dict(attested)
            )

        return handle

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/completions", completions("text"))
    app.router.add_post("/v1/chat/completions", completions("chat"))
    return app
