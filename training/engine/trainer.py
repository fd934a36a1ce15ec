"""The GRPO trainer: scored trajectory groups in, one LoRA update and metrics out.

One update reads top to bottom in `train_step`:
  advantages per group → tokenize the trajectories of groups with signal (a sequence for each conversation
  of a trajectory: its own and its additional histories, all with its advantage) → micro-batches under a token
  budget, packed into one row each (a group's shared prompt once, no padding) → per micro-batch: policy
  log-probs of the sampled tokens, loss, backward (gradients accumulate) → clip the gradient norm →
  AdamW step → scheduler step.
Both backends hand over a PEFT model, so everything here is backend-independent except the layout:
Unsloth replaces the attention that reads packed rows, so its micro-batches are padded instead.
"""

from __future__ import annotations

import contextlib
import gc
import math
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

# One Cancelled for the whole step: should_stop() said stop, in the sandbox or during an update (where the
# optimizer was not stepped). The runtime is pure too, and training may import rollouts.
from rollouts.sandbox import Cancelled
from rollouts.sandbox.records import scored_groups
from training.engine import fit
from training.engine.advantages import compute_advantages
from training.engine.attention import use_packed_attention
from training.engine.backends import LOADERS, LoadedModel, resolve_dtype
from training.engine.batching import MicroBatch, collate, pack, plan_micro_batches, plan_packed
from training.engine.checkpoint import CheckpointState, capture_rng, read_checkpoint, restore_rng, write_checkpoint
from training.engine.config import ConfigError, TrainConfig
from training.engine.logprobs import token_logprobs
from training.engine.losses import aggregate, kl_k3, policy_loss
from training.engine.optim import new_optimizer
from training.engine.tokenize import TokenizedSequence, tokenize_trajectory, trajectory_histories

# The smallest micro-batch budget an out-of-memory retry goes down to (TrainConfig's own lower bound).
MIN_MICRO_BATCH_TOKENS = 16


class UpdateOutOfMemory(RuntimeError):
    """The update does not fit the device's memory even one sequence per micro-batch; says what would."""


@dataclass
class _Sums:
    """Running sums over the micro-batches of one update, turned into means at the end."""

    loss: float = 0.0
    policy_loss: float = 0.0
    kl: float = 0.0
    sampler_kl: float = 0.0
    entropy: float = 0.0
    clipped: int = 0
    tokens: int = 0
    largest: int = 0  # positions of the largest micro-batch
    extra: dict[str, float] = field(default_factory=dict)


