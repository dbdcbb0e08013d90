"""Composer compatibility of the functional forms: ours and Composer 0.32.1's on the same inputs.

    make bench-composer-compat        # = .venv-composer/bin/python bench/composer_compat.py

Each case calls both sides on identical inputs (PIL images and tensors, range ends) and checks
that ours accepts whatever Composer's accepts and returns the same kind of thing: PIL in, PIL
out of the same mode and size; tensor in, tensor of the same shape. Where both are deterministic
given the same seed (torch draws on both sides), box, permutation or weight, the outputs are
compared too. Then every function both modules export has its parameters compared by name,
default, kind and order (``signature_gaps``). Prints a table; exits 1 if ours refused an input
Composer took, returned another type, or has a signature a call written for Composer's breaks.
"""

from __future__ import annotations

import argparse
import inspect
import pathlib
import sys
import traceback
import warnings
from typing import Any, Callable

# This directory holds bench/algorithms.py, named like the package under test: drop it from the
# import path so that `import algorithms` finds Tessera's package.
_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

import algorithms.functional as af  # noqa: E402

try:
    import composer.functional as cf
except ImportError as error:  # pragma: no cover - a hint for the wrong interpreter
    raise SystemExit("Composer is not installed here; run `make bench-composer-compat` "
                     "(it uses .venv-composer/bin/python)") from error


def rgb(height: int = 20, width: int = 24, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8))


def describe(value: Any) -> str:
    if isinstance(value, Image.Image):
        return f"PIL {value.mode} {value.size[0]}x{value.size[1]}"
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(describe(v) for v in value) + ")"
    if isinstance(value, float):
        return f"{value:.4g}"
    return type(value).__name__


def kind(value: Any) -> Any:
    """What must match between the two sides: type, PIL mode and size, tensor shape."""
    if isinstance(value, Image.Image):
        return ("PIL", value.mode, value.size)
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape))
    if isinstance(value, (tuple, list)):
        return tuple(kind(v) for v in value)
    if isinstance(value, (int, float, np.number)):  # 0 vs 0.0, int vs numpy.int64: both numbers
        return "number"
    return type(value).__name__


def as_array(value: Any) -> np.ndarray:
    if isinstance(value, Image.Image):
        return np.asarray(value).astype(np.float64)
    return value.detach().double().numpy()


def max_diff(a: Any, b: Any) -> float:
    if isinstance(a, (tuple, list)):
        return max(max_diff(u, v) for u, v in zip(a, b) if isinstance(u, (torch.Tensor, Image.Image)))
    x, y = as_array(a), as_array(b)
    return float(np.abs(x - y).max()) if x.size else 0.0


# --- the cases ------------------------------------------------------------------------------
# (name, input description, call(fn_module) -> result, compare) where compare is None (kinds
# only) or a tolerance: the largest allowed difference between outputs when both sides are run
# after the same torch.manual_seed.

Case = tuple[str, str, Callable[[Any], Any], "float | None", int]
X = torch.rand(4, 3, 16, 16)
X8 = (X * 255).to(torch.uint8)
Y = torch.tensor([0, 1, 2, 3])
PERM = torch.tensor([3, 2, 1, 0])
IMAGE = rgb()
GRAY = rgb().convert("L")

CASES: list[Case] = []


def case(name: str, given: str, call: Callable[[Any], Any], tolerance: float | None = None, seeds: int = 1) -> None:
    """``seeds`` > 1: Composer's side counts as accepting the input only if it does for every
    seed (its PIL primitives raise on some modes only when a particular operation is drawn)."""
    CASES.append((name, given, call, tolerance, seeds))


