"""AugMix: mix an image with a random blend of several chains of augmentations.

``width`` chains of ``depth`` (1 to 3 when ``depth = -1``) random operations each are blended
with Dirichlet(alpha) weights, and the blend is mixed with the original image with a
Beta(alpha, alpha) weight. The result stays close to the original image while covering many
augmentations, which improves robustness to corruptions and calibration. It is a per-example
augmentation: the Algorithm installs ``AugmentAndMixTransform`` in the training data at
``FIT_START``. (The paper's Jensen-Shannon consistency loss is not implemented, as in Composer.)
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence, TypeVar

import torch
from PIL import Image

from algorithms import images
from algorithms.augmix.primitives import augmentation_sets
from algorithms.base import Algorithm, AlgorithmState
from algorithms.events import Event

AugmentationFn = Callable[[torch.Tensor, float], torch.Tensor]
ImgT = TypeVar("ImgT", torch.Tensor, Image.Image)


def augmix_image(img: ImgT, severity: int = 3, depth: int = -1, width: int = 3, alpha: float = 1.0,
                 augmentation_set: Sequence[AugmentationFn] = augmentation_sets["all"]) -> ImgT:
    """AugMix one image ``(C, H, W)`` (float in [0, 1] or uint8) or PIL image (mode ``L`` or
    ``RGB``), or a batch ``(N, C, H, W)`` image by image.

    Composer 0.32's signature and types: a PIL image comes back as a PIL image of the same mode
    and size, a tensor as a tensor of the same shape and dtype (Composer returns float for a
    uint8 tensor). ``augmentation_set`` is a list of ``fn(tensor_image, severity)``
    (``algorithms.augmix.primitives.augmentation_sets``). Returns
    ``(1 - m) * img + m * sum_i w_i * chain_i(img)`` with ``w ~ Dirichlet(alpha)`` and
    ``m ~ Beta(alpha, alpha)``, so ``alpha`` must be > 0 (Composer's numpy draws refuse 0 too).
    """
    if not alpha > 0:
        raise ValueError(f"augmix_image alpha {alpha} must be > 0 (the Dirichlet and Beta concentration)")
    if images.is_pil(img):
        pixels = images.pil_to_uint8(img, "augmix_image img")
        return images.uint8_to_pil(augmix_image(pixels, severity, depth, width, alpha, augmentation_set), img.mode)
    if img.dim() == 4:
        return torch.stack([augmix_image(i, severity, depth, width, alpha, augmentation_set) for i in img])
    with _one_thread(img):
        return _augmix(img, severity, depth, width, alpha, augmentation_set)


@contextlib.contextmanager
def _one_thread(img: torch.Tensor) -> Iterator[None]:
    # Hazard: on CPU, one image's kernels are tiny and intra-op threads only add fork/join
    # overhead (6x slower with 2 threads on a busy 2-core machine). set_num_threads is global
    # but costs < 1 us; the loader calls this from the training thread.
    if img.device.type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _augmix(img: torch.Tensor, severity: int, depth: int, width: int, alpha: float,
            augmentation_set: Sequence[AugmentationFn]) -> torch.Tensor:
    weights = _dirichlet(alpha, width + 2)  # width chain weights, then a Beta pair for the mix
    chain_weights = weights[:width] / weights[:width].sum()
    mixing = float(weights[width] / (weights[width] + weights[width + 1]))
    source = img.float() if img.dtype == torch.uint8 else img
    combined = torch.zeros_like(source)
    for i in range(width):
        augmented = img
        for _ in range(depth if depth > 0 else int(torch.randint(1, 4, (1,)))):
            op = augmentation_set[int(torch.randint(len(augmentation_set), (1,)))]
            augmented = op(augmented, severity)
        combined += chain_weights[i] * (augmented.float() if img.dtype == torch.uint8 else augmented)
    mixed = torch.lerp(source, combined, mixing)
    return mixed.round().clamp(0, 255).to(torch.uint8) if img.dtype == torch.uint8 else mixed


def _dirichlet(alpha: float, n: int) -> torch.Tensor:
    # Independent Gamma(alpha) draws from torch's global generator; normalising any subset of
    # them gives a Dirichlet (two of them: a Beta).
    return torch._standard_gamma(torch.full((n,), float(alpha), dtype=torch.float64)).float()


class AugmentAndMixTransform(torch.nn.Module):
    """A torchvision-style transform applying ``augmix_image``; usable in ``transforms.Compose``."""

    def __init__(self, severity: int = 3, depth: int = -1, width: int = 3, alpha: float = 1.0,
                 augmentation_set: str = "all"):
        super().__init__()
        _check(severity, width, alpha, augmentation_set)
        self.severity, self.depth, self.width, self.alpha = severity, depth, width, alpha
        self.augmentation_set = augmentation_sets[augmentation_set]

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return augmix_image(img, self.severity, self.depth, self.width, self.alpha, self.augmentation_set)


class _RescaledAugMix:
    """AugMix for normalized images (Tessera's data sets): each image is mapped to [0, 1] by its
    own min and max, augmented, and mapped back, so the primitives see the range they expect."""

    def __init__(self, transform: AugmentAndMixTransform):
        self.transform = transform

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        low, high = image.min(), image.max()
        span = (high - low).clamp_min(1e-12)
        return self.transform((image - low) / span) * span + low


def _check(severity: int, width: int, alpha: float, augmentation_set: str) -> None:
    if not 0 <= severity <= 10:
        raise ValueError(f"severity {severity} must lie in [0, 10]")
    if width < 1:
        raise ValueError(f"width {width} must be >= 1")
    if alpha <= 0:
        raise ValueError(f"alpha {alpha} must be > 0")
    if augmentation_set not in augmentation_sets:
        raise ValueError(f"augmentation_set {augmentation_set!r} must be one of {sorted(augmentation_sets)}")


class AugMix(Algorithm):
    """Installs an AugMix transform in the training data's per-sample transforms at FIT_START."""

    name = "augmix"
    events = frozenset({Event.FIT_START})

    def __init__(self, severity: int = 3, depth: int = -1, width: int = 3, alpha: float = 1.0,
                 augmentation_set: str = "all"):
        _check(severity, width, alpha, augmentation_set)
        self.severity, self.depth, self.width, self.alpha = severity, depth, width, alpha
        self.augmentation_set = augmentation_set
        self._transform = _RescaledAugMix(AugmentAndMixTransform(severity, depth, width, alpha, augmentation_set))

    def apply(self, event: Event, state: AlgorithmState) -> None:
        if self._transform not in state.sample_transforms:  # a second fit must not add it twice
            state.sample_transforms.append(self._transform)
