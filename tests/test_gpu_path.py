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
from ctpore.models import attention_dispatch as D
from ctpore.models import backends as B
from ctpore.models import PoreFormer, PoreFormerConfig
from ctpore.models.attention_dispatch import causal_mask
from ctpore.models.poreformer_forward import fold_last_block
from ctpore.pipelines.stream import predict
from ctpore.pipelines.precision import resolve_device

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
    monkeypatch.setattr(D, "load_flash", lambda: (flash_attn_func, ""))  # what the flash path calls
    # the real check also wants q on CUDA; here the tensors stay on the CPU
    monkeypatch.setattr(D, "flash_ok", lambda q: q.dtype in (torch.float16, torch.bfloat16))
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
    cpu = reconstruct(scan, "poreformer", weights=w, precision="fp32")
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


# ---------------------------------------------------------------------------------------------
# GPU memory from a budget, and every CUDA call on the device asked for (mocked GPUs).

GIB = 2**30


@pytest.fixture
def two_gpus(monkeypatch):
    """Two stand-in GPUs: cuda:0 (cc 8.0, 3 GiB free), cuda:1 (cc 7.5, 60 GiB free). Returns the
    free memory by index (change it to move the figure) and the list of device indices asked;
    a call without a device is asked of the current device, cuda:0."""
    free = {0: 3 * GIB, 1: 60 * GIB}
    asked: list[int] = []

    def index(device=None) -> int:
        d = torch.device("cuda", device) if isinstance(device, int) else (
            torch.device(device) if device is not None else None)
        i = d.index if d is not None and d.index is not None else 0
        asked.append(i)
        return i

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free[index(device)], 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0 * index(device))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0 * index(device))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: ((8, 0), (7, 5))[index(device)])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what cuda:0 would say
    monkeypatch.setattr(B, "_flash_cache", {})
    return free, asked


def _fits(model, shape, plan, budget, device):
    from ctpore.pipelines.stream_plan import plan_tiles

    tile, chunk = plan
    window = max((w[1] - w[0], w[3] - w[2]) for _c, w in plan_tiles(shape[1], shape[2], tile, model.halo))
    core = (min(tile, shape[1]), min(tile, shape[2]))
    need = model.inference_bytes(window, core, chunk, device=device)
    return need <= budget, need, model.inference_bytes(window, core, chunk)


def test_the_gpu_plan_follows_the_free_memory_of_the_device_asked_for(two_gpus):
    from ctpore.models.weights import default_weights_path, load_model
    from ctpore.pipelines.stream_plan import plan_for_device

    free, asked = two_gpus
    model = load_model(default_weights_path())
    asked.clear()  # building it asked each GPU's capability by index (is flash possible anywhere?)
    shape = (256, 1024, 1024)
    big = plan_for_device(model, shape, 8 * GIB, "cuda:1")
    assert set(asked) == {1}  # never the current device, cuda:0
    ok, need_cuda, need_cpu_band = _fits(model, shape, big, free[1] - 0.1 * free[1], "cuda")
    assert ok and need_cuda > need_cpu_band  # planned with the band that runs on a GPU (larger)
    free[1] = 6 * GIB  # the same device with less free memory: a smaller plan, within it
    small_plan = plan_for_device(model, shape, 8 * GIB, "cuda:1")
    assert small_plan[0] * small_plan[1] < big[0] * big[1]
    assert _fits(model, shape, small_plan, 6 * GIB - GIB, "cuda")[0]  # less the 1 GiB margin
    capped = plan_for_device(model, shape, 8 * GIB, "cuda:1", gpu_memory_gb=2.0)
    assert _fits(model, shape, capped, 2 * GIB, "cuda")[0]
    assert plan_for_device(model, shape, 8 * GIB, "cpu", precision="fp32") == plan_streaming_cpu(model, shape, 8 * GIB)
    with pytest.raises(InputError, match="raise --memory-gb"):  # the host's staging buffers do not fit
        plan_for_device(model, shape, 1e5, "cuda:1")
    free[1] = GIB  # nothing left once the margin is kept
    with pytest.raises(InputError, match="--gpu-memory-gb"):
        plan_for_device(model, shape, 8 * GIB, "cuda:1")