for label, image in (("PIL RGB", IMAGE), ("PIL L", GRAY), ("tensor CHW", X[0]), ("tensor NCHW", X)):
    case("augmix_image", f"{label}", lambda f, i=image: f.augmix_image(i))
    for kwargs in ({"severity": 0}, {"severity": 10}, {"depth": 1, "width": 1}, {"depth": 3, "width": 5},
                   {"alpha": 0.01}):
        if label.startswith("PIL RGB") or label == "tensor CHW":
            case("augmix_image", f"{label} {kwargs}", lambda f, i=image, k=kwargs: f.augmix_image(i, **k))
    case("randaugment_image", f"{label}", lambda f, i=image: f.randaugment_image(i))
    for kwargs in ({"severity": 0}, {"severity": 10}, {"depth": 1}, {"depth": 5}):
        if label.startswith("PIL RGB") or label == "tensor CHW":
            case("randaugment_image", f"{label} {kwargs}", lambda f, i=image, k=kwargs: f.randaugment_image(i, **k))
case("augmix_image", "tensor CHW uint8", lambda f: f.augmix_image(X8[0]))
for mode in ("RGBA", "P", "LA"):
    case("augmix_image", f"PIL {mode}", lambda f, m=mode: f.augmix_image(IMAGE.convert(m)), seeds=20)
    case("randaugment_image", f"PIL {mode}", lambda f, m=mode: f.randaugment_image(IMAGE.convert(m)), seeds=20)
case("augmix_image", "tensor CHW alpha=0", lambda f: f.augmix_image(X[0], alpha=0.0))
case("randaugment_image", "PIL RGB depth=0", lambda f: f.randaugment_image(IMAGE, depth=0), 0.0)
case("randaugment_image", "tensor CHW depth=0", lambda f: f.randaugment_image(X[0], depth=0), 1 / 255)

for label, sample in (("PIL RGB", IMAGE), ("PIL L", GRAY), ("PIL RGBA", IMAGE.convert("RGBA")),
                      ("tensor NCHW", X), ("tensor CHW", X[0]), ("(PIL, PIL mask)", (IMAGE, GRAY)),
                      ("[PIL, PIL mask]", [IMAGE, GRAY]), ("(tensor, labels)", (X, Y)),
                      ("(tensor, mask)", (X, X[:, 0]))):
    # Same torch seed on both sides, and both draw rows then columns with torch.randperm.
    case("colout_batch", label, lambda f, s=sample: f.colout_batch(s), 0.0)
for p_row, p_col in ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 1.0)):
    for label, sample in (("PIL RGB", IMAGE), ("tensor NCHW", X)):
        case("colout_batch", f"{label} p_row={p_row} p_col={p_col}",
             lambda f, s=sample, r=p_row, c=p_col: f.colout_batch(s, p_row=r, p_col=c), 0.0)

for label, image in (("PIL RGB", IMAGE), ("PIL L", GRAY), ("PIL RGBA", IMAGE.convert("RGBA")),
                     ("tensor NCHW", X), ("tensor CHW", X[0])):
    case("cutout_batch", label, lambda f, i=image: f.cutout_batch(i))  # numpy vs torch draws: kinds only
for kwargs in ({"num_holes": 0}, {"length": 0.0}, {"length": 1.0}, {"num_holes": 3, "uniform_sampling": True}):
    tolerance = 0.0 if kwargs.get("num_holes") == 0 or kwargs.get("length") == 0.0 else None
    case("cutout_batch", f"PIL RGB {kwargs}", lambda f, k=kwargs: f.cutout_batch(IMAGE, **k), tolerance)
    case("cutout_batch", f"tensor NCHW {kwargs}", lambda f, k=kwargs: f.cutout_batch(X, **k), tolerance)

