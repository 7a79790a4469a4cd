"""Trees of arrays in HDF5 files that survive a kill mid-write and can be opened from anywhere.

A role's state is a tree: nested dicts become groups, numpy arrays become datasets, and every
other leaf (ints of any size, floats, strings, bools, None, lists) goes into one JSON attribute
of its group, because JSON keeps a 128-bit RNG state exact where an HDF5 integer cannot.

Files are written to a temporary name in the target folder, fsynced and renamed over the
target, so a reader sees the old file or the new one, never half of one. The default `libver`
keeps them readable by Debian's h5dump 1.10. Every dataset of more than one element carries a
fletcher32 checksum, so a flipped bit surfaces as an error instead of a silently wrong weight;
small ones are also gzipped (with shuffle), which every HDF5 build reads. Large ones (replay
columns of many GiB) are not: gzip writes about 40 MB/s, so a checkpoint of a big table would
take minutes; uncompressed chunks go at the disk's speed.

A leaf may also be `Pieces`: one array given as consecutive parts (a ring buffer's two halves),
written part by part into one dataset, so that a table of many GiB is written from the memory
it lives in rather than from a copy.

Reading trusts nothing: no pickles, no links followed, no data kept in other files. Every
problem a user can cause (wrong path, damaged file, file from elsewhere) becomes one
`StorageError` that names the file, the cause and the fix.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import h5py
import numpy as np

from ..errors import UserError

SCHEMA_VERSION = 1
"""Format version stamped on every group; a reader refuses files with a larger one."""

Tree: TypeAlias = dict[
    str, "Tree | np.ndarray | np.generic | int | float | str | bool | None | list[Any]"
]

ATTR_VERSION = "hpcmarl_schema_version"
ATTR_TYPE = "hpcmarl_type"
ATTR_JSON = "json_attrs"
_RESERVED = (ATTR_VERSION, ATTR_TYPE, ATTR_JSON)
NUMERIC_KINDS = "biufc"  # bool, signed, unsigned, float, complex: what h5dump shows as numbers
_FILTERS: dict[str, Any] = {
    "chunks": True,
    "compression": "gzip",
    "compression_opts": 4,
    "shuffle": True,
    "fletcher32": True,
}
COMPRESS_BELOW = 8 << 20
"""Datasets smaller than this many bytes are gzipped; larger ones are written as they are."""
CHUNK_BYTES = 1 << 20
"""Target chunk size of a large dataset: each chunk gets its own fletcher32 checksum."""
PART_BYTES = 64 << 20
"""A part larger than this is written in slices, so that no single write holds h5py's lock
(and the thread holding it) for long."""
DAMAGED_FIX = "the file is damaged: resume from an older checkpoint or use another copy of it"
FOREIGN_FIX = "give the path of an unedited file that hpcmarl wrote"


class StorageError(UserError):
    """A file hpcmarl cannot read back: missing, damaged, foreign or from a newer hpcmarl."""


@dataclass(frozen=True)
class Pieces:
    """An array stored as the concatenation of `parts` along the first axis.

    The parts are read, never copied, while the file is written: whoever builds a `Pieces` keeps
    them unchanged until the write is done."""

    parts: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("Pieces needs at least one part")
        first = self.parts[0]
        if any(p.dtype != first.dtype or p.shape[1:] != first.shape[1:] for p in self.parts):
            raise ValueError("the parts of Pieces must share their dtype and trailing shape")

    @property
    def dtype(self) -> np.dtype:
        return self.parts[0].dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (sum(len(p) for p in self.parts), *self.parts[0].shape[1:])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


@dataclass
class FileRecord:
    """What a reader needs to tell the file it gets from the file that was written."""

    name: str
    size: int
    sha256: str


# -- atomic replacement ------------------------------------------------------------------------
def fsync_dir(folder: str | Path) -> None:
    """Make a rename in `folder` durable; filesystems that cannot fsync a folder are skipped."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary path beside `path`; once the body wrote it, it replaces `path`.

    The temporary file is fsynced before the rename and the folder after it, so after a crash
    `path` holds either its old bytes or all of the new ones. On an error the temporary file
    is removed and `path` is untouched.
    """
    final = Path(path)
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Small files (manifests, pointers) get the same all-or-nothing guarantee as trees."""
    with atomic_path(path) as tmp, open(tmp, "xb") as fh:
        fh.write(data)