def plan_streaming_cpu(model, shape, budget):
    from ctpore.pipelines.stream_plan import plan_streaming

    return plan_streaming(model, shape, budget)


def test_reconstruct_plans_the_gpu_from_its_memory_and_the_host_from_memory_gb(two_gpus):
    """plan_budget (what reconstruct uses) on CUDA: the tiles fit the GPU's figure, the slab and the
    host's staging buffers fit what --memory-gb leaves."""
    from ctpore.models.weights import default_weights_path, load_model
    from ctpore.pipelines.budget import BASE_BYTES_CUDA, plan_budget, slab_bytes
    from ctpore.pipelines.stream_plan import plan_for_device, plan_tiles, stream_host_bytes

    free, asked = two_gpus
    model = load_model(default_weights_path())
    asked.clear()
    shape, dev = (512, 2048, 2048), torch.device("cuda:1")
    slab, host_budget = plan_budget(shape, 4.0, dev)  # a CUDA process holds its libraries in host memory
    tile, chunk = plan_for_device(model, shape, host_budget, dev)
    assert set(asked) == {1}
    assert _fits(model, shape, (tile, chunk), 0.9 * free[1], "cuda")[0]
    window = max((w[1] - w[0], w[3] - w[2]) for _c, w in plan_tiles(shape[1], shape[2], tile, model.halo))
    host = slab_bytes(shape[1:], slab) + stream_host_bytes(window, (min(tile, shape[1]), min(tile, shape[2])), chunk)
    assert host <= 4.0 * GIB - BASE_BYTES_CUDA
    cpu_slab, cpu_budget = plan_budget(shape, 4.0)  # the same host budget on CPU: far smaller tiles
    cpu_plan = plan_for_device(model, shape, cpu_budget, torch.device("cpu"))
    assert cpu_plan[0] * cpu_plan[1] < tile * chunk


def test_cuda_queries_go_to_the_device_asked_for(two_gpus):
    from ctpore.pipelines.precision import autocast_dtype

    _free, asked = two_gpus
    assert autocast_dtype("auto", torch.device("cuda:1")) == torch.float16  # cc 7.5 has no bf16
    assert not B.flash_capable(torch.device("cuda:1"))
    assert set(asked) == {1}
    assert autocast_dtype("auto", torch.device("cuda:0")) == torch.bfloat16 and B.flash_capable(torch.device("cuda:0"))


# ---------------------------------------------------------------------------------------------
# Numerics: the cheap, precision-sensitive parts in fp32 under autocast; the folded head.

def _dtypes_under_autocast(model, device="cpu"):
    seen: dict = {}

    def hook(name):
        def record(_mod, _inp, out):
            seen.setdefault(name, set()).add(out.dtype)
        return record

    handles = [model.stem.register_forward_hook(hook("stem")), model.down[0].register_forward_hook(hook("down")),
               model.head.register_forward_hook(hook("head"))]
    handles += [b.pos.register_forward_hook(hook("z features")) for b in model._attention_blocks()]
    x = torch.randn(1, 6, 24, 20, generator=torch.Generator().manual_seed(0)).to(device)
    with torch.inference_mode(), torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        logits = model(x)
    for h in handles:
        h.remove()
    return seen, logits


@pytest.mark.parametrize("folded", [True, False])
def test_stem_z_features_and_head_stay_fp32_under_autocast(folded):
    torch.manual_seed(0)
    model = PoreFormer(small(check_finite=None if folded else True)).eval()  # checking finiteness: no fold
    seen, logits = _dtypes_under_autocast(model)
    assert seen["down"] == {torch.bfloat16}  # autocast really ran the convolutions in bf16
    assert seen["stem"] == {torch.float32} and seen["z features"] == {torch.float32}
    assert seen.get("head", {torch.float32}) == {torch.float32} and ("head" in seen) != folded
    # logits computed in bf16 would all be bf16 numbers; fp32 ones are not
    assert logits.dtype == torch.float32 and (logits.bfloat16().float() != logits).any()