case("mixup_batch", "alpha=0", lambda f: f.mixup_batch(X, Y, alpha=0.0, indices=PERM), 0.0)
case("mixup_batch", "mixing=0, indices", lambda f: f.mixup_batch(X, Y, mixing=0.0, indices=PERM), 0.0)
case("mixup_batch", "mixing=1, indices", lambda f: f.mixup_batch(X, Y, mixing=1.0, indices=PERM), 1e-6)
case("mixup_batch", "one-hot targets", lambda f: f.mixup_batch(X, torch.eye(4)[Y], mixing=0.3, indices=PERM), 1e-6)
case("cutmix_batch", "alpha=0", lambda f: f.cutmix_batch(X, Y, alpha=0.0, indices=PERM))
case("cutmix_batch", "alpha=1", lambda f: f.cutmix_batch(X, Y, alpha=1.0, indices=PERM))
case("cutmix_batch", "bbox, indices", lambda f: f.cutmix_batch(X, Y, bbox=(2, 3, 9, 12), indices=PERM), 0.0)
case("cutmix_batch", "full bbox", lambda f: f.cutmix_batch(X, Y, bbox=(0, 0, 16, 16), indices=PERM), 0.0)
# Composer's code reads length backwards (box side sqrt(1 - length**2)): 1.0 mixes nothing, 0.0
# everything; ours follows its documentation (side length * H). Kinds only.
case("cutmix_batch", "length=1.0", lambda f: f.cutmix_batch(X, Y, length=1.0, indices=PERM))
case("cutmix_batch", "length=0.0", lambda f: f.cutmix_batch(X, Y, length=0.0, indices=PERM))
case("cutmix_batch", "one-hot targets", lambda f: f.cutmix_batch(X, torch.eye(4)[Y], bbox=(1, 1, 5, 5), indices=PERM),
     0.0)
for scale in (1.0, 0.5, 0.3):
    for mode in ("resize", "crop"):
        tolerance = 0.0 if mode == "resize" or scale == 1.0 else None
        case("resize_batch", f"scale={scale} {mode}", lambda f, s=scale, m=mode: f.resize_batch(X, Y, s, mode=m),
             tolerance)
case("resize_batch", "scale=0.5 resize, mask targets",
     lambda f: f.resize_batch(X, (X[:, 0] * 5).long(), 0.5, resize_targets=True), 0.0)
for smoothing in (0.0, 0.1, 1.0):
    case("smooth_labels", f"(N, C) indices s={smoothing}",
         lambda f, s=smoothing: f.smooth_labels(torch.randn(4, 10), Y, s), 1e-6)
case("smooth_labels", "(N, C, H, W) logits, (N, H, W) indices",
     lambda f: f.smooth_labels(torch.randn(2, 5, 3, 4), torch.randint(0, 5, (2, 3, 4)), 0.2), 1e-6)
case("smooth_labels", "(N, C) one-hot targets", lambda f: f.smooth_labels(torch.randn(4, 10), torch.eye(10)[Y], 0.1),
     1e-6)


def ema(smoothing: float) -> Callable[[Any], Any]:
    def call(f):
        torch.manual_seed(1)
        model, averaged = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)), \
            torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
        f.compute_ema(model, averaged, smoothing)
        return torch.cat([p.detach().flatten() for p in averaged.parameters()])
    return call


for smoothing in (0.0, 0.5, 1.0):
    case("compute_ema", f"smoothing={smoothing}", ema(smoothing), 1e-6)


