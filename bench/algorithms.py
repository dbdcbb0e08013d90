"""Functional ops, ours against Composer 0.32.1's, on identical inputs in one process.

    make bench-algorithms        # = .venv-composer/bin/python bench/algorithms.py

Prints the median milliseconds per call of each op (interleaved blocks of calls, so drift
affects both sides alike) and the ratio ours/Composer (< 1: ours is faster). Where both are
deterministic given the same box, permutation or mixing weight, the outputs are asserted equal
first. Composer lives only in the bench virtualenv (never a dependency of Tessera).
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import statistics
import sys
import time
import warnings
from typing import Any, Callable

# This script is named like the package it measures: drop bench/ from the import path so that
# `import algorithms` finds Tessera's package, not this file.
_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402

import algorithms.functional as af  # noqa: E402

try:
    import composer.functional as cf
except ImportError as error:  # pragma: no cover - a hint for the wrong interpreter
    raise SystemExit("Composer is not installed here; run `make bench-algorithms` "
                     "(it uses .venv-composer/bin/python)") from error

BATCH = (128, 1, 32, 32)  # the batch Composer's functional ops were first timed on, on this CPU


def median_ms(fn: Callable[[], Any], *, block: int, rounds: int) -> list[float]:
    """Per-call milliseconds of ``rounds`` blocks of ``block`` calls each."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(block):
            fn()
        times.append((time.perf_counter() - start) * 1000 / block)
    return times


def compare(ours: Callable[[], Any], theirs: Callable[[], Any], *, block: int = 50,
            rounds: int = 30) -> tuple[float, float]:
    for _ in range(3):  # warm-up (allocator, lazy inits)
        ours(), theirs()
    our_times, their_times = [], []
    for _ in range(rounds):  # interleaved: both see the same machine load
        our_times += median_ms(ours, block=block, rounds=1)
        their_times += median_ms(theirs, block=block, rounds=1)
    return statistics.median(our_times), statistics.median(their_times)


def equal(a: torch.Tensor, b: torch.Tensor, *, atol: float = 0.0) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    if atol:
        assert torch.allclose(a, b, atol=atol, rtol=0), (a - b).abs().max()
    else:
        assert torch.equal(a, b), (a - b).abs().max()


# --- the ops ------------------------------------------------------------------------------
# Each returns (ours, theirs, check): check asserts equal outputs where the op is deterministic
# given the same inputs and describes what was checked.


def cutmix():
    x, y = torch.randn(BATCH), torch.randint(0, 10, (BATCH[0],))
    indices, bbox = torch.randperm(BATCH[0]), (4, 6, 20, 22)

    def check():
        ours = af.cutmix_batch(x, y, bbox=bbox, indices=indices)
        theirs = cf.cutmix_batch(x, y, bbox=bbox, indices=indices)
        equal(ours[0], theirs[0]), equal(ours[1], theirs[1])
        assert abs(ours[2] - theirs[2]) < 1e-12 and tuple(ours[3]) == tuple(theirs[3])
        return "equal (same box, permutation)"

    return (lambda: af.cutmix_batch(x, y, alpha=1.0), lambda: cf.cutmix_batch(x, y, alpha=1.0), check)


def mixup():
    x, y = torch.randn(BATCH), torch.randint(0, 10, (BATCH[0],))
    indices = torch.randperm(BATCH[0])

    def check():
        ours = af.mixup_batch(x, y, mixing=0.3, indices=indices)
        theirs = cf.mixup_batch(x, y, mixing=0.3, indices=indices)
        equal(ours[0], theirs[0], atol=1e-6), equal(ours[1], theirs[1])
        return "allclose 1e-6 (lerp vs a*x+b*y; same mixing, permutation)"

    return (lambda: af.mixup_batch(x, y, alpha=0.2), lambda: cf.mixup_batch(x, y, alpha=0.2), check)


def cutout():
    x = torch.randn(BATCH)

    def check():
        ours, theirs = af.cutout_batch(x), cf.cutout_batch(x)
        assert ours.shape == theirs.shape and ((ours == 0).sum() > 0) and ((theirs == 0).sum() > 0)
        return "shape, holes present (random positions: torch vs numpy RNG)"

    return (lambda: af.cutout_batch(x, num_holes=1, length=0.5), lambda: cf.cutout_batch(x, num_holes=1, length=0.5),
            check)


