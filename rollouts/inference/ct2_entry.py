"""artweb's CPU inference server on CTranslate2, with the routes rollouts and serving use of vLLM's.

Run by rollouts.inference.ct2_server.CT2Server as `python -m rollouts.inference.ct2_entry ...`. It answers
OpenAI's chat and text completions (streamed or not, n samples, tools in the Hermes format, log-probs
with top alternatives, vLLM's `return_token_ids`, `ignore_eos`, stop strings, seeds), lists its model,
and loads a policy's merged weights on an admin route. The generation itself is ct2_engine.Engine.

Like the vLLM server (vllm_entry), every route but /health needs the key in ARTWEB_INFERENCE_API_KEY.
The server answers to one model name at a time: the base model's, or the loaded policy's.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import time
import uuid
from pathlib import Path

from rollouts.inference.ct2_engine import Engine, Job, Sampling
from rollouts.inference.ct2_openai import (
    MAX_N,
    MAX_TOP_LOGPROBS,
    TEMPLATE_ARGUMENTS,
    RequestError,
    arguments_as_objects,
    assistant_message,
    error_body,
    json_schema_of,
    settled_text,
)
from rollouts.inference.vllm_entry import RequireApiKey


class Server:
    def __init__(self, args) -> None:
        self.args = args
        self.engine = Engine(args.model, compute_type=args.compute_type, threads=args.threads, work_dir=args.work_dir)
        self.tokenizer = self.engine.tokenizer
        self.template = Path(args.chat_template).read_text() if args.chat_template else None
        self.base_name = args.served_model_name
        self.served = self.base_name
        self.max_model_len = args.max_model_len or int(
            getattr(self.engine._model.config, "max_position_embeddings", 0) or 2048
        )
        self._load_lock = asyncio.Lock()

    # --- request parsing -----------------------------------------------------------------------------

    def _number(self, body: dict, name: str, default, low, high, kind=float):
        value = body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
            raise RequestError(f"{name} must be a number from {low} to {high}", param=name)
        if not low <= value <= high:
            raise RequestError(f"{name} must be from {low} to {high}, got {value}", param=name)
        return kind(value)

    def _common(self, body: dict, prompt_ids: list[int], call_schema: dict | None = None) -> tuple[Job, dict]:
        if body.get("model") != self.served:
            raise RequestError(f"The model `{body.get('model')}` does not exist.", status=404, param="model")
        n = self._number(body, "n", 1, 1, MAX_N, int)
        room = self.max_model_len - len(prompt_ids)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None:
            limit = self._number({"max_tokens": limit}, "max_tokens", None, 1, 10**7, int)
            if limit > room:
                raise RequestError(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                    f"{len(prompt_ids) + limit} tokens ({len(prompt_ids)} in the messages, {limit} in the "
                    f"completion). Please reduce the length of the messages or completion.",
                    param="max_tokens",
                )
        elif room < 1:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens; the messages take "
                f"{len(prompt_ids)}.",
                param="messages",
            )
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise RequestError("stop must be a string or a list of non-empty strings", param="stop")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise RequestError("seed must be an integer", param="seed")
        top_k = self._number(body, "top_k", -1, -1, self.engine.vocab_size, int)
        top_logprobs = self._number(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS, int)
        sampling = Sampling(
            temperature=self._number(body, "temperature", 1.0, 0.0, 100.0),
            top_p=self._number(body, "top_p", 1.0, 1e-6, 1.0),
            top_k=max(0, top_k),
            seed=None if seed is None else seed % 2**32,
            top_logprobs=top_logprobs if body.get("logprobs") else 0,
            ignore_eos=bool(body.get("ignore_eos")),
        )
        job = Job(
            prompt_ids=prompt_ids,
            n=n,
            max_tokens=limit or room,
            sampling=sampling,
            stop=stop,
            json_schema=json_schema_of(body.get("response_format")) if call_schema is None else call_schema,
        )
        if call_schema is not None and body.get("response_format") not in (None, {"type": "text"}):
            raise RequestError(
                "response_format cannot be combined with a tool_choice that forces a call", param="response_format"
            )
        return job, {"logprobs": bool(body.get("logprobs")), "token_ids": bool(body.get("return_token_ids"))}

    def chat_prompt(self, body: dict) -> tuple[list[int], list | None, tuple | None]:
        """The prompt's token ids, the tools to parse calls for, and when tool_choice forces a call, as
        vLLM does: ("named", function name, its parameters' schema) or ("required", None, a schema of a
        list of calls); the answer is then generated to that schema."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError("messages must be a non-empty list of message objects", param="messages")
        tools = body.get("tools") or None
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
            raise RequestError("tools must be a list of tool objects", param="tools")
        choice = body.get("tool_choice")
        tools_for_parsing = None if choice == "none" else tools
        functions = {(t.get("function") or {}).get("name"): (t.get("function") or {}) for t in tools or []}
        forced = None
        if tools_for_parsing and isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if name not in functions:
                raise RequestError(f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
            forced = ("named", name, functions[name].get("parameters") or {"type": "object"})
        elif tools_for_parsing and choice == "required":
            calls = [
                {
                    "type": "object",
                    "properties": {"name": {"type": "string", "enum": [n]}, "parameters": f.get("parameters") or {}},
                    "required": ["name", "parameters"],
                }
                for n, f in functions.items()
            ]
            forced = ("required", None, {"type": "array", "minItems": 1, "items": {"anyOf": calls}})
        extra = body.get("chat_template_kwargs") or {}
        if not isinstance(extra, dict) or set(extra) & TEMPLATE_ARGUMENTS:
            raise RequestError(
                f"chat_template_kwargs must be an object of the template's own variables, none of "
                f"{', '.join(sorted(TEMPLATE_ARGUMENTS))}",
                param="chat_template_kwargs",
            )
        messages = [arguments_as_objects(m) for m in messages]
        try:
            ids = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                chat_template=self.template,
                add_generation_prompt=body.get("add_generation_prompt", True),
                tokenize=True,
                **extra,
            )
        except Exception as exc:  # a template error is the request's (a role it cannot render, ...)
            raise RequestError(
                f"The messages cannot be rendered by the chat template: {exc}", param="messages"
            ) from exc
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids], tools_for_parsing, forced

    # --- answers -------------------------------------------------------------------------------------

    def _logprobs_content(self, sample, chat: bool) -> dict:
        tokens = self.tokenizer.convert_ids_to_tokens(sample.token_ids)
        entries = []
        for k, lp in enumerate(sample.logprobs):
            text = self.tokenizer.convert_tokens_to_string([tokens[k]])
            top = sample.top[k] if k < len(sample.top) else []
            entries.append(
                {
                    "token": text,
                    "logprob": max(lp, -9999.0),
                    "bytes": list(text.encode()),
                    "top_logprobs": [
                        {"token": self.tokenizer.decode([i]), "logprob": max(v, -9999.0), "bytes": None} for i, v in top
                    ],
                }
            )
        if chat:
            return {"content": entries}
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries]}

    def _text(self, sample, stop: list[str]) -> str:
        text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        for s in stop:
            if s in text:
                text = text.split(s, 1)[0]
        return text

    async def _run(self, job: Job) -> Job:
        self.engine.submit(job)
        try:
            await asyncio.get_running_loop().run_in_executor(None, job.done.wait)
        except asyncio.CancelledError:
            job.cancelled = True
            raise
        if job.error:
            raise RequestError(job.error, status=500)
        return job

    async def chat(self, body: dict) -> dict:
        prompt_ids, tools, forced = self.chat_prompt(body)
        job, want = self._common(body, prompt_ids, forced[2] if forced else None)
        await self._run(job)
        choices = []
        for index, sample in enumerate(job.samples):
            message, called = assistant_message(self._text(sample, job.stop), tools, forced)
            choice = {
                "index": index,
                "message": message,
                "logprobs": self._logprobs_content(sample, True) if want["logprobs"] else None,
                "finish_reason": "tool_calls" if called and sample.finish_reason == "stop" else sample.finish_reason,
                "stop_reason": None,
            }
            if want["token_ids"]:
                choice["token_ids"] = list(sample.token_ids)
            choices.append(choice)
        answer = self._envelope("chat.completion", choices, job)
        if want["token_ids"]:
            answer["prompt_token_ids"] = prompt_ids
        return answer

    async def completion(self, body: dict) -> dict:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = self.tokenizer(prompt)["input_ids"]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_ids = prompt
        else:
            raise RequestError("prompt must be a string or a list of token ids", param="prompt")
        if any(not 0 <= t < self.engine.vocab_size for t in prompt_ids):
            raise RequestError("prompt has token ids outside the vocabulary", param="prompt")
        job, want = self._common(body, list(prompt_ids))
        await self._run(job)
        choices = []
        for index, sample in enumerate(job.samples):
            choice = {
                "index": index,
                "text": self._text(sample, job.stop),
                "logprobs": self._logprobs_content(sample, False) if want["logprobs"] else None,
                "finish_reason": sample.finish_reason,
                "stop_reason": None,
            }
            if want["token_ids"]:
                choice["token_ids"] = list(sample.token_ids)
            choices.append(choice)
        return self._envelope("text_completion", choices, job)

    def _envelope(self, kind: str, choices: list, job: Job) -> dict:
        completion_tokens = sum(len(s.token_ids) for s in job.samples)
        return {
            "id": f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.served,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(job.prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(job.prompt_ids) + completion_tokens,
            },
        }

    async def chat_stream(self, body: dict):
        """Server-sent events of chat.completion.chunk objects; text as it is sampled (when the request
        offered tools, each choice's message is sent whole at its end, so a call is never cut apart)."""
        prompt_ids, tools, forced = self.chat_prompt(body)
        job, want = self._common(body, prompt_ids, forced[2] if forced else None)
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue = asyncio.Queue()

        def on_token(index, sample):
            loop.call_soon_threadsafe(updates.put_nowait, index)

        job.on_token = on_token
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(index, delta, *, logprobs=None, finish=None, token_ids=None):
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            if token_ids is not None:
                choice["token_ids"] = token_ids
            data = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": self.served}
            return "data: " + json.dumps({**data, "choices": [choice]}) + "\n\n"

        async def events():
            sent_text = ["" for _ in job.samples]
            sent_tokens = [0] * len(job.samples)
            for index in range(job.n):
                yield chunk(index, {"role": "assistant", "content": ""})
            self.engine.submit(job)
            waiter = loop.run_in_executor(None, job.done.wait)
            try:
                while True:
                    getter = asyncio.ensure_future(updates.get())
                    await asyncio.wait({getter, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                    finished = waiter.done()
                    for index, sample in enumerate(job.samples):
                        if tools or sent_tokens[index] == len(sample.token_ids):
                            continue
                        text = self._text(sample, job.stop)
                        # Hold back a partly decoded character and what may be the start of a stop string.
                        safe = text if sample.finish_reason else settled_text(text, job.stop)
                        if len(safe) <= len(sent_text[index]) and not want["logprobs"]:
                            continue
                        new_ids = sample.token_ids[sent_tokens[index] :]
                        part = type(sample)(token_ids=new_ids, logprobs=sample.logprobs[sent_tokens[index] :])
                        part.top = sample.top[sent_tokens[index] :]
                        yield chunk(
                            index,
                            {"content": safe[len(sent_text[index]) :]},
                            logprobs=self._logprobs_content(part, True) if want["logprobs"] else None,
                            token_ids=new_ids if want["token_ids"] else None,
                        )
                        sent_text[index], sent_tokens[index] = safe, len(sample.token_ids)
                    if finished:
                        break
                if job.error:
                    yield "data: " + json.dumps(error_body(job.error, 500)) + "\n\n"
                    return
                for event in self._last_chunks(job, want, tools, forced, sent_text, sent_tokens, chunk):
                    yield event
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = self._envelope("chat.completion", [], job)["usage"]
                    base = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": self.served}
                    yield "data: " + json.dumps({**base, "choices": [], "usage": usage}) + "\n\n"
                yield "data: [DONE]\n\n"
            finally:
                job.cancelled = not job.done.is_set()

        return events()

    def _last_chunks(self, job: Job, want: dict, tools, forced, sent_text: list[str], sent_tokens: list[int], chunk):
        """Each choice's last chunks once the job is done: what was held back and its finish_reason, or, when
        the request offered tools, the whole message (its tool calls parsed) then the finish_reason."""
        for index, sample in enumerate(job.samples):
            text = self._text(sample, job.stop)
            finish = sample.finish_reason
            if tools:
                message, called = assistant_message(text, tools, forced)
                delta = {"content": message["content"]}
                if called:
                    delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
                    finish = "tool_calls" if finish == "stop" else finish
                yield chunk(
                    index,
                    delta,
                    logprobs=self._logprobs_content(sample, True) if want["logprobs"] else None,
                    token_ids=list(sample.token_ids) if want["token_ids"] else None,
                )
                yield chunk(index, {}, finish=finish)
            else:
                rest = sample.token_ids[sent_tokens[index] :]
                part = type(sample)(token_ids=rest, logprobs=sample.logprobs[sent_tokens[index] :])
                part.top = sample.top[sent_tokens[index] :]
                yield chunk(
                    index,
                    {"content": text[len(sent_text[index]) :]},
                    logprobs=self._logprobs_content(part, True) if want["logprobs"] and rest else None,
                    finish=finish,
                    token_ids=rest if want["token_ids"] else None,
                )

    async def load(self, body: dict) -> dict:
        """Serve other weights under `name`: merged ones (weights_dir), an adapter to fold into the base
        weights here (adapter_dir), or the base model (neither)."""
        name, weights, adapter = body.get("name"), body.get("weights_dir"), body.get("adapter_dir")
        if not isinstance(name, str) or not name:
            raise RequestError("give name (a string), and weights_dir or adapter_dir (a directory) or neither")
        for field, value in (("weights_dir", weights), ("adapter_dir", adapter)):
            if value is not None and (not isinstance(value, str) or not Path(value).is_dir()):
                raise RequestError(f"{field} must be a directory, got {value!r}", param=field)
        if weights is not None and adapter is not None:
            raise RequestError("give weights_dir or adapter_dir, not both")
        async with self._load_lock:
            loop = asyncio.get_running_loop()
            try:
                seconds = await loop.run_in_executor(
                    None, functools.partial(self.engine.load, weights, adapter_dir=adapter)
                )
            except ValueError as exc:  # MergeError too: an adapter that does not fit this model
                raise RequestError(str(exc), param="adapter_dir" if adapter else "weights_dir") from exc
            self.served = name
        return {"name": name, "seconds": round(seconds, 3)}


def build_app(server: Server):
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def read(request) -> dict:
        try:
            body = await request.json()
        except ValueError as exc:
            raise RequestError("the body is not JSON") from exc
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        return body

    def answer(handler, *, stream=None):
        async def endpoint(request):
            try:
                body = await read(request)
                if stream is not None and body.get("stream"):
                    return StreamingResponse(await stream(body), media_type="text/event-stream")
                return JSONResponse(await handler(body))
            except RequestError as exc:
                return JSONResponse(error_body(str(exc), exc.status, exc.param), status_code=exc.status)

        return endpoint

    async def health(request):
        return Response(status_code=200)

    async def models(request):
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": server.served,
                        "object": "model",
                        "created": 0,
                        "owned_by": "artweb",
                        "root": server.args.model,
                        "max_model_len": server.max_model_len,
                    }
                ],
            }
        )

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", answer(server.chat, stream=server.chat_stream), methods=["POST"]),
        Route("/v1/completions", answer(server.completion), methods=["POST"]),
        Route("/artweb/load", answer(server.load), methods=["POST"]),
    ]
    return Starlette(routes=routes, middleware=[Middleware(RequireApiKey, key=os.environ["ARTWEB_INFERENCE_API_KEY"])])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--chat-template", default=None)
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--threads", type=int, default=0, help="0: one per core")
    parser.add_argument("--work-dir", required=True)
    args = parser.parse_args(argv)
    if not os.environ.get("ARTWEB_INFERENCE_API_KEY"):
        raise SystemExit("Set ARTWEB_INFERENCE_API_KEY: this server answers only callers that hold it.")
    import logging

    import uvicorn

    # One line per batch and per weight load in the server's log (its size, tokens, seconds).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    app = build_app(Server(args))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
