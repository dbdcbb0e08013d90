"""The functional forms take what Composer 0.32's take, and return what they return.

A Composer user's data from an image folder arrives as PIL images, so the image forms Composer
lets take PIL images (augmix_image, randaugment_image, colout_batch, cutout_batch) must take them
and give back a PIL image of the same mode and size; tensors stay tensors of the same dtype. The
closed ranges Composer allows are accepted at their ends. (bench/composer_compat.py runs the
same inputs through Composer itself.)
"""

import numpy as np
import pytest
import torch
from PIL import Image

import algorithms.functional as af
from algorithms.randaugment import RandAugmentTransform


def rgb_image(height=20, width=24, seed=0):
    return Image.fromarray(np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8))


MODES = {"RGB": lambda: rgb_image(), "L": lambda: rgb_image().convert("L")}
ANY_MODES = {**MODES, "RGBA": lambda: rgb_image().convert("RGBA"), "P": lambda: rgb_image().convert("P"),
             "1": lambda: rgb_image().convert("1"), "F": lambda: rgb_image().convert("F")}


def pixels(image):
    return np.asarray(image)


# --- augmix_image / randaugment_image ------------------------------------------------------


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kwargs", [{}, {"severity": 0}, {"severity": 10}, {"depth": 1}, {"depth": 3},
                                    {"width": 1}, {"alpha": 1e-3}])
def test_augmix_image_takes_a_pil_image_and_returns_one_of_its_mode(mode, kwargs):
    torch.manual_seed(0)
    image = MODES[mode]()
    out = af.augmix_image(image, **kwargs)
    assert isinstance(out, Image.Image) and out.mode == mode and out.size == image.size


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kwargs", [{}, {"severity": 0}, {"severity": 10}, {"depth": 1}, {"depth": 4}])
def test_randaugment_image_takes_a_pil_image_and_returns_one_of_its_mode(mode, kwargs):
    torch.manual_seed(0)
    image = MODES[mode]()
    out = af.randaugment_image(image, **kwargs)
    assert isinstance(out, Image.Image) and out.mode == mode and out.size == image.size


def test_pil_augmentation_matches_the_uint8_tensor_path_draw_for_draw():
    image = rgb_image()
    as_tensor = torch.from_numpy(pixels(image).copy()).permute(2, 0, 1)
    for fn in (af.augmix_image, af.randaugment_image):
        torch.manual_seed(3)
        from_pil = fn(image)
        torch.manual_seed(3)
        from_tensor = fn(as_tensor)
        assert np.array_equal(pixels(from_pil), from_tensor.permute(1, 2, 0).numpy()), fn.__name__


def test_randaugment_depth_zero_is_the_identity_on_pil_and_tensors():
    image, tensor = rgb_image(), torch.rand(2, 3, 8, 8)
    assert pixels(af.randaugment_image(image, depth=0)).tobytes() == pixels(image).tobytes()
    assert torch.equal(af.randaugment_image(tensor, depth=0), tensor)
    RandAugmentTransform(depth=0)  # Composer's transform accepts depth 0 too


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_image_augmentations_keep_tensor_shape_and_dtype(dtype):
    torch.manual_seed(0)
    batch = torch.rand(2, 3, 8, 8)
    batch = (batch * 255).to(torch.uint8) if dtype == torch.uint8 else batch
    for fn in (af.augmix_image, af.randaugment_image):
        for x in (batch, batch[0]):
            out = fn(x, severity=10)
            assert out.shape == x.shape and out.dtype == dtype, fn.__name__


def test_augmentations_refuse_pil_modes_they_cannot_mean_and_alpha_zero():
    with pytest.raises(ValueError, match="mode 'RGBA'.*allowed modes are"):
        af.augmix_image(rgb_image().convert("RGBA"))
    with pytest.raises(ValueError, match="mode 'P'"):
        af.randaugment_image(rgb_image().convert("P"))
    with pytest.raises(ValueError, match="alpha 0 must be > 0"):
        af.augmix_image(torch.rand(3, 8, 8), alpha=0)


