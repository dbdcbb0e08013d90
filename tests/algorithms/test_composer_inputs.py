"""The functional forms take what Composer 0.32's take, and return what they return.

A Composer user's data from an image folder arrives as PIL images, so the image forms Composer
lets take PIL images (augmix_image, randaugment_image, colout_batch, cutout_batch) must take them
and give back a PIL image of the same mode and size; tensors stay tensors of the same dtype. The
closed ranges Composer allows are accepted at their ends. (bench/composer_compat.py runs the
same inputs through Composer itself.)
"""

import warnings

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


# --- Composer's signatures: apply_gradient_clipping, set_batch_sequence_length, low-precision
# norms, should_selective_backprop --------------------------------------------------------


def grads_after_backward(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    model(torch.randn(8, 6)).pow(2).sum().backward()
    return model


def flat_grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("clipping_type, threshold", [("norm", 0.1), ("value", 0.05), ("adaptive", 0.01)])
def test_apply_gradient_clipping_takes_composers_call_shape(clipping_type, threshold):
    ours = grads_after_backward()
    af.apply_gradient_clipping(ours.parameters(), clipping_type, threshold)
    for call in (lambda m: af.apply_gradient_clipping(m, clipping_type, threshold, False),
                 lambda m: af.apply_gradient_clipping(model=m, clipping_type=clipping_type,
                                                      clipping_threshold=threshold, fsdp_enabled=True)):
        model = grads_after_backward()
        before = flat_grads(model)
        call(model)
        # fsdp_enabled changes nothing without FSDP1 wrappers (Composer's would skip clipping)
        assert torch.equal(flat_grads(model), flat_grads(ours)) and not torch.equal(before, flat_grads(ours))
    if clipping_type == "norm":
        assert flat_grads(ours).norm().item() == pytest.approx(threshold, rel=1e-4)


def test_apply_gradient_clipping_goes_through_an_fsdp1_root_and_refuses_agc_there(tmp_path):
    """FSDP1 flattens parameters: the norm must come from the root wrapper (all ranks' shards)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel
    assert not dist.is_initialized(), "an earlier test left a process group running in this process"
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # FSDP1's deprecation notice
            torch.manual_seed(0)
            model = FullyShardedDataParallel(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)),
                                             device_id=torch.device("cpu"))
        model(torch.randn(8, 6)).pow(2).sum().backward()
        (flat,) = list(model.parameters())  # one flattened shard: 6*5+5+5*3+3 values
        assert flat.shape == (53,) and flat.grad.norm() > 1.0
        calls = []
        original = model.clip_grad_norm_
        model.clip_grad_norm_ = lambda **kw: calls.append(kw) or original(**kw)
        af.apply_gradient_clipping(model, "norm", 1.0, True)
        assert calls == [{"max_norm": 1.0}] and flat.grad.norm().item() == pytest.approx(1.0, rel=1e-4)
        af.apply_gradient_clipping(model, "value", 0.01, False)
        assert flat.grad.abs().max().item() == pytest.approx(0.01)
        with pytest.raises(ValueError, match="clipping_type 'adaptive'.*FSDP1"):
            af.apply_gradient_clipping(model, "adaptive", 0.01, True)
    finally:
        dist.destroy_process_group()


def token_batch(ends=(8, 5, 2)):
    """Rows of 8 tokens (ids 10..) with right padding after ``ends`` tokens, labels alongside."""
    ids = torch.arange(10, 10 + 8 * len(ends)).reshape(len(ends), 8)
    mask = (torch.arange(8) < torch.tensor(ends)[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids + 100}


def test_preserve_end_of_sequence_keeps_each_rows_last_token():
    # Composer's documented example: [10..15] cut to 3 is [10, 11, 15].
    row = torch.tensor([[10, 11, 12, 13, 14, 15]])
    assert af.set_batch_sequence_length(row, 3, preserve_end_of_sequence=True).tolist() == [[10, 11, 15]]
    assert af.set_batch_sequence_length(row, 3).tolist() == [[10, 11, 12]]
    batch = token_batch()
    before = {k: v.clone() for k, v in batch.items()}
    out = af.set_batch_sequence_length(batch, 3, preserve_end_of_sequence=True)
    # Row 0 ends at 7 and row 1 at 4, past the cut: their last token moves to position 2. Row 2
    # ends at 1, inside: only cut. Every tensor alike (labels, the mask itself).
    assert out["input_ids"].tolist() == [[10, 11, 17], [18, 19, 22], [26, 27, 28]]
    assert out["labels"].tolist() == [[110, 111, 117], [118, 119, 122], [126, 127, 128]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [1, 1, 0]]
    assert all(torch.equal(batch[k], before[k]) for k in batch)  # the caller's batch is not modified
    # (inputs, targets) without a mask: every row ends at its last position.
    x, y = af.set_batch_sequence_length((batch["input_ids"], batch["labels"]), 3, preserve_end_of_sequence=True)
    assert x[:, 2].tolist() == [17, 25, 33] and y[:, 2].tolist() == [117, 125, 133]


def test_preserve_end_of_sequence_is_ignored_when_reshaping_or_long_enough():
    batch = token_batch()
    reshaped = af.set_batch_sequence_length(batch, 4, truncate=False, preserve_end_of_sequence=True)
    assert torch.equal(reshaped["input_ids"], batch["input_ids"].reshape(6, 4))
    assert af.set_batch_sequence_length(batch, 8, preserve_end_of_sequence=True)["input_ids"] is batch["input_ids"]
    all_padding = token_batch(ends=(0, 8))
    out = af.set_batch_sequence_length(all_padding, 2, preserve_end_of_sequence=True)
    assert out["input_ids"].tolist() == [[10, 11], [18, 25]]  # an all-padding row has no end to keep
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 8, 1\)"):
        af.set_batch_sequence_length({**all_padding, "attention_mask": all_padding["attention_mask"][..., None]}, 2,
                                     preserve_end_of_sequence=True)


@pytest.mark.parametrize("apply, norm", [(af.apply_low_precision_layernorm, torch.nn.LayerNorm),
                                         (af.apply_low_precision_groupnorm, lambda: torch.nn.GroupNorm(2, 4))])
def test_low_precision_norms_default_to_no_precision_like_composer(apply, norm):
    from algorithms.base import NoEffectWarning
    model = torch.nn.Sequential(norm(4) if norm is torch.nn.LayerNorm else norm())
    kind = type(model[0])
    with pytest.warns(NoEffectWarning, match="precision None is not one of amp_bf16, amp_fp16"):
        assert apply(model) is model
    assert type(model[0]) is kind  # no surgery
    with pytest.raises(ValueError, match="precision 'fp64' is not one of None, fp32, amp_bf16, amp_fp16"):
        apply(model, "fp64")


def test_should_selective_backprop_follows_composers_schedule():
    # interrupt=2: every second batch (batch_idx + 1 even) is a plain step; 3: every third.
    assert [af.should_selective_backprop(0.6, b) for b in range(6)] == [True, False] * 3
    assert [af.should_selective_backprop(0.6, b, interrupt=3) for b in range(6)] == [True, True, False] * 2
    assert [af.should_selective_backprop(0.6, b, interrupt=0) for b in range(3)] == [True] * 3
    # The window is [start, end).
    assert [af.should_selective_backprop(d, 0, 0.5, 0.9) for d in (0.49, 0.5, 0.89, 0.9)] == \
        [False, True, True, False]
    with pytest.raises(ValueError, match="interrupt -1 must be >= 0"):
        af.should_selective_backprop(0.6, 0, interrupt=-1)
