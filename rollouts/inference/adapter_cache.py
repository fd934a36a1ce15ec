"""Adapters a serving worker keeps ready on its inference server, least recently used first out.

The OpenAI-compatible endpoint names any checkpoint; the worker loads its adapter on first use and keeps
the last `capacity` of them:

- "lora" mode: that many runtime LoRA adapters stay registered with vLLM beside whatever a run's step
  loaded; switching between them costs nothing.
- "merged" mode (the CPU build): vLLM holds one set of weights at a time, so what is kept is each
  adapter's merged copy on disk; switching back to one reloads its weights (no merge again).

A run's own step loads its policy as before (VLLMServer.ensure_adapter), after which the next request
for a kept checkpoint reloads that checkpoint's weights. No Django here: the worker's serving loop
(training.serving.worker) owns one of these per server.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Collection
from pathlib import Path

from rollouts.inference.merge import merge_adapter


@contextlib.contextmanager
def _merge_threads(n: int = 1):
    """torch's thread count while merging. The merge is elementwise work over every weight, and the
    server's engine keeps the same cores busy: on 2 cores under load one thread merged the default model
    in 1.1 s where two took 9 s (their OpenMP threads waiting on each other). Serving happens between
    training steps, so no trainer in this process is using torch meanwhile."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class AdapterCache:
    def __init__(self, server, *, capacity: int = 4) -> None:
        self.server = server
        self.capacity = max(1, capacity)
        self._lru: OrderedDict[str, str] = OrderedDict()  # served name -> adapter directory
        self._lock = threading.Lock()
        self.last_load_s: float | None = None  # how long the latest load took (0 when it was loaded)

    @property
    def _dir(self) -> Path:
        return Path(self.server.work_dir) / "serve-cache"

    def names(self) -> list[str]:
        return list(self._lru)

    def ensure(self, name: str, path: str, *, keep: Collection[str] = ()) -> str:
        """Make `name` (adapter directory `path`) the one requests reach; return the name to request.

        keep: names that requests being answered now use; none of them is let go of here, even when that
        leaves the cache over capacity for a while (a later ensure brings it back)."""
        path = str(path)
        with self._lock:
            t0 = time.perf_counter()
            if self._lru.get(name) not in (None, path):
                self._forget(name)  # the same name now means other weights
            if self.server.merged:
                if self.server.adapters.get(name) != path:
                    target = self._dir / _safe(name)
                    if not (target / "config.json").exists():
                        partial = self._dir / f".{_safe(name)}.partial"
                        shutil.rmtree(partial, ignore_errors=True)
                        with _merge_threads():
                            merge_adapter(self.server.model_path, path, partial)
                        shutil.rmtree(target, ignore_errors=True)
                        partial.rename(target)
                    self.server.load_merged(name, path, str(target))
            else:
                self.server.ensure_adapter(name, path)
            self._lru[name] = path
            self._lru.move_to_end(name)
            while len(self._lru) > self.capacity:
                out = next((n for n in self._lru if n != name and n not in keep), None)
                if out is None:
                    break
                self._forget(out)
            self.last_load_s = time.perf_counter() - t0
            return name

    def _forget(self, name: str) -> None:
        self._lru.pop(name, None)
        if self.server.merged:
            shutil.rmtree(self._dir / _safe(name), ignore_errors=True)
        elif name in self.server.adapters:
            self.server.unload_adapter(name)

    def clear(self) -> None:
        with self._lock:
            self._lru.clear()
            shutil.rmtree(self._dir, ignore_errors=True)
