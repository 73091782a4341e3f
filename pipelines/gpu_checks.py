"""The checks of ``ctpore bench gpu``, one per child process.

``python -m ctpore.pipelines.gpu_checks STEP '{"device": "cuda:0", ...}'`` runs one check and
prints its result as one JSON line (the last line of stdout); a failure ends the process with the
exception's one line last on stderr. :mod:`ctpore.pipelines.bench.gpu` runs each step this way
with its own timeout, so a hung kernel or an out-of-memory costs that step, not the run. The
module stays out of :mod:`ctpore.pipelines.bench` so that a child imports only torch, numpy and
the model (not the scan readers), and every check also runs on CPU (the tests run them there).

Steps
-----
``versions``     torch, CUDA, cuDNN, the GPU, flash-attn importable or why not, host memory in use.
``kernels``      the attention kernel alone (identity projections, two streamed chunks with a KV
                 cache): flash (flash-attn), sdpa and each of PyTorch's SDPA kernels forced in
                 turn, in bf16, against the math path in fp32 with TF32 off; the bound of
                 flash-attention's own tests (a kernel's error at most twice plain PyTorch's in the
                 same precision) and the direct flash - sdpa difference.
``sdpa_kernel``  which of PyTorch's SDPA kernels ran inside the shipped model: the aten operators and
                 GPU kernels the profiler saw, and which kernels accept the model's calls when
                 forced one at a time (``torch.nn.attention.sdpa_kernel``).
``model``        the shipped model on a simulated scan: each backend in bf16 (the real autocast
                 path of ``predict``) against the math path in fp32 with TF32 off, same bound.
``speed``        the model alone on a random volume with the plan ``reconstruct`` would take on
                 this device (:func:`~ctpore.pipelines.stream_plan.plan_for_device`): voxels per second,
                 the GPU's peak memory against the estimate.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections import Counter
from contextlib import contextmanager, nullcontext
from typing import Callable

import numpy as np
import torch

from ctpore.errors import InputError

__all__ = ["STEPS", "main", "tf32_off"]


@contextmanager
def tf32_off():
    """fp32 matrix products and convolutions in full fp32 (CUDA's TF32 off), restored after."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def _on(dev: torch.device):
    return torch.cuda.device(dev) if dev.type == "cuda" else nullcontext()


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _gb(n: float) -> float:
    return round(float(n) / 2**30, 3)


# --------------------------------------------------------------------------------------------
def versions(args: dict) -> dict:
    """What this machine runs: versions, the GPU, flash-attn, which packages import."""
    import importlib.metadata
    import importlib.util
    import platform

    from ctpore.version import __version__
    from ctpore.models.backends import load_flash
    from ctpore.runtime import current_rss

    dev = torch.device(args["device"])
    info = {"ctpore": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "numpy": np.__version__,
            "device": str(dev), "cuda_available": torch.cuda.is_available()}
    if dev.type == "cuda":
        with _on(dev):
            props = torch.cuda.get_device_properties(dev)
            free, total = torch.cuda.mem_get_info(dev)
            info.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                        multiprocessors=props.multi_processor_count, gpu_memory_gb=_gb(total),
                        gpu_free_gb=_gb(free), gpu_count=torch.cuda.device_count())
    fn, why = load_flash()
    try:
        flash_version = importlib.metadata.version("flash-attn")
    except importlib.metadata.PackageNotFoundError:
        flash_version = None
    info["flash_attn"] = {"importable": fn is not None, "version": flash_version, "why_not": why or None}
    info["sdpa_enabled"] = {name: bool(getattr(torch.backends.cuda, f"{name}_sdp_enabled")())
                            for name in ("flash", "mem_efficient", "cudnn", "math")
                            if hasattr(torch.backends.cuda, f"{name}_sdp_enabled")}
    info["tf32_default"] = {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32}
    info["host_rss_gb"] = _gb(current_rss())  # with CUDA initialised: what --memory-gb must leave room for
    info["packages"] = {m: importlib.util.find_spec(m) is not None
                        for m in ("nibabel", "tifffile", "scipy", "skimage", "safetensors", "yaml", "click",
                                  "tqdm", "monai", "pytest")}
    return info


