"""A playground answer shows the text the model wrote, token by token, without the end-of-turn token it
stopped on: the inference servers list that token (`<|im_end|>` for ChatML models) among the answer's
log-probs while the answer's text leaves it out."""

import pytest
from django.urls import reverse

from artweb.testing.factories import BaseModelFactory
from training.serving.models import ServeJob
from training.serving.services import serve_jobs
from training.serving.services.serve_jobs import answer_tokens, serve_job_execute

pytestmark = pytest.mark.django_db


def _token(text: str, logprob: float = -0.1) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}


def _choice(index: int, pieces: list[str], finish_reason: str, content: str) -> dict:
    """A chat completion's choice as vLLM answers it: every generated token in logprobs.content, the
    end-of-turn token included when the answer stopped on it, which message.content leaves out."""
    return {
        "index": index,
        "message": {"role": "assistant", "content": content},
        "logprobs": {"content": [_token(p) for p in pieces]},
        "finish_reason": finish_reason,
    }


def test_a_playground_session_shows_no_end_of_turn_token(client, alice, monkeypatch):
    """The serving worker and its inference server do not run in this tier: serve_generate answers as vLLM
    does (see _choice), and the model name resolves to the shared base model."""
    BaseModelFactory(owner=None, name="shared-model")
    monkeypatch.setattr(serve_jobs, "serve_model_resolve", lambda *, user, name: name)
    stopped = _choice(0, ["Hello", " there", "<|im_end|>"], "stop", "Hello there")
    cut = _choice(1, ["Hello", " again"], "length", "Hello again")
    monkeypatch.setattr(serve_jobs, "serve_generate", lambda *, target, body: {"choices": [cut, stopped]})
    job = ServeJob.objects.create(
        owner=alice,
        kind=ServeJob.Kind.PLAYGROUND,
        model_names=["shared-model"],
        params={"prompt": "Greet me.", "samples": 2, "temperature": 1.0, "max_tokens": 8, "tools": None},
        progress_total=1,
    )
    serve_job_execute(job_id=job.id)
    job.refresh_from_db()
    assert job.status == ServeJob.Status.DONE, job.error
    answers = job.result["columns"][0]["answers"]
    assert [[t["token"] for t in a["tokens"]] for a in answers] == [["Hello", " there"], ["Hello", " again"]]
    assert ["".join(t["token"] for t in a["tokens"]) for a in answers] == [a["content"] for a in answers]

    client.force_login(alice)
    page = client.get(reverse("playground-session", args=[job.id])).content.decode()
    assert "> there</span>" in page and "> again</span>" in page and "im_end" not in page


@pytest.mark.parametrize(
    "pieces, finish_reason, content, kept",
    [
        (["w", "5", "<|im_end|>"], "stop", "w5", 2),  # stopped on the end-of-turn token: dropped
        (["<|im_end|>"], "stop", "", 0),  # nothing but the end of the turn
        (["w", "5"], "stop", "w5", 2),  # a server that leaves the end token out: nothing to drop
        (["w", "5", "</s>"], "length", "w5</s>", 3),  # cut at max_tokens: every token is the answer's
        (["call", "<tool_call>"], "tool_calls", "", 2),  # tool calls: the tokens are the call's markup
    ],
)
def test_it_drops_only_a_last_token_the_text_leaves_out(pieces, finish_reason, content, kept):
    tokens = [{"token": p, "logprob": -0.5, "top": []} for p in pieces]
    assert answer_tokens(tokens, content=content, finish_reason=finish_reason) == tokens[:kept]
