"""RunSpec: everything a run needs, validated before anything is stored or scheduled.

All models forbid unknown fields. A validation error names the field (its ``loc``), the bad
value (``input``) and what is allowed (``msg``); the service returns those as a 422.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, WrapValidator, field_validator, model_validator

from api.algorithm_specs import AlgorithmSpec
from api.catalog import (ALGORITHMS, DATASETS, MODEL_RESIDUAL_BLOCKS, MODELS, MODELS_WITHOUT_BATCHNORM,
                         MODELS_WITHOUT_DROPOUT, arch_lacks_batchnorm, arch_lacks_dropout, residual_blocks_of_arch)
from api.data_specs import (ImageFolderSpec, ImportedDataSpec, WebDatasetSpec, dataset_domain, dataset_label,
                             route_data_spec, task_problem)
from api.eval_metric_specs import BUILTIN_EVAL_METRICS, MAX_EVAL_METRICS, EvalMetricList, eval_metric_problems
from api.logger_specs import LoggerSpec
from api.model_specs import (CodeRef, ImportedModelSpec, ModelTraits, TorchvisionModelSpec, imported_traits,
                             route_model_spec, torchvision_traits)
from api.run_edits import MAX_TAGS, TAG_CHARSET, Tag
from api.time import DurationTime, IntervalTime, OffsetTime, Time, TimeUnit
from api.validation_errors import worded_pattern

NAME_PATTERN = worded_pattern(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
                              "letters, digits, '_', '.' and '-', starting with a letter or digit")
WALL_TIME_PATTERN = worded_pattern(r"^[1-9][0-9]{0,8}(s|m|h|d)$",
                                   "a whole number of seconds, minutes, hours or days: '90s', '90m', '12h', '2d'")


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- models -----------------------------------------------------------------------------

class CifarResNetParams(Spec):
    width: int = Field(16, ge=4, le=256, description="channels of the first stage (16 in the paper)")


class ResNet18Params(Spec):
    small_input_stem: bool = Field(True, description="3x3 stride-1 stem without max-pool, for images <= 64px")


class SimpleCNNParams(Spec):
    width: int = Field(32, ge=4, le=512)
    hidden: int = Field(128, ge=8, le=4096)


class GPTSmallParams(Spec):
    n_layer: int = Field(4, ge=1, le=48, description="transformer blocks")
    n_head: int = Field(4, ge=1, le=64, description="attention heads; must divide d_model")
    d_model: int = Field(128, ge=8, le=4096, description="embedding width")
    max_seq_len: int = Field(256, ge=2, le=65536, description="rows of the learned position embedding")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "GPTSmallParams":
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} must be divisible by n_head {self.n_head}")
        return self


class CifarResNet20Spec(Spec):
    name: Literal["cifar_resnet20"]
    params: CifarResNetParams = Field(default_factory=CifarResNetParams)


class GPTSmallSpec(Spec):
    name: Literal["gpt_small"]
    params: GPTSmallParams = Field(default_factory=GPTSmallParams)


class ResNet18Spec(Spec):
    name: Literal["resnet18"]
    params: ResNet18Params = Field(default_factory=ResNet18Params)


class SimpleCNNSpec(Spec):
    name: Literal["simple_cnn"]
    params: SimpleCNNParams = Field(default_factory=SimpleCNNParams)


ModelSpec = Annotated[Union[CifarResNet20Spec, GPTSmallSpec, ResNet18Spec, SimpleCNNSpec, TorchvisionModelSpec],
                      Field(discriminator="name")]
# A named model, or your own code (`{import: "pkg.mod:fn"}`, see api.model_specs); serialized as
# whichever it is.
AnyModelSpec = Annotated[SerializeAsAny[ModelSpec], WrapValidator(route_model_spec)]


def model_traits(model: Any) -> ModelTraits:
    """Domain and architecture of any model spec, for the cross-field rules."""
    if isinstance(model, ImportedModelSpec):
        return imported_traits(model)
    if isinstance(model, TorchvisionModelSpec):
        return torchvision_traits(model.arch)
    info = MODELS[model.name]
    return ModelTraits(model.name, info.domain, info.architecture)


# --- data -------------------------------------------------------------------------------

Split = Literal["train", "test"]


class DigitsSpec(Spec):
    name: Literal["digits"]
    split: Split = "train"
    image_size: int = Field(32, ge=8, le=64, description="8x8 digits are upsampled (bilinear) to this size")


class FashionMNISTSpec(Spec):
    name: Literal["fashion_mnist"]
    split: Split = "train"
    root: str = Field("/usr/share/datasets/fashion-mnist", description="folder holding the *-ubyte.gz files")
    image_size: int = Field(28, ge=8, le=64)
    limit: int | None = Field(None, ge=1, description="use only the first N examples")


class SyntheticSpec(Spec):
    name: Literal["synthetic"]
    split: Split = "train"
    num_samples: int = Field(1024, ge=1, le=1_000_000)
    num_classes: int = Field(10, ge=2, le=1000)
    channels: int = Field(3, ge=1, le=4)
    image_size: int = Field(32, ge=4, le=256)
    noise: float = Field(1.0, ge=0.0, description="std of the Gaussian noise around each class mean")


class ShakespeareSpec(Spec):
    name: Literal["shakespeare"]
    split: Split = "train"
    seq_len: int = Field(128, ge=2, le=65536, description="characters per example (targets: shifted by one)")
    limit: int | None = Field(None, ge=1, description="use only the first N sequences")


DatasetSpec = Annotated[Union[DigitsSpec, FashionMNISTSpec, ShakespeareSpec, SyntheticSpec, ImageFolderSpec,
                              WebDatasetSpec],
                        Field(discriminator="name")]
# A named data set, or your own code's (`{import: "pkg.mod:fn"}`, see api.data_specs); serialized
# as whichever it is.
AnyDatasetSpec = Annotated[SerializeAsAny[DatasetSpec], WrapValidator(route_data_spec)]


class DataSpec(Spec):
    train: AnyDatasetSpec = Field(..., description="a named data set (GET /api/v1/datasets), or your own code's: "
                                                   "{import: 'package.module:callable', params: {...}}")
    eval: AnyDatasetSpec | None = None
    batch_size: int = Field(..., ge=1, le=65536, description="global batch size, split evenly across workers")
    eval_batch_size: int | None = Field(None, ge=1, le=65536,
                                        description="global batch size of evaluation (default: batch_size)")
    num_loader_workers: int = Field(0, ge=0, le=32, description="unused, and refused above 0 in a new submission: the "
                                    "built-in sets are sliced in memory; image_folder and webdataset take num_workers")
    drop_last: bool = Field(True, description="drop the last partial batch of an epoch; webdataset always does, and a "
                                              "new submission of webdataset with false is refused")

    @model_validator(mode="after")
    def _same_shape(self) -> "DataSpec":
        imported = [isinstance(d, ImportedDataSpec) for d in (self.train, self.eval)]
        if self.eval is not None and imported[0] != imported[1]:
            if imported[0]:
                mixed = f"data.eval is the named data set {self.eval.name!r} but data.train is your own (import)"
            else:
                mixed = (f"data.eval is your own data set (import) but data.train is the named data set "
                         f"{self.train.name!r}")
            raise ValueError(f"{mixed}; train and eval must come from the same data set: import both (each its own "
                             "callable, e.g. your train and test splits) or name both")
        for field, dataset in (("data.train", self.train), ("data.eval", self.eval)):
            problem = task_problem(dataset, field)
            if problem is not None:
                raise ValueError(problem)
        if self.eval is not None and imported[0] and self.eval.task != self.train.task:
            raise ValueError(f"data.eval.task {self.eval.task!r} differs from data.train.task {self.train.task!r}; "
                             "evaluation data must be of the training data's kind (give both the same task)")
        if self.eval is not None and self.eval.name != self.train.name:
            raise ValueError(
                f"data.eval.name {self.eval.name!r} differs from data.train.name {self.train.name!r}; "
                "train and eval must come from the same data set"
            )
        return self


def ignored_field_problems(spec: "RunSpec") -> list[tuple[str, Any, str]]:
    """``(field, value, why)`` for data fields that a new submission sets to no effect. Checked at
    submit only (``POST /runs``, ``POST /sweeps``): specs stored before these checks, which set
    them and trained as if they had not, must still load to resume, continue or export."""
    problems = []
    if spec.data.num_loader_workers:
        problems.append(("data.num_loader_workers", spec.data.num_loader_workers,
                         "no loader workers read the built-in sets, which are sliced in memory: leave it 0; to "
                         "decode in worker processes set num_workers on an image_folder or webdataset data set"))
    if not spec.data.drop_last and spec.data.train.name == "webdataset":
        problems.append(("data.drop_last", False, "a webdataset stream always takes num_samples // batch_size steps "
                         "an epoch, dropping the last partial batch: leave drop_last true"))
    return problems


# Characters of each split of the shakespeare plays (``workers.data.shakespeare``): a split of
# ``seq_len``-character windows holds ``(characters - 1) // seq_len`` of them (the targets are
# shifted by one). tests/workers/test_submit_data_rules.py holds these to the data.
SHAKESPEARE_CHARACTERS = {"train": 4_551_459, "test": 505_739}


def dataset_size(dataset: Any) -> int | None:
    """Examples in a built-in data set spec's split, as its builder loads them (``limit`` and
    ``num_samples`` applied); None for image_folder, webdataset and your own data set (import),
    whose size only their files or code know."""
    if isinstance(dataset, ImportedDataSpec):
        return None
    info = DATASETS[dataset.name]
    if info.num_train == 0:  # brought by the user: counted by the loader, from the files
        return None
    root = type(dataset).model_fields.get("root")
    if root is not None and dataset.root != root.default:  # other files in the set's format: counted there
        return None
    if dataset.name == "synthetic":
        return dataset.num_samples
    if dataset.name == "shakespeare":
        size = (SHAKESPEARE_CHARACTERS[dataset.split] - 1) // dataset.seq_len
    else:
        size = info.num_train if dataset.split == "train" else info.num_test
    limit = getattr(dataset, "limit", None)
    return size if limit is None else min(size, limit)


def loader_batches(num_examples: int, batch_size: int, world_size: int, *, drop_last: bool, pad: bool) -> int:
    """Batches an epoch of the rank with the fewest, as ``workers.data.loader.TensorLoader``
    counts them (its ``__len__``): ``batch_size`` is global, each of ``world_size`` ranks takes
    every ``world_size``-th example of the epoch's order. The loader refuses 0."""
    per_rank = batch_size // world_size
    if drop_last:
        length = num_examples // batch_size * batch_size
    elif pad:
        length = -(-num_examples // world_size) * world_size
    else:
        length = num_examples
    shard = len(range(world_size - 1, length, world_size))  # the last rank's share is the smallest
    return shard // per_rank if drop_last else -(-shard // per_rank)


def _described(dataset: Any, where: str) -> str:
    """``data.train (digits, split train, limit 10)``: what a size message is about."""
    details = [repr(dataset.name), f"split {dataset.split}"]
    for field in ("num_samples", "seq_len", "limit"):
        value = getattr(dataset, field, None)
        if value is not None:
            details.append(f"{field} {value}")
    return f"{where} ({', '.join(details)})"


def data_size_problems(spec: "RunSpec") -> list[tuple[str, Any, str]]:
    """``(field, value, why)`` for a built-in data set that the loaders would refuse on every
    worker: a training batch larger than the training examples (with ``drop_last`` an epoch has
    no full batch), or fewer evaluation examples than workers (a worker would evaluate none).
    Computed as the loaders do (``loader_batches``); image_folder and webdataset are counted only
    on the worker."""
    problems: list[tuple[str, Any, str]] = []
    data, workers = spec.data, spec.parallelism.num_workers
    if data.batch_size % workers:
        return problems  # a cross-field rule refuses it already
    train = dataset_size(data.train)
    if train is not None and not loader_batches(train, data.batch_size, workers, drop_last=data.drop_last, pad=True):
        largest = train // workers * workers
        fits = f"a data.batch_size of at most {largest}" + (f" (a multiple of parallelism.num_workers {workers})"
                                                             if workers > 1 else "")
        problems.append(("data.batch_size", data.batch_size,
                         f"more than the {train} examples of {_described(data.train, 'data.train')}: with "
                         f"data.drop_last true an epoch trains on full batches only, and there would be none; use "
                         f"{fits if largest else 'fewer workers'}, or set data.drop_last: false to train on one "
                         f"partial batch an epoch"))
    evaluated = dataset_size(data.eval) if data.eval is not None else None
    if evaluated is not None:
        batch = -(-(data.eval_batch_size or data.batch_size) // workers) * workers
        if not loader_batches(evaluated, batch, workers, drop_last=False, pad=False):
            field, value = "parallelism.num_workers", workers
            if getattr(data.eval, "limit", None) is not None:
                field, value = "data.eval.limit", data.eval.limit
            elif data.eval.name == "synthetic":
                field, value = "data.eval.num_samples", data.eval.num_samples
            examples = f"{evaluated} example" + ("s" if evaluated != 1 else "")
            problems.append((field, value, f"{_described(data.eval, 'data.eval')} has {examples}, fewer than the "
                             f"{workers} workers, which each evaluate a share of them: a worker would have none; use "
                             f"at most {evaluated} parallelism.num_workers or more evaluation examples"))
    return problems


# Where a RunSpec holds a time, with the units each may use instead of tokens.
TIME_FIELDS = (("max_duration", "ep, ba or sp (e.g. '5ep')"),
               ("eval_interval", "ep, ba, sp or a fraction of max_duration (e.g. '1ep', '0.25dur')"),
               ("checkpoint.interval", "ep, ba, sp or a fraction of max_duration (e.g. '1ep', '0.25dur')"),
               ("scheduler.warmup", "ep, ba, sp or a fraction of max_duration (e.g. '100ba', '0.1dur')"))


def token_unit_problems(spec: "RunSpec") -> list[tuple[str, Any, str]]:
    """``(field, value, why)`` for each time in ``tok`` when the train data set is not text: only
    text data counts tokens, and the worker could not convert it to batches."""
    domain = dataset_domain(spec.data.train)
    if domain == "text":
        return []
    problems = []
    for field, allowed in TIME_FIELDS:
        value: Any = spec
        for part in field.split("."):
            value = getattr(value, part)
        if value is not None and value.unit is TimeUnit.TOKEN:
            problems.append((field, str(value), f"counts tokens, and data set {dataset_label(spec.data.train)} is {domain} data, which has "
                                                f"none (only text data counts tokens); use {allowed}"))
    return problems


def unrunnable_problems(spec: "RunSpec") -> list[tuple[str, Any, str]]:
    """``(field, value, why)`` for what a new run, sweep base, sweep trial or fork asks that every
    worker would refuse at its start (``data_size_problems``, ``token_unit_problems``). Checked
    at submit only, as ``ignored_field_problems`` is: a spec stored before these checks must still
    load to resume, continue, export or run its sweep's trials."""
    return data_size_problems(spec) + token_unit_problems(spec)


# --- optimization -----------------------------------------------------------------------

class SGDSpec(Spec):
    name: Literal["sgd"]
    lr: float = Field(..., gt=0.0, le=100.0)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    nesterov: bool = False


class AdamWSpec(Spec):
    name: Literal["adamw", "adam"]
    lr: float = Field(..., gt=0.0, le=100.0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas {betas} must each lie in [0, 1)")
        return betas


OptimizerSpec = Annotated[Union[SGDSpec, AdamWSpec], Field(discriminator="name")]


class SchedulerSpec(Spec):
    name: Literal["constant", "cosine", "linear"] = "constant"
    warmup: OffsetTime = Field(default_factory=lambda: Time(0, TimeUnit.BATCH),
                               description="linear warmup from 0 to lr, e.g. '100ba' or '0.1dur'")
    alpha_f: float = Field(0.0, ge=0.0, le=1.0, description="final lr as a fraction of the initial lr")


# --- execution --------------------------------------------------------------------------

class Precision(str, enum.Enum):
    FP32 = "fp32"
    AMP_BF16 = "amp_bf16"
    AMP_FP16 = "amp_fp16"


class ParallelismSpec(Spec):
    strategy: Literal["none", "ddp", "fsdp"] = Field(
        "none", description="none: one worker; ddp: replicated model; fsdp: FSDP2 fully_shard per block + root")
    num_workers: int = Field(1, ge=1, le=1024)
    use_gpu: bool = False
    cpus_per_worker: int = Field(1, ge=1, le=256)

    @model_validator(mode="after")
    def _none_means_one_worker(self) -> "ParallelismSpec":
        if self.strategy == "none" and self.num_workers != 1:
            raise ValueError(f"parallelism.num_workers {self.num_workers}: strategy 'none' runs exactly one worker; "
                             "use strategy 'ddp' or 'fsdp' for more")
        return self


class CheckpointSpec(Spec):
    """Sharded checkpoints (torch.distributed.checkpoint) under ``{storage}/runs/{id}/checkpoints``."""

    interval: IntervalTime | None = Field(
        None, description="save every interval (e.g. '1ep', '500ba', '0.25dur'); always saved at the end")
    keep_last: int = Field(3, ge=2, le=1000, description="committed checkpoints to keep: at least 2, as the "
                                                          "newest may still be being written")
    async_save: bool = Field(False, description="write in the background while training continues")


class RunSpec(Spec):
    """A training run. See README 'RunSpec reference' for every field."""

    name: str = Field(..., min_length=1, max_length=128, pattern=NAME_PATTERN)
    model: AnyModelSpec = Field(..., description="a named model (GET /api/v1/models), or your own code: "
                                                 "{import: 'package.module:callable', params: {...}}")
    data: DataSpec
    optimizer: OptimizerSpec
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    max_duration: DurationTime
    eval_interval: IntervalTime | None = Field(None, description="evaluate every interval and at the end")
    eval_metrics: EvalMetricList = Field(
        default_factory=list, max_length=MAX_EVAL_METRICS, exclude_if=lambda metrics: not metrics,
        description=f"evaluation metrics besides eval/loss and eval/accuracy: built-in names "
                    f"({', '.join(BUILTIN_EVAL_METRICS)}) or your own {{import: 'package.module:callable', "
                    "params: {...}, name: ...}, reported as eval/<name>")
    precision: Precision = Precision.FP32
    microbatch_size: int | Literal["auto"] | None = Field(
        None, description="split each per-worker batch into microbatches of this size (gradient accumulation)")
    algorithms: list[AlgorithmSpec] = Field(default_factory=list)
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    max_restarts: int = Field(0, ge=0, le=100, description="worker-group restarts Ray Train may make")
    seed: int = Field(42, ge=0, le=2**31 - 1)
    deterministic: bool = False
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS,
                            description=f"labels to find the run by (each of {TAG_CHARSET}); "
                                        f"PATCH /runs/{{id}} edits them later")
    priority: Literal["low", "normal", "high"] = Field(
        "normal", description="queue order: higher first; runs of equal priority take turns across projects")
    max_wall_time: str | None = Field(
        None, pattern=WALL_TIME_PATTERN,
        description="wall-clock limit such as '90m' or '12h' (default: the project's); a run past it is stopped "
                    "with its checkpoints kept and ends FAILED")
    loggers: list[LoggerSpec] = Field(default_factory=list, max_length=8,
                                      description="also write metrics to TensorBoard / MLflow")
    code: CodeRef | None = Field(None, description="the code package (POST /api/v1/code) the workers import "
                                                   "model.import and data.*.import from; `tessera submit --code "
                                                   "DIR` sets it")

    @field_validator("microbatch_size")
    @classmethod
    def _positive_microbatch(cls, value: Any) -> Any:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"microbatch_size {value} must be a positive integer or 'auto'")
        return value

    @field_validator("algorithms")
    @classmethod
    def _no_duplicates(cls, algorithms: list[Any]) -> list[Any]:
        seen: set[str] = set()
        for algorithm in algorithms:
            if algorithm.name in seen:
                raise ValueError(f"algorithm {algorithm.name!r} is listed twice; list each method once")
            seen.add(algorithm.name)
        return algorithms

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "RunSpec":
        problems = cross_spec_problems(self)
        if problems:  # one per line: each becomes its own 422 item (api.validation_errors)
            raise ValueError("\n".join(problems))
        return self


def cross_spec_problems(spec: RunSpec) -> list[str]:
    """Rules that span several fields: each returned string names the fields and the rule, and
    starts with the path of the field it is about where one is (``algorithms[2] 'ema' ...``), which
    its 422 item then names."""
    problems: list[str] = []
    domain = dataset_domain(spec.data.train)
    model_info = model_traits(spec.model)
    if model_info.domain is not None and domain != model_info.domain:
        own = ""
        if isinstance(spec.data.train, ImportedDataSpec):
            own = (" (your own data set of task language_model is text data)" if domain == "text" else
                   " (your own data set is classification data: only vision models fit it; for token data, set "
                   "its task: language_model)")
        problems.append(f"model {model_info.label!r} is a {model_info.domain} model but data set "
                        f"{dataset_label(spec.data.train)} is {domain} data{own}")
    reported_pairs: set[frozenset[str]] = set()  # a conflict is symmetric: say it once
    for index, algorithm in enumerate(spec.algorithms):
        info, at = ALGORITHMS[algorithm.name], f"algorithms[{index}] {algorithm.name!r}"
        if info.domain not in ("any", domain):
            problems.append(f"{at} is for {info.domain} data but data set {dataset_label(spec.data.train)} is "
                            f"{domain}")
        # Your own model's architecture is unknown here: the surgery reports on the run if it finds nothing.
        if "transformer" in info.needs and model_info.architecture not in (None, "transformer"):
            problems.append(f"{at} needs a transformer model but model {model_info.label!r} is a "
                            f"{model_info.architecture}")
        if "batchnorm" in info.needs and _lacks_batchnorm(spec.model):
            problems.append(f"{at} needs BatchNorm layers but model {model_info.label!r} has none")
        if "dropout" in info.needs and _lacks_dropout(spec.model):
            problems.append(f"{at} needs torch.nn.Dropout layers but model {model_info.label!r} has none; use a "
                            f"model with dropout (gpt_small, torchvision vit_*/swin_*/vgg*/mobilenet*/efficientnet*) "
                            f"or your own")
        if "residual_blocks" in info.needs:
            problems.extend(f"algorithms[{index}] {problem}" for problem in _residual_block_problems(algorithm,
                                                                                                       spec.model))
        scale = getattr(algorithm, "scale_factor", 1.0) if algorithm.name == "selective_backprop" else 1.0
        if scale < 1.0 and domain != "vision":
            problems.append(f"algorithms[{index}].scale_factor {scale}: scoring on downscaled inputs needs image "
                            f"batches, and data set {dataset_label(spec.data.train)} is {domain}; leave it 1.0")
        for other_index, other in enumerate(spec.algorithms):
            if other.name in info.conflicts and frozenset((algorithm.name, other.name)) not in reported_pairs:
                reported_pairs.add(frozenset((algorithm.name, other.name)))
                reason = info.extra.get("conflict_reasons", {}).get(other.name)
                because = f" ({reason})" if reason else ""
                problems.append(f"{at} and algorithms[{other_index}] {other.name!r} do not compose{because}; "
                                "remove one")
    problems.extend(_sequence_length_problems(spec))
    train = spec.data.train
    catalogued = DATASETS[train.name].num_classes if train.name in DATASETS else 0  # 0: the data's own count
    num_classes = getattr(train, "num_classes", None) or catalogued or None  # None: known on the workers only
    problems.extend(eval_metric_problems(spec.eval_metrics, text=domain == "text", has_eval=spec.data.eval is not None,
                                         num_classes=num_classes))
    per_worker = spec.data.batch_size // spec.parallelism.num_workers
    if spec.data.batch_size % spec.parallelism.num_workers:
        problems.append(f"data.batch_size {spec.data.batch_size} must be divisible by parallelism.num_workers "
                        f"{spec.parallelism.num_workers}")
    if isinstance(spec.microbatch_size, int) and spec.microbatch_size > per_worker:
        problems.append(f"microbatch_size {spec.microbatch_size} exceeds the per-worker batch {per_worker} "
                        f"(data.batch_size / parallelism.num_workers)")
    if spec.scheduler.warmup.unit is TimeUnit.DURATION and spec.scheduler.warmup.value >= 1.0:
        problems.append("scheduler.warmup must end before max_duration (use a fraction < 1dur)")
    return problems


def _lacks_batchnorm(model: Any) -> bool:
    if isinstance(model, TorchvisionModelSpec):
        return arch_lacks_batchnorm(model.arch)
    return not isinstance(model, ImportedModelSpec) and model.name in MODELS_WITHOUT_BATCHNORM


def _lacks_dropout(model: Any) -> bool:
    if isinstance(model, TorchvisionModelSpec):
        return arch_lacks_dropout(model.arch)
    return not isinstance(model, ImportedModelSpec) and model.name in MODELS_WITHOUT_DROPOUT


def _residual_block_problems(algorithm: Any, model: Any) -> list[str]:
    """A built-in model must have the residual blocks the algorithm converts (your own model's are
    unknown here: the surgery reports on the run if it finds none)."""
    if isinstance(model, ImportedModelSpec):
        return []
    if isinstance(model, TorchvisionModelSpec):
        blocks, label = residual_blocks_of_arch(model.arch), f"torchvision {model.arch}"
    else:
        blocks, label = MODEL_RESIDUAL_BLOCKS.get(model.name, frozenset()), model.name
    target = getattr(algorithm, "target_layer_name", "auto")
    if not blocks:
        return [f"{algorithm.name!r} needs residual blocks but model {label!r} has none; "
                f"use a ResNet (cifar_resnet20, resnet18, torchvision resnet*/resnext*/wide_resnet*)"]
    if target != "auto" and target not in blocks:
        return [f"{algorithm.name!r} target_layer_name {target!r} is not in model {label!r}, "
                f"whose residual blocks are {', '.join(sorted(blocks))}; use one of those or 'auto'"]
    return []


def _sequence_length_problems(spec: RunSpec) -> list[str]:
    """Text data must fit the model's positions: its max_seq_len, or ALiBi's max_sequence_length."""
    max_len = getattr(spec.model.params, "max_seq_len", None)
    if max_len is None:
        return []
    limit, source = max_len, f"model.params.max_seq_len {max_len}"
    for algorithm in spec.algorithms:
        if algorithm.name == "alibi":
            limit = algorithm.max_sequence_length  # type: ignore[union-attr]
            source = f"algorithm 'alibi' max_sequence_length {limit}"
    problems = []
    for field_name in ("train", "eval"):
        data = getattr(spec.data, field_name)
        seq_len = getattr(data, "seq_len", None)
        if seq_len is not None and seq_len > limit:
            problems.append(f"data.{field_name}.seq_len {seq_len} exceeds {source}; shorten the sequences or "
                            f"raise the limit")
    return problems


def algorithm_names(spec: RunSpec) -> list[str]:
    return [a.name for a in spec.algorithms]


WALL_TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def wall_time_seconds(text: str) -> int:
    """Seconds in a ``max_wall_time`` string such as ``90m``."""
    return int(text[:-1]) * WALL_TIME_UNITS[text[-1]]
