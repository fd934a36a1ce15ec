"""When an inference server exits while starting, the error names the reason from its output, with what to
do and without the server's paths, instead of pointing at a log file a user cannot read.

The servers here are real processes: small Python programs that fail as vLLM does (a child process prints
the root cause, the parent re-raises a wrapper), and vLLM itself on models it cannot start."""

import os
import shutil
import sys
import textwrap

import pytest

from rollouts.inference.inference_server import InferenceServer, InferenceServerError, without_host_paths

# A server that fails as vLLM's does: its engine (a child process) dies on the root cause, and the
# process that was started re-raises it as "... See root cause above."
FAILS_LIKE_VLLM = textwrap.dedent(
    """
    import subprocess, sys
    subprocess.run([sys.executable, "-c", "import sys; open(sys.argv[1])", sys.argv[1]])
    raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    """
)


class ScriptServer(InferenceServer):
    engine = "Test"

    def __init__(self, model_path, script: str, args: list[str], **kwargs):
        super().__init__(model_path, **kwargs)
        self.script, self.args = script, args

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.script, *self.args]

    def environment(self) -> dict[str, str]:
        return dict(os.environ)


def start_error(server) -> str:
    with pytest.raises(InferenceServerError) as exc:
        server.start(timeout=120)
    return str(exc.value)


def test_it_names_the_root_cause_and_what_to_do_without_paths(tmp_path):
    missing = tmp_path / "models" / "my-model" / "model.safetensors"
    log_dir = tmp_path / "logs"
    server = ScriptServer(str(missing.parent), FAILS_LIKE_VLLM, [str(missing)], log_dir=str(log_dir))
    try:
        message = start_error(server)
    finally:
        server.stop()
    assert message.startswith(
        "Test could not start the model my-model: FileNotFoundError: [Errno 2] No such file or directory: "
        "'…/model.safetensors'. The model's files are missing on the worker"
    )
    assert str(tmp_path) not in message and "log" not in message
    assert "Engine core initialization failed" in next(log_dir.glob("*.log")).read_text()  # the log keeps it all


def test_it_reads_only_what_this_start_wrote(tmp_path):
    log_dir = tmp_path / "logs"
    server = ScriptServer("m", "raise ValueError('the first start failed')", [], log_dir=str(log_dir))
    try:
        assert "ValueError: the first start failed" in start_error(server)
        server.stop()
        server.script = "import sys; sys.exit(3)"
        message = start_error(server)
    finally:
        server.stop()
    assert "first start" not in message
    assert message == (
        "Test stopped while starting the model m (exit status 3) without saying why; an administrator finds its "
        "output in the worker's logs."
    )


def test_a_server_without_a_log_dir_keeps_its_output_in_its_work_dir(tmp_path):
    server = ScriptServer("m", "raise MemoryError('Cannot allocate memory')", [])
    try:
        message = start_error(server)
        work_dir = server.work_dir
    finally:
        server.stop()
    assert "MemoryError: Cannot allocate memory" in message and "does not fit in the worker's memory" in message
    assert not work_dir.exists()  # removed by stop(), its output with it


def test_it_cuts_paths_to_their_last_part():
    assert without_host_paths("No such file: '/srv/data/models/x/model.safetensors'") == (
        "No such file: '…/model.safetensors'"
    )
    assert without_host_paths("in ~/cache/hub and ./data/m, not https://huggingface.co/org/m") == (
        "in …/hub and …/m, not https://huggingface.co/org/m"
    )
    assert without_host_paths("a / b, 3/4") == "a / b, 3/4"


def _model_without(tmp_path, vllm_model_dir, *skip: str):
    model = tmp_path / "broken-model"
    model.mkdir()
    for name in os.listdir(vllm_model_dir):
        if name not in skip:
            shutil.copy(vllm_model_dir / name, model / name)
    return model


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_without_weights_says_the_files_are_missing(tmp_path, vllm_model_dir):
    from rollouts.inference.vllm_server import VLLMServer

    model = _model_without(tmp_path, vllm_model_dir, "model.safetensors")
    server = VLLMServer(str(model), max_model_len=2048, kv_cache_gb=0.25, enforce_eager=True, log_dir=tmp_path / "l")
    try:
        message = start_error(server)
    finally:
        server.stop()
    assert message.startswith(
        "vLLM could not start the model broken-model: RuntimeError: Cannot find any model weights"
    )
    assert "files are missing on the worker" in message and str(tmp_path) not in message


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_refusing_a_max_length_says_to_lower_it(tmp_path, vllm_model_dir):
    from rollouts.inference.vllm_server import VLLMServer

    server = VLLMServer(str(vllm_model_dir), max_model_len=100_000, kv_cache_gb=0.25, enforce_eager=True)
    try:
        message = start_error(server)
    finally:
        server.stop()
    assert "User-specified max_model_len (100000) is greater than the derived max_model_len" in message
    assert "Lower the base model's max length" in message and str(vllm_model_dir) not in message