def colout():
    x, y = torch.randn(BATCH), torch.randint(0, 10, (BATCH[0],))

    def check():
        ours, theirs = af.colout_batch((x, y)), cf.colout_batch((x, y))
        assert ours.shape == theirs.shape == (128, 1, 27, 27)
        return "shape (random rows/cols)"

    return (lambda: af.colout_batch((x, y), p_row=0.15, p_col=0.15),
            lambda: cf.colout_batch((x, y), p_row=0.15, p_col=0.15), check)


def resize():
    x, y = torch.randn(BATCH), torch.randint(0, 10, (BATCH[0],))

    def check():
        ours, theirs = af.resize_batch(x, y, 0.5), cf.resize_batch(x, y, 0.5)
        equal(ours[0], theirs[0]), equal(ours[1], theirs[1])
        return "equal"

    return (lambda: af.resize_batch(x, y, 0.5), lambda: cf.resize_batch(x, y, 0.5), check)


def smooth_labels():
    logits, y = torch.randn(BATCH[0], 10), torch.randint(0, 10, (BATCH[0],))

    def check():
        equal(af.smooth_labels(logits, y, 0.1), cf.smooth_labels(logits, y, 0.1), atol=1e-7)
        return "allclose 1e-7"

    return (lambda: af.smooth_labels(logits, y, 0.1), lambda: cf.smooth_labels(logits, y, 0.1), check)


def compute_ema():
    from workers.models.cifar_resnet import cifar_resnet20
    torch.manual_seed(0)
    model = cifar_resnet20(num_classes=10, in_channels=1)
    ours_ema, theirs_ema = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))

    def check():
        a, b = copy.deepcopy(ours_ema), copy.deepcopy(theirs_ema)
        af.compute_ema(model, a, 0.99), cf.compute_ema(model, b, 0.99)
        for (name, u), (_, v) in zip(a.state_dict().items(), b.state_dict().items()):
            if u.is_floating_point():
                equal(u, v, atol=1e-6)
        return "allclose 1e-6 (float tensors; Composer truncates int counters)"

    return (lambda: af.compute_ema(model, ours_ema, 0.99), lambda: cf.compute_ema(model, theirs_ema, 0.99), check)


def augmix():
    torch.manual_seed(0)
    image = torch.rand(3, 32, 32)

    def check():
        ours, theirs = af.augmix_image(image), cf.augmix_image(image)
        assert ours.shape == theirs.shape == image.shape
        return "shape (random chains; ours on tensors, Composer via PIL)"

    return (lambda: af.augmix_image(image), lambda: cf.augmix_image(image), check)


def surgery(name: str, build: Callable[[], torch.nn.Module], x: torch.Tensor, exact: bool = True, **kwargs):
    """Surgery ops change a model in place: each call gets a fresh copy (copying is not timed
    separately, it costs the same on both sides)."""
    ours_fn, theirs_fn = getattr(af, name), getattr(cf, name)
    base = build()

    def run(fn):
        model = copy.deepcopy(base)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(model, **kwargs)
        return model

    def check():
        ours, theirs = run(ours_fn).eval(), run(theirs_fn).eval()
        with torch.no_grad():
            a, b = ours(x), theirs(x)
        diff = (a - b).abs().max().item()
        if not exact:  # both approximate the layers; the approximations differ
            return f"model outputs differ by up to {diff:.2g} (not asserted: random init or eps differ)"
        assert diff < 1e-4, diff
        return f"model outputs allclose (max diff {diff:.1e})"

    return (lambda: run(ours_fn), lambda: run(theirs_fn), check)


def gradient_clipping():
    from workers.models.cifar_resnet import cifar_resnet20 as build
    torch.manual_seed(0)
    ours_model = build(num_classes=10, in_channels=1)
    ours_model(torch.randn(8, 1, 32, 32)).sum().backward()

    def with_grads(model):  # deepcopy leaves .grad behind
        other = copy.deepcopy(model)
        for p, q in zip(model.parameters(), other.parameters()):
            q.grad = p.grad.clone()
        return other
    theirs_model = with_grads(ours_model)

    def check():
        a, b = with_grads(ours_model), with_grads(theirs_model)
        af.apply_gradient_clipping(a, "norm", 0.1, False), cf.apply_gradient_clipping(b, "norm", 0.1, False)
        for u, v in zip(a.parameters(), b.parameters()):
            equal(u.grad, v.grad, atol=1e-7)
        return "allclose 1e-7 (norm clipping; AGC differs on zero weights: ours floors at 1e-3)"

    return (lambda: af.apply_gradient_clipping(ours_model, "norm", 0.1, False),
            lambda: cf.apply_gradient_clipping(theirs_model, "norm", 0.1, False), check)


