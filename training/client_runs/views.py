"""ART's ServerlessBackend protocol under /api/v1/art/: `ServerlessBackend(api_key=<artweb API token>,
base_url=<server>/api/v1/art)` and ART's client trains against artweb unchanged.

Plain Django views speaking the protocol as ART's client reads it (art/serverless/client.py): a Bearer
token, JSON in and out, lists as {"data": [...], "has_more": bool} paged with `after=<last id>`, errors as
{"error": {"message", "type", "param", "code"}}. The client retries GET and DELETE, never POST. Inference
for the client is the OpenAI endpoint at the same base (`/chat/completions`), which also answers to the
model names register() gives: `wandb-artifact:///<entity>/<project>/<name>[:step<N>]`.
"""

from __future__ import annotations

import statistics

from asgiref.sync import sync_to_async
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from artweb.jsonlimits import JSONLimitError, json_loads_limited
from training.client_runs import services
from training.client_runs.services import ClientError
from training.client_runs.wire import WireError, parse_model_create
from training.models import Run
from training.services.runs import run_event
from training.serving.apis.endpoint import bearer_user, relay_chat
from training.serving.protocol import ServeError, ServeTarget
from training.serving.selectors import checkpoint_target, serve_model_resolve
from training.serving.services.serving import serve_body_check

MAX_BODY_BYTES = 256 << 20  # a training job's groups as JSON (each trajectory is held to 4 MB besides)


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JsonResponse:
    return JsonResponse(ServeError(status, message, param=param, code=code).as_dict(), status=status)


def _body(request):
    try:
        return json_loads_limited(request.body or b"null", max_bytes=MAX_BODY_BYTES)
    except JSONLimitError as exc:
        raise ClientError(400, str(exc)) from None
    except ValueError:
        raise ClientError(400, "The request body is not JSON.") from None


def _api(methods: tuple[str, ...]):
    """A protocol route: the method checked, the token's user found, ClientError and ServeError answered."""

    def wrap(view):
        @csrf_exempt
        def handle(request, *args, **kwargs):
            if request.method not in methods:
                return _error(405, f"Use {' or '.join(methods)} here.")
            try:
                user = bearer_user(request)
                return view(request, user, *args, **kwargs)
            except ClientError as exc:
                return _error(exc.status, exc.message, exc.param)
            except ServeError as exc:
                return _error(exc.status, exc.message, exc.param, exc.code)

        return handle

    return wrap


def _model_out(found) -> dict:
    return {
        "id": str(found.run_id),
        "entity": found.entity,
        "project": found.project,
        "name": found.name,
        "base_model": found.base_model_requested,
        "run_id": str(found.run_id),
    }


@_api(("POST",))
def models_create(request, user):
    try:
        data = parse_model_create(_body(request))
    except WireError as exc:
        raise ClientError(400, str(exc), param=exc.param) from None
    return JsonResponse(_model_out(services.client_model_register(user=user, **data)))


@_api(("DELETE", "GET"))
def model_detail(request, user, model_id):
    if request.method == "GET":
        return JsonResponse(_model_out(services.client_model_get(user=user, model_id=model_id)))
    services.client_model_delete(user=user, model_id=model_id)
    return JsonResponse({"id": str(model_id), "deleted": True})


def _int_arg(request, name: str, default: int) -> int:
    value = request.GET.get(name)
    if value in (None, ""):
        return default
    if not value.isdigit():
        raise ClientError(400, f"'{name}' must be a whole number.", param=name)
    return int(value)


@_api(("GET", "DELETE"))
def model_checkpoints(request, user, model_id):
    if request.method == "DELETE":
        body = _body(request)
        steps = body.get("steps") if isinstance(body, dict) else None
        deleted, missing = services.client_checkpoints_delete(user=user, model_id=model_id, steps=steps)
        return JsonResponse({"deleted_count": deleted, "not_found_steps": missing})
    rows, more = services.client_checkpoints(
        user=user,
        model_id=model_id,
        after=request.GET.get("after"),
        limit=_int_arg(request, "limit", 100),
        order=request.GET.get("order") or "asc",
    )
    data = [{"id": str(c.id), "step": c.step, "metrics": _numbers(c.metrics)} for c in rows]
    return JsonResponse({"object": "list", "data": data, "has_more": more})


