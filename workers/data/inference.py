"""What a trained model expects as input, rebuilt from its run's spec: ``input_transform``.

A model takes its inputs as the run's data set made them (scaled, resized, cropped, normalized),
not as raw pixels: scikit-learn's 8x8 digits (0..16) fed as they are classify as one class.
``input_transform(spec)`` rebuilds the evaluation data set's preprocessing (the training set's
when there is none) as a callable on raw images, as ``workers.export.load_export`` hands it out
beside the model:

- ``digits``: pixels 0..16, upsampled (bilinear) to ``image_size``, normalized with the
  training split's mean and std at that size (``workers.data.digits.digits_statistics``);
- ``fashion_mnist``: pixels 0..255, resized to ``image_size``, Fashion-MNIST's mean and std;
- ``image_folder`` and ``webdataset``: uint8 images as decoded from their files, with the data
  set's ``transforms`` as evaluation applies them (resize, centred crop, normalize; no flip),
  through the loaders' own ``SampleTransform``.

Others get None: ``synthetic`` and ``shakespeare`` have no raw form, and your own data set's code
makes its inputs itself (import it and call it as the run's spec does).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from workers.data.images import normalize, resize

InputTransform = Callable[[torch.Tensor], torch.Tensor]


def input_transform(spec: Any) -> InputTransform | None:
    """A callable from raw images to the model's inputs for ``spec`` (a ``RunSpec``), or None
    when its data set has no raw image form (see the module docstring)."""
    dataset = spec.data.eval or spec.data.train
    name = getattr(dataset, "name", None)
    if name == "digits":
        from workers.data.digits import PIXEL_MAX, digits_statistics

        return PixelTransform(PIXEL_MAX, dataset.image_size, *digits_statistics(dataset.image_size))
    if name == "fashion_mnist":
        from workers.data.fashion_mnist import MEAN, STD

        return PixelTransform(255.0, dataset.image_size, MEAN, STD)
    if name in ("image_folder", "webdataset"):
        from workers.data.transforms import SampleTransform

        return ImageTransform(SampleTransform(dataset.transforms, train=False), dataset.channels)
    return None


class PixelTransform:
    """Grayscale images with pixels in ``0..pixel_max``, ``(N, H, W)``, ``(N, 1, H, W)`` or one
    ``(H, W)``, to ``(N, 1, size, size)`` float32: scaled to [0, 1], resized, normalized."""

    def __init__(self, pixel_max: float, size: int, mean: float, std: float):
        self.pixel_max, self.size, self.mean, self.std = pixel_max, size, mean, std

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        images = torch.as_tensor(images).float()
        if images.dim() == 2:
            images = images.unsqueeze(0)
        if images.dim() == 3:
            images = images.unsqueeze(1)
        if images.dim() != 4 or images.shape[1] != 1:
            raise ValueError(f"expected grayscale images (N, H, W), (N, 1, H, W) or (H, W); got {tuple(images.shape)}")
        return normalize(resize(images / self.pixel_max, self.size), self.mean, self.std)

    def __repr__(self) -> str:
        return (f"PixelTransform(pixels 0..{self.pixel_max:g} -> {self.size}x{self.size}, "
                f"mean {self.mean:.4g}, std {self.std:.4g})")


class ImageTransform:
    """uint8 images as decoded from files, ``(N, C, H, W)`` or one ``(C, H, W)``, through the
    data set's evaluation transforms, stacked to ``(N, C, H', W')`` float32."""

    def __init__(self, sample: Any, channels: int):
        self.sample, self.channels = sample, channels

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        images = torch.as_tensor(images)
        if images.dim() == 3:
            images = images.unsqueeze(0)
        if images.dim() != 4 or images.shape[1] != self.channels or images.dtype != torch.uint8:
            raise ValueError(f"expected uint8 images (N, {self.channels}, H, W) or ({self.channels}, H, W), as "
                             f"decoded from image files; got {images.dtype} {tuple(images.shape)}")
        return torch.stack([self.sample(image, None) for image in images])

    def __repr__(self) -> str:
        s = self.sample
        return f"ImageTransform(channels {self.channels}, resize {s.resize}, crop {s.crop}, normalize {s.mean is not None})"
