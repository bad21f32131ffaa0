"""OpenAI-compatible HTTP server (FastAPI) over an AsyncEngine: the front door of the serving stack.

    POST /v1/completions        {model, prompt (str | list[int]), max_tokens, temperature, top_p, top_k*, stop,
                                 seed, stream, stream_options.include_usage, ignore_eos*}      (* = extension)
    POST /v1/chat/completions   the same with messages [{role, content}] rendered by CHAT_TEMPLATE
    GET  /v1/models, /health (503 while draining), /metrics (Prometheus text, this server's own registry)

Non-stream: one JSON (choices[0].text or .message.content, finish_reason, usage). Stream (SSE): ``data: {chunk}``
events, ``data: [DONE]`` last. Errors are OpenAI-shaped ``{"error": {"message", "type", "param", "code"}}``:
400 naming the field (malformed JSON, wrong type, max_tokens <= 0, empty prompt, prompt + max_tokens beyond the
context, an unknown ``model`` -- code "model_not_found"), 429 + Retry-After when the bounded queue is full
(EngineFull) or the engine's KV-budget admission rejects the request (AdmissionRejected "kv_budget", code
"admission_kv_budget"), 503 + Retry-After when its SLO admission rejects it (code "admission_slo") and while
draining. The body is validated here, field by field, instead of by pydantic models so that every message names
the OpenAI field as the client spelt it.

Cancellation: each request has a watcher task on the ASGI ``receive`` channel; ``http.disconnect`` before the
request finished aborts it in the engine (its KV blocks are freed on the engine thread). Shutdown (uvicorn on
SIGTERM) runs the lifespan exit: stop admitting (503), wait up to ``drain_timeout_s`` for in-flight requests, then
stop the engine thread.

Also here: ``build_engine(model)`` ("tiny" or a save_model path, ByteTokenizer), ``run_server`` (`tinylearn serve`:
uvicorn on loopback only unless allow_remote -- the server has no authentication), ``serve_in_thread(app)`` (uvicorn
on a free loopback port in a thread, for tests, notebooks and the serving benchmark). An Engine given to create_app
is wrapped in an AsyncEngine whose thread starts at once; the lifespan exit (or ``aengine.shutdown()``) stops it.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import math
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .async_engine import AsyncEngine, EngineDraining, RequestStream
from .metrics import CONTENT_TYPE, ServerMetrics
from .tokenizer import ByteTokenizer
from .types import AdmissionRejected, EngineFull, RequestOutput, SamplingParams

CHAT_ROLES = ("system", "user", "assistant")
CHAT_TEMPLATE = "<|{role}|>\n{content}\n"
CHAT_GENERATION_PROMPT = "<|assistant|>\n"


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, *, kind: str = "invalid_request_error",
                 code: str | None = None, retry_after_s: float | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return JSONResponse(body, status_code=self.status, headers=headers)


def render_chat(messages: Any) -> str:
    """The prompt text of an OpenAI ``messages`` list (CHAT_TEMPLATE per message + the assistant's turn)."""
    if not isinstance(messages, list) or not messages:
        raise APIError(
            400, f"messages: expected a non-empty list of {{role, content}}, got {messages!r:.80}", "messages"
        )
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES or not isinstance(m.get("content"), str):
            raise APIError(
                400, f"messages[{i}]: expected {{role in {CHAT_ROLES}, content: str}}, got {m!r:.80}", "messages"
            )
        parts.append(CHAT_TEMPLATE.format(role=m["role"], content=m["content"]))
    return "".join(parts) + CHAT_GENERATION_PROMPT


def _field_of(e: BaseException) -> str | None:
    """The field an engine/SamplingParams error names: its message starts with ``field: ...``."""
    m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_\[\].]*)\s*:", str(e))
    return m.group(1) if m else None


def _opt(body: dict, name: str, types: tuple[type, ...], tname: str) -> Any:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) and bool not in types or not isinstance(v, types):
        raise APIError(400, f"{name}: expected {tname}, got {type(v).__name__} {v!r:.60}", name)
    return v