def link_atomic(path: str | Path, target: str) -> None:
    """Point the symbolic link `path` at `target` (relative to its folder) in one rename, so
    that a reader sees the old target or the new one, never no link; the folder is fsynced."""
    final = Path(path)
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}.tmp")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


def sha256_of(path: str | Path) -> str:
    """Hex digest, read in 1 MiB blocks so that a replay file of many GiB needs no memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


# -- writing -----------------------------------------------------------------------------------
def write_tree_atomic(
    path: str | Path, tree: Tree, kind: str, attrs: dict[str, Any] | None = None
) -> FileRecord:
    """Write `tree` to `path` all at once; `kind` tags the root so a reader can check it got
    the file it expects, and `attrs` (str, bool, int64 or float values) become plain root
    attributes that h5dump shows as they are."""
    final = Path(path)
    with atomic_path(final) as tmp:
        f = h5py.File(tmp, "w-", rdcc_nbytes=0)  # chunks written now: see _close_after_failure
        try:
            _stamp(f, kind)
            for name, value in (attrs or {}).items():
                f.attrs[name] = _checked_attr(name, value)
            _write_group(f, tree, "/")
            f.close()
        except BaseException:
            _close_after_failure(tmp, f)
            raise
    return FileRecord(final.name, final.stat().st_size, sha256_of(final))


def _close_after_failure(tmp: Path, f: h5py.File) -> None:
    """Free the blocks of a write that failed (a full disk, most often), then close the file.

    Closing flushes what HDF5 still holds; into a disk that is still full, that fails again,
    and h5py's finalizers print a traceback for every object left open. Emptied first, the
    file has room for those last writes; it is removed anyway."""
    try:
        os.truncate(tmp, 0)
    except OSError:
        pass
    try:
        f.close()
    except Exception:  # noqa: BLE001 - the first error is the one that counts
        pass


def _stamp(group: h5py.Group, hpcmarl_type: str) -> None:
    group.attrs[ATTR_VERSION] = SCHEMA_VERSION
    group.attrs[ATTR_TYPE] = hpcmarl_type


def _checked_attr(name: str, value: Any) -> Any:
    if name in _RESERVED:
        raise ValueError(f"attribute name {name!r} is reserved for hpcmarl's own use")
    if isinstance(value, (str, bool, float)):
        return value
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return np.int64(value)
    raise TypeError(f"root attribute {name!r} must be a str, bool, float or int64, not {value!r}")


def _write_group(group: h5py.Group, tree: Tree, where: str) -> None:
    leaves: dict[str, Any] = {}
    for key, value in tree.items():
        _check_key(key, where)
        if isinstance(value, dict):
            sub = group.create_group(key)
            _stamp(sub, "tree")
            _write_group(sub, value, f"{where}{key}/")
        elif isinstance(value, (np.ndarray, np.generic)):
            _write_array(group, key, value, where)
        elif isinstance(value, Pieces):
            _write_pieces(group, key, value, where)
        else:
            _check_json(value, f"{where}{key}")
            leaves[key] = value
    group.attrs[ATTR_JSON] = json.dumps(leaves, default=_numpy_scalar_in_list)


def _check_key(key: Any, where: str) -> None:
    if not isinstance(key, str) or not key or "/" in key or key == ".":
        raise ValueError(f"{where}: key {key!r} cannot name an HDF5 member; nest dicts instead")


def _check_json(value: Any, where: str) -> None:
    """Only values JSON brings back unchanged; lists may also hold numpy scalars (as numbers)."""
    if value is None or isinstance(value, (bool, int, float, str, np.generic)):
        if isinstance(value, np.generic) and value.dtype.kind not in NUMERIC_KINDS[:-1]:
            raise TypeError(f"{where}: a {value.dtype} scalar cannot be stored in JSON")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
        return
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        for k, item in value.items():
            _check_json(item, f"{where}.{k}")
        return
    raise TypeError(f"{where}: cannot store a {type(value).__name__} in an hpcmarl tree")


def _numpy_scalar_in_list(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store a {type(value).__name__} as JSON")


def _write_array(group: h5py.Group, key: str, value: np.ndarray | np.generic, where: str) -> None:
    if value.dtype.kind not in NUMERIC_KINDS:
        raise TypeError(f"{where}{key}: dtype {value.dtype} is not numeric; store numbers only")
    arr = np.asarray(value)
    if arr.ndim and arr.nbytes >= COMPRESS_BELOW:
        _write_pieces(group, key, Pieces((arr,)), where)
        return
    filters = _FILTERS if arr.ndim and arr.size else {}
    ds = group.create_dataset(key, data=arr, **filters)
    ds.attrs[ATTR_TYPE] = "scalar" if isinstance(value, np.generic) else "ndarray"


def _write_pieces(group: h5py.Group, key: str, value: Pieces, where: str) -> None:
    """One dataset filled part by part, in slices of at most PART_BYTES; small ones go through
    `_write_array`, compressed like any small array."""
    if value.dtype.kind not in NUMERIC_KINDS:
        raise TypeError(f"{where}{key}: dtype {value.dtype} is not numeric; store numbers only")
    shape = value.shape
    if not shape[0] or value.nbytes < COMPRESS_BELOW:
        _write_array(group, key, np.concatenate(value.parts), where)
        return
    row_bytes = max(1, value.nbytes // shape[0])
    chunk_rows = max(1, min(shape[0], CHUNK_BYTES // row_bytes))
    ds = group.create_dataset(
        key, shape=shape, dtype=value.dtype, chunks=(chunk_rows, *shape[1:]), fletcher32=True
    )
    ds.attrs[ATTR_TYPE] = "ndarray"
    slice_rows = max(chunk_rows, PART_BYTES // row_bytes // chunk_rows * chunk_rows)
    at = 0
    for part in value.parts:
        for start in range(0, len(part), slice_rows):
            piece = part[start : start + slice_rows]
            ds[at : at + len(piece)] = piece
            at += len(piece)


# -- reading -----------------------------------------------------------------------------------
def read_tree(path: str | Path, kind: str | None = None) -> Tree:
    """The tree `write_tree_atomic` wrote, exactly; `kind`, if given, must match the file's."""
    return read_tree_with_attrs(path, kind)[0]


