"""PoreFormer: shapes, backends agree, exact causality, halo, z encoding in V, guard, config."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
import yaml

from ctpore.errors import InputError, NonFiniteError
from ctpore.models import PoreFormer, PoreFormerConfig
from ctpore.models.attention import attention_entropy
from ctpore.models.backends import flash_available
from ctpore.models.blocks import z_features
from ctpore.models.poreformer_forward import forward_pass

HAS_FLASH = torch.cuda.is_available() and flash_available()

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def small(**kw) -> PoreFormerConfig:
    """A small config for fast tests: head size 8 everywhere; levels at 1/2 and 1/4 (attention at
    1/4), two full-resolution blocks; no windows unless asked."""
    base = dict(d_model=32, n_heads=4, n_kv_heads=None, n_layers=2, window=None, stem_channels=4,
                level_channels=(8, 32), level_attention=(0, 1), level_window=None)
    base.update(kw)
    return PoreFormerConfig(**base)


def pair(cfg: PoreFormerConfig, backend: str, seed: int = 0) -> tuple[PoreFormer, PoreFormer]:
    torch.manual_seed(seed)
    ref = PoreFormer(dataclasses.replace(cfg, attention_backend="math")).eval()
    other = PoreFormer(dataclasses.replace(cfg, attention_backend=backend)).eval()
    other.load_state_dict(ref.state_dict())
    return ref, other


def vol(b=1, z=12, y=20, x=20, seed=0) -> torch.Tensor:
    return torch.randn(b, z, y, x, generator=torch.Generator().manual_seed(seed))


def test_default_model_shape_and_tiling_grid():
    model = PoreFormer().eval()
    assert model.n_params() == sum(p.numel() for p in model.parameters())
    x = vol(2, 5, 9, 11)  # a plane smaller than one cell of the coarsest grid
    with torch.no_grad():
        y = model(x)
    assert y.shape == x.shape and y.dtype == torch.float32
    cfg = model.config
    assert model.align == 2 ** len(cfg.level_channels) and model.halo % model.align == 0
    assert model.token_halo == 0 and model.attention_backend == "sdpa"
    assert model.attention_block_names == ["level2.0", "level3.0", "blocks.0"]


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("window", [None, 3])
def test_backends_agree_fp32(window, n_kv_heads):
    ref, sdpa = pair(small(window=window, n_kv_heads=n_kv_heads), "sdpa")
    x = vol()
    with torch.no_grad():
        torch.testing.assert_close(sdpa(x), ref(x), atol=1e-5, rtol=0)


@pytest.mark.skipif(not HAS_FLASH, reason="needs CUDA (cc >= 8) and flash-attn")
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("window", [None, 3])
def test_flash_error_at_most_twice_plain_pytorch(window, n_kv_heads):
    ref, fl = pair(small(window=window, n_kv_heads=n_kv_heads), "flash")
    ref, fl = ref.cuda(), fl.cuda()
    x = vol().cuda()
    with torch.no_grad():
        truth = ref(x)
        low_ref = copy.deepcopy(ref).half()
        err_plain = (low_ref(x.half()).float() - truth).abs().max().item()
        err_flash = (fl.half()(x.half()).float() - truth).abs().max().item()
    assert err_flash <= 2 * err_plain


@pytest.mark.parametrize("n_kv_heads", [None, 1])
def test_sdpa_bf16_error_at_most_twice_plain_pytorch(n_kv_heads):
    ref, sdpa = pair(small(window=4, n_kv_heads=n_kv_heads), "sdpa")
    x = vol().bfloat16()
    with torch.no_grad():
        ref_bf16 = copy.deepcopy(ref).bfloat16()
        truth = copy.deepcopy(ref_bf16).float()(x.float())  # fp32 on the same rounded weights
        err_plain = (ref_bf16(x).float() - truth).abs().max().item()
        err_sdpa = (sdpa.bfloat16()(x).float() - truth).abs().max().item()
    assert err_plain > 0
    assert err_sdpa <= 2 * err_plain, (err_sdpa, err_plain)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("window", [None, 3])
def test_causality_is_exact(backend, window):
    torch.manual_seed(0)
    model = PoreFormer(small(window=window, attention_backend=backend)).eval()
    x = vol()
    with torch.no_grad():
        base = model(x)
        for z in (0, 4, 10):
            x2 = x.clone()
            x2[:, z + 1 :] = torch.randn_like(x2[:, z + 1 :]) * 3
            y2 = model(x2)
            assert torch.equal(y2[:, : z + 1], base[:, : z + 1])
            assert not torch.equal(y2[:, z + 1 :], base[:, z + 1 :])  # the change reached later


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_window_bounds_how_far_back_the_output_reaches(backend):
    window, layers, level_window = 3, 2, 2
    torch.manual_seed(0)
    model = PoreFormer(small(window=window, n_layers=layers, level_window=level_window,
                             attention_backend=backend)).eval()
    x = vol()
    # slices back that slice z can depend on: the windows of the stacked attention blocks add up
    reach = layers * (window - 1) + (level_window - 1)
    z = 10
    with torch.no_grad():
        base = model(x)
        far = x.clone()
        far[:, : z - reach] += 5.0  # beyond the reach of slice z
        assert torch.equal(model(far)[:, z], base[:, z])
        near = x.clone()
        near[:, z - reach] += 5.0  # just inside it
        assert not torch.equal(model(near)[:, z], base[:, z])


@pytest.mark.parametrize("levels", [(8, 32), (8, 8, 16)])
def test_halo_is_the_in_plane_receptive_field(levels):
    torch.manual_seed(0)
    model = PoreFormer(small(level_channels=levels, level_attention=(0,) * (len(levels) - 1) + (1,))).eval()
    h = model.halo
    size = 2 * h + 2 * model.align + 1
    x = vol(1, 6, size, size)
    cy = cx = size // 2
    with torch.no_grad():
        base = model(x)
        x2 = x.clone()
        x2[0, 2, cy, cx] += 4.0
        changed = (model(x2) != base)[0].any(0)  # (Y, X) any slice changed
    ys, xs = torch.nonzero(changed, as_tuple=True)
    cheb = torch.maximum((ys - cy).abs(), (xs - cx).abs())
    # within the halo (tiles stitch exactly), and the halo not much wider than the reach (it is a
    # bound: how far a stride-2 conv or an upsampling reaches depends on the pixel's parity)
    assert 0.75 * h < cheb.max().item() <= h


def test_z_encoding_is_added_into_v():
    torch.manual_seed(0)
    model = PoreFormer(small()).eval()
    attn = model.blocks[0].attn
    token = torch.randn(1, 1, 32).expand(2, 15, 32).contiguous()  # equal content at every z
    zf = z_features(0, 15, model.config.pos_features, model.config.pos_max_period)
    with torch.no_grad():
        q, k, v = attn.project(token, model.blocks[0].pos(zf))
    assert torch.equal(q[:, 3], q[:, 12]) and torch.equal(k[:, 3], k[:, 12])
    assert not torch.allclose(v[:, 3], v[:, 12])  # depth shows up in V only

    x = vol()
    with torch.no_grad():
        base = model(x)
        for blk in [*model.blocks, *model.level_blocks[1]]:
            blk.pos.weight.zero_()
        assert not torch.allclose(model(x), base, atol=1e-4)
        # without the encoding, shifting the absolute depth changes nothing ...
        torch.testing.assert_close(model(x, z0=500), model(x), atol=1e-6, rtol=0)
    # ... with it, it does
    torch.manual_seed(0)
    model = PoreFormer(small()).eval()
    with torch.no_grad():
        assert not torch.allclose(model(x, z0=500), model(x), atol=1e-4)
    assert not any("pos" in n for n, _ in PoreFormer(small(pos_in_v=False)).named_parameters())


def test_z_features_match_numpy_for_deep_slices():
    z0, n, f, period = 9_990, 20, 16, 10_000.0
    got = z_features(z0, n, f, period).double().numpy()
    z = np.arange(z0, z0 + n, dtype=np.float64)[:, None]
    freqs = period ** (-np.arange(f // 2) / (f // 2))
    want = np.concatenate([np.sin(z * freqs), np.cos(z * freqs)], axis=1)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_nonfinite_guard_names_layer_and_tensor():
    torch.manual_seed(0)
    # math backend: PyTorch's CPU SDPA kernel turns an all-NaN query row into zeros, silently
    # (one more reason for the guard), so only the math path shows NaN flowing through.
    model = PoreFormer(small(attention_backend="math"))
    x = vol(1, 5, 6, 7)
    with torch.no_grad():
        model.blocks[1].attn.qkv.weight[0, :] = float("nan")  # channel 0 of q, every token
    n = 5 * 6 * 7
    model.train()  # on by default in training
    msg = rf"^layer blocks\.1\.attn: q has {n} non-finite values$"
    with pytest.raises(NonFiniteError, match=msg):
        model(x)
    model.eval()  # off by default in eval: NaN flows through
    with torch.no_grad():
        assert torch.isnan(model(x)).any()
    model.config.check_finite = True  # switchable
    with pytest.raises(NonFiniteError, match=r"blocks\.1\.attn: q"):
        with torch.no_grad():
            model(x)

    model = PoreFormer(small(check_finite=True)).eval()
    with torch.no_grad():
        model.blocks[0].pos.weight.fill_(float("inf"))
    with pytest.raises(NonFiniteError, match=r"^layer blocks\.0\.attn: v has"):
        with torch.no_grad():
            model(x)
    model = PoreFormer(small(check_finite=True)).eval()
    bad = x.clone()
    bad[0, 1, 2, 3] = float("nan")
    with pytest.raises(NonFiniteError, match=r"^layer encoder: output has"):
        with torch.no_grad():
            model(bad)


def test_attention_maps_per_layer_and_head():
    torch.manual_seed(0)
    cfg = small(window=4, attention_backend="sdpa")
    model = PoreFormer(cfg).eval()
    x = vol(1, 9, 8, 10)
    maps = model.attention_maps(x)
    assert len(maps) == cfg.n_layers + 1  # the 1/4 level's block, then the full-resolution ones
    for w in maps:
        assert w.shape == (1, 8, 10, cfg.n_heads, 9, 9)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-6, rtol=0)
        zq, zk = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
        assert torch.all(w[..., zk > zq] == 0)
    for w in maps[1:]:  # the full-resolution blocks' window
        assert torch.all(w[..., zk <= zq - 4] == 0)
    coarse = maps[0]  # a 1/4-resolution column serves the 4 x 4 pixels it covers
    torch.testing.assert_close(coarse[:, 4:8, 4:8], coarse[:, 4:5, 4:5].expand(-1, 4, 4, -1, -1, -1))
    for w, keys in zip(maps, (9, 4, 4)):  # at most 9 earlier slices at 1/4, 4 in the window
        ent = attention_entropy(w.reshape(-1, cfg.n_heads, 9, 9))
        assert ent.shape == (cfg.n_heads,)
        assert torch.all(ent >= 0) and torch.all(ent <= math.log(keys) + 1e-6)
    point = model.attention_maps(x, region=(3, 5))
    torch.testing.assert_close(point[1], maps[1][:, 3:4, 5:6])
    with torch.no_grad():  # the math path behind the maps gives the same logits
        torch.testing.assert_close(forward_pass(model, x, 0, None, True)[0], model(x), atol=1e-5, rtol=0)


def test_training_step_reaches_every_parameter():
    torch.manual_seed(0)
    model = PoreFormer(small(window=3, dropout=0.1)).train()
    x = vol(2, 6, 8, 8)
    target = (x > 0).float()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), target)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_config_yaml_describes_the_shipped_model_field_by_field():
    from ctpore.models.poreformer_config import SHIPPED_CONFIG
    from ctpore.models.weights import default_weights_path, read_metadata

    data = yaml.safe_load(SHIPPED_CONFIG.read_text())["model"]
    fields = {f.name for f in dataclasses.fields(PoreFormerConfig)}
    assert set(data) == fields
    shipped = default_weights_path()
    if shipped is None:
        pytest.skip("no shipped weights")
    assert PoreFormerConfig.from_yaml() == PoreFormerConfig.from_dict(read_metadata(shipped)["config"])
    cfg = PoreFormerConfig(window=8, n_kv_heads=2, level_channels=[4, 8], level_attention=[0, 1])
    assert PoreFormerConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.level_channels == (4, 8)
    assert PoreFormerConfig() == PoreFormerConfig.from_yaml()  # the defaults are the shipped model


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"d_model": 30, "n_heads": 4}, "divisible by n_heads, got 30 and 4"),
        ({"window": 0}, "window must be"),
        ({"level_attention": (0, 1)}, "level_attention needs one count >= 0 per level"),
        ({"level_channels": (8, 30, 64), "level_attention": (0, 1, 0)}, "divisible by n_heads, got 30 and 4"),
        ({"attention_backend": "fast"}, "got 'fast'"),
    ],
)
def test_bad_config_raises_input_error(kw, match):
    with pytest.raises(InputError, match=match):
        PoreFormer(PoreFormerConfig(**kw))


def test_bad_input_raises_input_error():
    model = PoreFormer(small())
    with pytest.raises(InputError, match=r"\(B, Z, Y, X\)"):
        model(torch.zeros(4, 5, 6))
    with pytest.raises(InputError, match="float"):
        model(torch.zeros(1, 4, 5, 6, dtype=torch.int64))
    with pytest.raises(InputError, match="unknown PoreFormer config keys: colour"):
        PoreFormerConfig.from_dict({"colour": 1})