class _Server:
    """State shared by the routes of one app."""

    def __init__(self, engine: Any, model_name: str, max_waiting: int | None, tokenizer: Any,
                 drain_timeout_s: float) -> None:  # fmt: skip
        self.aengine = engine if isinstance(engine, AsyncEngine) else AsyncEngine(engine, max_waiting=max_waiting)
        eng = self.aengine.engine
        self.model_name = model_name
        self.tokenizer = tokenizer or getattr(eng, "tokenizer", None) or ByteTokenizer()
        self.engine_text = getattr(eng, "tokenizer", None) is not None  # the engine detokenizes (and cuts stops)
        cfg = getattr(getattr(eng, "model", None), "config", None)
        self.max_seq_len = getattr(cfg, "max_seq_len", None)
        self.metrics = ServerMetrics()
        self.drain_timeout_s = float(drain_timeout_s)
        self.created = int(time.time())

    # ------------------------------------------------------------------ request parsing
    async def body(self, request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"body: malformed JSON ({e})", None) from None
        if not isinstance(body, dict):
            raise APIError(400, f"body: expected a JSON object, got {type(body).__name__}", None)
        model = body.get("model", self.model_name)
        if not isinstance(model, str):
            raise APIError(400, f"model: expected a string, got {type(model).__name__}", "model")
        if model != self.model_name:
            raise APIError(400, f"model: the model {model!r} does not exist (serving {self.model_name!r})", "model",
                           code="model_not_found")  # fmt: skip
        return body

    def prompt_ids(self, prompt: Any, field: str = "prompt") -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = getattr(self.tokenizer, "vocab_size", None)
            bad = [t for t in prompt if t < 0 or (vocab is not None and t >= vocab)]
            if bad:
                raise APIError(400, f"{field}: token ids must lie in [0, {vocab}), got {bad[0]}", field)
            ids = list(prompt)
        else:
            raise APIError(400, f"{field}: expected a string or a list of token ids, got {prompt!r:.60}", field)
        if not ids:
            raise APIError(400, f"{field}: must not be empty", field)
        return ids

    def params(self, body: dict, n_prompt: int) -> SamplingParams:
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise APIError(400, f"max_tokens: expected an integer >= 1, got {max_tokens!r:.60}", "max_tokens")
        if max_tokens <= 0:
            raise APIError(400, f"max_tokens: must be >= 1, got {max_tokens}", "max_tokens")
        if self.max_seq_len is not None:
            if n_prompt >= self.max_seq_len:
                raise APIError(400, f"prompt: {n_prompt} tokens leave no room in the context of "
                                    f"max_seq_len={self.max_seq_len} tokens", "prompt")  # fmt: skip
            if n_prompt + max_tokens > self.max_seq_len:
                raise APIError(400, f"max_tokens: prompt {n_prompt} + max_tokens {max_tokens} exceed the context of "
                                    f"max_seq_len={self.max_seq_len} tokens", "max_tokens")  # fmt: skip
        n = _opt(body, "n", (int,), "1")
        if n not in (None, 1):
            raise APIError(400, f"n: only n=1 is supported, got {n}", "n")
        temperature = _opt(body, "temperature", (int, float), "a number in [0, 2]")
        if temperature is not None and not 0 <= temperature <= 2:
            raise APIError(400, f"temperature: must be in [0, 2], got {temperature}", "temperature")
        stop = body.get("stop")
        if stop is not None and not (isinstance(stop, str) or isinstance(stop, list) and len(stop) <= 4):
            raise APIError(400, f"stop: expected a string or a list of up to 4 strings, got {stop!r:.60}", "stop")
        kw = dict(
            temperature=1.0 if temperature is None else float(temperature),
            top_p=_opt(body, "top_p", (int, float), "a number in (0, 1]"),
            top_k=_opt(body, "top_k", (int,), "an integer >= 1"),
            seed=_opt(body, "seed", (int,), "an integer >= 0"),
            max_tokens=max_tokens,
            stop=() if stop is None else stop,
            ignore_eos=bool(_opt(body, "ignore_eos", (bool,), "a boolean") or False),
        )
        try:
            return SamplingParams(**kw)
        except (TypeError, ValueError) as e:
            raise APIError(400, str(e), _field_of(e)) from None

    # ------------------------------------------------------------------ generation
    def text_of(self, out: RequestOutput) -> str:
        """The final text: the engine's (it cut stop strings) or, without an engine tokenizer, decoded here."""
        return out.text if self.engine_text else self.tokenizer.decode(out.token_ids)

    def stream_decoder(self, params: SamplingParams) -> Any:
        """f(out) -> the text safe to send so far: complete UTF-8 characters (an incremental decoder, so invalid
        bytes become U+FFFD exactly as in the final text) minus the last len(longest stop) - 1 characters, which a
        stop string could still cut; the finished output's text is the final one."""
        hold = max((len(x) for x in params.stop), default=1) - 1
        byte_level = isinstance(self.tokenizer, ByteTokenizer)
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        buf: list[str] = []

        def visible(out: RequestOutput) -> str:
            if out.finished:
                return self.text_of(out)
            if not byte_level:
                text = self.tokenizer.stream_text(out.token_ids)
            else:
                buf.append(dec.decode(bytes(t for t in out.new_token_ids if 0 <= t < 256)))
                text = "".join(buf)
            return text[: len(text) - hold] if hold else text

        return visible

    async def submit(self, ids: list[int], params: SamplingParams) -> RequestStream:
        try:
            return await self.aengine.add_request(ids, params)
        except AdmissionRejected as e:  # KV budget: 429 (capacity, like a full queue); SLO: 503 (cannot serve in time)
            status, kind = (429, "rate_limit_error") if e.reason == "kv_budget" else (503, "service_unavailable")
            raise APIError(status, f"admission: {e}", None, kind=kind, code=f"admission_{e.reason}",
                           retry_after_s=e.retry_after_s) from None  # fmt: skip
        except EngineFull as e:
            raise APIError(429, f"queue: server overloaded ({e})", None, kind="rate_limit_error",
                           code="queue_full", retry_after_s=e.retry_after_s) from None  # fmt: skip
        except EngineDraining as e:
            raise APIError(503, str(e), None, kind="service_unavailable", code="draining",
                           retry_after_s=e.retry_after_s) from None  # fmt: skip
        except (TypeError, ValueError) as e:
            raise APIError(400, str(e), _field_of(e)) from None

    async def run(self, request: Request, ids: list[int], params: SamplingParams, stream: bool, chat: bool,
                  include_usage: bool) -> Response:  # fmt: skip
        t0 = time.perf_counter()
        rs = await self.submit(ids, params)
        watcher = asyncio.ensure_future(_watch_disconnect(request, rs))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        state: dict[str, Any] = {"ttft": None, "final": None, "t0": t0}

        def record() -> None:
            watcher.cancel()
            fin = state["final"]
            if fin is None:  # never finished (client gone, server error): make sure the engine lets go of it
                rs.abort()
                self.metrics.observe_request(ttft_s=state["ttft"], e2e_s=time.perf_counter() - t0, n_output=0,
                                             n_prompt=len(ids), finish_reason="abort")  # fmt: skip
                return
            self.metrics.observe_request(ttft_s=state["ttft"], e2e_s=time.perf_counter() - t0,
                                         n_output=len(fin.token_ids), n_prompt=len(ids),
                                         finish_reason=fin.finish_reason or "unknown")  # fmt: skip

        async def outputs() -> Any:
            async for out in rs:
                if out.new_token_ids and state["ttft"] is None:
                    state["ttft"] = time.perf_counter() - t0
                if out.finished:
                    state["final"] = out
                yield out

        usage = lambda fin: {  # noqa: E731
            "prompt_tokens": len(ids), "completion_tokens": len(fin.token_ids),
            "total_tokens": len(ids) + len(fin.token_ids),
        }  # fmt: skip
        base = {"id": rid, "created": int(time.time()), "model": self.model_name}
        if not stream:
            try:
                async for _ in outputs():
                    pass
            finally:
                record()
            fin = state["final"]
            text = self.text_of(fin)
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text}}
            else:
                choice = {"index": 0, "text": text, "logprobs": None}
            choice["finish_reason"] = fin.finish_reason
            obj = "chat.completion" if chat else "text_completion"
            self.metrics.count_response(200)
            return JSONResponse({**base, "object": obj, "choices": [choice], "usage": usage(fin)})

        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: str | None, finish: str | None, role: bool = False) -> str:
            if chat:
                d: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
                if delta:
                    d["content"] = delta
                choice = {"index": 0, "delta": d, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            return f"data: {json.dumps({**base, 'object': obj, 'choices': [choice]})}\n\n"

        async def sse() -> Any:
            sent, visible = "", self.stream_decoder(params)
            try:
                if chat:
                    yield chunk(None, None, role=True)
                async for out in outputs():
                    text = visible(out)
                    delta = text[len(sent) :] if text.startswith(sent) else ""
                    sent += delta
                    if delta or out.finished:
                        yield chunk(delta, out.finish_reason if out.finished else None)
                fin = state["final"]
                if include_usage and fin is not None:
                    yield f"data: {json.dumps({**base, 'object': obj, 'choices': [], 'usage': usage(fin)})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                record()

        self.metrics.count_response(200)
        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _watch_disconnect(request: Request, rs: RequestStream) -> None:
    """Abort ``rs`` when the client goes away before it finished (ASGI http.disconnect)."""
    try:
        while True:
            msg = await request.receive()
            if msg.get("type") == "http.disconnect":
                rs.abort()
                return
    except Exception:  # noqa: BLE001 -- the connection is gone either way
        rs.abort()


def create_app(engine: Any, *, model_name: str = "tiny", max_waiting: int | None = 64, tokenizer: Any = None,
               drain_timeout_s: float = 30.0) -> FastAPI:  # fmt: skip
    """The FastAPI app serving ``engine`` (an Engine, or an AsyncEngine already running) under ``model_name``.

    ``max_waiting`` bounds the requests queued but not yet running (beyond it: 429); ``app.state.server`` holds
    the AsyncEngine (``.aengine``) and the metrics (``.metrics``)."""
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"model_name: expected a non-empty string, got {model_name!r}")
    srv = _Server(engine, model_name, max_waiting, tokenizer, drain_timeout_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        yield
        await srv.aengine.drain(srv.drain_timeout_s)  # SIGTERM: finish in-flight requests, then stop
        srv.aengine.shutdown()

    app = FastAPI(title="tinylearn serve", lifespan=lifespan)
    app.state.server = srv

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        srv.metrics.count_response(exc.status)
        return exc.response()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await srv.body(request)
        if "prompt" not in body:
            raise APIError(400, "prompt: required", "prompt")
        ids = srv.prompt_ids(body["prompt"])
        return await _generate(request, body, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await srv.body(request)
        ids = srv.prompt_ids(render_chat(body.get("messages")), "messages")
        return await _generate(request, body, ids, chat=True)

    async def _generate(request: Request, body: dict, ids: list[int], chat: bool) -> Response:
        params = srv.params(body, len(ids))
        stream = _opt(body, "stream", (bool,), "a boolean") or False
        so = _opt(body, "stream_options", (dict,), "an object") or {}
        return await srv.run(request, ids, params, stream, chat, bool(so.get("include_usage", False)))

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": srv.model_name, "object": "model", "created": srv.created, "owned_by": "tinylearn"}
        if srv.max_seq_len is not None:
            card["max_model_len"] = srv.max_seq_len
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        ae = srv.aengine
        if ae.error is not None:
            return JSONResponse({"status": "error", "detail": repr(ae.error)}, status_code=503)
        if ae.draining:
            return JSONResponse({"status": "draining"}, status_code=503, headers={"Retry-After": "5"})
        return JSONResponse({"status": "ok", **{k: ae.stats().get(k) for k in ("waiting", "running")}})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(srv.metrics.render(srv.aengine.stats()), media_type=CONTENT_TYPE)

    return app


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_host(host: str, allow_remote: bool = False) -> str:
    """``host`` if it is a loopback address (or ``allow_remote``); else ValueError saying why."""
    if not isinstance(host, str) or not host:
        raise TypeError(f"host: expected a non-empty string, got {host!r}")
    if host not in LOOPBACK_HOSTS and not allow_remote:
        raise ValueError(
            f"host: refusing to listen on {host!r}: the server has no authentication and no TLS, so it binds to "
            f"loopback only ({', '.join(LOOPBACK_HOSTS)}); pass --allow-remote to expose it anyway"
        )
    return host


def build_engine(model: str = "tiny", *, seed: int = 0, **engine_kw: Any) -> Any:
    """An Engine over ``model``: "tiny" (tiny_model(seed)) or a path saved by save_model; ByteTokenizer + its EOS."""
    from .checkpoint import load_model, tiny_model
    from .engine import Engine
    from .tokenizer import EOS

    m = tiny_model(seed) if model == "tiny" else load_model(model)
    tok = ByteTokenizer()
    eos = EOS if m.config.vocab_size > EOS else None
    return Engine(m, tokenizer=tok, eos_token_id=eos, **engine_kw)


def run_server(model: str = "tiny", *, host: str = "127.0.0.1", port: int = 8000, allow_remote: bool = False,
               max_waiting: int = 64, drain_timeout_s: float = 30.0, log_level: str = "info", seed: int = 0,
               **engine_kw: Any) -> None:  # fmt: skip
    """``tinylearn serve``: build the engine, create the app and run uvicorn until SIGINT/SIGTERM (then drain)."""
    import uvicorn

    check_host(host, allow_remote)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port: expected an int in [0, 65535], got {port!r}")
    engine = build_engine(model, seed=seed, max_waiting=max_waiting, **engine_kw)
    name = "tiny" if model == "tiny" else str(model).rsplit("/", 1)[-1].removesuffix(".safetensors")
    app = create_app(engine, model_name=name, max_waiting=max_waiting, drain_timeout_s=drain_timeout_s)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=drain_timeout_s)


@contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 20.0) -> Iterator[str]:
    """Run ``app`` under uvicorn in a background thread (tests, notebooks, benchmarks); yields its base URL.

    port 0 picks a free loopback port. On exit uvicorn shuts down as on SIGTERM (lifespan drain, engine stop)."""
    import uvicorn

    check_host(host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=timeout_s)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="tinylearn-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"serve_in_thread: uvicorn did not start on {host}:{port} within {timeout_s} s")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