class GRPOTrainer:
    def __init__(
        self,
        cfg: TrainConfig,
        base_model_path: str,
        device: str = "cpu",
        *,
        seed: int = 0,
        chat_template: str | None = None,
        packed: bool | None = None,
    ):
        """seed: the LoRA initialisation's and any dropout's (a resumed trainer restores its saved RNG
        states instead). chat_template: a Jinja chat template to render trajectories with instead of
        the tokenizer's own; it must be the one the inference server rendered them with. packed: pack
        micro-batches (default: with the peft backend, when the model's attention can be swapped) or
        pad them (the layout before packing; the tests and the benchmark compare the two)."""
        if cfg.backend not in LOADERS:
            raise ConfigError("backend", f"backend must be one of {sorted(LOADERS)}, got {cfg.backend!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ConfigError("seed", f"seed must be an integer in [0, 4294967295], got {seed!r}")
        self.cfg = cfg
        self.seed = seed
        self.chat_template = chat_template or None
        self.base_model_path = str(base_model_path)
        self.device = str(device)
        if packed and cfg.backend != "peft":
            raise ConfigError("backend", "packed micro-batches need the peft backend")
        self.packed = cfg.backend == "peft" if packed is None else bool(packed)
        self._base_dtype = resolve_dtype(cfg.dtype, self.device)  # what the loaders give the base weights
        self.step = 0
        # The micro-batch budget in use: the config's, halved for good each time an update runs out of device
        # memory (train_step), so later updates of the run start from what fitted.
        self.micro_batch_tokens = cfg.micro_batch_tokens or fit.CPU_DEFAULT_TOKENS
        # A GPU update's budget left to the worker is sized from memory at load and from each update's peak.
        self._sizing = cfg.micro_batch_tokens is None and self.device.startswith("cuda")
        self._loaded: LoadedModel | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self._param_names: list[str] = []

    # --- lifecycle -------------------------------------------------------------------------------------
    def load(self, checkpoint_dir: str | None = None, *, state: CheckpointState | None = None) -> None:
        """Base weights + a fresh LoRA (None), or exactly the state saved in checkpoint_dir (or kept in
        memory: `state`, a snapshot())."""
        self.close()
        if checkpoint_dir:
            state = read_checkpoint(checkpoint_dir)
        if state is not None:
            self._check_compatible(state.config)
        # Seed every RNG at a run's start so the LoRA init and any dropout are reproducible;
        # a resumed run restores the saved RNG states below instead.
        memory = fit.check_before_load(self.cfg, self.base_model_path, self.device)
        if memory is not None and self._sizing:
            self.micro_batch_tokens = memory.micro_batch_tokens
        _seed_everything(self.seed)
        self._loaded = LOADERS[self.cfg.backend](self.cfg, self.base_model_path, self.device, seed=self.seed)
        if self.chat_template:
            self._loaded.tokenizer.chat_template = self.chat_template
        if self.packed and not use_packed_attention(self._loaded.model):
            self.packed = False  # a model without pluggable attention trains on padded rows, as before
        self._new_optimizer()
        if state is not None:
            self._restore(state)

    def adopt(self, cfg: TrainConfig, seed: int, state: CheckpointState) -> None:
        """Train another run on the weights loaded: its config and seed, and its LoRA, optimizer, schedule, RNG
        and step from `state` (a checkpoint read, or a snapshot()), exactly as load() would restore them. The
        other run's config must load the same model (training.engine.parking.structure)."""
        self.cfg, self.seed = cfg, seed
        self.micro_batch_tokens = cfg.micro_batch_tokens or fit.CPU_DEFAULT_TOKENS
        self._sizing = cfg.micro_batch_tokens is None and self.device.startswith("cuda")
        self._check_compatible(state.config)
        self._new_optimizer()
        self._restore(state)

    def snapshot(self) -> CheckpointState:
        """What save_checkpoint writes, kept in memory (the optimizer is replaced before it steps again)."""
        from peft.utils import get_peft_model_state_dict

        adapter = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}
        return CheckpointState(
            adapter=adapter,
            optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(),
            rng=capture_rng(),
            param_names=list(self._param_names),
            config=self.cfg.to_dict(),
            step=self.step,
            micro_batch_tokens=self.micro_batch_tokens,
        )

    def _new_optimizer(self) -> None:
        self._param_names, self.optimizer, self.scheduler = new_optimizer(self.cfg, self.model)
        self.step = 0

    def _check_compatible(self, saved: dict[str, Any]) -> None:
        for key in ("lora_rank", "lora_alpha", "lora_target_modules"):
            mine = self.cfg.to_dict()[key]
            if saved.get(key) != mine:
                raise ConfigError(
                    key,
                    f"{key} is {mine!r} but the checkpoint was trained with "
                    f"{saved.get(key)!r}; resume with the checkpoint's LoRA settings",
                )

    def _restore(self, state: Any) -> None:
        from peft.utils import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, state.adapter)
        if getattr(result, "unexpected_keys", None):
            raise ConfigError(
                "lora_target_modules", f"checkpoint adapter has weights this model lacks: {result.unexpected_keys[:3]}"
            )
        if state.param_names != self._param_names:
            raise ConfigError("lora_target_modules", "checkpoint optimizer state belongs to other parameters")
        self.optimizer.load_state_dict(state.optimizer)
        self.scheduler.load_state_dict(state.scheduler)
        restore_rng(state.rng)
        self.step = state.step
        # The budget the run had reached (sized on the device): the same micro-batches, the same sums.
        self.micro_batch_tokens = (self._sizing and state.micro_batch_tokens) or self.micro_batch_tokens

    def close(self) -> None:
        """Drop the model and optimizer; frees their memory (and the GPU's cache)."""
        self._loaded = self.optimizer = self.scheduler = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    @property
    def model(self) -> Any:
        if self._loaded is None:
            raise RuntimeError("call trainer.load() first")
        return self._loaded.model

    @property
    def tokenizer(self) -> Any:
        if self._loaded is None:
            raise RuntimeError("call trainer.load() first")
        return self._loaded.tokenizer

    def save_checkpoint(self, directory: str) -> dict:
        return write_checkpoint(
            directory,
            peft_model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            param_names=self._param_names,
            config=self.cfg.to_dict(),
            step=self.step,
            micro_batch_tokens=self.micro_batch_tokens,
        )

    # --- one update ------------------------------------------------------------------------------------
    def train_step(self, groups: list[list[dict]], should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """groups: each scenario's rollouts; those that returned several trajectories are split into their
        groups first (scored_groups), and "advantages" in the result is per split group."""
        start = time.perf_counter()
        groups = [g for group in groups for g in scored_groups(group)]
        adv = compute_advantages(groups, scale_rewards=self.cfg.scale_rewards)
        seqs = self.tokenize_groups(groups, adv.values, adv.used)
        tokenize_seconds = time.perf_counter() - start
        truncated = sum(s.truncated for s in seqs)
        seqs = [s for s in seqs if s.n_trainable > 0]
        total_tokens = sum(s.n_trainable for s in seqs)
        keys = [s.source[0] for s in seqs]  # a group's trajectories share their prompt
        lr = self.optimizer.param_groups[0]["lr"]

        self.model.train()
        budget_before = self.micro_batch_tokens
        before = fit.peak_start(self.device) if self._sizing else 0
        sums, processed, batches, out_of_memory = self._accumulate_all(seqs, keys, total_tokens, should_stop)
        if self._sizing and not out_of_memory and sums.largest:
            vocab = self.model.get_output_embeddings().weight.shape[0]
            self.micro_batch_tokens = fit.budget_after_update(
                self.device, before=before, largest=sums.largest, vocab=vocab
            )
        grad_norm = self._clip_and_step(stepped := total_tokens > 0)

        elapsed = time.perf_counter() - start
        # Means over the trained tokens. A step that trained none (every group scored alike) has no entropy,
        # clip fraction or sampler KL to report: NaN, which the step's record leaves out, never a 0 that
        # reads as a collapsed policy.
        n = sums.tokens or float("nan")
        return {
            "step": self.step,
            "loss": sums.loss,
            "policy_loss": sums.policy_loss,
            "policy_clip_fraction": sums.clipped / n,
            "kl": sums.kl,
            "sampler_kl": sums.sampler_kl / n,
            "entropy": sums.entropy / n if self.cfg.compute_entropy else float("nan"),
            "grad_norm": grad_norm,
            "learning_rate": lr,
            "tokens_trained": total_tokens,
            # Positions the model ran over: each trained sequence, padding and shared prompts included.
            "tokens_processed": processed,
            "trajectories_trained": len({s.source for s in seqs}),  # a trajectory trains one sequence per history
            "groups_used": adv.groups_used,
            "groups_skipped": adv.groups_skipped,
            "sequences_truncated": truncated,
            "micro_batches": len(batches),
            "micro_batch_tokens": self.micro_batch_tokens,
            # Times this update ran out of device memory and started again with half the micro-batch budget.
            "out_of_memory_retries": out_of_memory,
            "micro_batch_tokens_before": budget_before,
            "optimizer_stepped": int(stepped),
            "train_seconds": elapsed,
            "tokenize_seconds": tokenize_seconds,
            "tokens_per_second": total_tokens / elapsed if elapsed > 0 else 0.0,
            "advantages": adv.values,
        }

    def _accumulate_all(
        self, seqs: list[TokenizedSequence], keys: list[int], total_tokens: int, should_stop
    ) -> tuple[_Sums, int, list[list[int]], int]:
        """Every micro-batch's forward and backward, gradients summed in .grad: (sums, positions processed,
        the micro-batches, out-of-memory retries).

        An out-of-memory error of the device drops the partial gradients, halves the micro-batch budget and
        starts the update over: the same sequences and the same sums in smaller pieces, so the result is the
        one a smaller budget gives from the start. When one sequence per micro-batch does not fit either,
        UpdateOutOfMemory says what would."""
        retries = 0
        while True:
            batches = self._plan(seqs, keys)
            self.optimizer.zero_grad(set_to_none=True)
            sums, processed = _Sums(), 0
            try:
                for rows in batches:
                    if should_stop is not None and should_stop():
                        raise Cancelled(f"update {self.step + 1} cancelled before its optimizer step")
                    mb = self._batch([seqs[i] for i in rows], [keys[i] for i in rows])
                    processed += mb.tokens_processed
                    sums.largest = max(sums.largest, mb.tokens_processed)
                    self._accumulate(mb, total_tokens, len(seqs), sums)
                return sums, processed, batches, retries
            except torch.OutOfMemoryError as exc:
                # Leave the handler before freeing: its traceback holds the failed micro-batch's tensors.
                error = str(exc).splitlines()[0] if str(exc) else "out of memory"
            except BaseException:
                self.optimizer.zero_grad(set_to_none=True)
                raise
            self.optimizer.zero_grad(set_to_none=True)
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            if max(map(len, batches)) <= 1 or self.micro_batch_tokens <= MIN_MICRO_BATCH_TOKENS:
                longest = max(len(s.input_ids) for s in seqs)
                raise UpdateOutOfMemory(
                    f"The update ran out of {self.device} memory even with one sequence per micro-batch (the "
                    f"longest is {longest} tokens; {error}). A smaller max_seq_len or max_tokens, a smaller "
                    "model or a 4-bit base, or more memory for training (a smaller inference KV cache, "
                    "ARTWEB_VLLM_KV_CACHE_GB) would fit."
                )
            retries += 1
            self.micro_batch_tokens = max(self.micro_batch_tokens // 2, MIN_MICRO_BATCH_TOKENS)

    def tokenize_groups(
        self, groups: list[list[dict]], advantages: list[list[float | None]], used: list[bool]
    ) -> list[TokenizedSequence]:
        """Sequences of every scored trajectory of the groups with signal, advantage attached: one for the
        trajectory and one for each of its additional histories, each with the trajectory's advantage."""
        seqs: list[TokenizedSequence] = []
        cache: dict[str, list[int]] = {}
        for g, (group, group_adv, ok) in enumerate(zip(groups, advantages, used, strict=True)):
            if not ok:
                continue
            for t, (traj, a) in enumerate(zip(group, group_adv, strict=True)):
                if a is None:
                    continue
                for history in trajectory_histories(traj):
                    seq = tokenize_trajectory(self.tokenizer, history, self.cfg.max_seq_len, cache)
                    seq.advantage, seq.source = a, (g, t)
                    seqs.append(seq)
        return seqs

    # --- a step whose groups a client posted (training.services.steps.sources) ----------------------------
    def apply_step_settings(self, settings: dict[str, Any]) -> None:
        """Train the next updates with these TrainConfig keys (a client's job sends its loss, clip bounds,
        reward scaling and learning rate); the learning rate goes to the optimizer and its schedule."""
        if not settings:
            return
        self.cfg = replace(self.cfg, **settings)
        if (lr := settings.get("learning_rate")) is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = group["initial_lr"] = lr
            if self.scheduler is not None:
                self.scheduler.base_lrs = [lr] * len(self.optimizer.param_groups)

    @torch.no_grad()
    def logprobs(self, trajectories: list[dict]) -> list[list[float]]:
        """The current policy's log-prob of each sampled token of each trajectory (for evaluation,
        on-policy checks and tests); dropout off, nothing trained."""
        seqs = [tokenize_trajectory(self.tokenizer, t, self.cfg.max_seq_len) for t in trajectories]
        result: list[list[float]] = [[] for _ in seqs]
        was_training = self.model.training
        self.model.eval()
        try:
            live = [i for i, s in enumerate(seqs) if s.n_trainable > 0]
            # One key for all: whatever prompt the trajectories share is computed once.
            keys = [0] * len(live)
            for rows in self._plan([seqs[i] for i in live], keys):
                mb = self._batch([seqs[live[r]] for r in rows], [keys[r] for r in rows])
                with self._precision(mb):
                    lp, _ = self._token_logprobs(mb, with_entropy=False)
                for seq_row, value in zip(mb.seq_ids.tolist(), lp.tolist(), strict=True):
                    result[live[rows[seq_row]]].append(value)
        finally:
            self.model.train(was_training)
        return result

    def _plan(self, seqs: list[TokenizedSequence], keys: list[int]) -> list[list[int]]:
        """Micro-batches of sequence indices under the micro-batch budget (real tokens when packed)."""
        if self.packed:
            return plan_packed(seqs, keys, self.micro_batch_tokens)
        return plan_micro_batches([len(s.input_ids) for s in seqs], self.micro_batch_tokens)

    def _batch(self, seqs: list[TokenizedSequence], keys: list[int]) -> MicroBatch:
        """Sequences with equal keys share their common prompt (packed layout only)."""
        if self.packed:
            return pack(seqs, keys, self.device)
        return collate(seqs, self._pad_id(), self.device)

    def _accumulate(self, mb: MicroBatch, total_tokens: int, total_seqs: int, sums: _Sums) -> None:
        """Forward + backward of one micro-batch; its gradient share adds to .grad."""
        cfg = self.cfg
        with self._precision(mb):
            new_lp, entropy = self._token_logprobs(mb, with_entropy=cfg.compute_entropy)
        eps_low, eps_high = cfg.clip_range()
        pl = policy_loss(cfg.loss, new_lp, mb.old_logprobs, mb.advantages, mb.seq_ids, eps_low, eps_high)
        agg = lambda per_token: aggregate(  # noqa: E731
            per_token, mb.seq_ids, mb.seq_token_counts, cfg.loss_aggregation, total_tokens, total_seqs
        )
        policy_part = agg(pl.per_token)
        loss = policy_part
        if cfg.kl_beta > 0:
            with torch.no_grad(), self.model.disable_adapter(), self._precision(mb):
                ref_lp, _ = self._token_logprobs(mb, with_entropy=False)
            kl_part = agg(kl_k3(new_lp, ref_lp))
            loss = loss + cfg.kl_beta * kl_part
            sums.kl += float(kl_part.detach())
        loss.backward()
        sums.loss += float(loss.detach())
        sums.policy_loss += float(policy_part.detach())
        sums.sampler_kl += float(kl_k3(new_lp.detach(), mb.old_logprobs).sum())
        sums.clipped += int(pl.clipped.sum())
        sums.tokens += mb.n_tokens
        if entropy is not None:
            sums.entropy += float(entropy.sum())

    def _token_logprobs(self, mb: MicroBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log π(target) [N] for the trained tokens, and their entropy [N] (no grad) if asked.

        The output projection runs on the N trained positions only, not on all B×T, which for
        agent rollouts (long prompts, short answers) saves most of the vocabulary-sized work.
        """
        causal_lm = self.model.get_base_model()
        extra: dict[str, Any] = {}
        if mb.layout is not None:
            extra = {"position_ids": mb.position_ids, "packed_layout": mb.layout}
        out = causal_lm.get_decoder()(
            input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False, **extra
        )
        hidden = out.last_hidden_state.flatten(0, 1)[mb.hidden_index]  # [N, H]
        logprobs, entropy = token_logprobs(hidden, causal_lm.get_output_embeddings(), mb.targets, with_entropy)
        return logprobs, entropy

    def _precision(self, mb: MicroBatch) -> contextlib.AbstractContextManager:
        """Mixed precision for the forward pass of a half-precision base under the peft backend.

        The adapter stays fp32 (Adam's small steps would round away in bf16) while its matmuls run in
        the base's dtype under autocast; PEFT's own cast of every input up to the adapter's dtype is
        turned off, since it would convert each layer's activations twice. On the CPU, short
        micro-batches use the plain (math) attention kernel: the fused CPU kernel's bf16 backward was
        measured 5x slower than fp32 at ~100 tokens. Unsloth manages precision itself.
        """
        dtype = self._base_dtype
        if self.cfg.backend != "peft" or dtype == torch.float32:
            return contextlib.nullcontext()
        from peft.helpers import disable_input_dtype_casting

        stack = contextlib.ExitStack()
        device_type = "cuda" if self.device.startswith("cuda") else "cpu"
        stack.enter_context(torch.autocast(device_type=device_type, dtype=dtype))
        stack.enter_context(disable_input_dtype_casting(self.model))
        if device_type == "cpu" and mb.attention_width <= 2048:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        return stack

    def _clip_and_step(self, stepped: bool) -> float:
        """Clip the global grad norm, step AdamW (only when something was trained) and the scheduler.

        The scheduler and the step counter advance either way, so both stay aligned with the run's steps.
        """
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grad_norm = 0.0
        if stepped:
            max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            self.optimizer.step()
        with warnings.catch_warnings():
            # Expected when the first update had nothing to train: the schedule still follows the steps.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return grad_norm

    def _pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_trainer(
    cfg: TrainConfig,
    base_model_path: str,
    device: str = "cpu",
    *,
    seed: int = 0,
    chat_template: str | None = None,
    packed: bool | None = None,
) -> GRPOTrainer:
    """A trainer for cfg.backend; call .load() before training."""
    return GRPOTrainer(
        cfg, base_model_path=base_model_path, device=device, seed=seed, chat_template=chat_template, packed=packed
    )