def freeze_layers():
    from workers.models.cifar_resnet import cifar_resnet20 as build
    base = build(num_classes=10, in_channels=1)

    def run(fn):
        model = copy.deepcopy(base)
        return fn(model, torch.optim.SGD(model.parameters(), lr=0.1), 0.8, 0.5, 1.0)

    def check():
        ours, theirs = run(af.freeze_layers), run(cf.freeze_layers)
        assert ours[0] == theirs[0] and abs(ours[1] - theirs[1]) < 1e-12, (ours, theirs)
        return f"same depth and fraction {ours}"

    return (lambda: run(af.freeze_layers), lambda: run(cf.freeze_layers), check)


def bottlenecks():
    from torchvision.models.resnet import Bottleneck
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Bottleneck(64, 16) for _ in range(4)]).eval()


def mlp_with_dropout():
    """A VGG-style classifier head: three Linear layers with Dropout between (GyroDropout's case)."""
    torch.manual_seed(0)
    layers = []
    for _ in range(3):
        layers += [torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Dropout(0.5)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(512, 10)).eval()


GYRO = {"iters_per_epoch": 196, "max_epoch": 100, "p": 0.5, "sigma": 256, "tau": 16}


def gyro_dropout_structure(model: torch.nn.Module, rows: int, features: int, p: float, tau: int) -> dict[str, Any]:
    """What one training forward of a converted lone dropout does to a batch of ones: the values
    it takes, how many distinct row masks (at most ``tau``), whether consecutive groups of
    ``rows / tau`` rows share one, and the kept fraction (about ``1 - p``)."""
    out = model.train()(torch.ones(rows, features))
    group = rows // tau
    return {"values": sorted(set(out.unique().tolist())), "distinct_rows": len({tuple(r) for r in out.tolist()}),
            "groups_share_a_mask": all(torch.equal(out[i], out[i - i % group]) for i in range(rows)),
            "kept": (out != 0).float().mean().item(),
            "eval_is_identity": torch.equal(model.eval()(out), out)}


def gyro_dropout():
    """Surgery on a VGG-style head is timed; the check runs one training forward of each side's
    converted dropout (the outputs cannot match: each side draws its masks from its own RNG) and
    asserts the structure both must have. The batch is a multiple of ``tau``, as Composer's needs."""
    ours_fn, theirs_fn, _ = surgery("apply_gyro_dropout", mlp_with_dropout, torch.randn(8, 512), **GYRO)

    def check():
        p, tau = GYRO["p"], GYRO["tau"]
        found = {}
        for side, fn in (("ours", af.apply_gyro_dropout), ("composer", cf.apply_gyro_dropout)):
            torch.manual_seed(0)
            lone = torch.nn.Sequential(torch.nn.Dropout(p))
            fn(lone, **GYRO)
            found[side] = got = gyro_dropout_structure(lone, rows=2 * tau, features=512, p=p, tau=tau)
            assert got["values"] == [0.0, 1 / (1 - p)] and 1 < got["distinct_rows"] <= tau, (side, got)
            assert got["groups_share_a_mask"] and abs(got["kept"] - (1 - p)) < 0.05 and got["eval_is_identity"], \
                (side, got)
        return (f"training-mode structure matches: {tau} groups of 2 rows, <= {tau} masks (ours "
                f"{found['ours']['distinct_rows']}, Composer {found['composer']['distinct_rows']}), kept "
                f"{found['ours']['kept']:.3f} / {found['composer']['kept']:.3f}; outputs not compared (own RNGs)")

    return ours_fn, theirs_fn, check


def cifar_resnet20():
    from workers.models.cifar_resnet import cifar_resnet20 as build
    torch.manual_seed(0)
    return build(num_classes=10, in_channels=1).eval()


