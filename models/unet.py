"""U-Nets (MONAI): the CNNs users would train instead of PoreFormer, as baselines.

Both map ``(B, Z, Y, X) -> logits (B, Z, Y, X)`` like PoreFormer, so training, streaming and the
benchmark treat all three the same way: a 2D U-Net applied slice by slice and a 3D U-Net.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ctpore.errors import InputError

__all__ = ["UNET_CHANNELS", "UNET_STRIDES", "UNet2DSlices", "UNet3D", "UNETS", "build_unet", "predict_unet"]

#: Default U-Net shape: three levels, 16-32-64 channels, one residual unit per level.
UNET_CHANNELS = (16, 32, 64)
UNET_STRIDES = (2, 2)


class _MonaiUNet(nn.Module):
    """A MONAI U-Net of ``spatial_dims`` dimensions, one input and one output channel.

    Parameters
    ----------
    channels, strides : tuple of int
        Passed to :class:`monai.networks.nets.UNet`.
    """

    kind = ""
    spatial_dims = 0

    def __init__(self, channels=UNET_CHANNELS, strides=UNET_STRIDES):
        super().__init__()
        from monai.networks.nets import UNet

        self.config = {"kind": self.kind, "channels": list(channels), "strides": list(strides)}
        self.net = UNet(spatial_dims=self.spatial_dims, in_channels=1, out_channels=1,
                        channels=tuple(channels), strides=tuple(strides), num_res_units=1)


class UNet2DSlices(_MonaiUNet):
    """A 2D U-Net applied to every slice on its own (the CNN people train on slices)."""

    kind, spatial_dims = "unet2d", 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, z, y, w = x.shape  # (B, Z, Y, X)
        out = self.net(x.reshape(b * z, 1, y, w))  # (B*Z, 1, Y, X)
        return out.reshape(b, z, y, w)


class UNet3D(_MonaiUNet):
    """A 3D U-Net (MONAI) over the whole volume."""

    kind, spatial_dims = "unet3d", 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.unsqueeze(1)).squeeze(1)  # (B, 1, Z, Y, X) -> (B, Z, Y, X)


UNETS = {"unet2d": UNet2DSlices, "unet3d": UNet3D}


def build_unet(config: dict) -> nn.Module:
    """A U-Net from its config dict (``{"kind": "unet2d"|"unet3d", "channels", "strides"}``)."""
    kind = config.get("kind")
    if kind not in UNETS:
        raise InputError(f"unknown U-Net kind {kind!r}; expected one of {sorted(UNETS)}")
    return UNETS[kind](channels=config.get("channels", UNET_CHANNELS), strides=config.get("strides", UNET_STRIDES))


@torch.inference_mode()
def predict_unet(model: nn.Module, volume: np.ndarray, roi: int = 64, overlap: float = 0.25,
                 device: str = "cpu") -> np.ndarray:
    """Pore probability of a normalized ``(Z, Y, X)`` volume with a U-Net, tiled by MONAI.

    Uses :func:`monai.inferers.sliding_window_inference` (Gaussian blending) with windows of
    ``roi`` voxels (slices of ``roi`` x ``roi`` for the 2D U-Net).
    """
    from monai.inferers import sliding_window_inference

    model = model.eval().to(device)
    x = torch.as_tensor(np.asarray(volume, np.float32), device=device)
    if model.kind == "unet2d":
        x2 = x[:, None]  # (Z, 1, Y, X): slices as a batch
        logits = sliding_window_inference(x2, (roi, roi), sw_batch_size=8, predictor=model.net,
                                          overlap=overlap, mode="gaussian")
        logits = logits[:, 0]
    else:
        x3 = x[None, None]  # (1, 1, Z, Y, X)
        logits = sliding_window_inference(x3, (roi, roi, roi), sw_batch_size=1, predictor=model.net,
                                          overlap=overlap, mode="gaussian")[0, 0]
    return torch.sigmoid(logits).cpu().numpy().astype(np.float32)
