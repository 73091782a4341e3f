"""The C look-back-window attention kernel (models/_winattn.c) and the bf16 CPU path.

The kernel is checked against an exact float64 reference built from loops (not from the kernel's
own formulation) and against the module's math path through a streamed KV cache; the bf16 path
against the stored fp32 model.
"""

from __future__ import annotations

import math
import shutil
import sys

import numpy as np
import pytest
import torch

from ctpore.models import PoreFormer, PoreFormerConfig, window_kernel
from ctpore.models.attention import MultiHeadAttention
from ctpore.models.kv_cache import KVCache
from ctpore.pipelines import precision
from ctpore.pipelines.precision import cpu_weights_dtype, precision_name
from ctpore.pipelines.stream import predict

needs_kernel = pytest.mark.skipif(not window_kernel.available(),
                                  reason="the C kernel is not built here (no C compiler when ctpore was installed)")


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Exact (float64) attention of query i (key position Zk - Zq + i) over the keys in its window;
    query head h reads key/value head h // (H / Hkv)."""
    n, zq, h, d = q.shape
    zk, hkv = k.shape[1], k.shape[2]
    rep = h // hkv
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(n, zq, h, d, dtype=torch.float64)
    for i in range(zq):
        p = zk - zq + i
        keys = list(range(max(0, p - window + 1), p + 1))
        for head in range(h):
            s = torch.einsum("nd,nkd->nk", q[:, i, head], k[:, keys, head // rep]) / math.sqrt(d)
            out[:, i, head] = torch.einsum("nk,nkd->nd", torch.softmax(s, -1), v[:, keys, head // rep])
    return out


def test_kernel_is_built_where_a_compiler_is():
    if sys.platform != "linux" or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("the kernel is built on Linux with a C compiler; this machine has none")
    assert window_kernel.available(), "pip install should have built models/_winattn.c (run it again, read its output)"


@needs_kernel
@pytest.mark.parametrize("n, zq, extra, h, hkv, window", [
    (1, 1, 0, 1, 1, 1), (7, 5, 0, 4, 1, 8), (600, 16, 7, 4, 1, 8), (513, 16, 7, 2, 1, 3), (40, 3, 20, 4, 1, 8),
    (9, 12, 7, 1, 1, 5), (300, 16, 23, 4, 4, 24), (50, 16, 0, 4, 4, 24), (70, 9, 40, 4, 2, 32), (33, 6, 10, 3, 1, 13),
])
def test_kernel_fp32_equals_the_exact_reference(n, zq, extra, h, hkv, window):
    g = torch.Generator().manual_seed(n + zq)
    q = 3 * torch.randn(n, zq, h, 16, generator=g)
    k, v = torch.randn(2, n, zq + extra, hkv, 16, generator=g)
    out = window_kernel.window_attention(q, k, v, window)
    assert out.dtype == torch.float32 and out.shape == q.shape
    torch.testing.assert_close(out.double(), reference(q, k, v, window), atol=2e-6, rtol=2e-6)


@needs_kernel
def test_kernel_bf16_is_within_one_rounding_of_the_exact_result():
    g = torch.Generator().manual_seed(1)
    q = (3 * torch.randn(700, 16, 4, 16, generator=g)).bfloat16()
    k, v = torch.randn(2, 700, 23, 1, 16, generator=g).bfloat16()
    out = window_kernel.window_attention(q, k, v, 8)
    assert out.dtype == torch.bfloat16
    exact = reference(q, k, v, 8)
    err = (out.double() - exact).abs()
    assert bool((err <= exact.abs() * 2.0**-8 + 1e-6).all())  # bf16 keeps 8 bits: half an ulp is 2^-9


@needs_kernel
def test_kernel_reads_strided_keys_and_declines_what_it_is_not_for():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(300, 8, 4, 16, generator=g)
    kv = torch.randn(300, 8, 1, 48, generator=g)  # keys and values as slices of a packed projection
    k, v = kv[..., :16], kv[..., 32:]
    torch.testing.assert_close(window_kernel.window_attention(q, k, v, 8).double(), reference(q, k, v, 8),
                               atol=2e-6, rtol=2e-6)
    assert window_kernel.window_attention(q, k, v, 33) is None  # a window wider than 32
    assert window_kernel.window_attention(q, k[:-1], v[:-1], 4) is None  # keys for other columns
    assert window_kernel.window_attention(q, k, v[:, :-1], 4) is None  # values for other slices
    assert window_kernel.window_attention(q[..., :8], k[..., :8], v[..., :8], 4) is None  # head size 8
    assert window_kernel.window_attention(q.double(), k.double(), v.double(), 4) is None
    with torch.enable_grad():
        assert window_kernel.window_attention(q.requires_grad_(), k, v, 4) is None  # training: SDPA


@needs_kernel
@pytest.mark.parametrize("zc, zq, hkv, window", [(7, 8, 1, 8), (23, 8, 4, 24), (3, 5, 1, 8), (20, 4, 2, 32)])
def test_kernel_reads_a_caches_positions_in_place_as_if_joined(zc, zq, hkv, window):
    g = torch.Generator().manual_seed(zc + zq)
    q = 3 * torch.randn(257, zq, 4, 16, generator=g)
    buf = torch.randn(2, 257, 31, hkv, 16, generator=g)  # a cache's buffer: its first zc slots in use
    kp, vp = buf[0, :, :zc], buf[1, :, :zc]
    k, v = torch.randn(2, 257, zq, hkv, 16, generator=g)
    out = window_kernel.window_attention(q, k, v, window, past=(kp, vp))
    exact = reference(q, torch.cat([kp, k], 1), torch.cat([vp, v], 1), window)
    torch.testing.assert_close(out.double(), exact, atol=2e-6, rtol=2e-6)
    assert window_kernel.window_attention(q, k, v, window, past=(kp[:-1], vp[:-1])) is None  # other columns


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_reads_slice_major_queries_in_place_and_writes_its_output_in_their_layout(dtype):
    # (Zq, N, ...) memory, as a channels-last map of slices holds its tokens, seen as (N, Zq, ...):
    # the same values as from column-major copies, and an output laid out slice-major too
    g = torch.Generator().manual_seed(5)
    n, zq = 300, 8
    q_sm = torch.randn(zq, n, 4, 16, generator=g).to(dtype).transpose(0, 1)
    kv_sm = torch.randn(zq, n, 32, generator=g).to(dtype)
    k_sm, v_sm = (t.unflatten(-1, (1, 16)).transpose(0, 1) for t in kv_sm.split(16, -1))
    kp, vp = torch.randn(2, n, 7, 1, 16, generator=g).to(dtype)
    out = window_kernel.window_attention(q_sm, k_sm, v_sm, 8, past=(kp, vp))
    assert out.stride() == q_sm.stride()  # slice-major, as the queries
    packed = window_kernel.window_attention(q_sm.contiguous(), k_sm.contiguous(), v_sm.contiguous(), 8,
                                            past=(kp, vp))
    assert packed.is_contiguous() and torch.equal(out, packed)
    if dtype == torch.float32:
        exact = reference(q_sm, torch.cat([kp, k_sm], 1), torch.cat([vp, v_sm], 1), 8)
        torch.testing.assert_close(out.double(), exact, atol=2e-6, rtol=2e-6)


@needs_kernel
@pytest.mark.parametrize("precision_", ["fp32", "bf16"])
def test_the_slice_major_full_resolution_path_gives_the_column_major_paths_bits(monkeypatch, precision_):
    # the shipped model's last block folds into the head, so its bands take the slice-major path;
    # turned off, the same bands take the column-major one (one transposing copy): equal bits
    from ctpore.models.weights import default_weights_path, load_model

    model = load_model(default_weights_path())
    vol = np.random.default_rng(3).standard_normal((20, 96, 80)).astype(np.float32)
    calls = []
    real = MultiHeadAttention.heads_slice_major

    def counted(self, *a, **k):
        out = real(self, *a, **k)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(MultiHeadAttention, "heads_slice_major", counted)
    fast = predict(model, vol, chunk_slices=8, tile=64, precision=precision_)
    assert calls and all(calls)
    x = torch.from_numpy(vol[None, :8, :64, :64].copy())
    with torch.inference_mode():
        whole = model(x)  # no KV cache: the column-major path, which the next lines compare with
    monkeypatch.setattr(MultiHeadAttention, "heads_slice_major", lambda self, *a, **k: None)
    assert np.array_equal(fast, predict(model, vol, chunk_slices=8, tile=64, precision=precision_))
    with torch.inference_mode():
        assert torch.equal(whole, model(x))


def test_kernel_turned_off_by_the_environment(no_window_kernel):
    assert not window_kernel.available()
    k, v = torch.randn(2, 4, 4, 1, 16)
    assert window_kernel.window_attention(torch.randn(4, 4, 4, 16), k, v, 4) is None


@needs_kernel
@pytest.mark.parametrize("chunk", [3, 16])
@pytest.mark.parametrize("n_kv_heads, window", [(1, 8), (None, 24)], ids=["mqa-8", "mha-24"])
def test_attention_runs_the_kernel_and_equals_the_math_path_through_a_cache(chunk, n_kv_heads, window):
    torch.manual_seed(0)
    fast = MultiHeadAttention(64, 4, n_kv_heads=n_kv_heads, causal=True, window=window, backend="sdpa").eval()
    ref = MultiHeadAttention(64, 4, n_kv_heads=n_kv_heads, causal=True, window=window, backend="math").eval()
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(300, 40, 64)
    outs = {}
    with torch.inference_mode():
        for name, mha in (("fast", fast), ("ref", ref)):
            cache = KVCache(window)
            outs[name] = torch.cat([mha(x[:, z:z + chunk], cache=cache) for z in range(0, 40, chunk)], 1)
    torch.testing.assert_close(outs["fast"], outs["ref"], atol=1e-5, rtol=1e-5)
    assert fast.ran["window"] > 0 and fast.ran["sdpa"] == 0


def test_precision_resolution(monkeypatch):
    cpu = torch.device("cpu")
    assert cpu_weights_dtype("fp32", cpu) is None and cpu_weights_dtype("bf16", cpu) is torch.bfloat16
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: True)
    assert cpu_weights_dtype("auto", cpu) is torch.bfloat16 and precision_name("auto", cpu) == "bf16"
    assert precision.autocast_dtype("auto", cpu) is None  # bf16 weights on CPU, not autocast
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: False)
    assert cpu_weights_dtype("auto", cpu) is None and precision_name("auto", cpu) == "fp32"


def test_native_bf16_is_read_from_the_cpu_flags():
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((set(line.split(":", 1)[1].split()) for line in fh if line.startswith("flags")), set())
    except OSError:
        flags = set()
    assert precision.cpu_native_bf16() == bool(flags & {"avx512_bf16", "amx_bf16"})


def test_bf16_copy_keeps_the_stem_head_and_z_maps_fp32_and_the_model_unchanged():
    model = PoreFormer(PoreFormerConfig(level_channels=(8, 8), level_attention=(0, 1))).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    half = model.with_weights_in(torch.bfloat16)
    fp32 = {n for n, p in half.named_parameters() if p.dtype == torch.float32}
    expect = {n for n, _ in half.named_parameters()
              if n.startswith(("stem.", "head.", f"blocks.{len(half.blocks) - 1}.attn.proj.")) or ".pos." in n}
    assert fp32 == expect
    assert all(torch.equal(before[k], v) and v.dtype == torch.float32 for k, v in model.state_dict().items())


def test_bf16_prediction_stays_close_to_fp32_and_is_deterministic():
    from ctpore.models.weights import default_weights_path, load_model

    shipped_model = load_model(default_weights_path())
    vol = np.random.default_rng(0).standard_normal((20, 96, 80)).astype(np.float32)
    p32 = predict(shipped_model, vol, chunk_slices=8, tile=64, precision="fp32")
    p16 = predict(shipped_model, vol, chunk_slices=8, tile=64, precision="bf16")
    again = predict(shipped_model, vol, chunk_slices=8, tile=64, precision="bf16")
    assert np.array_equal(p16, again)
    diff = np.abs(p16 - p32)
    assert diff.mean() < 2e-3 and diff.max() < 0.1
    assert ((p16 > 0.5) == (p32 > 0.5)).mean() > 0.995


def test_the_plan_counts_bf16_activations_at_two_bytes_and_stays_in_the_budget(monkeypatch):
    """Where the budget binds (a wide plane), the bf16 copy gets larger tiles or chunks than fp32,
    and its estimate still fits the budget; fp32 is planned as before."""
    from ctpore.pipelines.budget import plan_budget
    from ctpore.pipelines.stream_plan import plan_for_device, plan_streaming, plan_tiles

    model = PoreFormer().eval()
    shape = (1024, 1024, 1024)
    budget = plan_budget(shape, 1.5)[1]
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: True)
    half = plan_for_device(model, shape, budget, precision="auto")
    full = plan_for_device(model, shape, budget, precision="fp32")
    assert full == plan_streaming(model, shape, budget)
    assert half[0] * half[0] * half[1] > full[0] * full[0] * full[1]
    tiles = plan_tiles(1024, 1024, half[0], model.halo)
    window = max((w[1] - w[0], w[3] - w[2]) for _c, w in tiles)
    need = model.inference_bytes(window, (half[0], half[0]), half[1], dtype_bytes=2)
    assert need <= budget < model.inference_bytes(window, (half[0], half[0]), half[1])


# -- the kernel's own boundary ------------------------------------------------------------------


def _compile(cc: str, flags: list, out, src) -> bool:
    import subprocess

    return subprocess.run([cc, *flags, "-o", str(out), str(src), "-lm"], capture_output=True).returncode == 0


def test_the_c_harness_declines_what_the_kernel_is_not_written_for_under_the_sanitizers(tmp_path):
    """tests/c/winattn_harness.c, built with AddressSanitizer and UBSan (float-to-int included) where
    the compiler has them: a window of 0 or 33, more queries than keys, no query, no key/value head,
    H not a multiple of Hkv and a backward column range are each declined (-2) before anything is
    touched; valid problems of every window class match a plain reference; NaN and infinite input run
    with no undefined behaviour. (A run of the kernel as it was before these guards writes out of
    bounds at the first case.)"""
    import subprocess
    from pathlib import Path

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler here")
    src = Path(__file__).parent / "c" / "winattn_harness.c"
    exe = tmp_path / "harness"
    sanitized = ["-O1", "-g", "-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all",
                 "-Wno-psabi"]
    if not _compile(cc, sanitized, exe, src):  # no sanitizer runtime here: the checks of return codes still run
        assert _compile(cc, ["-O2", "-Wno-psabi"], exe, src), "the harness does not build"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60,
                         env={"ASAN_OPTIONS": "detect_leaks=0", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


@needs_kernel
@pytest.mark.parametrize("case", ["window 0", "window 33", "more queries than keys", "no key/value head",
                                  "H not a multiple of Hkv", "keys on another device", "head size 8"])
def test_the_python_side_declines_each_shape_the_kernel_is_not_written_for(case):
    """Each shape the kernel is not written for is answered None (PyTorch's kernel runs instead) before
    the C entry is called; the C entry declines them too (the harness above)."""
    q = torch.randn(3, 4, 4, 16)
    k = v = torch.randn(3, 6, 1, 16)
    window = 8
    if case == "window 0":
        window = 0
    elif case == "window 33":
        window = 33
    elif case == "more queries than keys":
        q = torch.randn(3, 7, 4, 16)
    elif case == "no key/value head":
        k = v = torch.randn(3, 6, 0, 16)
    elif case == "H not a multiple of Hkv":
        k = v = torch.randn(3, 6, 3, 16)
    elif case == "keys on another device":
        k = torch.randn(3, 6, 1, 16, device="meta")
    else:
        q, k, v = torch.randn(3, 4, 4, 8), torch.randn(3, 6, 1, 8), torch.randn(3, 6, 1, 8)
    assert window_kernel.window_attention(q, k, v, window) is None
    assert window_kernel.window_attention(torch.randn(3, 4, 4, 16), torch.randn(3, 6, 1, 16),
                                          torch.randn(3, 6, 1, 16), 8) is not None  # the valid one runs


@needs_kernel
def test_non_finite_input_runs_and_stays_in_its_column():
    """A NaN in one column's queries gives NaN in that column only: no undefined behaviour spills
    into the others (the harness checks the same under UBSan)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(40, 16, 4, 16, generator=g)
    k, v = torch.randn(2, 40, 23, 1, 16, generator=g)
    q[7, 3, 1, 5] = float("nan")
    k[9, 2, 0, 0] = float("inf")
    out = window_kernel.window_attention(q, k, v, 8)
    clean = [i for i in range(40) if i not in (7, 9)]
    torch.testing.assert_close(out[clean].double(), reference(q[clean], k[clean], v[clean], 8),
                               rtol=1e-5, atol=1e-5)
