"""Weights I/O: safetensors round trip with the config; pickles refused, never unpickled."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import pytest
import torch

from ctpore.errors import InputError
from ctpore.models import PoreFormer
from ctpore.models.weights import (
    default_weights_path,
    load_model,
    read_metadata,
    save_weights,
    sha256_file,
)
from helpers import small

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py




@pytest.fixture()
def model() -> PoreFormer:
    torch.manual_seed(0)
    return PoreFormer(small()).eval()


def test_round_trip_same_outputs_and_config(tmp_path, model):
    path = save_weights(model, tmp_path / "sub" / "w.safetensors",
                        {"trained_on": "synthetic", "epochs": 3})
    assert sorted(p.name for p in path.parent.iterdir()) == ["w.safetensors"]  # no temp file left
    loaded = load_model(path)
    assert loaded.config == model.config and not loaded.training
    x = torch.randn(1, 7, 9, 9)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    meta = read_metadata(path)
    assert meta["config"] == model.config.to_dict()
    assert meta["trained_on"] == "synthetic" and meta["epochs"] == "3"
    assert meta["format"] == "ctpore.poreformer"


def test_backend_override_keeps_weights(tmp_path, model):
    path = save_weights(model, tmp_path / "w.safetensors")
    loaded = load_model(path, device="cpu", attention_backend="math")
    assert loaded.attention_backend == "math"
    x = torch.randn(1, 6, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=1e-5, rtol=0)


class _Trap:
    """Unpickling this touches a marker file: proof that a pickle was executed."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("name", ["w.pt", "w.pth", "w.ckpt", "w.safetensors", "w.bin"])
@pytest.mark.parametrize("kind", ["torch.save", "pickle"])
def test_pickles_are_refused_and_never_run(tmp_path, model, name, kind):
    marker = tmp_path / "pickle_was_run"
    path = tmp_path / name
    payload = {"state": model.state_dict(), "trap": _Trap(marker)}
    if kind == "torch.save":
        torch.save(payload, path)  # a zip archive
    else:
        path.write_bytes(pickle.dumps(payload, protocol=4))
    for fn in (load_model, read_metadata):
        with pytest.raises(InputError) as info:
            fn(path)
        msg = str(info.value)
        assert "is not a safetensors file" in msg
        assert "ctpore never unpickles weights (it could run code). Convert it with" in msg
        assert name in msg
    assert not marker.exists()


def test_other_bad_files(tmp_path):
    with pytest.raises(InputError, match="no such weights file"):
        load_model(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"hello, this is not a tensor file at all")
    with pytest.raises(InputError, match="not a safetensors file"):
        load_model(junk)
    with pytest.raises(InputError, match="directory"):
        load_model(tmp_path)


def test_tensors_that_do_not_fit_the_config(tmp_path, model):
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    del state["head.bias"]
    bad_cfg = small(d_model=16, n_heads=2, n_kv_heads=None).to_json()
    save_file(state, tmp_path / "a.safetensors", metadata={"config": model.config.to_json()})
    with pytest.raises(InputError, match="missing head.bias"):
        load_model(tmp_path / "a.safetensors")
    save_file(state, tmp_path / "b.safetensors", metadata={"config": bad_cfg})
    with pytest.raises(InputError, match="do not fit"):
        load_model(tmp_path / "b.safetensors")
    save_file(state, tmp_path / "c.safetensors")
    with pytest.raises(InputError, match="no 'config' metadata"):
        load_model(tmp_path / "c.safetensors")


def test_sha256_file(tmp_path):
    p = tmp_path / "abc"
    p.write_bytes(b"abc")  # FIPS 180-2 test vector
    assert sha256_file(p) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    big = tmp_path / "big"
    data = bytes(range(256)) * 10_000  # several read blocks
    big.write_bytes(data)
    assert sha256_file(big) == hashlib.sha256(data).hexdigest()


def test_default_weights_path(tmp_path, monkeypatch):
    """The shipped weights are found and are a PoreFormer; a folder without them gives None."""
    import ctpore.models.weights as w

    p = default_weights_path()
    if p is not None:
        assert p.name == "poreformer.safetensors" and p.is_file()
        assert read_metadata(p)["format"] == w.FORMAT
        assert load_model(p).config.d_model == 64
    monkeypatch.setattr(w, "weights_dir", lambda: tmp_path)
    assert w.default_weights_path() is None
    (tmp_path / "poreformer.safetensors").write_bytes(b"x")
    assert w.default_weights_path() == tmp_path / "poreformer.safetensors"
