"""Data attachments in the real jail: a run's files at /data/<name>, read-only whatever user code tries,
nothing else of the store in sight, and an ART·E style agent answering from an attached SQLite database.

The hostile scripts are what a stranger could upload; each attack is checked from outside afterwards too:
the stored file's hash and mode are what they were before the batch.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from aiohttp import web

from rollouts.sandbox.attachments import attachment_keep, attachment_receive
from rollouts.sandbox.prestart import prestarted
from rollouts.sandbox.rollouts import run_rollouts
from tests.rollouts.sandbox.test_hostile import report
from tests.rollouts.sandbox.threaded_server import ThreadedServer

EMAILS = [
    ("alice@example.com", "Lunch", "Lunch is moved to Thursday at noon."),
    ("bob@example.com", "Q3 budget", "The Q3 budget is 48,000 euros."),
    ("carol@example.com", "Offsite", "The offsite will be in Lisbon."),
]


def make_mail_db(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE emails (sender TEXT, subject TEXT, body TEXT)")
        db.executemany("INSERT INTO emails VALUES (?, ?, ?)", EMAILS)
    sqlite3.connect(path).close()


def store_file(store: Path, source: Path) -> Path:
    with open(source, "rb") as f:
        incoming, sha, _ = attachment_receive(f, store, max_bytes=1 << 30)
    return attachment_keep(incoming, store, sha)


@pytest.fixture
def store(tmp_path):
    """An attachment store in a directory the sandbox uid cannot enter (as a data dir is), holding this
    run's mail.db and another user's file."""
    directory = tmp_path / "data" / "attachments"
    make_mail_db(tmp_path / "mail.db")
    (tmp_path / "other.json").write_text('{"secret": "another user\'s data"}')
    mail = store_file(directory, tmp_path / "mail.db")
    other = store_file(directory, tmp_path / "other.json")
    (tmp_path / "data").chmod(0o700)
    return {"mail": mail, "other": other, "dir": directory}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


ATTACKS = """
import ctypes, sqlite3, stat
def attempt(label, fn):
    try:
        fn()
        out[label] = 'done'
    except Exception as e:
        out[label] = type(e).__name__ + ': ' + str(e)[:80]
path = '/data/mail.db'
attempt('open r+b', lambda: open(path, 'r+b').write(b'X'))
attempt('open ab', lambda: open(path, 'ab').write(b'X'))
attempt('os.open O_RDWR', lambda: os.open(path, os.O_RDWR))
attempt('O_TRUNC', lambda: os.open(path, os.O_WRONLY | os.O_TRUNC))
attempt('truncate', lambda: os.truncate(path, 0))
attempt('chmod', lambda: os.chmod(path, 0o666))
attempt('chown', lambda: os.chown(path, 1000, 1000))
attempt('utime', lambda: os.utime(path, (0, 0)))
attempt('rename in /data', lambda: os.rename(path, '/data/moved.db'))
attempt('rename to /tmp', lambda: os.rename(path, '/tmp/moved.db'))
attempt('unlink', lambda: os.unlink(path))
attempt('new file in /data', lambda: open('/data/new.db', 'w').write('x'))
attempt('mkdir in /data', lambda: os.mkdir('/data/sub'))
attempt('hard link', lambda: os.link(path, '/tmp/linked.db'))
attempt('setxattr', lambda: os.setxattr(path, 'user.x', b'1'))
def sqlite_write():
    db = sqlite3.connect(path)
    db.execute("INSERT INTO emails VALUES ('eve@example.com', 'pwned', 'pwned')")
    db.commit()
attempt('sqlite insert', sqlite_write)
def sqlite_drop():
    db = sqlite3.connect(path, isolation_level=None)
    db.execute('DROP TABLE emails')
