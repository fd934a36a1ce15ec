"""Adapters a serving worker keeps ready on its inference server, least recently used first out.

The OpenAI-compatible endpoint names any checkpoint; the worker loads its adapter on first use and keeps
the last `capacity` of them:

- "lora" mode: that many runtime LoRA adapters stay registered with vLLM beside whatever a run's step
  loaded; switching between them costs nothing.
- "merged" mode (the CPU build): vLLM holds one set of weights at a time, so what is kept is each
  adapter's merged copy on disk; switching back to one reloads its weights (no merge again).

The cache lets go only of the names it loaded. On a server that a run's step uses as well ("lora" mode),
the serving worker names its adapters with SERVING_PREFIX, so that the step's names and
the cache's never meet: the step retires its old adapters, the cache its least recently used ones, and each
leaves the other's alone. No Django here: the worker's serving loop (training.serving.worker) owns one of
these per server.
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

# The names this cache loads adapters under on a server a run's step uses as well ("lora" mode): the step's
# retire_adapters (inference_server) leaves them alone, and the cache lets go of no other.
SERVING_PREFIX = "serving-"


@contextlib.contextmanager
def _merge_threads(n: int = 1):
    """torch's thread count while merging. The merge is elementwise work over every weight, and the
    server's engine keeps the same cores busy: on 2 cores under load one thread merged the default model
    in 1.1 s where two took 9 s (their OpenMP threads waiting on each other). The count is the calling
    thread's own (OpenMP keeps it per thread): a trainer updating on another thread of this process meanwhile
    keeps its threads."""
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
        self._merging = threading.Lock()  # held while a merged copy is written (ensure, prepare)
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
                    self.server.load_merged(name, path, str(self._merged_copy(name, path)))
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

    def prepare(self, name: str, path: str) -> None:
        """Merged mode: write `name`'s merged copy now, unless it is kept already, without holding the cache:
        requests answered with other policies meanwhile are not held up by the merge (seconds on a CPU that
        trains meanwhile); ensure() then only loads it. Nothing to do in "lora" mode."""
        path = str(path)
        if self.server.merged and self._lru.get(name) is None:
            self._merged_copy(name, path)

    def _merged_copy(self, name: str, path: str) -> Path:
        """The merged copy of adapter `path` for `name`, written unless it is there (one merge at a time); the
        adapter it was merged from is noted beside it, so a name that came to mean other weights is merged anew."""
        target = self._dir / _safe(name)
        with self._merging:
            source = target / ".adapter-path"
            if not (target / "config.json").exists() or not source.exists() or source.read_text() != path:
                partial = self._dir / f".{_safe(name)}.partial"
                shutil.rmtree(partial, ignore_errors=True)
                with _merge_threads():
                    merge_adapter(self.server.model_path, path, partial)
                (partial / ".adapter-path").write_text(path)
                shutil.rmtree(target, ignore_errors=True)
                partial.rename(target)
        return target

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
