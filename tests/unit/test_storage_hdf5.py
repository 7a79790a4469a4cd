"""HDF5 trees: exact round trips, filters on disk, and a clear refusal for every bad input."""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from hpcmarl.storage.hdf5 import (
    SCHEMA_VERSION,
    StorageError,
    read_tree,
    read_tree_with_attrs,
    sha256_of,
    write_tree_atomic,
)

H5DUMP = "/usr/bin/h5dump"


def sample_tree() -> dict[str, Any]:
    rng = np.random.default_rng(7)
    ints = {f"{dt}": np.arange(-3, 3).astype(dt) for dt in ("int8", "int16", "int32", "int64")}
    return {
        "f32": rng.random((5, 3), dtype=np.float32),
        "f64": rng.random(17),
        "u8": np.arange(250, 256, dtype=np.uint8),
        "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
        "flags": np.array([[True, False], [False, True]]),
        "zero_d": np.array(2.5, dtype=np.float32),
        "np_scalar": np.int64(-9),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "ints": ints,
        "nested": {"deeper": {"w": np.ones((2, 2)), "note": "deep"}, "empty_group": {}},
        "rng_state": 2**127 + 12345,
        "nothing": None,
        "seq": [1, "two", 3.5, None, [True, False]],
        "name": "replay0",
        "yes": True,
        "count": 7,
        "ratio": 0.1,
    }


def assert_same(expected: Any, got: Any, where: str = "") -> None:
    """Equal values of the same type; arrays also of the same dtype and shape."""
    assert type(got) is type(expected), where
    if isinstance(expected, dict):
        assert set(got) == set(expected), where
        for key in expected:
            assert_same(expected[key], got[key], f"{where}/{key}")
    elif isinstance(expected, (np.ndarray, np.generic)):
        assert got.dtype == expected.dtype and got.shape == expected.shape, where
        assert np.array_equal(got, expected), where
    else:
        assert got == expected, where


def test_round_trip_is_exact_for_every_kind_of_leaf(tmp_path: Path) -> None:
    tree = sample_tree()
    write_tree_atomic(tmp_path / "t.h5", tree, "role_state", {"role": "replay0", "n": 3})
    got, attrs = read_tree_with_attrs(tmp_path / "t.h5", "role_state")
    assert_same(tree, got)
    assert attrs == {"role": "replay0", "n": 3}


def test_datasets_are_chunked_and_filtered_and_groups_stamped(tmp_path: Path) -> None:
    write_tree_atomic(tmp_path / "t.h5", sample_tree(), "role_state")
    with h5py.File(tmp_path / "t.h5", "r") as f:
        ds = f["f32"]
        assert ds.chunks and ds.compression == "gzip" and ds.compression_opts == 4
        assert ds.shuffle and ds.fletcher32
        assert f["zero_d"].chunks is None and f["empty"].chunks is None
        assert f.attrs["hpcmarl_type"] == "role_state"
        assert f["nested/deeper"].attrs["hpcmarl_type"] == "tree"
        assert f["nested"].attrs["hpcmarl_schema_version"] == SCHEMA_VERSION
        assert json.loads(f["nested/deeper"].attrs["json_attrs"]) == {"note": "deep"}


def test_record_describes_the_final_file_and_no_temp_file_remains(tmp_path: Path) -> None:
    record = write_tree_atomic(tmp_path / "t.h5", {"x": np.arange(10)}, "k")
    assert record.name == "t.h5"
    assert record.size == (tmp_path / "t.h5").stat().st_size
    assert record.sha256 == sha256_of(tmp_path / "t.h5")
    assert [p.name for p in tmp_path.iterdir()] == ["t.h5"]


def test_failed_write_leaves_the_previous_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    write_tree_atomic(path, {"x": np.arange(10)}, "k")
    before = path.read_bytes()
    with pytest.raises(TypeError, match="not numeric"):
        write_tree_atomic(path, {"a": np.arange(3), "s": np.array(["a", "b"])}, "k")
    with pytest.raises(TypeError):
        write_tree_atomic(path, {"o": np.array([object()])}, "k")
    with pytest.raises(ValueError, match="nest dicts"):
        write_tree_atomic(path, {"column/x": np.arange(3)}, "k")
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.h5"]


