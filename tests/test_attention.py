"""The attention engine: backends against the explicit reference, masks, cache, diagnostics."""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest
import torch

from ctpore.errors import InputError, NonFiniteError
from ctpore.models.kv_cache import KVCache
from ctpore.models.attention import MultiHeadAttention, attention_entropy, check_finite
from ctpore.models.attention_dispatch import causal_mask
from ctpore.models.backends import flash_available, resolve_backend

D_MODEL, N_HEADS = 32, 4  # head size 8 (flash-attn needs a multiple of 8)


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


HAS_FLASH = torch.cuda.is_available() and flash_available()
needs_flash = pytest.mark.skipif(not HAS_FLASH, reason="needs CUDA (cc >= 8) and flash-attn")


def make_pair(backend_b: str, **kw) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    """The math reference and another backend holding the same weights."""
    torch.manual_seed(0)
    ref = MultiHeadAttention(D_MODEL, N_HEADS, backend="math", **kw).eval()
    other = MultiHeadAttention(D_MODEL, N_HEADS, backend=backend_b, **kw).eval()
    other.load_state_dict(ref.state_dict())
    return ref, other


def allowed_by_loops(zq: int, zk: int, window: int | None) -> torch.Tensor:
    """Independent, loop-written truth of which keys each query may see (bottom-right)."""
    out = torch.zeros(zq, zk, dtype=torch.bool)
    for i in range(zq):
        p = i + zk - zq
        for j in range(zk):
            out[i, j] = j <= p and (window is None or j >= p - window + 1)
    return out


def reference_float64(mha: MultiHeadAttention, x: torch.Tensor, window: int | None) -> torch.Tensor:
    """Per-head loops in float64 from the packed weights: the definition, written out."""
    w = mha.qkv.weight.double()
    b = mha.qkv.bias.double()
    d, hd, h, hkv = mha.d_model, mha.head_dim, mha.n_heads, mha.n_kv_heads
    x = x.double()
    q = x @ w[:d].T + b[:d]
    k = x @ w[d : d + hkv * hd].T + b[d : d + hkv * hd]
    v = x @ w[d + hkv * hd :].T + b[d + hkv * hd :]
    z = x.shape[1]
    allowed = allowed_by_loops(z, z, window)
    heads = []
    for head in range(h):
        g = head // (h // hkv)  # kv head serving this query head
        qh = q[..., head * hd : (head + 1) * hd]
        kh = k[..., g * hd : (g + 1) * hd]
        vh = v[..., g * hd : (g + 1) * hd]
        s = qh @ kh.transpose(1, 2) / math.sqrt(hd)
        s = s.masked_fill(~allowed, float("-inf"))
        heads.append(torch.softmax(s, -1) @ vh)
    o = torch.cat(heads, -1)
    return o @ mha.proj.weight.double().T + mha.proj.bias.double()


def test_causal_mask_matches_loops():
    for zq, zk in [(5, 5), (1, 6), (3, 8)]:
        for window in (None, 1, 2, 4, 10):
            assert torch.equal(causal_mask(zq, zk, window), allowed_by_loops(zq, zk, window))


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("window", [None, 3])
def test_math_equals_per_head_reference(window, n_kv_heads):
    torch.manual_seed(1)
    mha = MultiHeadAttention(D_MODEL, N_HEADS, n_kv_heads, window=window, backend="math").eval()
    x = torch.randn(3, 9, D_MODEL)
    with torch.no_grad():
        out = mha(x)
    torch.testing.assert_close(out.double(), reference_float64(mha, x, window), atol=1e-5,
                               rtol=0)