def test_the_folded_head_is_the_same_with_autocast_on_and_off():
    torch.manual_seed(0)
    model = PoreFormer(small()).eval()
    plain = fold_last_block(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = fold_last_block(model)
    for a, b in zip(plain, under):
        assert b.dtype == torch.float32 and torch.equal(a, b)
    x = torch.randn(1, 7, 20, 16, generator=torch.Generator().manual_seed(1))
    unfolded_model = PoreFormer(small(check_finite=True)).eval()  # checks finiteness: runs the head unfolded
    unfolded_model.load_state_dict(model.state_dict())
    with torch.inference_mode():
        ref = unfolded_model(x)
        torch.testing.assert_close(model(x), ref, atol=1e-5, rtol=0)  # autocast off: the same algebra
        with torch.autocast("cpu", dtype=torch.bfloat16):
            on = model(x)
            on_unfolded = unfolded_model(x)
        off = model(x)
    torch.testing.assert_close(on, ref, atol=0.05, rtol=0)  # bf16 elsewhere, the head in fp32
    torch.testing.assert_close(on, on_unfolded, atol=0.05, rtol=0)
    torch.testing.assert_close(off, ref, atol=1e-5, rtol=0)  # and off again after autocast


# ---------------------------------------------------------------------------------------------
# Keeping the GPU busy: the staging gives the same numbers as the plain loop.

def test_read_ahead_loads_one_ahead_in_order_and_raises_at_the_item():
    from ctpore.pipelines.staging import read_ahead

    started: list[int] = []

    def load(i):
        started.append(i)
        if i == 4:
            raise InputError("item 4 is bad")
        return i * 10

    got = []
    with pytest.raises(InputError, match="item 4"):
        for i, r in read_ahead(load, range(6)):
            assert max(started) <= i + 1  # never more than one ahead
            got.append(r)
    assert got == [0, 10, 20, 30] and 5 not in started


@pytest.mark.parametrize("ahead", [False, True])
def test_overlapped_staging_gives_the_bits_of_the_plain_loop(monkeypatch, ahead):
    """Two rotating input and output buffers, writes deferred by one chunk and the read-ahead thread
    (the CUDA path's logic, here on CPU) change nothing: the same bits, every chunk once, in order."""
    import functools

    from ctpore.pipelines import stream as S
    from ctpore.pipelines.staging import Staging

    torch.manual_seed(0)
    model = PoreFormer(small(window=4))
    vol = np.random.default_rng(0).standard_normal((11, 40, 37)).astype(np.float32)
    want = predict(model, vol, chunk_slices=3, tile=16)
    monkeypatch.setattr(S, "Staging", functools.partial(Staging, overlap=True))
    monkeypatch.setattr(S, "READ_AHEAD_ON_CPU", ahead)
    calls = []
    got = predict(model, vol, chunk_slices=3, tile=16, progress=lambda d, t, _s: calls.append((d, t)))
    assert np.array_equal(got, want)
    n = len(calls)
    assert calls == [(i, n) for i in range(1, n + 1)] and n == 4 * 9  # 4 chunks x 9 tiles (3 x 3)
    bad = vol.copy()
    bad[7, 3, 3] = np.nan
    with pytest.raises(InputError, match="non-finite"):
        predict(model, bad, chunk_slices=3, tile=16)


# ---------------------------------------------------------------------------------------------
# Install and versions

def test_the_gpu_extra_builds_nothing_against_torch_and_the_torch_floor_has_enable_gqa():
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    extras = [r.lower() for reqs in meta["optional-dependencies"].values() for r in reqs]
    assert not [r for r in extras if re.match(r"flash[-_]attn", r)]  # its build imports torch: no extra may need it
    torch_req = next(r for r in meta["dependencies"] if re.match(r"torch\b", r))
    floor = tuple(int(v) for v in re.search(r">=\s*([\d.]+)", torch_req).group(1).split(".")[:2])
    assert floor >= (2, 5)  # SDPA's enable_gqa (models/attention_dispatch.py passes it) came with torch 2.5
    assert "enable_gqa" in F.scaled_dot_product_attention.__doc__


# ---------------------------------------------------------------------------------------------
# On a real GPU (run by scripts/gpu_check.sh; skipped here)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
def test_cuda_predict_equals_the_cpu_one():
    """Pinned buffers, non-blocking copies, read-ahead and writes behind, on the real device."""
    import copy

    from ctpore.pipelines.gpu_checks import tf32_off

    torch.manual_seed(0)
    model = PoreFormer(small(window=4)).eval()
    vol = np.random.default_rng(0).standard_normal((13, 70, 61)).astype(np.float32)
    cpu = predict(model, vol, chunk_slices=4, tile=32, precision="fp32")
    with tf32_off():
        gpu = predict(copy.deepcopy(model), vol, chunk_slices=4, tile=32, device="cuda", precision="fp32")
    np.testing.assert_allclose(gpu, cpu, atol=1e-5, rtol=0)


@needs_cuda
def test_cuda_autocast_keeps_stem_z_features_and_head_in_fp32():
    torch.manual_seed(0)
    seen, logits = _dtypes_under_autocast(PoreFormer(small()).eval().cuda(), "cuda")
    assert seen["down"] == {torch.bfloat16}
    assert seen["stem"] == {torch.float32} and seen["z features"] == {torch.float32}
    assert (logits.bfloat16().float() != logits).any()


@needs_cuda
def test_cuda_attention_kernels_in_bf16_within_twice_plain_pytorch():
    from ctpore.pipelines.gpu_checks import kernel_agreement

    for case in kernel_agreement({"device": "cuda", "columns": 512, "chunk": 16}).values():
        assert case["sdpa"]["within_twice_math"], case
        if case["flash"].get("available"):
            assert case["flash"]["within_twice_math"], case


@needs_cuda
def test_cuda_peak_memory_stays_within_the_gpu_budget():
    from ctpore.models.weights import default_weights_path, load_model
    from ctpore.pipelines.stream_plan import plan_for_device

    model = load_model(default_weights_path(), device="cuda")
    shape = (24, 512, 512)
    plan = plan_for_device(model, shape, 8 * GIB, "cuda", gpu_memory_gb=1.0)
    ok, estimate, _cpu_band = _fits(model, shape, plan, GIB, "cuda")
    assert ok  # the plan's estimate is within the cap
    vol = np.random.default_rng(0).random(shape, dtype=np.float32)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    predict(model, vol, chunk_slices=plan[1], tile=plan[0], device="cuda")
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base <= estimate  # and the estimate bounds what it took


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_cuda_a_run_on_the_second_gpu_leaves_the_first_alone():
    torch.manual_seed(0)
    model = PoreFormer(small(window=4))
    vol = np.random.default_rng(0).standard_normal((6, 40, 40)).astype(np.float32)
    predict(model, vol, chunk_slices=3, tile=16, device="cuda:1")
    assert torch.cuda.memory_allocated(0) == 0 and torch.cuda.max_memory_reserved(0) == 0


@needs_cuda
def test_cuda_a_scan_split_across_two_workers_equals_the_single_run(tmp_path):
    """The split run on the GPU: two worker processes share the device, each runs its slabs with
    the single run's tile and chunk plan, so every voxel and metric is the single run's."""
    import warnings

    distributed = pytest.importorskip("distributed")
    zarr = pytest.importorskip("zarr")
    from ctpore.data.io import geometry_from_array, save_volume
    from ctpore.data.synthetic import make_pair
    from ctpore.pipelines.reconstruct import reconstruct_file
    from ctpore.pipelines.split import reconstruct_split

    vol, _truth, info = make_pair(5, shape=(256, 96, 96), scene="core-air-offcentre")
    path = save_volume(tmp_path / "core.nii", np.asarray(vol),
                       geometry_from_array(vol.shape, tuple(info["scene"]["spacing_mm"])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        single = reconstruct_file(path, tmp_path / "one", device="cuda", memory_gb=8, output_format="ome-zarr")
        torch.cuda.empty_cache()
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                      dashboard_address=None) as cluster, distributed.Client(cluster) as client:
            got = reconstruct_split(path, tmp_path / "two", client, device="cuda", memory_gb=8, slab_slices=64)
    assert got["result"]["split"]["slabs"] == 4
    for kind in ("pores", "prob", "sample"):
        a, b = zarr.open_group(str(single[kind]), mode="r"), zarr.open_group(str(got[kind]), mode="r")
        assert sorted(a.array_keys()) == sorted(b.array_keys())
        for k in a.array_keys():
            assert np.array_equal(a[k][:], b[k][:]), (kind, k)
    skip = {"seconds", "stage_seconds", "split"}
    assert {k: v for k, v in single["result"].items() if k not in skip} == \
        {k: v for k, v in got["result"].items() if k not in skip}
