"""The trained model as one file, and ``load_model`` to rebuild it.

At the end of training (``Trainer.fit``), every rank gathers the model's full state dict (a
collective under FSDP) and rank 0 writes it to ``{run}/exports/step-{N}.safetensors`` and
``.pt``, where N is the final batch. The service streams those files
(``GET /api/v1/runs/{id}/model``); it never needs torch. The files carry what rebuilds the
model: the run spec (model spec and the algorithm list, whose surgery algorithms are replayed
on a fresh model), the classes, input channels and image size, and the final eval metrics.

``load_model(source)`` takes a run id (fetched from the service), a URL or a local path, and
returns the ``nn.Module`` in eval mode with the surgery replayed and the weights loaded. A model
built from your own code (the spec's ``code.digest``) gets its code package installed first, as
workers install it (``install_export_code``). ``load_export(source)`` returns it with the input
transform that turns raw images into what it was trained on (``workers.data.inference``).
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from api.data_specs import dataset_domain
from api.model_specs import ImportedModelSpec
from api.specs import RunSpec
from workers.checkpoint.storage import storage_for
from workers.paths import code_package_url, export_url

FORMATS = ("safetensors", "torch")

log = logging.getLogger(__name__)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unwrapped model's full state dict on CPU. Under a process group every rank must call
    it (FSDP gathers its shards); rank 0 gets the tensors, other ranks may get an empty dict."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        state = getattr(model, "module", model).state_dict()
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {key: value.detach().cpu().contiguous().clone() for key, value in state.items()
            if isinstance(value, torch.Tensor)}


def export_metadata(spec: RunSpec, *, surgery: list[Any], step: int, num_classes: int, in_channels: int,
                    image_size: int | None, metrics: dict[str, float]) -> dict[str, str]:
    """What ``load_model`` needs to rebuild the model, as safetensors' string-to-string metadata.
    ``surgery``: the specs of the run's algorithms that change the model (recorded for people;
    ``load_model`` replays them from the spec)."""
    surgery = [a.model_dump(mode="json") for a in surgery]
    return {"format": "pt", "tessera.spec": spec.model_dump_json(), "tessera.step": str(step),
            "tessera.num_classes": str(num_classes), "tessera.in_channels": str(in_channels),
            "tessera.image_size": json.dumps(image_size), "tessera.surgery": json.dumps(surgery),
            "tessera.metrics": json.dumps({k: v for k, v in metrics.items() if k.startswith("eval/")})}


def write_exports(run: str, state: dict[str, torch.Tensor], metadata: dict[str, str]) -> dict[str, str]:
    """Write both formats under ``{run}/exports/``; return their URLs by format. The safetensors
    file goes last: the service reads an export as READY once that file exists, and a download
    of the other format must find it there by then."""
    from safetensors.torch import save

    step = int(metadata["tessera.step"])
    urls = {fmt: export_url(run, step, fmt) for fmt in FORMATS}
    storage = storage_for(run)
    buffer = io.BytesIO()
    torch.save({"state_dict": state, "metadata": metadata}, buffer)
    storage.write_bytes(urls["torch"], buffer.getvalue())
    storage.write_bytes(urls["safetensors"], save(state, metadata=metadata))
    return urls


def read_export(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The state dict and metadata of an exported file's bytes (either format)."""
    if data[:2] == b"PK":  # torch.save's zip
        saved = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        return saved["state_dict"], saved["metadata"]
    from safetensors.torch import load

    header_len = int.from_bytes(data[:8], "little")
    metadata = json.loads(data[8:8 + header_len]).get("__metadata__", {})
    return load(data), metadata


def rebuild_model(metadata: dict[str, str]) -> torch.nn.Module:
    """A fresh model as the run built it, with its surgery algorithms applied (no weights loaded:
    the caller loads them, so surgery skips computing how its new tensors start)."""
    from algorithms.registry import build_algorithms
    from workers.engine import Engine
    from workers.events import Event
    from workers.models import build_model
    from workers.models.user_code import loss_of
    from workers.loss import soft_cross_entropy
    from workers.state import State

    spec = RunSpec.model_validate_json(metadata["tessera.spec"])
    num_classes, in_channels = int(metadata["tessera.num_classes"]), int(metadata["tessera.in_channels"])
    model = build_model(spec.model, num_classes=num_classes, in_channels=in_channels,
                        image_size=json.loads(metadata["tessera.image_size"]),
                        domain=dataset_domain(spec.data.train))
    surgery = [a for a in build_algorithms(spec.algorithms) if a.changes_model]
    state = State(model=model, num_classes=num_classes, max_batches=1, loss_fn=loss_of(model, soft_cross_entropy),
                  algorithms=surgery, loads_weights=True)  # the export's tensors are loaded next
    Engine(surgery).run_event(Event.INIT, state)
    return state.model