attempt('sqlite drop', sqlite_drop)
def remount(flags):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(None, path.encode(), None, flags, None) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
attempt('remount rw', lambda: remount(0x20 | 0x1000))  # MS_REMOUNT | MS_BIND, without MS_RDONLY
attempt('remount /data rw', lambda: remount(0x20))
out['mode'] = oct(stat.S_IMODE(os.stat(path).st_mode))
out['rows'] = sqlite3.connect('file:' + path + '?mode=ro', uri=True).execute('SELECT COUNT(*) FROM emails').fetchone()[0]
"""


def test_user_code_cannot_change_an_attachment_in_any_way(request_for, store):
    before, mode = digest(store["mail"]), store["mail"].stat().st_mode
    results = run_rollouts(request_for(report(ATTACKS), attachments={"mail.db": store["mail"]}))
    out = results[0].trajectories[0]["metadata"]
    assert results[0].trajectories[0]["error"] is None, results[0].trajectories[0]["error"]
    assert out.pop("rows") == len(EMAILS)
    assert out.pop("mode") == "0o444"
    assert [label for label, outcome in out.items() if outcome == "done"] == []
    assert out["sqlite insert"].startswith("OperationalError: attempt to write a readonly database")
    assert out["remount rw"].startswith(("PermissionError", "OSError"))
    # Nothing changed outside either, and the well-behaved rollout went on.
    assert digest(store["mail"]) == before and store["mail"].stat().st_mode == mode
    assert sorted(p.name for p in store["dir"].iterdir()) == sorted([store["mail"].name, store["other"].name])
    assert results[1].rewards == [1.0, 1.0]


def test_the_jail_shows_the_runs_attachments_only(request_for, store):
    """Another user's stored file sits in the same store: the jail has neither the store nor that file,
    by its host path or under /data."""
    code = (
        "out['data'] = sorted(os.listdir('/data'))\n"
        f"for path in {[str(store['other']), str(store['dir']), '/data/other.json']!r}:\n"
        "    try:\n"
        "        out[path] = open(path).read()[:100]\n"
        "    except OSError as e:\n"
        "        out[path] = type(e).__name__\n"
        "out['env'] = os.environ.get('ARTWEB_ATTACHMENTS')\n"
    )
    results = run_rollouts(request_for(report(code), attachments={"mail.db": store["mail"]}))
    out = results[0].trajectories[0]["metadata"]
    assert out.pop("data") == ["mail.db"]
    assert out.pop("env") == "/data"
    assert set(out.values()) == {"FileNotFoundError"}, out


def test_a_batch_without_attachments_has_no_data_folder(request_for):
    results = run_rollouts(request_for(report("out['data'] = os.path.exists('/data')\n")))
    assert results[0].trajectories[0]["metadata"] == {"data": False}


def test_an_attachment_name_that_leaves_data_is_refused_before_the_jail_starts(request_for, store):
    with pytest.raises(ValueError, match="not a file name"):
        run_rollouts(request_for(report(""), attachments={"../etc/passwd": store["mail"]}))


@pytest.mark.slow
def test_a_prestarted_batch_has_the_runs_attachments(request_for, store):
    prestarted.discard()
    try:
        for step in (1, 2):  # the second batch takes the jail the first one pre-started
            request = request_for(
                report("out['rows'] = len(open('/data/mail.db', 'rb').read()) > 0\n"),
                scenarios=[{"i": 0}],
                group_size=1,
                sandboxes=1,
                step=step,
                warm_key="run-attach",
                prestart_next=step == 1,
                attachments={"mail.db": store["mail"]},
            )
            if step == 2:
                assert prestarted.keys() == ["run-attach"]
            (group,) = run_rollouts(request)
            assert [t["error"] for t in group.trajectories] == [None]
            assert group.trajectories[0]["metadata"] == {"rows": True}
    finally:
        prestarted.discard()


# --- an ART·E style agent ---------------------------------------------------------------------------


class ScriptedMailModel(ThreadedServer):
    """An OpenAI-compatible stand-in for the policy, as the sandbox tests' FakeJudge is for a judge: no model
    here can be relied on to pick the right tool, so its moves are scripted. Asked a question, it calls the
    search_inbox tool with the question's last word; given the tool's result, it answers with that result
    word for word. The answer can only be right if the script read it from the attached database."""

    def __init__(self) -> None:
        super().__init__("scripted-mail-model")
        self.requests: list[dict] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._complete)

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        last = body["messages"][-1]
        if last["role"] == "tool":
            message = {"role": "assistant", "content": last["content"]}
        else:
            keyword = last["content"].rstrip("?").split()[-1]
            call = {"id": "call-1", "type": "function", "function": {"name": "search_inbox", "arguments": ""}}
            call["function"]["arguments"] = json.dumps({"keyword": keyword})
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "stop" if message["content"] else "tool_calls"
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )


ART_E_SCRIPT = """
import json, sqlite3
import art

TOOLS = [{"type": "function", "function": {
    "name": "search_inbox",
    "description": "Bodies of the emails whose subject contains a keyword.",
    "parameters": {"type": "object", "properties": {"keyword": {"type": "string"}}, "required": ["keyword"]},
}}]


