"""The simulator's HTTP face: vLLM's OpenAI-compatible API, /metrics, /health and the fault admin endpoint.

Streaming follows vLLM and OpenAI: `data: {json}\\n\\n` events, one per generated token, the last token's
event carrying `finish_reason`, then (with `stream_options.include_usage`) a chunk with empty `choices` and the
`usage`, then `data: [DONE]`. A chat stream opens with a chunk that holds only the assistant role. A client
that goes away aborts its request in the engine (finished_reason="abort"), as in vLLM.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from array import array
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from simulator.admission import RETRY_AFTER_S, Admission, PrefillTicket, QueueLimits
from simulator.clock import RealClock
from simulator.config import EngineConfig
from simulator.costmodel import CostParams
from simulator.engine import EngineCore, RealtimeLoop, RequestError
from simulator.faults import FaultError, FaultState
from simulator.metrics import VllmMetrics
from simulator.request import FINISH_ABORT, FINISH_ERROR, Request
from simulator.tokens import PromptTooLong, output_word, tokenize, tokenize_chat

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for the legacy completions API
# A prompt of the longest context (128 Ki tokens) is about 1.4 MB as JSON token ids; 8 MiB leaves room for chat
# overhead. Bodies are read by requests already counted in flight, so all of them together stay bounded too.
MAX_BODY_BYTES = 8 * 1024 * 1024
# JSON nesting a body may have: a chat request with content parts nests 4 deep, a tool's JSON schema a few more.
# Deeper bodies get a 400 (Python's parser would otherwise end in RecursionError, a 500).
MAX_JSON_DEPTH = 16
MAX_TOKEN_ID = 2**32 - 1  # token ids in a prompt: 32 bits, more than any vocabulary


class BadBody(ValueError):
    """A request body the API refuses with 400; `field` names the offending field (None: the whole body)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


async def read_body(request: web.Request) -> bytearray:
    """The body, at most MAX_BODY_BYTES (else 413), read without aiohttp keeping a copy for the handler's life
    (`request.read()` caches it: a queued request would hold its body until it finishes)."""
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=request.content_length or 0)
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=len(body))
    return body