def clipped(clipping_type: str, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
    """Composer's call shape (model first, fsdp_enabled), on the same gradients both sides."""
    def call(f):
        torch.manual_seed(2)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
        model(torch.randn(8, 6)).pow(2).sum().backward()
        f.apply_gradient_clipping(model, clipping_type, *args, **kwargs)
        return torch.cat([p.grad.flatten() for p in model.parameters()])
    return call


for clipping_type, threshold in (("norm", 0.1), ("value", 0.05), ("adaptive", 0.01)):
    case("apply_gradient_clipping", f"{clipping_type} {threshold}, fsdp_enabled=False",
         clipped(clipping_type, threshold, False), 1e-6)
    case("apply_gradient_clipping", f"{clipping_type} by keyword, fsdp_enabled=False",
         clipped(clipping_type, clipping_threshold=threshold, fsdp_enabled=False), 1e-6)
# fsdp_enabled=True without FSDP1 wrappers: Composer finds no root and clips nothing, ours clips.
case("apply_gradient_clipping", "norm 0.1, fsdp_enabled=True, no FSDP", clipped("norm", 0.1, True))


def token_batch(padded: bool) -> dict[str, torch.Tensor]:
    """Three rows of 8 tokens (ids 10..), labels alongside; ``padded``: right padding, rows 1 and 2
    end after 5 and 2 tokens (one past a cut to 3, one within it)."""
    ids = torch.arange(10, 34).reshape(3, 8)
    mask = torch.ones(3, 8, dtype=torch.long)
    if padded:
        mask[1, 5:] = 0
        mask[2, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids + 100}


def cut(length: int, padded: bool = False, **kwargs: Any) -> Callable[[Any], Any]:
    def call(f):  # Composer cuts the dict in place: a fresh one each call; keys in a fixed order
        out = f.set_batch_sequence_length(token_batch(padded), length, **kwargs)
        return tuple(out[k] for k in sorted(out))
    return call


for padded in (False, True):
    for length in (3, 8):
        for kwargs in ({}, {"preserve_end_of_sequence": True}, {"truncate": True, "preserve_end_of_sequence": False}):
            case("set_batch_sequence_length", f"dict{' padded' if padded else ''} to {length} {kwargs}",
                 cut(length, padded=padded, **kwargs), 0.0)
case("set_batch_sequence_length", "dict to 4 truncate=False", cut(4, truncate=False), 0.0)
case("set_batch_sequence_length", "dict to 4 truncate=False, preserve", cut(4, truncate=False,
                                                                           preserve_end_of_sequence=True), 0.0)
case("set_batch_sequence_length", "dict without attention_mask, preserve",
     lambda f: f.set_batch_sequence_length({"input_ids": torch.arange(16).reshape(2, 8)}, 3,
                                           preserve_end_of_sequence=True)["input_ids"], 0.0)

case("should_selective_backprop", "grid of durations, batches, start/end, interrupt 0..3",
     lambda f: torch.tensor([f.should_selective_backprop(d, b, s, e, i) for d in (0.0, 0.49, 0.5, 0.7, 0.9, 0.99)
                             for b in range(7) for s, e in ((0.5, 0.9), (0.0, 1.0)) for i in (0, 1, 2, 3)]), 0.0)
case("should_selective_backprop", "defaults", lambda f: torch.tensor([f.should_selective_backprop(0.6, b)
                                                                      for b in range(6)]), 0.0)


def quietly(call: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # both sides warn NoEffectWarning (each its own class)
        return call()


for norm in ("layernorm", "groupnorm"):
    layer = (lambda: torch.nn.LayerNorm(4)) if norm == "layernorm" else (lambda: torch.nn.GroupNorm(2, 4))
    case(f"apply_low_precision_{norm}", "precision omitted (None)",
         lambda f, n=norm, m=layer: quietly(lambda: getattr(f, f"apply_low_precision_{n}")(torch.nn.Sequential(m()))))


# --- running them ---------------------------------------------------------------------------


def run(call: Callable[[Any], Any], module: Any, seed: int) -> tuple[Any, str | None]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    try:
        return call(module), None
    except Exception as error:  # noqa: BLE001 - the table reports what each side raised
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:70] if str(error) else ''}"


def check_case(name: str, given: str, call: Callable[[Any], Any], tolerance: float | None,
               seeds: int) -> tuple[str, str, bool]:
    ours, our_error = run(call, af, 0)
    theirs, their_error = run(call, cf, 0)
    if seeds > 1 and not their_error:
        errors = [error for seed in range(1, seeds) for _, error in [run(call, cf, seed)] if error]
        if errors:
            their_error = f"{errors[0]} (for {len(errors)}/{seeds} seeds)"
    if their_error and our_error:
        return "both refuse", f"composer {their_error} | ours {our_error}", True
    if our_error:
        return "FAIL", f"ours refuses what Composer takes: {our_error}", False
    if their_error:
        return "ours only", f"Composer raises {their_error}; ours -> {describe(ours)}", True
    if kind(ours) != kind(theirs):
        return "FAIL", f"ours -> {describe(ours)}, composer -> {describe(theirs)}", False
    detail = describe(ours if not isinstance(ours, tuple) else ours[0])
    if tolerance is None:
        return "same kind", detail, True
    diff = max_diff(ours, theirs)
    if diff > tolerance:
        return "DIFFERS", f"{detail}; max diff {diff:.3g} > {tolerance:g}", True
    return "equal" if diff == 0 else "close", f"{detail}; max diff {diff:.3g}", True


