"""Generation on CTranslate2: the engine behind artweb's second CPU inference server (ct2_entry).

vLLM's CPU build computes in bf16, which is fast where the processor has bf16 units (AMX, AVX512-BF16)
and emulated, several times slower, where it has not (AVX2-only processors: 22-35 tok/s for the
default model, bench/results/cpu_paths.md); its fp32 path on AVX2 answers garbage. CTranslate2 runs
the model in fp32 with kernels for each instruction set, dispatched at run time.

One policy at a time, like vLLM's merged mode: the base weights, or a step's adapter merged into them
(rollouts.inference.merge), converted in memory to CTranslate2's format when loaded. Requests that arrive
together run as one batch; each sequence stops on its own (end of text, its max_tokens, a stop string)
and its tokens are handed over as they are sampled, so answers can stream.

Log-probs are those of the model's own distribution, before temperature, top-p or top-k, as vLLM
reports them by default (checked against transformers in tests/rollouts/sandbox/test_ct2.py).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import queue
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollouts.inference.ct2_convert import convert, write_model_bin

logger = logging.getLogger(__name__)

# How the batcher gathers a batch (see Engine._gather): a step's rollouts send their requests within
# tens of milliseconds of each other, from several sandbox processes.
GATHER_QUIET_S = 0.05
GATHER_MAX_S = 0.5


@dataclass(frozen=True)
class Sampling:
    """What one batch shares: CTranslate2 takes these per call, not per sequence."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: the whole vocabulary
    seed: int | None = None  # a seeded request runs in a batch of its own
    top_logprobs: int = 0  # > 0: the batch computes the full distribution at every step
    ignore_eos: bool = False  # the end token is per batch too


