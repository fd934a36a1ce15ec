"""What the inference proxy (rollouts.sandbox.proxy) passes from a jailed batch to a model server, and the
errors, in OpenAI's shape, that it answers everything else with.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from rollouts.sandbox.proxy import Upstream

# What a rollout may call; every other method and path is refused before it reaches an upstream.
FORWARDED_ROUTES = {("POST", "/v1/chat/completions"): "/chat/completions", ("POST", "/v1/completions"): "/completions"}
PASSED_ROUTES = "POST /v1/chat/completions, POST /v1/completions and GET /v1/models"

# The request fields passed on, per route: OpenAI's own that an inference server handles as OpenAI does,
# return_token_ids (vLLM's: the sampled token ids, which the trainer needs; see SAMPLED_TOKENS), and the
# sampling knobs of vLLM's that only shape the caller's own completion (top_k, min_p, repetition_penalty,
# ignore_eos ...; agent scripts pass them in extra_body, and their cost is bounded by the token caps).
# Anything else is an inference server's extension and refused: vLLM's priority (jumping other batches'
# queue), kv_transfer_params, vllm_xargs, chat_template and chat_template_kwargs (the caller's own Jinja
# or its variables in the server's template), guided decoding and cache salts, and whatever a later server
# version adds.
_SAMPLING = frozenset(
    "model n max_tokens temperature top_p stop seed stream stream_options presence_penalty frequency_penalty "
    "logit_bias logprobs user return_token_ids "
    "top_k min_p repetition_penalty min_tokens ignore_eos stop_token_ids skip_special_tokens "
    "spaces_between_special_tokens include_stop_str_in_output".split()
)
FORWARDED_FIELDS = {
    "/chat/completions": _SAMPLING
    | frozenset(
        "messages max_completion_tokens top_logprobs tools tool_choice parallel_tool_calls response_format "
        "reasoning_effort".split()
    ),
    "/completions": _SAMPLING | frozenset("prompt suffix echo best_of".split()),
}

# Alternatives per sampled token a request may ask for (chat's top_logprobs, legacy completions' logprobs):
# OpenAI's own limit, vLLM's default max_logprobs and artweb's CTranslate2 server's. Each one repeats in
# the reply for every token of every choice, and -1 would ask vLLM for the whole vocabulary.
MAX_TOP_LOGPROBS = 20
_TOP_LOGPROBS_FIELD = {"/chat/completions": "top_logprobs", "/completions": "logprobs"}

# Asked of the worker's own inference servers (vLLM and artweb's CTranslate2 server, which both answer
# them) on every chat completion, over whatever the caller sent: each choice then carries the token ids
# the policy sampled (`token_ids`) and their log-probabilities, which the trainer trains on. The SDK's
# client asks for them itself; a client the script built (an AsyncOpenAI on model.inference_base_url, as
# ART's notebooks do) gets them from here, so its turns train on the sampled tokens too. The reply is
# passed on as the server gave it, these fields included: the script's Choice objects hold them, and the
# trajectory records them as it records the SDK's.
SAMPLED_TOKENS = {"logprobs": True, "return_token_ids": True}

# Marks a request the proxy turned away itself (counted in stats()), as against an upstream failure.
REFUSED = web.ResponseKey("refused", bool)


def openai_error(status: int, message: str, code: str, error_type: str = "invalid_request_error") -> web.Response:
    """An error in OpenAI's shape, so the openai client raises its usual exception with our message."""
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    response = web.json_response(body, status=status)
    response[REFUSED] = status < 500
    return response


def check_fields(body: dict, suffix: str, caps: Mapping[str, int]) -> web.Response | None:
    """A 400 naming the first field that is not passed, or over its cap; None when all pass."""
    allowed = FORWARDED_FIELDS[suffix]
    unknown = sorted(set(body) - allowed)
    if unknown:
        return openai_error(
            400,
            f"The request field(s) {', '.join(unknown)} are not accepted here: the proxy passes only "
            f"OpenAI's own fields and vLLM's sampling options for {suffix} ({', '.join(sorted(allowed))}).",
            "field_not_allowed",
        )
    bounds = {name: (1, cap) for name, cap in caps.items()}
    bounds[_TOP_LOGPROBS_FIELD[suffix]] = (0, MAX_TOP_LOGPROBS)
    for name, (low, high) in bounds.items():
        value = body.get(name)
        # A bool passes as 0 or 1 where 0 is allowed: legacy completions' logprobs=True means one alternative.
        whole = type(value) is int or (low == 0 and type(value) is bool)
        if value is not None and (not whole or not low <= value <= high):
            return openai_error(
                400,
                f"{name} must be a whole number from {low} to {high} (the proxy's limit for {name}); "
                f"got {json.dumps(value)[:40]}.",
                "value_out_of_range",
            )
    return None


def asking_sampled_tokens(body: dict, suffix: str) -> dict:
    """The body a worker's own server gets: a chat completion asks for its sampled token ids and their
    log-probabilities (SAMPLED_TOKENS), whatever the caller set them to; anything else goes as sent."""
    if suffix != "/chat/completions":
        return body
    return {**body, **SAMPLED_TOKENS}


def model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "artweb"}


def model_not_found(model, allowed: Mapping[str, Upstream]) -> web.Response:
    names = ", ".join(allowed) or "no model"
    if model is None:
        return openai_error(404, f"The request names no model. This batch may use: {names}.", "model_not_found")
    return openai_error(
        404,
        f"The model `{model}` does not exist or you do not have access to it. This batch may use: {names}.",
        "model_not_found",
    )
