"""AugMix's augmentation primitives on image tensors ``(C, H, W)`` with values in [0, 1].

Ports of Composer's PIL primitives (``composer.algorithms.utils.augmentation_primitives``) to
``torchvision.transforms.v2.functional``: the same operations, the same ``level`` (severity in
[0, 10]) to magnitude mapping, random numbers from torch's global generator. Each takes
``(image, level)`` and returns an image of the same shape and dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF


def _uniform(low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand(()))


def _sample_level(level: float) -> float:
    return _uniform(0.1, level)


def _signed(value: float) -> float:
    return -value if float(torch.rand(())) > 0.5 else value


def _symmetric_sample(level: float) -> float:
    # Median 1 (no change): uniform on [1, level] or on [1 - 0.09 * level, 1], equally likely.
    return _uniform(1.0, level) if float(torch.rand(())) > 0.5 else _uniform(1.0 - 0.09 * level, 1.0)


def _as_uint8(image: torch.Tensor) -> torch.Tensor:
    return image if image.dtype == torch.uint8 else (image.clamp(0, 1) * 255).round().to(torch.uint8)


def _like(result: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    return result if image.dtype == torch.uint8 else result.to(image.dtype) / 255.0


def autocontrast(image: torch.Tensor, level: float = 0.0) -> torch.Tensor:
    return TF.autocontrast(image)


def equalize(image: torch.Tensor, level: float = 0.0) -> torch.Tensor:
    return _like(TF.equalize(_as_uint8(image)), image)


def posterize(image: torch.Tensor, level: float) -> torch.Tensor:
    bits = 4 - int(_sample_level(level) * 4 / 10)
    if image.dtype == torch.uint8:
        return TF.posterize(image, bits)
    step = 2 ** (8 - bits)  # keep the top `bits` bits of the 8-bit value, without a uint8 round trip
    return image.clamp(0, 1).mul(255).round_().div_(step).floor_().mul_(step / 255)


def rotate(image: torch.Tensor, level: float) -> torch.Tensor:
    theta = math.radians(_signed(int(_sample_level(level) * 30 / 10)))
    cos, sin = math.cos(theta), math.sin(theta)
    cx, cy = image.shape[-1] / 2, image.shape[-2] / 2  # about the centre, like PIL's rotate
    return _warp(image, cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy)


def solarize(image: torch.Tensor, level: float) -> torch.Tensor:
    threshold = 256 - int(_sample_level(level) * 256 / 10)
    if threshold >= 256:
        return image
    # Invert pixels at or above the threshold (in 8-bit units, as PIL's solarize).
    return TF.solarize(image, threshold if image.dtype == torch.uint8 else threshold / 255)


def _warp(image: torch.Tensor, a: float, b: float, c: float, d: float, e: float, f: float) -> torch.Tensor:
    """Output pixel (x, y) reads the input at (a x + b y + c, d x + e y + f) (PIL's AFFINE data),
    bilinear, zero outside: one affine_grid + grid_sample, without torchvision's per-call checks."""
    height, width = image.shape[-2:]
    # The same map in grid_sample's normalized coordinates (align_corners=False).
    theta = torch.tensor([[[a, b * height / width, (a * (width - 1) + b * (height - 1) + 2 * c + 1) / width - 1],
                           [d * width / height, e, (d * (width - 1) + e * (height - 1) + 2 * f + 1) / height - 1]]],
                         dtype=torch.float32)
    source = image.float() if image.dtype == torch.uint8 else image
    grid = F.affine_grid(theta.to(source.device, source.dtype), [1, *source.shape], align_corners=False)
    out = F.grid_sample(source[None], grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0]
    return out.round().clamp(0, 255).to(torch.uint8) if image.dtype == torch.uint8 else out


def _shear(image: torch.Tensor, level: float, axis: int) -> torch.Tensor:
    factor = _signed(_sample_level(level) * 0.3 / 10)
    return _warp(image, 1, factor, 0, 0, 1, 0) if axis == 0 else _warp(image, 1, 0, 0, factor, 1, 0)


def shear_x(image: torch.Tensor, level: float) -> torch.Tensor:
    return _shear(image, level, 0)


def shear_y(image: torch.Tensor, level: float) -> torch.Tensor:
    return _shear(image, level, 1)


def _translate(image: torch.Tensor, level: float, axis: int) -> torch.Tensor:
    pixels = _signed(int(_sample_level(level) * image.shape[-1 - axis] / 3 / 10))
    return _warp(image, 1, 0, pixels, 0, 1, 0) if axis == 0 else _warp(image, 1, 0, 0, 0, 1, pixels)


def translate_x(image: torch.Tensor, level: float) -> torch.Tensor:
    return _translate(image, level, 0)


def translate_y(image: torch.Tensor, level: float) -> torch.Tensor:
    return _translate(image, level, 1)


def _enhance(fn, image: torch.Tensor, factor: float) -> torch.Tensor:
    if fn is TF.adjust_saturation and image.shape[-3] != 3:
        return image  # saturation means nothing for one channel
    return fn(image, factor)


def color(image: torch.Tensor, level: float) -> torch.Tensor:
    return _enhance(TF.adjust_saturation, image, _symmetric_sample(level))


def contrast(image: torch.Tensor, level: float) -> torch.Tensor:
    return _enhance(TF.adjust_contrast, image, _symmetric_sample(level))


def brightness(image: torch.Tensor, level: float) -> torch.Tensor:
    return _enhance(TF.adjust_brightness, image, _symmetric_sample(level))


def sharpness(image: torch.Tensor, level: float) -> torch.Tensor:
    return _enhance(TF.adjust_sharpness, image, _symmetric_sample(level))


def _original(fn):
    def enhance(image: torch.Tensor, level: float) -> torch.Tensor:
        return _enhance(fn, image, _sample_level(level) * 1.8 / 10 + 0.1)
    enhance.__name__ = f"{fn.__name__}_original"
    return enhance


color_original = _original(TF.adjust_saturation)
contrast_original = _original(TF.adjust_contrast)
brightness_original = _original(TF.adjust_brightness)
sharpness_original = _original(TF.adjust_sharpness)

_SAFE = [autocontrast, equalize, posterize, rotate, solarize, shear_x, shear_y, translate_x, translate_y]
augmentation_sets = {
    "all": _SAFE + [color, contrast, brightness, sharpness],
    "safe": list(_SAFE),  # no overlap with the corruptions of ImageNet-C / CIFAR-10-C
    "original": _SAFE + [color_original, contrast_original, brightness_original, sharpness_original],
}