# --- colout_batch -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", sorted(ANY_MODES))
def test_colout_takes_pil_images_of_any_mode(mode):
    image = ANY_MODES[mode]()
    out = af.colout_batch(image, p_row=0.25, p_col=0.5)
    assert isinstance(out, Image.Image) and out.mode == mode
    assert out.size == (int(0.5 * image.width), int(0.75 * image.height))
    if mode == "P":
        assert out.getpalette() == image.getpalette()


def test_colout_on_pil_drops_the_rows_the_tensor_path_drops_for_the_same_seed():
    image = rgb_image()
    tensor = torch.from_numpy(pixels(image).copy()).permute(2, 0, 1)
    torch.manual_seed(5)
    from_pil = af.colout_batch(image)
    torch.manual_seed(5)
    from_tensor = af.colout_batch(tensor)
    assert np.array_equal(pixels(from_pil), from_tensor.permute(1, 2, 0).numpy())


def test_colout_pairs_as_tuple_or_list_of_pil_or_tensors():
    image, mask = rgb_image(), rgb_image(seed=1).convert("L")
    for sample in ((image, mask), [image, mask]):
        out_image, out_mask = af.colout_batch(sample)
        assert (out_image.mode, out_mask.mode) == ("RGB", "L") and out_image.size == out_mask.size
    assert isinstance(af.colout_batch((image,)), Image.Image)  # a 1-tuple is just the image
    out = af.colout_batch((image, torch.tensor(3)))  # a class label: auto leaves it alone
    assert isinstance(out, Image.Image)
    with pytest.raises(ValueError, match="got 3 items"):
        af.colout_batch((image, mask, mask))


@pytest.mark.parametrize("p_row, p_col", [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 1.0)])
def test_colout_range_ends(p_row, p_col):
    image, tensor = rgb_image(), torch.rand(2, 3, 20, 24)
    out = af.colout_batch(image, p_row=p_row, p_col=p_col)
    assert out.size == (int((1 - p_col) * 24), int((1 - p_row) * 20)) and out.mode == "RGB"
    assert af.colout_batch(tensor, p_row=p_row, p_col=p_col).shape == (2, 3, int((1 - p_row) * 20),
                                                                       int((1 - p_col) * 24))
    if p_row == p_col == 0.0:
        assert out.tobytes() == image.tobytes()


# --- cutout_batch -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", sorted(ANY_MODES))
def test_cutout_takes_pil_images_of_any_mode_and_zeroes_one_square(mode):
    image = ANY_MODES[mode]()
    torch.manual_seed(0)
    out = af.cutout_batch(image, num_holes=1, length=0.5)
    assert isinstance(out, Image.Image) and out.mode == image.mode and out.size == image.size
    before, after = pixels(image), pixels(out)
    changed = (before != after).reshape(before.shape[0], before.shape[1], -1).any(-1)
    assert (after[changed] == 0).all()  # only hole pixels changed, and they are zero
    assert changed.any()  # something was cut


def test_cutout_on_pil_cuts_where_the_tensor_path_cuts_for_the_same_seed():
    image = rgb_image()
    tensor = torch.from_numpy(pixels(image).copy()).permute(2, 0, 1)
    torch.manual_seed(9)
    from_pil = af.cutout_batch(image, num_holes=2, length=0.3, uniform_sampling=True)
    torch.manual_seed(9)
    from_tensor = af.cutout_batch(tensor, num_holes=2, length=0.3, uniform_sampling=True)
    assert np.array_equal(pixels(from_pil), from_tensor.permute(1, 2, 0).numpy())


def test_cutout_range_ends():
    image, tensor = rgb_image(), torch.rand(2, 3, 8, 8)
    assert af.cutout_batch(image, num_holes=0).tobytes() == image.tobytes()
    assert af.cutout_batch(image, length=0.0).tobytes() == image.tobytes()
    full = af.cutout_batch(tensor, length=1.0)
    assert full.shape == tensor.shape and (full == 0).any()
    assert af.cutout_batch(tensor, num_holes=0).dtype == tensor.dtype