def signature_gaps(ours_fn: Callable[..., Any], theirs_fn: Callable[..., Any]) -> tuple[list[str], list[str]]:
    """(gaps, notes) of our signature against Composer's. A gap breaks a call written for
    Composer's: a parameter we lack, one we require that Composer defaults, another default, one
    Composer passes positionally that we take by keyword only, our extra parameters without
    defaults, another order. Notes break nothing: a default where Composer requires the argument,
    extra parameters with defaults."""
    theirs = inspect.signature(theirs_fn).parameters
    ours = inspect.signature(ours_fn).parameters
    empty = inspect.Parameter.empty
    gaps, notes = [], []
    missing = [p for p in theirs if p not in ours and theirs[p].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                                            inspect.Parameter.VAR_KEYWORD)]
    if missing and not any(q.kind is inspect.Parameter.VAR_KEYWORD for q in ours.values()):
        gaps.append("missing " + ", ".join(missing))
    for name in (p for p in theirs if p in ours):
        mine, their = ours[name], theirs[name]
        if their.default is not empty and mine.default is empty:
            gaps.append(f"{name}: ours required, Composer's defaults to {their.default!r}")
        elif (their.default is not empty and mine.default != their.default and not callable(their.default)
              and not isinstance(their.default, (list, tuple))):
            gaps.append(f"{name}: ours {mine.default!r} vs {their.default!r}")
        elif their.default is empty and mine.default is not empty:
            notes.append(f"{name} defaults to {mine.default!r} (Composer: required)")
        if their.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and mine.kind is not their.kind:
            gaps.append(f"{name}: ours {mine.kind.description}, Composer's positional or keyword")
    order = [p for p in theirs if p in ours]
    ours_order = [p for p in ours if p in theirs]
    if order != ours_order:
        gaps.append(f"order differs: {ours_order}")
    extra = [p for p in ours if p not in theirs and ours[p].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                                         inspect.Parameter.VAR_KEYWORD)]
    required = [p for p in extra if ours[p].default is empty]
    if required:
        gaps.append("ours also requires " + ", ".join(required))
    if len(extra) > len(required):
        notes.append("ours also takes " + ", ".join(p for p in extra if p not in required))
    return gaps, notes


def signature_rows() -> list[tuple[str, str, bool]]:
    """(name, note, ok) for every function Composer exports; ``ok`` False for a gap. A function
    we do not have yet is listed, not failed (the table's last line names them)."""
    rows = []
    for name in sorted(set(cf.__all__) & set(af.__all__)):
        gaps, notes = signature_gaps(getattr(af, name), getattr(cf, name))
        text = "; ".join(gaps + notes) or "same parameters and defaults"
        rows.append((name, ("GAP: " if gaps else "") + text, not gaps))
    for name in sorted(set(cf.__all__) - set(af.__all__)):
        rows.append((name, "not in algorithms.functional", True))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="function names to run (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import composer
    import PIL
    print(f"torch {torch.__version__}, composer {composer.__version__}, pillow {PIL.__version__}")
    print(f"{'function':29} {'input':50} {'result':11}  detail")
    failed = []
    for name, given, call, tolerance, seeds in CASES:
        if args.only and name not in args.only:
            continue
        try:
            result, detail, ok = check_case(name, given, call, tolerance, seeds)
        except Exception:  # a bug in the comparison itself: show it, count it
            result, detail, ok = "ERROR", traceback.format_exc().splitlines()[-1], False
        print(f"{name:29} {given:50} {result:11}  {detail}")
        if not ok:
            failed.append(f"{name}({given})")
    print()
    print(f"{'function':32} signature against Composer's")
    absent = []
    for name, note, ok in signature_rows():
        print(f"{name:32} {note}")
        if not ok:
            failed.append(f"{name} signature")
        elif note == "not in algorithms.functional":
            absent.append(name)
    print()
    print("incompatible: " + (", ".join(failed) if failed else "none")
          + "; not in algorithms.functional: " + (", ".join(absent) if absent else "none"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