def resnet18():
    from workers.models.resnet import resnet18 as build
    torch.manual_seed(0)
    return build(num_classes=10, in_channels=3).eval()


OPS: dict[str, tuple[Callable[[], tuple], dict[str, int]]] = {
    "cutmix_batch": (cutmix, {}),
    "mixup_batch": (mixup, {}),
    "cutout_batch": (cutout, {}),
    "colout_batch": (colout, {}),
    "resize_batch(0.5)": (resize, {}),
    "smooth_labels": (smooth_labels, {}),
    "compute_ema(resnet20)": (compute_ema, {}),
    "augmix_image(3x32x32)": (augmix, {"block": 5, "rounds": 20}),
    "apply_channels_last(resnet20)": (
        lambda: surgery("apply_channels_last", cifar_resnet20, torch.randn(4, 1, 32, 32)), {"block": 5, "rounds": 10}),
    "apply_blurpool(resnet20)": (
        lambda: surgery("apply_blurpool", cifar_resnet20, torch.randn(4, 1, 32, 32)), {"block": 5, "rounds": 10}),
    "apply_factorization(resnet18)": (
        lambda: surgery("apply_factorization", resnet18, torch.randn(2, 3, 32, 32), exact=False, min_channels=256,
                        min_features=256), {"block": 1, "rounds": 5}),
    "apply_gradient_clipping(resnet20)": (gradient_clipping, {"block": 5, "rounds": 10}),
    "freeze_layers(resnet20)": (freeze_layers, {"block": 5, "rounds": 10}),
    "apply_stochastic_depth(4 bottlenecks)": (
        lambda: surgery("apply_stochastic_depth", bottlenecks, torch.randn(2, 64, 8, 8),
                        target_layer_name="ResNetBottleneck", drop_rate=0.2), {"block": 5, "rounds": 10}),
    "apply_ghost_batchnorm(resnet20)": (
        lambda: surgery("apply_ghost_batchnorm", cifar_resnet20, torch.randn(4, 1, 32, 32), ghost_batch_size=2),
        {"block": 5, "rounds": 10}),
    "apply_squeeze_excite(resnet20)": (
        lambda: surgery("apply_squeeze_excite", cifar_resnet20, torch.randn(4, 1, 32, 32), exact=False,
                        latent_channels=8, min_channels=32), {"block": 5, "rounds": 10}),
    "apply_weight_standardization(resnet20)": (
        lambda: surgery("apply_weight_standardization", cifar_resnet20, torch.randn(4, 1, 32, 32), exact=False),
        {"block": 2, "rounds": 5}),
    # Masks come from each side's own RNG, so outputs are compared by their structure in training
    # mode (gyro_dropout_check). (GatedLinearUnits has no entry: Composer's converts HuggingFace
    # BERT layers only, and Tessera has no BERT.)
    "apply_gyro_dropout(3-layer MLP)": (gyro_dropout, {"block": 5, "rounds": 10}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="op names to run (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import composer
    print(f"torch {torch.__version__}, composer {composer.__version__}, {args.threads} threads, "
          f"batch {BATCH} unless noted; median ms per call")
    print(f"{'op':32} {'ours':>9} {'composer':>9} {'ours/composer':>14}  outputs")
    slower = []
    for name, (make, timing) in OPS.items():
        if args.only and name not in args.only:
            continue
        if name.startswith("apply_") and not hasattr(af, name.split("(")[0]):
            print(f"{name:32} {'-':>9} {'-':>9} {'-':>14}  not implemented here yet")
            continue
        try:
            ours, theirs, check = make()
            checked = check()
        except Exception as error:  # a surgery op that Composer cannot apply to this model, etc.
            print(f"{name:32} {'-':>9} {'-':>9} {'-':>14}  skipped: {type(error).__name__}: {error}")
            continue
        ours_ms, theirs_ms = compare(ours, theirs, **timing)
        ratio = ours_ms / theirs_ms
        if ratio > 1.0:
            slower.append(name)
        print(f"{name:32} {ours_ms:9.3f} {theirs_ms:9.3f} {ratio:14.2f}  {checked}")
    print("apply_alibi: not compared (Composer's needs a HuggingFace GPT-2/BERT model; ours targets gpt_small)")
    print("slower than Composer: " + (", ".join(slower) if slower else "none"))


if __name__ == "__main__":
    main()