def read_tree_with_attrs(path: str | Path, kind: str | None = None) -> tuple[Tree, dict[str, Any]]:
    """The tree and the root attributes given to `write_tree_atomic` as `attrs`."""
    file = Path(path)
    sniff(file)
    try:
        with h5py.File(file, "r") as f:
            check_group(f, file, kind)
            attrs = {k: plain(v) for k, v in f.attrs.items() if k not in _RESERVED}
            return _read_group(f, file, set()), attrs
    except (OSError, RuntimeError, ValueError, TypeError, KeyError) as err:
        raise damaged(file, err) from err


def sniff(file: Path) -> None:
    """Recognise files that are not HDF5 by their first bytes, before any library parses them."""
    try:
        with open(file, "rb") as fh:
            head = fh.read(8)
    except FileNotFoundError:
        raise StorageError(f"{file} does not exist", "check the path") from None
    except OSError as err:
        raise StorageError(f"{file} cannot be opened ({err.strerror})", "check the path") from None
    if not head:
        raise StorageError(f"{file} is empty (truncated: its write never finished)", DAMAGED_FIX)
    if head.startswith((b"PK\x03\x04", b"\x80")):
        raise StorageError(
            f"{file} is a zip or pickle archive, not HDF5",
            f"this is a torch/pickle file; hpcmarl reads only its own HDF5 files: {FOREIGN_FIX}",
        )


