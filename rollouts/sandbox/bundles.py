"""Rollout bundles: a rollout script uploaded as a zip with its helper modules, data files and pure-Python
wheels, read into a checked, normalised form and stored by content hash.

Nothing here trusts the archive: names are checked one by one (relative, no `..`, no links or special
files, no two entries with one name), every entry is read with a byte cap instead of believing the sizes
its header declares, and the whole bundle is bounded in files and bytes. The sandbox reads a stored bundle
again with the same checks before it writes a single file into a box (defence in depth: the box is bound
into the jail). No Django here: the sandbox imports this module; limits come from the caller.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import tempfile
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROLLOUT = "rollout.py"
# The box's own files beside the script (rollouts.sandbox.batch.BatchFiles): a bundle may not bring them.
RESERVED = frozenset({"reward.py", "batch.json"})
# Dropped without a word: byte code (the sandbox compiles its own) and what archivers add on their own.
JUNK_PARTS = frozenset({"__pycache__", "__MACOSX", ".DS_Store"})
PURE_WHEEL_TAGS = frozenset({("py3", "none", "any"), ("py2.py3", "none", "any")})
WHEEL_NAME = re.compile(
    r"^(?P<dist>[^-]+)-(?P<ver>[^-]+)(-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)
# A stored zip is written with this date on every entry, so equal bundles make equal bytes.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


class BundleError(ValueError):
    """A bundle refused: the message names the entry and what to change."""


@dataclass(frozen=True)
class BundleLimits:
    max_files: int = 500
    max_bytes: int = 50 << 20  # every file's uncompressed size together; also the largest upload
    max_ratio: int = 200  # uncompressed / compressed size of one entry, past ratio_floor_bytes
    ratio_floor_bytes: int = 1 << 20  # smaller entries may compress as well as they like
    max_depth: int = 16  # folders above a file
    max_name_chars: int = 255  # one path component


@dataclass(frozen=True)
class Bundle:
    files: dict[str, bytes]  # normalised relative POSIX path → content, sorted by path

    @property
    def sha256(self) -> str:
        """The hash of the sorted (path, content hash) list: equal files give an equal hash, whatever the
        archive's order, dates or compression."""
        h = hashlib.sha256()
        for path, data in self.files.items():
            h.update(f"{path}\0{hashlib.sha256(data).hexdigest()}\n".encode())
        return h.hexdigest()

    @property
    def rollout_bytes(self) -> bytes:
        return self.files[ROLLOUT]

    @property
    def wheels(self) -> list[str]:
        return [p for p in self.files if p.endswith(".whl")]

    def to_zip(self) -> bytes:
        """The canonical archive: sorted entries, one date, regular files with mode 0644."""
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for path, data in self.files.items():
                info = zipfile.ZipInfo(path, date_time=ZIP_EPOCH)
                info.external_attr = (stat.S_IFREG | 0o644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
        return out.getvalue()


def _refuse(name: str, problem: str) -> BundleError:
    return BundleError(f"Bundle entry {name!r}: {problem}")


def _clean_name(raw: str, limits: BundleLimits) -> str:
    """The entry's normalised relative path, or BundleError saying what is wrong with it."""
    if "\\" in raw:
        raise _refuse(raw, "has a backslash; zip paths use '/'. Make the archive with a zip tool, not by hand.")
    if raw.startswith("/") or re.match(r"^[A-Za-z]:", raw):
        raise _refuse(raw, "is an absolute path; give paths relative to the bundle's root.")
    if any(ord(c) < 32 or c == "\x7f" for c in raw):
        raise _refuse(raw, "has a control character in its name; rename it.")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(raw, "climbs out of the bundle with '..'; keep every file inside the bundle's folder.")
    if not parts:
        raise _refuse(raw, "has an empty name.")
    if len(parts) > limits.max_depth + 1:
        raise _refuse(raw, f"is nested more than {limits.max_depth} folders deep; flatten the layout.")
    if any(len(p) > limits.max_name_chars for p in parts):
        raise _refuse(raw, f"has a name part longer than {limits.max_name_chars} characters; shorten it.")
    return unicodedata.normalize("NFC", "/".join(parts))


def _check_kind(info: zipfile.ZipInfo) -> None:
    """Only regular files (and folders, skipped by the caller): no links, devices, pipes or encryption."""
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise _refuse(info.filename, "is a symbolic link; put the file itself in the bundle instead of a link.")
    if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise _refuse(info.filename, "is not a regular file (a device, pipe or socket); remove it.")
    if info.flag_bits & 0x1:
        raise _refuse(info.filename, "is encrypted; zip the bundle without a password.")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise _refuse(info.filename, "uses a compression method other than store or deflate; zip it again.")


def _read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, budget: int, limits: BundleLimits) -> bytes:
    """The entry's bytes, never more than `budget` (what is left of the bundle's size limit) and never more
    than its header declares: the header is what a zip bomb lies in."""
    name = info.filename
    if info.file_size > budget:
        raise _refuse(name, f"would take the bundle past its {limits.max_bytes} byte limit; leave large files out.")
    if info.file_size > limits.ratio_floor_bytes and info.file_size > limits.max_ratio * max(info.compress_size, 1):
        raise _refuse(name, f"expands more than {limits.max_ratio} times; this looks like a zip bomb. Remove it.")
    try:
        with zf.open(info) as f:
            data = f.read(budget + 1)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError) as exc:
        raise _refuse(
            name, f"cannot be read ({exc}): the archive is damaged or lies about its sizes. Zip it again."
        ) from exc
    if len(data) > budget:
        raise _refuse(name, f"would take the bundle past its {limits.max_bytes} byte limit; leave large files out.")
    if len(data) != info.file_size:
        raise _refuse(name, f"holds {len(data)} bytes but its header says {info.file_size}; make the zip again.")
    return data