# --- the batch forms: alpha, length, smoothing at the ends ----------------------------------


def test_mixup_alpha_zero_mixes_nothing():
    x, y = torch.randn(4, 3, 5, 5), torch.arange(4)
    mixed, _, mixing = af.mixup_batch(x, y, alpha=0.0)
    assert mixing == 0.0 and torch.equal(mixed, x)
    for mixing in (0.0, 1.0):
        indices = torch.tensor([1, 0, 3, 2])
        mixed, permuted, _ = af.mixup_batch(x, y, mixing=mixing, indices=indices)
        assert torch.equal(mixed, x if mixing == 0.0 else x[indices]) and torch.equal(permuted, y[indices])
    with pytest.raises(ValueError, match="alpha -1"):
        af.mixup_batch(x, y, alpha=-1.0)


def test_cutmix_alpha_zero_is_a_full_size_box_and_length_ends():
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 8, 8), torch.arange(4)
    _, _, area, (x1, y1, x2, y2) = af.cutmix_batch(x, y, alpha=0.0)
    # The box has the image's size, clipped around a random centre: at least a quarter mixed.
    assert 0.0 <= area <= 0.75 and area == pytest.approx(1 - (x2 - x1) * (y2 - y1) / 64)
    mixed, _, area, _ = af.cutmix_batch(x, y, length=0.0)
    assert area == 1.0 and torch.equal(mixed, x)
    _, _, area, _ = af.cutmix_batch(x, y, length=1.0)
    assert 0.0 <= area < 1.0
    with pytest.raises(ValueError, match="alpha -0.5"):
        af.cutmix_batch(x, y, alpha=-0.5)


def test_resize_batch_scale_one_returns_the_inputs():
    x, y = torch.randn(2, 3, 8, 8), torch.arange(2)
    for mode in ("resize", "crop"):
        out_x, out_y = af.resize_batch(x, y, 1.0, mode=mode)
        assert out_x is x and out_y is y


def test_smooth_labels_range_ends_and_composer_class_dim():
    logits, target = torch.randn(3, 4), torch.tensor([0, 3, 1])
    assert torch.equal(af.smooth_labels(logits, target, 1.0), torch.full((3, 4), 0.25))
    assert torch.equal(af.smooth_labels(logits, target, 0.0), torch.eye(4)[target])
    # Segmentation: logits (N, C, H, W), index targets (N, H, W), classes on dim 1 as in Composer.
    logits, target = torch.randn(2, 5, 3, 4), torch.randint(0, 5, (2, 3, 4))
    smoothed = af.smooth_labels(logits, target, 0.5)
    assert smoothed.shape == logits.shape
    assert torch.equal(smoothed.argmax(1), target) and torch.allclose(smoothed.sum(1), torch.ones(2, 3, 4))
    # A language model's (B, T, V) logits with (B, T) targets: the last dimension.
    logits, target = torch.randn(2, 6, 9), torch.randint(0, 9, (2, 6))
    assert torch.equal(af.smooth_labels(logits, target, 0.0).argmax(-1), target)
    with pytest.raises(ValueError, match="fits neither class dimension"):
        af.smooth_labels(torch.randn(2, 6, 9), torch.randint(0, 9, (3, 3)), 0.1)
    with pytest.raises(ValueError, match="smoothing 1.5"):
        af.smooth_labels(logits, target, 1.5)


def test_compute_ema_smoothing_ends():
    torch.manual_seed(0)
    model, ema = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = [p.clone() for p in ema.parameters()]
    af.compute_ema(model, ema, smoothing=1.0)
    assert all(torch.equal(a, b) for a, b in zip(ema.parameters(), before))
    af.compute_ema(model, ema, smoothing=0.0)
    assert all(torch.equal(a, b) for a, b in zip(ema.parameters(), model.parameters()))
