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

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from fleetledger.shards.contract import Generation, GenerationRequest, RolloutDataFailure

__all__ = ["MODEL_NAME", "simulated_app"]

MODEL_NAME = "fleetledger-sim"

Generate = Callable[[GenerationRequest], Awaitable[Generation]]


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


def simulated_app(shard: int, generate: Generate) -> web.Application:
    """The routes, answered by ``generate`` (the shard's own generation)."""

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
            if not body.get("stream"):
                return web.json_response(_completion(kind, generation, chunk=False))
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            payload = json.dumps(_completion(kind, generation, chunk=True))
            await response.write(f"data: {payload}\n\n".encode())
            await asyncio.sleep(0)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response

        return handle

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/completions", completions("text"))
    app.router.add_post("/v1/chat/completions", completions("chat"))
    app["shard"] = shard
    return app