@pytest.mark.parametrize("window", [None, 1, 3])
@pytest.mark.parametrize("zq_zk", [(7, 7), (2, 7)])
def test_math_weights_are_causal_windowed_and_normalized(window, zq_zk):
    zq, zk = zq_zk
    mha = MultiHeadAttention(D_MODEL, N_HEADS, window=window, backend="math").eval()
    cache = KVCache(None)  # keep everything so the queries see zk keys
    x = torch.randn(2, zk, D_MODEL)
    with torch.no_grad():
        if zk > zq:
            mha(x[:, : zk - zq], cache=cache)
        _, w = mha(x[:, zk - zq :], cache=cache, need_weights=True)
    assert w.shape == (2, N_HEADS, zq, zk)
    allowed = allowed_by_loops(zq, zk, window)
    assert torch.all(w[..., ~allowed] == 0)  # exactly zero above the diagonal / outside W
    assert torch.all(w[..., allowed] > 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, N_HEADS, zq), atol=1e-6, rtol=0)


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("window", [None, 3])
def test_sdpa_equals_math_fp32(window, n_kv_heads):
    ref, sdpa = make_pair("sdpa", n_kv_heads=n_kv_heads, window=window)
    x = torch.randn(4, 11, D_MODEL)
    with torch.no_grad():
        torch.testing.assert_close(sdpa(x), ref(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("n_kv_heads", [None, 1])
@pytest.mark.parametrize("window", [None, 1, 4])
def test_kv_cache_chunks_equal_full_pass(backend, window, n_kv_heads):
    """Queries shorter than keys: the cache path must align causality bottom-right."""
    ref, mha = make_pair(backend, n_kv_heads=n_kv_heads, window=window)
    x = torch.randn(3, 13, D_MODEL)
    with torch.no_grad():
        full = ref(x)
        for chunk in (1, 5):
            cache = KVCache(window)
            parts = [mha(x[:, z : z + chunk], cache=cache) for z in range(0, 13, chunk)]
            torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n_kv_heads", [None, 1])
@pytest.mark.parametrize("window", [None, 1, 4])
def test_kv_cache_in_bands_of_sequences_equals_whole_chunks(window, n_kv_heads):
    """A chunk processed in bands of sequences (committed once per chunk) = the whole chunk."""
    ref, mha = make_pair("sdpa", n_kv_heads=n_kv_heads, window=window)
    x = torch.randn(7, 13, D_MODEL)
    with torch.no_grad():
        full = ref(x)
        cache, parts = KVCache(window), []
        for z in range(0, 13, 5):
            chunk = x[:, z : z + 5]
            bands = [mha(chunk[r : r + 3], cache=cache, cache_rows=slice(r, min(7, r + 3)), n_rows=7)
                     for r in range(0, 7, 3)]
            cache.commit(chunk.shape[1])
            parts.append(torch.cat(bands))
        torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


def test_one_kv_head_as_rows_equals_the_math_path():
    """Multi-query attention on CPU runs the heads as rows of one problem; same numbers."""
    ref, mha = make_pair("sdpa", n_kv_heads=1, window=3)
    x = torch.randn(4, 9, D_MODEL)
    with torch.no_grad():
        torch.testing.assert_close(mha(x), ref(x), atol=1e-5, rtol=0)
    assert mha.ran["sdpa"] == 1 and ref.ran["math"] == 1  # each call records the kernel that ran


@pytest.mark.parametrize("window, expect", [(None, 10), (1, 0), (4, 3), (20, 10)])
def test_kv_cache_keeps_window_minus_one(window, expect):
    mha = MultiHeadAttention(D_MODEL, N_HEADS, window=window, backend="sdpa").eval()
    cache = KVCache(window)
    with torch.no_grad():
        for z in range(0, 10, 3):
            mha(torch.randn(2, min(3, 10 - z), D_MODEL), cache=cache)
    assert len(cache) == expect


@pytest.mark.parametrize("window, chunks", [(8, (8, 8, 3, 8)), (24, (8, 8, 8, 8, 5)), (4, (1, 2, 9)), (1, (3, 3))])
def test_a_cache_read_in_place_then_appended_holds_what_extend_would(window, chunks):
    """past() gives the positions extend() would join before the chunk's, band by band, and append()
    leaves the cache as extend() does: the last window - 1 positions, whatever the chunk sizes."""
    gen = torch.Generator().manual_seed(window)
    seen_k, seen_v = [], []
    a, b = KVCache(window), KVCache(window)
    for zq in chunks:
        k, v = torch.randn(2, 6, zq, 2, 16, generator=gen)
        for rows in (slice(0, 4), slice(4, 6)):  # in bands of the sequences, as a tile streams
            past = a.past(rows)
            k_all, v_all = b.extend(k[rows], v[rows], rows, 6)
            joined = (k[rows], v[rows]) if past is None else (torch.cat([past[0], k[rows]], 1),
                                                              torch.cat([past[1], v[rows]], 1))
            assert torch.equal(joined[0], k_all) and torch.equal(joined[1], v_all)
            a.append(k[rows], v[rows], rows, 6)
        a.commit(zq)
        b.commit(zq)
        seen_k.append(k)
        seen_v.append(v)
        keep = min(window - 1, sum(c.shape[1] for c in seen_k))
        assert len(a) == len(b) == keep
        assert torch.equal(a.k, torch.cat(seen_k, 1)[:, -keep:] if keep else a.k)
        assert torch.equal(a.v, torch.cat(seen_v, 1)[:, -keep:] if keep else a.v)


def low_precision_errors(backend: str, dtype: torch.dtype, device: str, identity: bool = False,
                         **kw):
    """Max error of `backend` and of plain PyTorch (math) in `dtype` against an fp32 reference.

    The reference is the math path in fp32 on the same rounded weights and inputs. With
    ``identity`` the projections are identities (exact in any precision), so the errors are
    those of the attention core alone rather than of the surrounding linear layers.
    """
    ref, other = make_pair(backend, **kw)
    if identity:
        with torch.no_grad():
            kv = ref.kv_dim
            eye = torch.eye(D_MODEL)
            ref.qkv.weight.copy_(torch.cat([eye, eye[:kv], eye[:kv]]))
            ref.qkv.bias.zero_()
            ref.proj.weight.copy_(eye)
            ref.proj.bias.zero_()
        other.load_state_dict(ref.state_dict())
    low_ref = copy.deepcopy(ref).to(device, dtype)
    other = other.to(device, dtype)
    ref32 = copy.deepcopy(low_ref).float()  # fp32 copy of the SAME rounded weights
    gen = torch.Generator().manual_seed(3)
    x = (2 * torch.randn(64, 40, D_MODEL, generator=gen)).to(device, dtype)
    with torch.no_grad():
        truth = ref32(x.float())
        err_backend = (other(x).float() - truth).abs().max().item()
        err_plain = (low_ref(x).float() - truth).abs().max().item()
    return err_backend, err_plain


@pytest.mark.parametrize("identity", [False, True])
@pytest.mark.parametrize("n_kv_heads", [None, 1])
@pytest.mark.parametrize("window", [None, 5])
def test_sdpa_bf16_error_at_most_twice_plain_pytorch(window, n_kv_heads, identity):
    err_sdpa, err_math = low_precision_errors("sdpa", torch.bfloat16, "cpu", identity,
                                              window=window, n_kv_heads=n_kv_heads)
    assert err_math > 1e-3  # bf16 really is coarser than fp32 here
    assert err_sdpa <= 2 * err_math, (err_sdpa, err_math)


@needs_flash
@pytest.mark.parametrize("identity", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("window", [None, 5])
def test_flash_low_precision_error_at_most_twice_plain_pytorch(window, n_kv_heads, dtype,
                                                                identity):
    err_flash, err_math = low_precision_errors("flash", dtype, "cuda", identity, window=window,
                                               n_kv_heads=n_kv_heads)
    assert err_flash <= 2 * err_math, (err_flash, err_math)


@needs_flash
@pytest.mark.parametrize("window", [None, 4])
def test_flash_kv_cache_chunks_equal_full_pass(window):
    ref, fl = make_pair("flash", window=window, n_kv_heads=2)
    ref, fl = ref.cuda().half(), fl.cuda().half()
    x = torch.randn(8, 13, D_MODEL, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        full = ref(x).float()
        cache = KVCache(window)
        out = torch.cat([fl(x[:, z : z + 5], cache=cache) for z in range(0, 13, 5)], 1)
    assert (out.float() - full).abs().max().item() < 1e-2


def test_auto_backend_and_flash_refusal_here():
    if HAS_FLASH:
        assert resolve_backend("auto", 16) == "flash"
    else:
        assert resolve_backend("auto", 16) == "sdpa"
        with pytest.raises(InputError, match="flash"):
            MultiHeadAttention(D_MODEL, N_HEADS, backend="flash")
    with pytest.raises(InputError, match="got 'fast'"):
        resolve_backend("fast")


def test_flash_attn_not_imported_at_module_load():
    code = (
        "import sys, ctpore.models.attention, ctpore.models.poreformer; "
        "print('flash_attn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_dropout_only_while_training():
    torch.manual_seed(0)
    drop = MultiHeadAttention(D_MODEL, N_HEADS, dropout=0.5, backend="sdpa")
    plain = MultiHeadAttention(D_MODEL, N_HEADS, dropout=0.0, backend="sdpa")
    plain.load_state_dict(drop.state_dict())
    x = torch.randn(2, 6, D_MODEL)
    drop.eval()
    with torch.no_grad():
        assert torch.equal(drop(x), plain.eval()(x))
        drop.train()
        assert not torch.allclose(drop(x), drop(x))


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"n_kv_heads": 3}, "n_kv_heads must divide"),
        ({"window": 0}, "window must be"),
        ({"window": 3, "causal": False}, "needs causal"),
        ({"dropout": 1.0}, "dropout must be"),
    ],
)
def test_bad_settings_raise_input_error(kw, match):
    with pytest.raises(InputError, match=match):
        MultiHeadAttention(D_MODEL, N_HEADS, **kw)


def test_attention_entropy_analytic():
    w = torch.zeros(2, 3, 4, 4)
    w[:, 0] = 0.25  # uniform over 4 keys: log 4
    w[:, 1, :, 2] = 1.0  # one key: 0
    w[:, 2, :, :2] = 0.5  # uniform over 2 keys, zeros elsewhere: log 2
    ent = attention_entropy(w)
    torch.testing.assert_close(ent, torch.tensor([math.log(4), 0.0, math.log(2)]))


def test_check_finite_counts_and_names():
    t = torch.zeros(4, 5)
    t[0, 0], t[1, 2], t[3, 4] = float("nan"), float("inf"), float("-inf")
    with pytest.raises(NonFiniteError, match=r"^layer blocks\.1\.attn: q has 3 non-finite values$"):
        check_finite(t, "blocks.1.attn", "q")
    check_finite(torch.zeros(3), "x", "y")  # finite: silent
