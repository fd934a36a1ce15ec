"""Reads what wandb wrote offline: the run's .wandb transaction log (a LevelDB-style record log of
protobuf Records, the format `wandb sync` uploads) and the media files beside it."""

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32 * 1024
HEADER = 7  # ":W&B", magic 0xBEE1, version


def records(path: Path):
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, pending = HEADER, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # the rest of a block too small for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            rec = pb.Record()
            rec.ParseFromString(pending)
            pending = b""
            yield rec


def _nested(items) -> dict:
    """Items keyed by key or by a nested_key path, as one nested dict (a table's fields under its name)."""
    out: dict = {}
    for item in items:
        path = [item.key] if item.key else list(item.nested_key)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = json.loads(item.value_json)
    return out


def read_run(root: Path, run_id: str) -> dict:
    """Everything the offline runs with id run_id recorded under root/wandb: config, history, summary."""
    out = {"config": {}, "history": {}, "summary": {}, "run": None, "tables": []}
    dirs = sorted((Path(root) / "wandb").glob(f"offline-run-*-{run_id}*"))
    for d in dirs:
        for rec in records(d / f"run-{run_id}.wandb"):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                out["run"] = rec.run
                out["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
            elif kind == "config":
                out["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
            elif kind == "history":
                row = _nested(rec.history.item)
                out["history"].setdefault(row.get("_step"), {}).update(row)
            elif kind == "summary":
                out["summary"].update(_nested(rec.summary.update))
        table_dir = d / "files" / "media" / "table"
        out["tables"] += [
            json.loads(p.read_text()) | {"_file": str(p.relative_to(table_dir))}
            for p in sorted(table_dir.rglob("*.table.json"))
        ]
    out["dirs"] = dirs
    return out