def _check_wheel(path: str, data: bytes) -> None:
    match = WHEEL_NAME.match(PurePosixPath(path).name)
    if not match:
        raise _refuse(path, "is not named like a wheel (name-version-py3-none-any.whl); keep pip's file name.")
    tag = (match["py"], match["abi"], match["plat"])
    if tag not in PURE_WHEEL_TAGS:
        raise _refuse(
            path,
            f"is built for {'-'.join(tag)}; only pure-Python wheels (py3-none-any) run in the sandbox. "
            "Use the package's pure-Python wheel or leave it out.",
        )
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise _refuse(path, "is not a zip archive, so it is no wheel; download it again.")


def _entries(zf: zipfile.ZipFile, limits: BundleLimits) -> dict[str, bytes]:
    """Every regular file's normalised path and bytes; junk dropped, refusals raised."""
    infos = zf.infolist()
    if len(infos) > 4 * limits.max_files:  # checked again on files kept; this bounds the work on names
        raise BundleError(f"The bundle has {len(infos)} entries; the limit is {limits.max_files} files.")
    files: dict[str, bytes] = {}
    left = limits.max_bytes
    for info in infos:
        _check_kind(info)
        path = _clean_name(info.filename, limits)
        parts = path.split("/")
        if info.is_dir() or any(p in JUNK_PARTS for p in parts) or path.endswith((".pyc", ".pyo")):
            continue
        if path in files:
            raise _refuse(info.filename, "appears twice in the archive; keep one copy.")
        if len(files) >= limits.max_files:
            raise BundleError(f"The bundle has more than {limits.max_files} files; leave some out.")
        data = _read_entry(zf, info, left, limits)
        left -= len(data)
        files[path] = data
    return files


def _strip_top(files: dict[str, bytes]) -> dict[str, bytes]:
    """A zip of a folder holds one top folder: the bundle is what is inside it."""
    if ROLLOUT in files or not files:
        return files
    tops = {p.split("/", 1)[0] for p in files}
    if len(tops) == 1 and all("/" in p for p in files):
        return {p.split("/", 1)[1]: d for p, d in files.items()}
    return files


def _check_layout(files: dict[str, bytes]) -> None:
    if ROLLOUT not in files:
        raise BundleError(
            f"The bundle has no {ROLLOUT} at its root; put your rollout script there (inside one top folder is fine)."
        )
    for name in RESERVED & files.keys():
        raise _refuse(name, "is a name the sandbox uses itself; rename it (upload a reward function separately).")
    folders = {str(parent) for p in files for parent in PurePosixPath(p).parents if str(parent) != "."}
    for path in files:
        if path in folders:
            raise _refuse(path, "is both a file and a folder; rename one of them.")
    for path, data in files.items():
        if path.endswith(".whl"):
            _check_wheel(path, data)


def bundle_read(data: bytes, limits: BundleLimits | None = None) -> Bundle:
    """The checked bundle in a zip upload, or BundleError with what to fix."""
    limits = limits or BundleLimits()
    if len(data) > limits.max_bytes:
        raise BundleError(f"The bundle is {len(data)} bytes; the limit is {limits.max_bytes}.")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as exc:
        raise BundleError(f"The bundle is not a readable zip archive ({exc}); zip the folder again.") from exc
    with zf:
        files = _strip_top(_entries(zf, limits))
    _check_layout(files)
    return Bundle(files=dict(sorted(files.items())))


def bundle_store(bundle: Bundle, root: Path) -> Path:
    """Write the canonical zip to root/<sha256>.zip (once: the name is its content), atomically, readable
    by this user only; returns its path."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = root / f"{bundle.sha256}.zip"
    if target.is_file():
        return target
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".incoming-", suffix=".zip")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(bundle.to_zip())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def bundle_unpack(
    path: Path, dest: Path, limits: BundleLimits | None = None, *, skip: frozenset = frozenset()
) -> Bundle:
    """Check the stored bundle again and write its files (less `skip`) under dest, a folder of this
    process's own: folders 0700, files 0600, each created anew and never through a link."""
    bundle = bundle_read(path.read_bytes(), limits)
    bundle_write(bundle, dest, skip=skip)
    return bundle


def bundle_write(bundle: Bundle, dest: Path, *, skip: frozenset = frozenset()) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for rel, data in bundle.files.items():
        if rel in skip:
            continue
        target = dest.joinpath(*rel.split("/"))
        for parent in reversed(target.relative_to(dest).parents[:-1]):
            folder = dest / parent
            if not folder.is_dir() or folder.is_symlink():
                folder.mkdir(mode=0o700)  # fails on anything already there but a real folder
        fd = os.open(target, flags, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
