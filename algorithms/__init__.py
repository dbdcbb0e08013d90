"""Speedup methods in the style of MosaicML Composer: one folder per method.

Each method has a torch-only functional form (re-exported from ``algorithms.functional``) and an
``Algorithm`` subclass that wires it to the training loop's events (``algorithms.registry``).
This package imports only torch, torchvision and ``api``; the runtime in ``workers`` drives it.
"""