# --------------------------------------------------------------------------------------------
def _identity_attention(backend: str, d_model: int, n_heads: int, n_kv_heads: int | None, window: int | None):
    """A MultiHeadAttention whose projections are identities: its output is the kernel's, exactly
    (a product by 1 is exact in any precision)."""
    from ctpore.models.attention import MultiHeadAttention

    m = MultiHeadAttention(d_model, n_heads, n_kv_heads, causal=True, window=window, backend=backend).eval()
    with torch.no_grad():
        eye = torch.eye(d_model)
        m.qkv.weight.copy_(torch.cat([eye, eye[: m.kv_dim], eye[: m.kv_dim]]))
        m.qkv.bias.zero_()
        m.proj.weight.copy_(eye)
        m.proj.bias.zero_()
    return m


def _kernel_case(dev: torch.device, d_model: int, n_heads: int, n_kv_heads: int | None, window: int | None,
                 columns: int, chunk: int) -> dict:
    from ctpore.models.kv_cache import KVCache

    gen = torch.Generator().manual_seed(3)
    x = (2 * torch.randn(2, columns, chunk, d_model, generator=gen)).to(dev, torch.bfloat16)  # two chunks

    def run(m, dtype) -> torch.Tensor:  # both chunks, the second with the first in the cache
        cache = KVCache(window)
        return torch.stack([m(x[i].to(dtype), cache=cache) for i in range(2)]).float()

    res: dict = {"columns": columns, "chunk": chunk, "n_heads": n_heads, "n_kv_heads": n_kv_heads or n_heads,
                 "window": window, "head_dim": d_model // n_heads}
    with torch.inference_mode():
        with tf32_off():
            truth = run(_identity_attention("math", d_model, n_heads, n_kv_heads, window).to(dev), torch.float32)
        plain = run(_identity_attention("math", d_model, n_heads, n_kv_heads, window).to(dev, torch.bfloat16),
                    torch.bfloat16)
        bound = float((plain - truth).abs().max())
        res["math_bf16_error"] = bound
        outs = {}
        for backend in ("sdpa", "flash"):
            try:
                m = _identity_attention(backend, d_model, n_heads, n_kv_heads, window).to(dev, torch.bfloat16)
            except InputError as exc:
                res[backend] = {"available": False, "why": _said(exc)}
                continue
            outs[backend] = run(m, torch.bfloat16)
            err = float((outs[backend] - truth).abs().max())
            res[backend] = {"available": True, "error": err, "within_twice_math": err <= 2 * bound, "ran": dict(m.ran)}
        if len(outs) == 2:
            res["flash_minus_sdpa"] = float((outs["flash"] - outs["sdpa"]).abs().max())
        res["sdpa_kernels"] = {}
        m = _identity_attention("sdpa", d_model, n_heads, n_kv_heads, window).to(dev, torch.bfloat16)
        for name, kernel in _sdpa_backends():
            with _why_not() as why:
                with _force(kernel):
                    err = float((run(m, torch.bfloat16) - truth).abs().max())
                res["sdpa_kernels"][name] = {"error": err, "within_twice_math": err <= 2 * bound}
            if why:
                res["sdpa_kernels"][name] = {"refused": why[0]}
    return res


def kernel_agreement(args: dict) -> dict:
    """The attention kernel alone, as PoreFormer calls it at full resolution and at its levels."""
    from ctpore.models.poreformer_config import PoreFormerConfig

    dev = torch.device(args["device"])
    cfg = PoreFormerConfig()
    columns, chunk = int(args.get("columns", 4096)), int(args.get("chunk", 32))
    with _on(dev):
        return {
            "full_resolution": _kernel_case(dev, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.window, columns, chunk),
            "levels": _kernel_case(dev, cfg.level_channels[-1], cfg.n_heads, None, cfg.level_window, columns, chunk),
        }


# --------------------------------------------------------------------------------------------
def _sdpa_backends() -> list[tuple[str, object]]:
    from torch.nn.attention import SDPBackend

    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
    return [(n.lower(), getattr(SDPBackend, n)) for n in names if hasattr(SDPBackend, n)]


def _force(kernel):
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel([kernel])


def _line(exc: BaseException | Warning | str, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _said(exc: InputError) -> str:
    """An input error's line with its file named, not its folder: the JSON goes into ``docs/``, which
    never names a path of the machine that wrote it."""
    return f"{exc.path.name}: {exc.message}" if exc.path is not None else exc.message


@contextmanager
def _why_not():
    """Run a forced kernel: an exception inside is swallowed and its line, with the reasons
    PyTorch gave in warnings ("... not used because ..."), put in the list this yields."""
    why: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield why
        except Exception as exc:  # any refusal is a result here, not a failure
            reasons = [_line(w.message, 160) for w in caught if "because" in str(w.message)][:3]
            why.append(_line("; ".join([f"{type(exc).__name__}: {_line(exc, 160)}", *reasons]), 600))


#: aten operators of PyTorch's SDPA kernels (what ``scaled_dot_product_attention`` dispatches to).
SDPA_OPERATORS = {
    "aten::_scaled_dot_product_flash_attention": "flash (PyTorch's)",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (PyTorch's, CPU)",
    "aten::_scaled_dot_product_efficient_attention": "mem-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
    "aten::_scaled_dot_product_attention_math": "math",
}


def sdpa_kernel_ran(args: dict) -> dict:
    """Which SDPA kernel served the shipped model's sdpa calls (profiler), and which accept them."""
    from torch.profiler import ProfilerActivity, profile

    from ctpore.models.weights import default_weights_path, load_model
    from ctpore.pipelines.stream import predict

    dev = torch.device(args["device"])
    shape = tuple(args.get("shape", (16, 256, 256)))
    vol = np.random.default_rng(0).random(shape, dtype=np.float32)
    with _on(dev):
        model = load_model(default_weights_path(), device=dev, attention_backend="sdpa")
        run = lambda: predict(model, vol, chunk_slices=shape[0], tile=max(shape[1:]), device=dev)  # noqa: E731
        run()  # warm-up
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=activities) as prof:
            run()
            _sync(dev)
        ops = Counter()
        kernels = Counter()
        for e in prof.key_averages():
            if e.key in SDPA_OPERATORS:
                ops[e.key] += e.count
            elif dev.type == "cuda" and any(s in e.key.lower() for s in ("fmha", "flash", "attention", "cudnn")) \
                    and not e.key.startswith("aten::"):
                kernels[e.key[:120]] += e.count
        accepted = {}
        for name, kernel in _sdpa_backends():
            with _why_not() as why:
                with _force(kernel):
                    run()
                accepted[name] = True
            if why:
                accepted[name] = why[0]
    ran = [SDPA_OPERATORS[k] for k, _n in ops.most_common()]
    return {"shape": list(shape), "precision": "auto", "ran": "+".join(ran) or "none", "operators": dict(ops),
            "gpu_kernels": dict(kernels.most_common(8)), "accepted_when_forced": accepted,
            "how": "torch.profiler: the aten::_scaled_dot_product_* operators (and GPU kernels) of one predict call; "
                   "then each SDPA kernel forced alone with torch.nn.attention.sdpa_kernel"}


# --------------------------------------------------------------------------------------------
def model_agreement(args: dict) -> dict:
    """The shipped model on a simulated scan: each backend in bf16 against math in fp32, TF32 off."""
    from ctpore.data.normalize import normalize_volume
    from ctpore.data.synthetic import make_pair
    from ctpore.models.weights import default_weights_path, load_model
    from ctpore.pipelines.stream import predict

    dev = torch.device(args["device"])
    shape = tuple(args.get("shape", (32, 256, 256)))
    scan, _truth, _info = make_pair(int(args.get("seed", 2000000)), shape=shape)
    vol = normalize_volume(scan)
    chunk, tile = min(16, shape[0]), max(shape[1:])
    path = default_weights_path()
    res: dict = {"shape": list(shape), "chunk_slices": chunk, "tile": tile, "compared": "probabilities"}
    with _on(dev):
        with tf32_off():
            truth = predict(load_model(path, device=dev, attention_backend="math"), vol, chunk, tile, dev,
                            precision="fp32")
            sdpa32 = load_model(path, device=dev, attention_backend="sdpa")
            sdpa_out = predict(sdpa32, vol, chunk, tile, dev, precision="fp32")
            res["sdpa_fp32_error"] = float(np.abs(sdpa_out - truth).max())
        outs = {}
        for backend in ("math", "sdpa", "flash"):
            try:
                model = load_model(path, device=dev, attention_backend=backend)
            except InputError as exc:
                res[backend] = {"available": False, "why": _said(exc)}
                continue
            model.reset_backends_ran()
            outs[backend] = predict(model, vol, chunk, tile, dev, precision="bf16")
            d = np.abs(outs[backend] - truth)
            res[backend] = {"available": True, "max_abs_error_bf16": float(d.max()),
                            "mean_abs_error_bf16": float(d.mean()),
                            "ran": model.backends_ran()}
    bound = res["math"]["max_abs_error_bf16"]
    for backend in ("sdpa", "flash"):
        if res[backend].get("available"):
            res[backend]["within_twice_math"] = res[backend]["max_abs_error_bf16"] <= 2 * bound
    if "flash" in outs and "sdpa" in outs:
        res["flash_minus_sdpa"] = float(np.abs(outs["flash"] - outs["sdpa"]).max())
    return res


def model_speed(args: dict) -> dict:
    """The model alone (``predict``, input in memory) with the plan this device gets."""
    from ctpore.models.weights import default_weights_path, load_model
    from ctpore.pipelines.stream_plan import plan_for_device, plan_tiles
    from ctpore.pipelines.precision import precision_name
    from ctpore.pipelines.stream import predict

    dev = torch.device(args["device"])
    shape = tuple(int(s) for s in args.get("shape", (256, 1024, 1024)))
    host_budget = float(args.get("host_gb", 64.0)) * 2**30
    vol = np.random.default_rng(0).random(shape, dtype=np.float32)
    out = np.empty(shape, np.float32)
    with _on(dev):
        model = load_model(default_weights_path(), device=dev)
        tile, chunk = plan_for_device(model, shape, host_budget, dev, args.get("gpu_memory_gb"))
        tile_ = -(-tile // model.align) * model.align
        window = max((w[1] - w[0], w[3] - w[2]) for _c, w in plan_tiles(shape[1], shape[2], tile_, model.halo))
        estimate = model.inference_bytes(window, (min(tile_, shape[1]), min(tile_, shape[2])), chunk, device=dev)
        warm = min(shape[0], 2 * chunk)
        predict(model, vol[:warm], chunk, tile, dev, out=out[:warm])
        _sync(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        model.reset_backends_ran()
        t = time.perf_counter()
        predict(model, vol, chunk, tile, dev, out=out)
        _sync(dev)
        dt = time.perf_counter() - t
    res = {"shape": list(shape), "tile": tile, "chunk_slices": chunk, "seconds": round(dt, 3),
           "voxels_per_s": float(np.prod(shape)) / dt, "ran": model.backends_ran(),
           "precision": precision_name("auto", dev), "estimate_gb": _gb(estimate)}
    if dev.type == "cuda":
        res.update(gpu_peak_gb=_gb(torch.cuda.max_memory_allocated(dev)),
                   gpu_peak_reserved_gb=_gb(torch.cuda.max_memory_reserved(dev)))
    return res


STEPS: dict[str, Callable[[dict], dict]] = {
    "versions": versions,
    "kernels": kernel_agreement,
    "sdpa_kernel": sdpa_kernel_ran,
    "model": model_agreement,
    "speed": model_speed,
}


def main(argv: list[str] | None = None) -> None:
    """``python -m ctpore.pipelines.gpu_checks STEP [JSON]``: print the step's result as one JSON line."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in STEPS:
        raise SystemExit(f"usage: python -m ctpore.pipelines.gpu_checks {{{','.join(STEPS)}}} [JSON arguments]")
    args = json.loads(argv[1]) if len(argv) > 1 else {"device": "cuda"}
    result = STEPS[argv[0]](args)
    print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