@dataclass
class LoadedExport:
    """A run's exported model ready for inference, with what it expects: ``input_transform``
    (``workers.data.inference``: raw images to the model's inputs; None when the data set has no
    raw image form, e.g. your own data set's code), the run's ``spec``, the ``step`` it was
    exported at and its final evaluation ``metrics``."""

    model: torch.nn.Module
    spec: RunSpec
    step: int
    metrics: dict[str, float]

    @functools.cached_property
    def input_transform(self) -> Any:
        """Built when first read (the digits' statistics load scikit-learn's data set)."""
        from workers.data.inference import input_transform

        return input_transform(self.spec)


def load_export(source: str, *, step: int | None = None, service_url: str | None = None,
                fmt: str = "safetensors", project: str | None = None) -> LoadedExport:
    """The trained model of ``source`` ready for inference (eval mode, on CPU), with its input
    transform and what the run recorded (``LoadedExport``).

    ``source``: a run id (its export fetched from the service at ``service_url``, default where
    the SDK's ``Client`` finds it: ``$TESSERA_URL``, else the credentials file's URL), or an
    fsspec URL / local path of an exported file. A model built from your own code is rebuilt
    from the run's code package (``install_export_code``; ``project``: the project it was
    uploaded to, where the run id does not say).
    """
    data = _fetch(source, step=step, service_url=service_url, fmt=fmt)
    state, metadata = read_export(data)
    install_export_code(metadata, source, service_url=service_url, project=project)
    model = rebuild_model(metadata)
    model.load_state_dict(state)
    spec = RunSpec.model_validate_json(metadata["tessera.spec"])
    return LoadedExport(model=model.eval(), spec=spec, step=int(metadata["tessera.step"]),
                        metrics=json.loads(metadata.get("tessera.metrics", "{}")))


def load_model(source: str, *, step: int | None = None, service_url: str | None = None,
               fmt: str = "safetensors", project: str | None = None) -> torch.nn.Module:
    """The trained model of ``source`` ready for inference (eval mode, on CPU): ``load_export``'s
    ``model``. Its inputs are what the run's data set made, not raw pixels: ``load_export``
    gives the ``input_transform`` that makes them."""
    return load_export(source, step=step, service_url=service_url, fmt=fmt, project=project).model


def _service_url(service_url: str | None) -> str:
    """``service_url``, else where the SDK's ``Client`` finds the service (``TESSERA_URL``, the
    credentials file)."""
    from api.client import service_url as find_url

    return find_url(service_url)


def _as_url(source: str) -> str | None:
    """``source`` as an fsspec URL (a local path becomes ``file://``), or None for a run id."""
    if os.path.exists(source):
        return "file://" + os.path.abspath(source)
    return source if "://" in source else None


def _fetch(source: str, *, step: int | None, service_url: str | None, fmt: str) -> bytes:
    url = _as_url(source)
    if url is not None:
        return storage_for(url).read_bytes(url)
    import tempfile

    from api.client import Client

    with Client(_service_url(service_url)) as client, tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model")
        client.download_model(source, path, fmt=fmt, step=step)
        with open(path, "rb") as file:
            return file.read()


# ``workers.paths.export_url`` under a storage root: ``{storage}/runs/{id}/exports/step-{N}.{suffix}``.
_EXPORT_IN_STORAGE = re.compile(r"^(?P<storage>.+)/runs/[^/]+/exports/step-\d+\.(?:safetensors|pt)$")


def install_export_code(metadata: dict[str, str], source: str, *, service_url: str | None = None,
                        project: str | None = None) -> Path | None:
    """Make the code package an export's model was built from importable, through the workers'
    ``install_code`` (checked against ``code.digest``, unpacked once under ``$TESSERA_CODE_CACHE``,
    first on ``sys.path``); its folder, or None for a model that needs no package.

    Only a package the cache lacks is fetched: from the storage the export lies in when
    ``source`` is an export's URL or path there and the package is stored beside it, else
    from the service at ``service_url`` (default as ``load_model``'s; ``GET /api/v1/code/{digest}/package``
    with your API key) in ``project`` (default: the run's project for a run id, else the key's
    only project, else ``default``). It runs in your process, as your model's code does.

    A package that cannot be had, while ``model.import``'s package is importable here anyway
    (installed, on ``sys.path``), leaves that one to be imported, with a warning: as before
    ``load_model`` installed packages."""
    spec = RunSpec.model_validate_json(metadata["tessera.spec"])
    if spec.code is None or not isinstance(spec.model, ImportedModelSpec):  # a built-in model needs no package
        return None
    import importlib.util
    import warnings

    from workers.models.user_code import UserCodeError, install_code
    from workers.models.user_requirements import RequirementsError

    digest = spec.code.digest
    try:
        return install_code(spec.code, storage_url=None,
                            fetch=lambda: _fetch_code(digest, source, service_url=service_url, project=project))
    except RequirementsError:
        raise  # the package is there; what it needs is not: importing it from elsewhere would not help
    except UserCodeError as exc:
        top_level = spec.model.module_name.split(".")[0]
        found = importlib.util.find_spec(top_level)
        if found is None:
            raise
        warnings.warn(f"{exc}; importing {top_level!r} from {found.origin or found.submodule_search_locations} "
                      "instead, which may differ from the code the run trained", stacklevel=3)
        return None