async def read_json(request: web.Request) -> Any:
    """The request's JSON body, or BadBody: not JSON, not UTF-8, or nested deeper than MAX_JSON_DEPTH."""
    raw = await read_body(request)
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadBody(f"the body nests JSON deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError):  # JSONDecodeError, and ints past Python's digit limit
        raise BadBody("the body is not valid JSON") from None
    if json_depth(body) > MAX_JSON_DEPTH:
        raise BadBody(f"the body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    return body


def json_depth(value: Any) -> int:
    """How deeply lists and objects nest in `value` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            break  # deep enough to refuse: no need to walk the rest
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def _flag(body: dict, name: str, default: bool = False) -> bool:
    """A boolean field: true, false or absent (null: the default); anything else names the field."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be true or false, got {value!r}", param=name)
    return value


def _error(status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> web.Response:
    kind = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
            503: "ServiceUnavailableError"}.get(status, "Error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status, headers=headers)


@dataclass(slots=True)
class _Call:
    """One parsed API request."""

    chat: bool
    model: str
    lora: str | None
    prompt_ids: array[int]  # typecode "I": 4 bytes a token, where a list of ints costs 8 to 36
    max_tokens: int | None
    ignore_eos: bool
    stream: bool
    include_usage: bool


class SimulatorServer:
    """One simulated engine behind an aiohttp application."""

    def __init__(self, config: EngineConfig, cost_params: CostParams | None = None, faults: FaultState | None = None,
                 queue_limits: QueueLimits | None = None):
        self.config = config
        self.admission = Admission(queue_limits or QueueLimits())
        self.core = EngineCore(config, RealClock(), cost_params, faults)
        self.metrics = VllmMetrics(self.core)
        self.loop = RealtimeLoop(self.core)
        self.created = int(time.time())

    @property
    def faults(self) -> FaultState:
        return self.core.faults

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/admin/faults", self.get_faults)
        app.router.add_post("/admin/faults", self.post_faults)
        app.router.add_get("/admin/state", self.state)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        self.loop.start()

    async def _stop(self, _app: web.Application) -> None:
        await self.loop.stop()

    # ------------------------------------------------------------------ simple endpoints
    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200 if self.loop.alive else 503)

    async def metrics_page(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, _request: web.Request) -> web.Response:
        base = self.config.model_name
        entry = {"object": "model", "created": self.created, "owned_by": "vllm", "max_model_len": self.config.model_len}
        data = [entry | {"id": base, "root": base, "parent": None}]
        data += [entry | {"id": name, "root": f"/adapters/{name}", "parent": base} for name in self.config.lora_adapters]
        return web.json_response({"object": "list", "data": data})

    async def get_faults(self, _request: web.Request) -> web.Response:
        return web.json_response(self.faults.to_json(self.core.clock.now()))

    async def post_faults(self, request: web.Request) -> web.Response:
        try:
            patch = await read_json(request)
        except BadBody as e:
            return _error(400, f"faults: {e}; send e.g. {{\"slowdown\": 3}}")
        try:
            self.faults.update(patch, self.core.clock.now())
        except FaultError as e:
            return _error(400, str(e), e.field)
        self.loop.notify()
        return web.json_response(self.faults.to_json(self.core.clock.now()))

    async def state(self, _request: web.Request) -> web.Response:
        """The engine's live state in one JSON object (the demo and tests read it)."""
        core = self.core
        return web.json_response({
            "running": len(core.scheduler.running),
            "waiting": len(core.scheduler.waiting),
            "kv_cache_usage": core.kv.usage,
            "kv_blocks": core.kv.num_blocks,
            "kv_blocks_usable": core.kv.usable_blocks,
            "kv_blocks_used": core.kv.num_used_blocks,
            "preemptions": core.scheduler.num_preemptions,
            "running_loras": sorted(core.scheduler.running_loras()),
            "in_flight": self.admission.in_flight,  # requests the API holds, counted against --max-num-queued-reqs
            "prefill_tokens": self.admission.prefill_tokens,  # against --max-num-queued-tokens
            "refused": self.admission.refused,
        })

    # ------------------------------------------------------------------ generation
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    def _parse(self, body: Any, chat: bool) -> _Call:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        model = body.get("model") or self.config.model_name
        if not isinstance(model, str):
            raise RequestError(f"model must be a string, got {type(model).__name__}", param="model")
        if model == self.config.model_name:
            lora = None
        elif model in self.config.lora_adapters:
            lora = model
        else:
            raise RequestError(f"The model `{model}` does not exist.", status=404, param="model")
        n = body.get("n", 1)
        if isinstance(n, bool) or n not in (1, None):
            raise RequestError("the simulator generates one choice per request: n must be 1", param="n")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RequestError("messages must be a non-empty list", param="messages")
            try:
                prompt_ids = tokenize_chat(messages, self._prompt_limit)
            except ValueError as e:
                raise RequestError(str(e), param="messages") from None
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        else:
            prompt_ids = self._prompt_ids(body.get("prompt"), self._prompt_limit)
            max_tokens = body.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
            raise RequestError(f"max_tokens must be an integer, got {max_tokens!r}", param="max_tokens")
        stream = _flag(body, "stream")
        options = body.get("stream_options")
        if options is not None and not stream:
            raise RequestError("Stream options can only be defined when `stream=True`.", param="stream_options")
        if options is not None and not isinstance(options, dict):
            raise RequestError("stream_options must be an object, e.g. {\"include_usage\": true}",
                               param="stream_options")
        try:
            include_usage = _flag(options or {}, "include_usage")
        except RequestError:
            raise RequestError("stream_options.include_usage must be true or false",
                               param="stream_options.include_usage") from None
        return _Call(chat, model, lora, array("I", prompt_ids), max_tokens, _flag(body, "ignore_eos"), stream, include_usage)

    @property
    def _prompt_limit(self) -> int:
        """The longest prompt that can fit: the context less one output token (the engine checks the rest)."""
        return self.config.model_len - 1

    @staticmethod
    def _prompt_ids(prompt: Any, limit: int) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            try:
                return tokenize(prompt, limit)
            except PromptTooLong as e:
                raise RequestError(f"{e}: this model's maximum context length is {limit + 1} tokens",
                                   param="prompt") from None
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID
                                            for t in prompt):
            return list(prompt)
        raise RequestError(f"prompt must be a string, a list of token ids (0 to {MAX_TOKEN_ID}), or a list holding "
                           "one of those", param="prompt")

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """Admission first (before the body is read), then the request; counted in flight until it ends."""
        refusal = self.admission.refusal()
        if refusal is not None:
            return _error(503, refusal, headers={"Retry-After": str(RETRY_AFTER_S)})
        self.admission.in_flight += 1
        try:
            return await self._serve_admitted(request, chat)
        finally:
            self.admission.in_flight -= 1

    async def _accept(self, request: web.Request, chat: bool) -> tuple[_Call, Request] | web.Response:
        """The parsed call and its engine request, or the error answer; the body is gone when this returns."""
        try:
            body = await read_json(request)
        except BadBody as e:
            return _error(400, str(e), e.field)
        try:
            call = self._parse(body, chat)
            return call, self.core.new_request(
                call.prompt_ids, call.max_tokens, ignore_eos=call.ignore_eos, lora=call.lora,
                request_id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            )
        except RequestError as e:
            return _error(e.status, str(e), e.param)

    async def _serve_admitted(self, request: web.Request, chat: bool) -> web.StreamResponse:
        accepted = await self._accept(request, chat)
        if isinstance(accepted, web.Response):
            return accepted
        call, req = accepted
        events: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
        ticket = PrefillTicket(self.admission, req.num_prompt_tokens)

        def listener(r: Request) -> None:
            ticket.release()  # its first token (or its end): no longer waiting for prefill
            events.put_nowait((r.num_output_tokens, r.finish_reason))

        req.listener = listener
        self.core.add_request(req)
        self.loop.notify()
        try:
            if req.finish_reason == FINISH_ERROR:  # an injected http500: refused before any work
                return _error(500, "injected fault: the engine failed this request")
            if call.stream:
                return await self._stream(request, call, req, events)
            return await self._complete(request, call, req, events)
        finally:
            ticket.release()
            if not req.finished:  # the client went away (handler cancelled or write failed)
                self.core.abort(req.request_id)
                self.loop.notify()

    def _chunk(self, call: _Call, req: Request, choices: list[dict], usage: dict | None = None) -> bytes:
        obj: dict[str, Any] = {
            "id": req.request_id,
            "object": "chat.completion.chunk" if call.chat else "text_completion",
            "created": self.created,
            "model": call.model,
            "choices": choices,
        }
        if call.include_usage:
            obj["usage"] = usage
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    @staticmethod
    def _usage(req: Request) -> dict:
        p, c = req.num_prompt_tokens, req.num_output_tokens
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    async def _stream(self, request: web.Request, call: _Call, req: Request, events: asyncio.Queue) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if call.chat:
            first = {"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}
            await resp.write(self._chunk(call, req, [first]))
        sent = 0
        while True:
            count, reason = await events.get()
            if reason == FINISH_ABORT:
                _break_connection(request)
                return resp
            while sent < count:
                word = output_word(req.seed, sent)
                sent += 1
                done = (reason or None) if sent == count else None
                if call.chat:
                    choice = {"index": 0, "delta": {"content": word}, "logprobs": None, "finish_reason": done}
                else:
                    choice = {"index": 0, "text": word, "logprobs": None, "finish_reason": done, "stop_reason": None}
                await resp.write(self._chunk(call, req, [choice]))
            if reason:
                break
        if call.include_usage:
            await resp.write(self._chunk(call, req, [], self._usage(req)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _complete(self, request: web.Request, call: _Call, req: Request, events: asyncio.Queue) -> web.Response:
        reason = ""
        while not reason:
            _, reason = await events.get()
        if reason == FINISH_ABORT:
            _break_connection(request)
            return web.Response(status=500)  # never reaches the client: the connection is gone
        text = "".join(output_word(req.seed, i) for i in range(req.num_output_tokens))
        if call.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
        return web.json_response({
            "id": req.request_id,
            "object": "chat.completion" if call.chat else "text_completion",
            "created": self.created,
            "model": call.model,
            "choices": [choice],
            "usage": self._usage(req),
        })


def _break_connection(request: web.Request) -> None:
    """An injected abort: drop the TCP connection without ending the response, as a crashed server would."""
    transport = request.transport
    if transport is not None:
        transport.close()


async def start(server: SimulatorServer, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve on host:port (0: the OS picks a free port); returns the runner (call `cleanup()`) and base URL."""
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    shown = f"[{host}]" if ":" in host else host
    return runner, f"http://{shown}:{bound}"
