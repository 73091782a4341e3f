"""The GPU path without a GPU: what reaches the flash kernel, and what the metrics report.

flash-attn needs CUDA, so its kernel is replaced by a stand-in that records the dtype it was
called with and computes the same attention (bottom-right causal, windowed) with PyTorch. The
dispatch around it is ctpore's own: autocast to bf16 must bring half-precision tensors to the
kernel, fp32 must never reach it, and the reported backend must be the one that ran. On a CUDA
machine with flash-attn, tests/test_attention.py and tests/test_poreformer.py run the real kernel.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ctpore.errors import InputError
from ctpore.models import attention as A
from ctpore.models import backends as B
from ctpore.models import PoreFormer, PoreFormerConfig
from ctpore.models.attention import causal_mask
from ctpore.pipelines.stream import predict, resolve_device

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def small(**kw) -> PoreFormerConfig:
    base = dict(d_model=32, n_heads=4, n_layers=1, window=4, stem_channels=4, level_channels=(8, 32),
                level_attention=(0, 1), level_window=6)
    base.update(kw)
    return PoreFormerConfig(**base)


@pytest.fixture
def fake_flash(monkeypatch):
    """A stand-in for flash_attn_func; returns the list of the q dtypes it was called with."""
    calls: list = []

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1)):
        calls.append(q.dtype)
        assert q.dtype in (torch.float16, torch.bfloat16)  # what the real kernel demands
        b, zq, h, d = q.shape
        zk, hkv = k.shape[1], k.shape[2]
        win = None if window_size[0] < 0 else window_size[0] + 1
        mask = causal_mask(zq, zk, win) if causal else None
        rep = h // hkv
        out = F.scaled_dot_product_attention(
            q.float().transpose(1, 2), k.float().repeat_interleave(rep, 2).transpose(1, 2),
            v.float().repeat_interleave(rep, 2).transpose(1, 2), attn_mask=mask,
            scale=softmax_scale or 1 / math.sqrt(d))
        return out.transpose(1, 2).to(q.dtype)

    monkeypatch.setattr(B, "load_flash", lambda: (flash_attn_func, ""))  # what resolve_backend asks
    monkeypatch.setattr(A, "load_flash", lambda: (flash_attn_func, ""))  # what the flash path calls
    # the real check also wants q on CUDA; here the tensors stay on the CPU
    monkeypatch.setattr(A.MultiHeadAttention, "_flash_ok",
                        staticmethod(lambda q: q.dtype in (torch.float16, torch.bfloat16)))
    return calls


def test_bf16_reaches_the_kernel_fp32_never_does_and_the_report_says_which_ran(fake_flash):
    torch.manual_seed(0)
    model = PoreFormer(small(attention_backend="flash")).eval()
    vol = np.random.default_rng(0).standard_normal((10, 24, 20)).astype(np.float32)
    ref = predict(model, vol, chunk_slices=4, tile=16, precision="fp32")
    assert fake_flash == [] and model.backends_ran() == "sdpa"  # fp32 went through sdpa, said so
    model.reset_backends_ran()
    got = predict(model, vol, chunk_slices=4, tile=16, precision="bf16")
    assert fake_flash and set(fake_flash) == {torch.bfloat16}
    assert model.backends_ran() == "flash"
    np.testing.assert_allclose(got, ref, atol=0.02)  # the same model, in bf16


def test_reconstruct_reports_the_backend_that_ran(tmp_path, fake_flash):
    from ctpore.models.weights import save_weights
    from ctpore.pipelines.reconstruct import reconstruct

    torch.manual_seed(0)
    w = save_weights(PoreFormer(small()).eval(), tmp_path / "w.safetensors")  # backend "auto"
    scan = (np.random.default_rng(1).random((8, 20, 20)) * 1000).astype(np.uint16)
    cpu = reconstruct(scan, "poreformer", weights=w)  # auto precision on CPU: fp32
    assert cpu.metrics["attention_backend"] == "sdpa" and fake_flash == []
    half = reconstruct(scan, "poreformer", weights=w, precision="bf16")
    assert half.metrics["attention_backend"] == "flash" and set(fake_flash) == {torch.bfloat16}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_usage_error():
    with pytest.raises(InputError, match="no usable CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(InputError, match="not a device PyTorch knows"):
        resolve_device("gpu0")


def test_cli_refuses_cuda_here_with_one_line(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from ctpore.app.cli import main

    scan = tmp_path / "s.nii.gz"
    import nibabel as nib

    nib.save(nib.Nifti1Image(np.zeros((8, 8, 8), np.uint16), np.eye(4)), scan)
    for argv in (["reconstruct", str(scan), "-o", str(tmp_path / "out"), "--device", "cuda"],
                 ["bench", "gpu", "--workdir", str(tmp_path / "gpu")]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no usable CUDA GPU" in err[0]
    assert not (tmp_path / "out").exists()


def test_gpu_bench_test_scan_is_a_readable_simulated_volume(tmp_path):
    from ctpore.data.io import load_scan
    from ctpore.pipelines.bench.gpu import make_test_scan

    path = make_test_scan(tmp_path / "scan.nii", (40, 300, 140))
    with load_scan(path) as s:
        vol = s.read()
    assert vol.shape == (40, 300, 140) and vol.std() > 0
    np.testing.assert_array_equal(vol[:, 128:256], vol[:, 127::-1][:, :128])  # mirrored past 128
    assert path.stat().st_size == 352 + 2 * vol.size  # uint16, uncompressed