def damaged(file: Path, err: Exception) -> StorageError:
    text = str(err)
    if "truncated" in text:
        cause = "is truncated (its write never finished)"
    elif "signature not found" in text:
        return StorageError(f"{file} is not an HDF5 file", FOREIGN_FIX)
    elif "filter" in text or "checksum" in text.lower():
        cause = "is corrupt: a dataset fails its fletcher32 checksum or cannot be decompressed"
    else:
        cause = f"is corrupt or unreadable ({text})"
    return StorageError(f"{file} {cause}", DAMAGED_FIX)


def check_group(group: h5py.Group, file: Path, expected: str | None) -> None:
    version, found = group.attrs.get(ATTR_VERSION), plain(group.attrs.get(ATTR_TYPE))
    where = f"{file} (group {group.name})"
    if version is None or found is None:
        raise StorageError(f"{where} was not written by hpcmarl (no {ATTR_VERSION})", FOREIGN_FIX)
    if int(version) > SCHEMA_VERSION:
        raise StorageError(
            f"{where} was written by a newer hpcmarl (schema version {int(version)}; "
            f"this one reads up to {SCHEMA_VERSION})",
            "read it with the hpcmarl version that wrote it, or upgrade hpcmarl",
        )
    if expected is not None and found != expected:
        raise StorageError(f"{where} holds a {found!r}, not a {expected!r}", FOREIGN_FIX)


def _read_group(group: h5py.Group, file: Path, seen: set[Any]) -> Tree:
    if group.id in seen:
        raise StorageError(f"{file}: group {group.name} is linked in twice", FOREIGN_FIX)
    seen.add(group.id)
    tree = json.loads(plain(group.attrs.get(ATTR_JSON, "{}")))
    if not isinstance(tree, dict):
        raise StorageError(f"{file}: {group.name} has a malformed {ATTR_JSON}", DAMAGED_FIX)
    for key in group:
        if key in tree:
            raise StorageError(f"{file}: {group.name} holds {key!r} twice", DAMAGED_FIX)
        tree[key] = _read_member(group, key, file, seen)
    return tree


def _read_member(group: h5py.Group, key: str, file: Path, seen: set[Any]) -> Any:
    obj = checked_member(group, key, file, "tree")
    if isinstance(obj, h5py.Group):
        return _read_group(obj, file, seen)
    value = obj[()]
    return value if plain(obj.attrs.get(ATTR_TYPE)) == "scalar" else np.asarray(value)


def checked_member(group: h5py.Group, key: str, file: Path, kind: str | None) -> Any:
    """`group[key]`, trusted only as far as hpcmarl wrote it: reached through a hard link (a
    soft or external link is refused, not followed); a group must carry hpcmarl's stamp (of
    type `kind` when given); a dataset must be a numeric array stored in this file."""
    link = group.get(key, getlink=True)
    if not isinstance(link, h5py.HardLink):
        raise link_refused(file, group, key, link)
    obj = group[key]
    if isinstance(obj, h5py.Group):
        check_group(obj, file, kind)
    elif not isinstance(obj, h5py.Dataset):
        raise StorageError(f"{file}: {obj.name} is not a group or dataset", FOREIGN_FIX)
    elif obj.is_virtual or obj.external:
        raise StorageError(f"{file}: dataset {obj.name} keeps its data in other files", FOREIGN_FIX)
    elif obj.dtype.kind not in NUMERIC_KINDS:
        raise StorageError(f"{file}: dataset {obj.name} is of type {obj.dtype}", FOREIGN_FIX)
    return obj


def link_refused(file: Path, group: h5py.Group, key: str, link: Any) -> StorageError:
    target = f"{link.filename}:{link.path}" if isinstance(link, h5py.ExternalLink) else link.path
    kind = type(link).__name__
    return StorageError(
        f"{file}: {group.name.rstrip('/')}/{key} is a {kind} to {target}; "
        "hpcmarl never follows links",
        FOREIGN_FIX,
    )


def plain(value: Any) -> Any:
    """HDF5 attributes come back as numpy scalars or bytes; callers want Python values."""
    if isinstance(value, bytes):
        return value.decode()
    return value.item() if isinstance(value, np.generic) else value