def _numbers(metrics: dict) -> dict:
    return {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@_api(("POST",))
def model_log(request, user, model_id):
    """ART up to 0.5.7 posts what model.log() logs: recorded on the run's timeline with the groups' mean
    reward (a "val" split's mean is the run's validation reward of its latest step)."""
    found = services.client_model_get(user=user, model_id=model_id)
    body = _body(request)
    groups = body.get("trajectory_groups") if isinstance(body, dict) else None
    split = body.get("split") if isinstance(body, dict) else None
    if not isinstance(groups, list) or not isinstance(split, str):
        raise ClientError(400, "The body must be {model_id, trajectory_groups: [...], split}.")
    rewards = [
        t["reward"]
        for g in groups
        if isinstance(g, dict)
        for t in g.get("trajectories") or []
        if isinstance(t, dict) and isinstance(t.get("reward"), (int, float)) and not isinstance(t.get("reward"), bool)
    ]
    mean = statistics.fmean(rewards) if rewards else None
    run = Run.objects.get(id=found.run_id)
    run_event(
        run=run,
        kind="client_log",
        message=f"The ART client logged {len(groups)} {split} groups"
        + (f", mean reward {mean:.4f}." if mean is not None else "."),
        data={"split": split[:20], "groups": len(groups), "reward_mean": mean, "step": run.steps_done},
    )
    if split in ("val", "validation") and mean is not None:
        services.client_val_reward_record(run=run, reward=mean)
    return JsonResponse({})


@_api(("POST",))
def training_jobs_create(request, user):
    job = services.client_job_create(user=user, body=_body(request))
    return JsonResponse({"id": str(job.id)})


@_api(("GET",))
def training_job_events(request, user, job_id):
    events, more = services.client_job_events(
        user=user, job_id=job_id, after=request.GET.get("after"), limit=_int_arg(request, "limit", 100)
    )
    data = [{"id": str(e.id), "type": e.type, "data": e.data} for e in events]
    return JsonResponse({"object": "list", "data": data, "has_more": more})


@_api(("POST",))
def sft_jobs_create(request, user):
    raise ClientError(
        400,
        "Supervised fine-tuning (train_sft) is not supported by artweb: it trains with GRPO only. Use "
        "backend.train() (or model.train()) with scored trajectory groups.",
    )


# --- inference for the client --------------------------------------------------------------------------


def _prepare(request, raw: bytes) -> tuple[ServeTarget, dict]:
    user = bearer_user(request)
    try:
        body = json_loads_limited(raw or b"null")
    except (JSONLimitError, ValueError):
        raise ServeError(400, "The request body is not JSON (or nests too deeply).") from None
    body = serve_body_check(body)
    name = body.get("model")
    if not (isinstance(name, str) and name.startswith("wandb-artifact:///")):
        return serve_model_resolve(user=user, name=name), body
    try:
        run, ckpt = services.client_inference_target(user=user, name=name)
    except ClientError as exc:
        raise ServeError(exc.status, exc.message, param=exc.param) from None
    # The trainer needs the sampled ids and their log-probs: asked for on every request of a client's run,
    # so the Choice objects the client keeps carry them back in its training job.
    body.setdefault("logprobs", True)
    body.setdefault("return_token_ids", True)
    if ckpt is None:
        return ServeTarget(requested=name, base_model_id=run.base_model_id), body
    return checkpoint_target(name, ckpt), body


_prepare_async = sync_to_async(_prepare, thread_sensitive=False)


@csrf_exempt
async def chat_completions(request):
    return await relay_chat(request, _prepare_async)