@dataclass
class Sample:
    """One sequence's output, filled in as the engine samples it."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class Job:
    """A request: `n` samples of one prompt. `on_token(index, sample)` is called from the engine's thread
    after each sampled token; `done` is set when every sample has finished."""

    prompt_ids: list[int]
    n: int
    max_tokens: int
    sampling: Sampling
    stop: list[str] = field(default_factory=list)
    # A JSON schema the answer must follow (OpenAI's response_format, or a tool call that tool_choice
    # demands; {} for any JSON object): such a job
    # runs on its own, through transformers with a grammar (see Engine._run_guided).
    json_schema: dict | None = None
    on_token: object = None
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False

    def __post_init__(self) -> None:
        self.samples = [Sample() for _ in range(self.n)]


class Engine:
    def __init__(self, model_dir: str, *, compute_type: str = "float32", threads: int = 0, work_dir: str) -> None:
        import ctranslate2
        import torch
        import transformers

        self._ct2 = ctranslate2
        # torch only converts weights here (CTranslate2 generates on threads of its own). The conversion is
        # thousands of small calls (one tensor comparison per pair of same-shaped weights, to share tied
        # ones); with a pool of threads each call waits for them to wake, seconds in all on busy cores.
        torch.set_num_threads(1)
        self.model_dir = model_dir
        self.compute_type = compute_type
        self.threads = threads
        self.work_dir = Path(work_dir)
        # Where CTranslate2 reads each policy from (see _generator_of); a previous server's is stale. Memory
        # a load frees is kept for the next (CT2Server sets glibc's thresholds so): each load then reuses the
        # same pages, where giving them back made the next load fault them in again, up to seconds a load in
        # a run.
        self._policy_dir = self.work_dir / "policy"
        shutil.rmtree(self._policy_dir, ignore_errors=True)
        self._weights: int | None = None  # this process's descriptor of policy_dir's model.bin
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        # A float32 copy of the model in memory: each load puts a policy's weights into it and converts.
        self._model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self._names = set(self._model.state_dict())
        # The base weights are read again from their files when they are served again; a model without
        # safetensors files keeps a copy in memory instead.
        self._base_state = (
            None
            if any(Path(model_dir).glob("*.safetensors"))
            else {k: v.clone() for k, v in self._model.state_dict().items()}
        )
        config = self._model.config
        eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        self.eos_ids = sorted({i for i in [*eos, self.tokenizer.eos_token_id] if isinstance(i, int)})
        self.vocab_size = int(config.vocab_size)
        # The converter runs gc.collect() once per layer; with torch and transformers loaded that is
        # ~0.2 s each (7 s for 30 layers). What is alive now lives as long as the server: freeze it.
        gc.collect()
        gc.freeze()
        self._generator = None
        self._grammars = None  # xgrammar's compiler for this tokenizer, made on the first guided request
        self._swap = threading.Lock()  # held by a batch while it runs, and by a load
        self._queue: queue.Queue[Job] = queue.Queue()
        self.load(None)
        threading.Thread(target=self._loop, name="ct2-batches", daemon=True).start()

    # --- weights -------------------------------------------------------------------------------------

    def load(self, weights_dir: str | None, *, adapter_dir: str | None = None) -> float:
        """Serve the base weights (None), the merged weights in weights_dir, or the base weights with the
        LoRA adapter in adapter_dir folded in (in float32, the policy a float32 trainer holds); return the
        seconds taken. Waits for the batch in progress; batches queued meanwhile run on the new weights."""
        import torch
        from safetensors import safe_open

        from rollouts.inference.merge import MergeError, fold, read_adapter

        t0 = time.perf_counter()
        lora = read_adapter(adapter_dir) if adapter_dir is not None else {}
        source = weights_dir or self.model_dir
        with contextlib.ExitStack() as files:
            # The weights are read one at a time, each into the model's own tensor: no second copy of the
            # model, whole, in memory during a load.
            if weights_dir is None and self._base_state is not None:
                found = dict.fromkeys(self._base_state)
                read = self._base_state.__getitem__
                shape = lambda name: tuple(self._base_state[name].shape)  # noqa: E731
            else:
                found = {}
                for path in sorted(Path(source).glob("*.safetensors")):
                    fh = files.enter_context(safe_open(str(path), framework="pt"))
                    found.update(dict.fromkeys(fh.keys(), fh))
                read = lambda name: found[name].get_tensor(name)  # noqa: E731
                shape = lambda name: tuple(found[name].get_slice(name).get_shape())  # noqa: E731
            missing = self._names - set(found)
            # Tied embeddings: a checkpoint may omit the output layer that shares the input's weights.
            missing.discard("lm_head.weight")
            if missing:
                raise ValueError(f"{source} lacks {len(missing)} of the model's weights, e.g. {sorted(missing)[:3]}")
            if unmatched := set(lora) - set(found):
                raise MergeError(f"Adapter layers with no matching base weight: {sorted(unmatched)[:5]}")
            own = self._model.state_dict()  # the model's tensors themselves, not copies
            names = self._names & set(found)
            for name in sorted(names):  # all checked before anything is written
                if shape(name) != tuple(own[name].shape):
                    raise ValueError(
                        f"{source}: {name} has shape {shape(name)}, the model's is {tuple(own[name].shape)}"
                    )
            # Under the lock from here: the batch in progress finishes on the old weights, and nothing
            # generates on a mix of the two (the model in memory also answers guided requests, see
            # _run_guided).
            stages: dict[str, float] = {}

            def lap(stage: str) -> None:
                stages[stage] = time.perf_counter() - t0 - sum(stages.values())

            with self._swap:
                lap("waiting")
                with torch.no_grad():
                    for name in names:
                        if name in lora:
                            fold(own[name], read(name), lora[name])
                        else:
                            own[name].copy_(read(name))
                lap("weights")
                spec = convert(self._model, self.tokenizer, self.compute_type)
                lap("conversion")
                self._generator = None  # its memory goes to the next one
                self._generator = self._generator_of(spec)
                lap("generator")
                del spec
        gc.collect()  # the converted module tree's cycles; their memory stays with the process (see __init__)
        seconds = time.perf_counter() - t0
        logger.info(
            "loaded %s in %.2f s (%s)",
            adapter_dir or weights_dir or "the base weights",
            seconds,
            ", ".join(f"{stage} {s:.2f}" for stage, s in stages.items()),
        )
        return seconds

    def _generator_of(self, spec):
        """A generator on spec's weights, read from policy_dir.

        The first load lets CTranslate2 write the whole directory; its config and vocabulary never change
        after (same model, same tokenizer). Later loads only write model.bin again, in place, straight from
        the weights' memory (write_model_bin): CTranslate2's own writer copies each weight into a bytes
        object first and writes a new file, 1-2 s for the default model against 0.1-0.2 s. The file's pages
        stay in the page cache between loads (memory the kernel can take back), so a load writes into
        pages it already has instead of faulting in new ones: measured in a run, fresh pages made a load's
        write and read of the weights take 0.3-3 s instead of 0.2-0.4 s. The generator copies the weights
        it reads; the file is not read again until the next load rewrites it. On Linux the file has no name
        once written: model.bin is a link to this process's descriptor of it.
        """
        weights = self._policy_dir / "model.bin"
        if self._weights is None:
            self._policy_dir.mkdir(parents=True, exist_ok=True)
            spec.save(str(self._policy_dir))
            self._weights = os.open(weights, os.O_RDWR)
            if Path("/proc/self/fd").is_dir():
                # The file lives as long as this process holds it open, not longer: a server killed
                # without its stop() leaves no copy of the weights in its work directory.
                weights.unlink()
                weights.symlink_to(f"/proc/self/fd/{self._weights}")
        else:
            with open(self._weights, "r+b", closefd=False) as fh:
                fh.seek(0)  # the descriptor's offset is where the last load's writing ended
                write_model_bin(spec, fh)
                fh.truncate()
        return self._ct2.Generator(
            str(self._policy_dir), device="cpu", compute_type=self.compute_type, intra_threads=self.threads
        )

    # --- requests ------------------------------------------------------------------------------------

    def submit(self, job: Job) -> Job:
        self._queue.put(job)
        return job

    def _gather(self) -> list[Job]:
        """The next batch's jobs: the first to arrive, and those that follow it closely (until none came
        for GATHER_QUIET_S, at most GATHER_MAX_S after the first). A batch runs to its longest answer
        before the next one starts, so a request that just misses one waits for all of it."""
        jobs = [self._queue.get()]
        deadline = time.monotonic() + GATHER_MAX_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                jobs.append(self._queue.get(timeout=min(GATHER_QUIET_S, left)))
            except queue.Empty:
                break
        return jobs

    def _loop(self) -> None:
        while True:
            jobs = self._gather()
            batches: dict[Sampling, list[Job]] = {}
            for job in jobs:
                if job.cancelled:
                    continue
                if job.json_schema is not None or job.sampling.seed is not None:
                    self._run_guided(job)
                else:
                    batches.setdefault(job.sampling, []).append(job)
            for sampling, group in batches.items():
                self._run(sampling, group)

    def _run(self, sampling: Sampling, jobs: list[Job]) -> None:
        rows = [(job, i) for job in jobs for i in range(job.n)]  # batch row -> (job, sample index)
        texts = ["" for _ in rows]  # decoded so far, for stop strings
        stopped = [False] * len(rows)
        step_logits = StepLogits()

        def finish(row: int, reason: str) -> bool:
            job, i = rows[row]
            job.samples[i].finish_reason = reason
            stopped[row] = True
            if all(s.finish_reason for s in job.samples):
                job.done.set()
            return True

        def on_step(step) -> bool:
            row = step.batch_id
            if stopped[row]:
                return True
            job, i = rows[row]
            sample = job.samples[i]
            sample.token_ids.append(int(step.token_id))
            sample.logprobs.append(float(step.log_prob) if step.log_prob is not None else math.nan)
            if sampling.top_logprobs:
                sample.top.append(_top(step_logits.of(step, row, stopped), sampling.top_logprobs))
            if job.on_token is not None:
                job.on_token(i, sample)
            if job.cancelled:
                return finish(row, "abort")
            if step.token_id in self.eos_ids and not sampling.ignore_eos:
                return finish(row, "stop")
            if job.stop:
                texts[row] = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
                if any(s in texts[row] for s in job.stop):
                    return finish(row, "stop")
            if len(sample.token_ids) >= job.max_tokens:
                return finish(row, "length")
            return False

        started = time.perf_counter()
        try:
            shared = _shared_prefix([job.prompt_ids for job, _ in rows])
            start = self.tokenizer.convert_ids_to_tokens(rows[0][0].prompt_ids[:shared]) if shared else None
            prompts = [self.tokenizer.convert_ids_to_tokens(job.prompt_ids[shared:]) for job, _ in rows]
            with self._swap:
                self._generator.generate_batch(
                    prompts,
                    # The start the rows share (a system prompt; a group's whole prompt) is run once for the
                    # batch instead of once a row. Not kept between batches: one per distinct start would
                    # pile up over a step's turns.
                    static_prompt=start,
                    cache_static_prompt=False,
                    max_length=max(job.max_tokens for job in jobs),
                    # Greedy is CTranslate2's top-k of 1; its temperature must stay positive.
                    sampling_topk=1 if sampling.temperature == 0 else sampling.top_k,
                    sampling_topp=sampling.top_p,
                    sampling_temperature=sampling.temperature or 1.0,
                    end_token=[] if sampling.ignore_eos else self.eos_ids,
                    include_prompt_in_result=False,
                    return_scores=True,
                    return_logits_vocab=bool(sampling.top_logprobs),
                    callback=on_step,
                )
            for row in range(len(rows)):
                if not stopped[row]:  # the batch's max_length or an end token ignored by this row
                    finish(row, "length")
            logger.info(
                "batch of %d sequences (%d requests): %d tokens in %.2f s",
                len(rows),
                len(jobs),
                sum(len(job.samples[i].token_ids) for job, i in rows),
                time.perf_counter() - started,
            )
        except Exception as exc:  # a request must never hang on an engine error
            logger.exception("generation failed")
            for job in jobs:
                job.error = f"generation failed: {exc}"
                job.done.set()

    def _run_guided(self, job: Job) -> None:
        """Generate a job through transformers on the same weights, one job at a time: slower than a batch.

        For what CTranslate2 cannot do: restrict the next token (job.json_schema: RULER's judge, forced
        tool calls; xgrammar, the grammar engine vLLM uses, masks what the schema forbids), and repeat a
        seeded request (its sampler's generators are seeded once per thread, not per call)."""
        import torch
        import xgrammar
        from xgrammar.contrib.hf import LogitsProcessor

        try:
            if self._grammars is None and job.json_schema is not None:
                info = xgrammar.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size)
                self._grammars = xgrammar.GrammarCompiler(info)
            processors = []
            if job.json_schema is not None:
                grammar = (
                    self._grammars.compile_json_schema(json.dumps(job.json_schema))
                    if job.json_schema
                    else self._grammars.compile_builtin_json_grammar()
                )
                processors.append(LogitsProcessor(grammar))
            sampling = job.sampling
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            threads = torch.get_num_threads()
            torch.set_num_threads(self.threads or os.cpu_count() or 1)
            try:
                with self._swap, torch.no_grad():
                    out = self._model.generate(
                        torch.tensor([job.prompt_ids] * job.n),
                        attention_mask=torch.ones(job.n, len(job.prompt_ids), dtype=torch.long),
                        max_new_tokens=job.max_tokens,
                        do_sample=sampling.temperature > 0,
                        temperature=sampling.temperature or None,
                        top_p=sampling.top_p,
                        top_k=sampling.top_k or None,
                        logits_processor=processors,
                        eos_token_id=self.eos_ids,
                        min_new_tokens=job.max_tokens if sampling.ignore_eos else None,
                        pad_token_id=self.eos_ids[0],
                        output_logits=True,
                        return_dict_in_generate=True,
                    )
            finally:
                torch.set_num_threads(threads)
            new = out.sequences[:, len(job.prompt_ids) :]
            raw = torch.stack(out.logits, dim=1).float().log_softmax(-1)  # (n, steps, vocab), before the mask
            for i, sample in enumerate(job.samples):
                for k, token in enumerate(new[i].tolist()):
                    sample.token_ids.append(int(token))
                    sample.logprobs.append(float(raw[i, k, token]))
                    if sampling.top_logprobs:
                        sample.top.append(_top(raw[i, k].numpy(), sampling.top_logprobs))
                    if token in self.eos_ids and not sampling.ignore_eos:
                        break
                    if job.stop and any(
                        s in self.tokenizer.decode(sample.token_ids, skip_special_tokens=True) for s in job.stop
                    ):
                        sample.finish_reason = "stop"
                        break
                ended = sample.token_ids and sample.token_ids[-1] in self.eos_ids and not sampling.ignore_eos
                sample.finish_reason = sample.finish_reason or ("stop" if ended else "length")
                if job.on_token is not None:
                    job.on_token(i, sample)
        except Exception as exc:  # a request must never hang on an engine error
            logger.exception("guided generation failed")
            job.error = f"generation failed: {exc}"
        job.done.set()


