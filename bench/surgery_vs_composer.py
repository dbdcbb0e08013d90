"""Tessera's surgery methods next to Composer 0.32.1's functional forms (bench only).

Run with the Composer venv (``make composer-venv``; it has Tessera installed editable):

    .venv-composer/bin/python bench/surgery_vs_composer.py

Checks where the two should agree exactly given the same model, and reports where they differ
by design: ALiBi slopes; BlurPool outputs on ResNet-20 with the same weights; which layers
Factorize replaces at Composer's thresholds (both re-initialize factorized layers randomly by default,
from different random draws, so outputs are not compared).
"""

from __future__ import annotations

import copy
import pathlib
import sys
import warnings

# bench/algorithms.py would shadow Tessera's ``algorithms`` package: drop bench/ from the path.
_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402

import algorithms.functional as af  # noqa: E402
from algorithms.alibi import alibi_slopes  # noqa: E402
from algorithms.blurpool import BlurConv2d, BlurMaxPool2d  # noqa: E402
from algorithms.factorize import FactorizedConv2d, FactorizedLinear  # noqa: E402
from workers.models import cifar_resnet20, resnet18, simple_cnn  # noqa: E402


def main() -> None:
    import composer.functional as cf
    import importlib.util

    import composer

    # Composer's alibi package needs transformers (not installed); its slopes live in a plain module.
    utils_path = (pathlib.Path(composer.__file__).parent / "algorithms" / "alibi" / "attention_surgery_functions"
                  / "utils.py")
    spec = importlib.util.spec_from_file_location("composer_alibi_utils", utils_path)
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    _get_alibi_head_slopes = utils._get_alibi_head_slopes
    from composer.algorithms.factorize.factorize_modules import FactorizedConv2d as CFConv
    from composer.algorithms.factorize.factorize_modules import FactorizedLinear as CFLinear

    warnings.simplefilter("ignore")
    for heads in (1, 2, 3, 4, 6, 8, 12, 16, 20):
        assert alibi_slopes(heads) == [float(s) for s in _get_alibi_head_slopes(heads)], heads
    print("alibi slopes: identical for 1, 2, 3, 4, 6, 8, 12, 16, 20 heads")

    torch.manual_seed(0)
    for name, build in (("cifar_resnet20", lambda: cifar_resnet20(10)), ("simple_cnn", lambda: simple_cnn(10))):
        ours = build().eval()
        theirs = copy.deepcopy(ours)
        af.apply_blurpool(ours)
        cf.apply_blurpool(theirs)
        x = torch.randn(4, 3, 32, 32)
        diff = (ours(x) - theirs(x)).abs().max().item()
        kinds = sorted(type(m).__name__ for m in ours.modules() if isinstance(m, (BlurConv2d, BlurMaxPool2d)))
        print(f"blurpool {name}: replaced {kinds}; max |ours - composer| = {diff:.2e}")

    for name, build in (("resnet18", lambda: resnet18(10)),):
        ours = build()
        theirs = copy.deepcopy(ours)
        af.apply_factorization(ours, min_channels=256, min_features=256)
        cf.apply_factorization(theirs, min_channels=256, min_features=256)
        mine = [n for n, m in ours.named_modules() if isinstance(m, (FactorizedConv2d, FactorizedLinear))]
        composer = [n for n, m in theirs.named_modules() if isinstance(m, (CFConv, CFLinear))]
        count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        print(f"factorize {name}: same layers replaced: {mine == composer} ({len(mine)}); "
              f"params ours {count(ours)} vs composer {count(theirs)}")


if __name__ == "__main__":
    main()