def _fetch_code(digest: str, source: str, *, service_url: str | None, project: str | None) -> tuple[bytes, str]:
    """The package's bytes and where they came from (``install_code``'s ``fetch``)."""
    import tempfile

    from api.client import Client
    from api.errors import ApiError
    from workers.models.user_code import UserCodeError, read_package

    url = _as_url(source)
    stored = _EXPORT_IN_STORAGE.match(url) if url is not None else None
    if stored is not None:
        package_url = code_package_url(stored["storage"], digest)
        try:
            if storage_for(package_url).isfile(package_url):
                return read_package(digest, package_url)
        except Exception as exc:  # a storage we cannot read here: the service may still serve it
            log.info("reading the code package at %s failed (%s); asking the service", package_url, exc)
    base = _service_url(service_url)
    where = f"the service at {base}"
    with Client(base) as client, tempfile.TemporaryDirectory() as folder:
        try:
            if project is None and url is None:  # a run id: its package is in the run's project
                project = client.get_run(source).project
            path = Path(folder) / f"{digest}.zip"
            client.download_code(digest, path, project=project)
            return path.read_bytes(), where
        except ApiError as exc:
            if exc.status_code != 404:
                raise UserCodeError(f"code.digest {digest}: cannot download the package from {where}: {exc}") from None
            in_project = f"project {project}" if project else "the API key's default project"
            raise UserCodeError(
                f"code.digest {digest}: {where} has no such package in {in_project} ({exc}); pass project= "
                "(the run's project), service_url= (the service that ran the run), or upload the package again "
                "(Client.upload_code, `tessera submit --code DIR`)") from None
        except Exception as exc:  # unreachable, a package cut short, ...
            raise UserCodeError(f"code.digest {digest}: cannot download the package from {where}: "
                                f"{type(exc).__name__}: {exc}; set service_url= (or $TESSERA_URL) to the service "
                                "that ran the run") from None


# --- an earlier step, on request ---------------------------------------------------------
# ``POST /api/v1/runs/{id}/exports {"step": N}`` has the service write an export request next to
# the run's exports and submit ``python -m workers.export --request URL`` as a Ray job: the
# service never imports torch, so consolidating a sharded checkpoint happens here, on a worker.

def export_checkpoint(checkpoint_url: str, *, spec: RunSpec, metrics: dict[str, float] | None = None,
                      storage_url: str | None = None) -> dict[str, str]:
    """Consolidate the model weights of the committed checkpoint at ``checkpoint_url`` (any world
    size, DDP or FSDP) into one file per format under the run's ``exports/``; return their URLs.

    The model is rebuilt from ``spec`` and the checkpoint's marker (classes, channels, image
    size), its surgery replayed, and the weights loaded strictly before anything is written, so a
    file that cannot be loaded back is never exported."""
    from algorithms.registry import build_algorithms
    from workers.checkpoint import MARKER, join, read_checkpoint
    from workers.paths import run_of_checkpoints

    storage = storage_for(checkpoint_url)
    marker = json.loads(storage.read_bytes(join(checkpoint_url, MARKER)))
    fingerprint = marker["fingerprint"]
    if spec.code is not None:  # the run's own model code, as its workers installed it
        from workers.models.user_code import install_code

        install_code(spec.code, storage_url=storage_url)
    surgery = [s for s, a in zip(spec.algorithms, build_algorithms(spec.algorithms)) if a.changes_model]
    metadata = export_metadata(spec, surgery=surgery, step=int(marker["step"]),
                               num_classes=int(fingerprint["num_classes"]),
                               in_channels=int(fingerprint["in_channels"]),
                               image_size=marker.get("inputs", {}).get("image_size"), metrics=metrics or {})
    model = rebuild_model(metadata)
    state = {key: value.detach().cpu().contiguous() for key, value in read_checkpoint(checkpoint_url)["model"].items()
             if isinstance(value, torch.Tensor)}
    model.load_state_dict(state)  # strict: the export must rebuild
    return write_exports(run_of_checkpoints(run_of_checkpoints(checkpoint_url)), state, metadata)


def main(argv: list[str] | None = None) -> int:
    """``python -m workers.export --request URL``: carry out one export request (a JSON file
    the service wrote: ``{spec, checkpoint_url, metrics}``)."""
    import argparse
    import os

    parser = argparse.ArgumentParser(prog="python -m workers.export")
    parser.add_argument("--request", required=True, help="URL of the export request JSON")
    args = parser.parse_args(argv)
    request = json.loads(storage_for(args.request).read_bytes(args.request))
    urls = export_checkpoint(request["checkpoint_url"], spec=RunSpec.model_validate(request["spec"]),
                             metrics=request.get("metrics"), storage_url=os.environ.get("TESSERA_STORAGE_URL"))
    print(json.dumps({"exported": urls}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