def search_inbox(keyword):
    # Read-only by URI, and a plain connect, which SQLite opens read-only by itself on a read-only file.
    uri = sqlite3.connect("file:/data/mail.db?mode=ro", uri=True)
    plain = sqlite3.connect("/data/mail.db")
    query = "SELECT body FROM emails WHERE subject LIKE ?"
    rows = uri.execute(query, (f"%{keyword}%",)).fetchall()
    assert rows == plain.execute(query, (f"%{keyword}%",)).fetchall()
    return " ".join(body for (body,) in rows) or "no email found"


async def rollout(model, scenario):
    client = model.openai_client()
    messages = [
        {"role": "system", "content": "Answer from the user's inbox; search it first."},
        {"role": "user", "content": scenario["question"]},
    ]
    trajectory = art.Trajectory(messages_and_choices=messages, tools=TOOLS)
    for _ in range(3):
        completion = await client.chat.completions.create(
            model=model.name, messages=trajectory.messages(), tools=TOOLS
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        if not choice.message.tool_calls:
            break
        for call in choice.message.tool_calls:
            result = search_inbox(**json.loads(call.function.arguments))
            trajectory.messages_and_choices.append({"role": "tool", "tool_call_id": call.id, "content": result})
    trajectory.metadata["answer"] = choice.message.content
    return trajectory
"""

ART_E_REWARD = """
def reward(trajectory, scenario):
    return 1.0 if scenario["expected"] in (trajectory.metadata.get("answer") or "") else 0.0
"""


def test_an_art_e_style_agent_answers_from_an_attached_sqlite_database(request_for, store):
    scenarios = [
        {"question": "How large is the Q3 budget?", "expected": "48,000 euros"},
        {"question": "Where is the Offsite?", "expected": "Lisbon"},
        {"question": "When is Lunch?", "expected": "Thursday at noon"},
    ]
    with ScriptedMailModel() as model:
        results = run_rollouts(
            request_for(
                ART_E_SCRIPT,
                reward=ART_E_REWARD,
                scenarios=scenarios,
                group_size=2,
                base_url=model.base_url,
                model_name="run-1@1",
                attachments={"mail.db": store["mail"]},
            )
        )
    for group in results:
        assert group.errors == []
        assert group.rewards == [1.0, 1.0]
        tool_turns = [m for m in group.trajectories[0]["messages"] if m["role"] == "tool"]
        assert len(tool_turns) == 1 and group.scenario["expected"] in tool_turns[0]["content"]
    assert len(model.requests) == 2 * 2 * len(scenarios)  # a tool call and an answer per rollout


def test_the_same_agent_scores_nothing_without_the_attachment(request_for):
    """The control: with no database bound, the same script and model cannot answer (the tool fails)."""
    with ScriptedMailModel() as model:
        results = run_rollouts(
            request_for(
                ART_E_SCRIPT,
                reward=ART_E_REWARD,
                scenarios=[{"question": "Where is the Offsite?", "expected": "Lisbon"}],
                group_size=1,
                base_url=model.base_url,
                model_name="run-1@1",
            )
        )
    assert results[0].rewards == [None]
    assert "unable to open database file" in results[0].errors[0]


def test_plain_sqlite_reads_work_on_a_read_only_attachment_in_wal_mode_with_immutable(request_for, tmp_path):
    """A database saved in WAL mode needs its -shm file beside it, which a read-only folder cannot hold:
    a plain connect fails to read it, `?immutable=1` reads it (what the guide says to do)."""
    path = tmp_path / "wal.db"
    make_mail_db(path)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
    stored = store_file(tmp_path / "store", path)
    code = (
        "import sqlite3\n"
        "def count(target, **kw):\n"
        "    try:\n"
        "        return sqlite3.connect(target, **kw).execute('SELECT COUNT(*) FROM emails').fetchone()[0]\n"
        "    except sqlite3.Error as e:\n"
        "        return type(e).__name__\n"
        "out['plain'] = count('/data/wal.db')\n"
        "out['immutable'] = count('file:/data/wal.db?mode=ro&immutable=1', uri=True)\n"
    )
    results = run_rollouts(request_for(report(code), attachments={"wal.db": stored}))
    out = results[0].trajectories[0]["metadata"]
    assert out["immutable"] == len(EMAILS)
    assert out["plain"] != len(EMAILS)
