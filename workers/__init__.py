"""Tessera's training runtime: the loop, its engine and state, data, models, and Ray entry points.

Imports ``algorithms``, ``api``, torch and ray; never ``service``. All contact with
``ray.train`` lives in ``workers.ray_train``.
"""