def test_missing_truncated_and_non_hdf5_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="does not exist"):
        read_tree(tmp_path / "nope.h5")
    path = tmp_path / "t.h5"
    write_tree_atomic(path, {"x": np.arange(100_000)}, "k")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(StorageError, match="truncated") as err:
        read_tree(path)
    assert "fix:" in str(err.value) and str(path) in str(err.value)
    (tmp_path / "text.h5").write_text("hello, not hdf5\n")
    with pytest.raises(StorageError, match="not an HDF5 file"):
        read_tree(tmp_path / "text.h5")


def test_a_flipped_data_byte_fails_the_checksum(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    write_tree_atomic(path, {"big": np.random.default_rng(0).random((4000, 16))}, "k")
    with h5py.File(path, "r") as f:
        chunk = f["big"].id.get_chunk_info(0)
    data = bytearray(path.read_bytes())
    data[chunk.byte_offset + chunk.size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(StorageError, match="corrupt.*fletcher32"):
        read_tree(path)


def test_links_and_external_storage_are_never_followed(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    target = tmp_path / "elsewhere.h5"
    write_tree_atomic(target, {"secret": np.arange(3)}, "k")
    for name, link in [
        ("ext", h5py.ExternalLink(str(target), "/secret")),
        ("soft", h5py.SoftLink("/sub/x")),
    ]:
        write_tree_atomic(path, {"sub": {"x": np.arange(3)}}, "k")
        with h5py.File(path, "a") as f:
            f["sub"][name] = link
        with pytest.raises(StorageError, match=f"sub/{name} is a .*Link.*never follows links"):
            read_tree(path)
    raw = tmp_path / "raw.bin"
    raw.write_bytes(np.arange(4, dtype=np.int64).tobytes())
    write_tree_atomic(path, {}, "k")
    with h5py.File(path, "a") as f:
        f.create_dataset("outside", shape=(4,), dtype=np.int64, external=[(str(raw), 0, 32)])
    with pytest.raises(StorageError, match="other files"):
        read_tree(path)


def test_torch_and_pickle_files_are_refused_without_unpickling(tmp_path: Path) -> None:
    torch_like = tmp_path / "model.pt"
    with zipfile.ZipFile(torch_like, "w") as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02K\x01.")
    pickled = tmp_path / "state.pkl"
    pickled.write_bytes(b"\x80\x04K\x01.")  # the protocol-4 pickle of the int 1
    for path in (torch_like, pickled):
        with pytest.raises(StorageError, match="this is a torch/pickle file; hpcmarl reads only"):
            read_tree(path)


def test_foreign_newer_and_mismatched_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    write_tree_atomic(path, {"sub": {"x": np.arange(3)}}, "role_state")
    with pytest.raises(StorageError, match="holds a 'role_state', not a 'offline_replay'"):
        read_tree(path, "offline_replay")
    with h5py.File(path, "a") as f:
        f["sub"].attrs["hpcmarl_schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(StorageError, match="written by a newer hpcmarl"):
        read_tree(path)
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(StorageError, match="not written by hpcmarl"):
        read_tree(tmp_path / "plain.h5")


@pytest.mark.skipif(
    not Path(H5DUMP).exists(), reason="h5dump not installed (apt-get install hdf5-tools)"
)
def test_debian_h5dump_reads_a_written_file(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    write_tree_atomic(path, sample_tree(), "role_state", {"role": "replay0"})
    header = subprocess.run([H5DUMP, "-H", str(path)], capture_output=True, text=True)
    assert header.returncode == 0, header.stderr
    assert 'DATASET "f32"' in header.stdout and "json_attrs" in header.stdout
    small = tmp_path / "small.h5"
    write_tree_atomic(small, {"w": np.array([1.5, -2.0]), "b": np.array([True])}, "k")
    full = subprocess.run([H5DUMP, str(small)], capture_output=True, text=True)
    assert full.returncode == 0, full.stderr
    assert "1.5, -2" in full.stdout and "TRUE" in full.stdout


def test_sha256_of_matches_hashlib_on_a_multi_block_file(tmp_path: Path) -> None:
    data = np.random.default_rng(1).bytes(3 * (1 << 20) + 17)
    (tmp_path / "blob").write_bytes(data)
    assert sha256_of(tmp_path / "blob") == hashlib.sha256(data).hexdigest()
