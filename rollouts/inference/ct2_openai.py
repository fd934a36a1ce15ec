"""OpenAI's request and answer shapes, as artweb's CTranslate2 server (ct2_entry) reads and writes them:
errors, tool calls in the Hermes format and forced ones, response_format schemas, streamed text."""

from __future__ import annotations

import json
import uuid

MAX_N = 64
# Arguments of apply_chat_template that the server sets itself: a request's chat_template_kwargs may not.
TEMPLATE_ARGUMENTS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
MAX_TOP_LOGPROBS = 20


class RequestError(Exception):
    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


def error_body(message: str, status: int, param: str | None = None) -> dict:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def assistant_message(text: str, tools, forced: tuple | None = None) -> tuple[dict, bool]:
    """The assistant message for a generated text, with its tool calls: the Hermes ones when the request
    offered tools, or the forced call's JSON; (message, has tool calls)."""
    calls = []
    if forced is not None:
        try:
            made = json.loads(text)
        except ValueError:
            made = None  # cut short by max_tokens: no call, the text stays content
        if forced[0] == "named" and made is not None:
            made = [{"name": forced[1], "parameters": made}]
        for call in made or []:
            calls.append(call_object(call["name"], call["parameters"]))
        if calls:
            return {"role": "assistant", "content": None, "tool_calls": calls}, True
        return {"role": "assistant", "content": text, "tool_calls": []}, False
    if tools and "<tool_call>" in text:
        # Each call is the JSON object after an opening tag; a closing tag may be missing at the end.
        for raw in text.split("<tool_call>")[1:]:
            try:
                parsed, _ = json.JSONDecoder().raw_decode(raw.strip())
                name, arguments = parsed["name"], parsed.get("arguments", {})
            except (ValueError, KeyError, TypeError, AttributeError):
                calls = []
                break  # not a well-formed call: the text stays content, as vLLM's parser leaves it
            calls.append(call_object(name, arguments))
    if calls:
        content = text.split("<tool_call>", 1)[0].strip() or None
        return {"role": "assistant", "content": content, "tool_calls": calls}, True
    return {"role": "assistant", "content": text, "tool_calls": []}, False


def call_object(name: str, arguments) -> dict:
    return {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
    }


def json_schema_of(response_format) -> dict | None:
    """The schema OpenAI's response_format asks for: None for free text, {} for any JSON object."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if isinstance(schema, dict):
            return schema
    raise RequestError(
        'response_format must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
        '"json_schema": {"name": ..., "schema": {...}}}',
        param="response_format",
    )


def settled_text(text: str, stop: list[str]) -> str:
    """The part of a growing text that can be sent: no trailing replacement character (a byte sequence
    the next token completes) and nothing that could be the beginning of a stop string."""
    text = text.rstrip("\ufffd")
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                return text[:-k]
    return text


def arguments_as_objects(message: dict) -> dict:
    """Tool calls' arguments come as JSON text; chat templates render them as objects."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        fn = dict(call.get("function") or {})
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"])
            except ValueError:
                pass
        fixed.append({**call, "function": fn})
    return {**message, "tool_calls": fixed}