def _shared_prefix(prompts: list[list[int]]) -> int:
    """How many leading tokens every prompt has in common, leaving each at least one of its own (a row's
    decoding starts from its last prompt token); 0 for a single row, where there is nothing to share."""
    if len(prompts) < 2:
        return 0
    return max(0, min(len(os.path.commonprefix(prompts)), min(map(len, prompts)) - 1))


class StepLogits:
    """Each row's logits at a decoding step of a batch, for its top log-probs.

    CTranslate2 hands a step's logits to the callback of the first row still decoding, as one view of
    (rows still decoding, vocab), and an empty view to the other rows' callbacks of that step. So the first
    callback of a step keeps them, with the rows they belong to (in batch order), and each row reads its own.
    """

    def __init__(self) -> None:
        self.step: int | None = None
        self.values = None
        self.rows: list[int] = []

    def of(self, step, row: int, stopped: list[bool]):
        """Row `row`'s logits at `step` (a GenerationStepResult); `stopped`: which rows of the batch stopped
        decoding, as the step's first callback sees them."""
        shape = list(step.logits.shape)
        if shape:
            self.step, self.values = step.step, _as_array(step.logits).reshape(shape[0], -1)
            self.rows = [r for r, done in enumerate(stopped) if not done]
        if self.step != step.step or row not in self.rows or self.values.shape[0] != len(self.rows):
            raise RuntimeError(f"no logits for row {row} at step {step.step}")
        return self.values[self.rows.index(row)]


def _as_array(logits):
    """A CTranslate2 StorageView as float32 numpy: bfloat16 has no array interface (numpy would fail with
    "float() argument must be ..."), so other types are converted to float32 first."""
    import numpy as np

    to = getattr(logits, "to", None)
    if to is not None and str(getattr(logits, "dtype", "")) != "DataType.float32":
        import ctranslate2

        logits = to(ctranslate2.DataType.float32)
    return np.asarray(logits, dtype=np.float32)


def _top(logits, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens at a step and their log-probs, from one row's logits at that step (an array
    or a StorageView of one row)."""
    import numpy as np

    values = _as_array(logits).reshape(-1)
    shifted = values - values.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    best = np.argpartition(-logprobs, k)[:k] if k < logprobs.size else np.arange(logprobs.size)
    best = best[np.argsort(-logprobs[best])]
    return [(int(i), float(logprobs[i])) for i in best]
