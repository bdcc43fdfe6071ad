"""The model repository: each model's ``config.pbtxt`` as a :class:`ModelSpec`.

:func:`load_repository` reads every ``<model>/config.pbtxt`` of a repository (parsed with the
``ModelConfig`` protobuf that ``tritonclient`` ships) into a :class:`ModelSpec`: tensor names,
dtypes and dims, the batch limit, the files a load override uploads, and the GPU manager's
parameters (``tangram_dops``, ``tangram_memory_mb``). ``config.pbtxt`` stays the single source.
A spec also checks a request's inputs against the config and turns outputs into JSON values.

Loading one repository model under another name ("file override"): Triton's repository API
accepts ``load(name, config=<JSON>, files={"file:1/model.py": bytes})``; the files form a
temporary model directory, so any name can be loaded from the same code with its own config
(placement, batching). Models loaded that way do not appear in the server's repository index.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format, text_format
from numpy.typing import NDArray
from tritonclient.grpc import model_config_pb2

from tangram_celery.errors import ServiceError, ValidationError

DEFAULT_DOPS = (1, 2, 4, 8)
DEFAULT_MEMORY_MB = 1024

# config data_type -> (wire datatype, numpy dtype)
DTYPES: dict[str, tuple[str, Any]] = {
    "TYPE_BOOL": ("BOOL", np.bool_),
    "TYPE_UINT8": ("UINT8", np.uint8),
    "TYPE_UINT16": ("UINT16", np.uint16),
    "TYPE_UINT32": ("UINT32", np.uint32),
    "TYPE_UINT64": ("UINT64", np.uint64),
    "TYPE_INT8": ("INT8", np.int8),
    "TYPE_INT16": ("INT16", np.int16),
    "TYPE_INT32": ("INT32", np.int32),
    "TYPE_INT64": ("INT64", np.int64),
    "TYPE_FP16": ("FP16", np.float16),
    "TYPE_FP32": ("FP32", np.float32),
    "TYPE_FP64": ("FP64", np.float64),
    "TYPE_STRING": ("BYTES", np.object_),
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor as ``config.pbtxt`` declares it (dims without the batch)."""

    name: str
    data_type: str
    dims: tuple[int, ...]

    @property
    def datatype(self) -> str:
        """The wire datatype (``BYTES``, ``FP32``, ...)."""
        return DTYPES[self.data_type][0]

    @property
    def numpy_dtype(self) -> Any:
        """The numpy dtype of this tensor."""
        return DTYPES[self.data_type][1]


@dataclass(frozen=True)
class ModelSpec:
    """One model of the repository: its config and the files that recreate it under any name."""

    name: str
    config: Mapping[str, Any]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    files: Mapping[str, bytes] = field(repr=False)
    dops: tuple[int, ...] = DEFAULT_DOPS
    memory_mb: int = DEFAULT_MEMORY_MB

    def override(
        self,
        name: str,
        instance_group: Sequence[Mapping[str, Any]],
        parameters: Mapping[str, str] | None = None,
        *,
        dynamic_batching: bool = True,
    ) -> dict[str, Any]:
        """This model's config as JSON for a load under ``name`` with another placement.

        ``dynamic_batching=False`` drops dynamic batching (each request executes alone).
        """
        config: dict[str, Any] = json.loads(json.dumps(self.config))
        config["name"] = name
        config["instance_group"] = [dict(g) for g in instance_group]
        merged = dict(config.get("parameters", {}))
        for key, value in (parameters or {}).items():
            merged[key] = {"string_value": value}
        config["parameters"] = merged
        if not dynamic_batching:
            config.pop("dynamic_batching", None)
        return config

    def encode(self, inputs: Mapping[str, Any]) -> tuple[dict[str, NDArray[Any]], bool]:
        """Validate ``inputs`` against the config and build one array per input tensor.

        A value is one row (a scalar for ``dims: [1]``) or a list of rows; every input must have
        the same number of rows. Returns the arrays and whether a single row was given.
        Raises :class:`ValidationError` naming ``inputs.<tensor>``.
        """
        if not isinstance(inputs, Mapping):
            raise ValidationError("inputs", "must be an object of tensor name -> value(s)")
        expected = {t.name for t in self.inputs}
        unknown = sorted(set(inputs) - expected)
        if unknown:
            raise ValidationError(
                f"inputs.{unknown[0]}", f"{self.name} has no such input; inputs: {sorted(expected)}"
            )
        arrays: dict[str, NDArray[Any]] = {}
        singles: set[bool] = set()
        for spec in self.inputs:
            if spec.name not in inputs:
                raise ValidationError(f"inputs.{spec.name}", f"missing (model {self.name})")
            array, single = _encode_tensor(spec, inputs[spec.name], self.max_batch_size)
            arrays[spec.name] = array
            singles.add(single)
        rows = {a.shape[0] for a in arrays.values()}
        if len(rows) > 1 or len(singles) > 1:
            raise ValidationError(
                "inputs", f"every input needs the same number of rows, got {sorted(rows)}"
            )
        return arrays, singles == {True}

    def decode(self, outputs: Mapping[str, NDArray[Any]], single: bool) -> dict[str, Any]:
        """The outputs as JSON-safe values: one value per output, or one list per output."""
        result: dict[str, Any] = {}
        for spec in self.outputs:
            rows = [_json_value(row) for row in outputs[spec.name]]
            result[spec.name] = rows[0] if single else rows
        return result


def _encode_tensor(spec: TensorSpec, value: Any, max_batch_size: int) -> tuple[NDArray[Any], bool]:
    where = f"inputs.{spec.name}"
    single = not isinstance(value, list | tuple)
    rows = [value] if single else list(value)
    if not rows:
        raise ValidationError(where, "empty list: give at least one row")
    if max_batch_size and len(rows) > max_batch_size:
        raise ValidationError(where, f"{len(rows)} rows, the model takes at most {max_batch_size}")
    converted = [_encode_value(spec, where, row) for row in rows]
    array = np.empty(len(converted), dtype=spec.numpy_dtype)
    if spec.numpy_dtype is np.object_ or all(np.ndim(c) == 0 for c in converted):
        array[:] = converted
    else:
        array = np.asarray(converted, dtype=spec.numpy_dtype)
    if spec.dims == (1,) and array.ndim == 1:
        array = array.reshape(-1, 1)
    shape = array.shape[1:]
    if len(shape) != len(spec.dims) or any(
        d not in (-1, s) for d, s in zip(spec.dims, shape, strict=True)
    ):
        raise ValidationError(
            where, f"each row must have shape {list(spec.dims)}, got {list(shape)}"
        )
    if not max_batch_size:
        if array.shape[0] != 1:
            raise ValidationError(where, f"{spec.name} takes no batch: give one row")
        array = array[0]
    return array, single


def _encode_value(spec: TensorSpec, where: str, value: Any) -> Any:
    if spec.data_type == "TYPE_STRING":
        if isinstance(value, str):
            return value.encode("utf-8")
        if isinstance(value, bytes):
            return value
        raise ValidationError(where, f"expected a string, got {type(value).__name__}")
    if spec.data_type == "TYPE_BOOL":
        if isinstance(value, bool):
            return value
        raise ValidationError(where, f"expected true/false, got {type(value).__name__}")
    if isinstance(value, list | tuple):
        return [_encode_value(spec, where, v) for v in value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(where, f"expected a number, got {type(value).__name__}")
    if spec.data_type.startswith(("TYPE_INT", "TYPE_UINT")) and not isinstance(value, int):
        raise ValidationError(where, f"expected an integer, got {value!r}")
    return value


def _json_value(row: NDArray[Any]) -> Any:
    flat = np.asarray(row).reshape(-1)
    values = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v.item() for v in flat]
    return values[0] if flat.size == 1 else values


def read_config(path: Path) -> dict[str, Any]:
    """A ``config.pbtxt`` as the JSON dict Triton's load override takes (proto field names)."""
    message = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(path.read_text(), message)
    except text_format.ParseError as exc:
        raise ServiceError(f"{path}: not a valid Triton model config: {exc}") from None
    parsed = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return dict(parsed)


def read_model(directory: Path) -> ModelSpec:
    """The :class:`ModelSpec` of one model directory (``config.pbtxt`` + version folders)."""
    config = read_config(directory / "config.pbtxt")
    name = str(config.get("name") or directory.name)
    if name != directory.name:
        raise ServiceError(f"{directory}: config name {name!r} differs from its directory name")
    config["name"] = name
    parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
    return ModelSpec(
        name=name,
        config=config,
        inputs=tuple(_tensor(t) for t in config.get("input", [])),
        outputs=tuple(_tensor(t) for t in config.get("output", [])),
        max_batch_size=int(config.get("max_batch_size", 0)),
        files=dict(_version_files(directory)),
        dops=_dops(directory, parameters.get("tangram_dops", "")),
        memory_mb=int(parameters.get("tangram_memory_mb") or DEFAULT_MEMORY_MB),
    )


def load_repository(root: Path | str) -> dict[str, ModelSpec]:
    """Every model of a repository directory, by name."""
    base = Path(root)
    if not base.is_dir():
        raise ServiceError(f"model repository {base} is not a directory")
    models = [read_model(d) for d in sorted(base.iterdir()) if (d / "config.pbtxt").is_file()]
    return {m.name: m for m in models}


def _tensor(raw: Mapping[str, Any]) -> TensorSpec:
    return TensorSpec(
        name=str(raw["name"]),
        data_type=str(raw.get("data_type", "TYPE_INVALID")),
        dims=tuple(int(d) for d in raw.get("dims", [])),
    )


def _version_files(directory: Path) -> Iterator[tuple[str, bytes]]:
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if path.is_file() and relative.parts[0].isdigit() and "__pycache__" not in relative.parts:
            yield f"file:{relative.as_posix()}", path.read_bytes()


def _dops(directory: Path, raw: str) -> tuple[int, ...]:
    if not raw:
        return DEFAULT_DOPS
    try:
        dops = tuple(sorted({int(part) for part in raw.split(",") if part.strip()}))
    except ValueError:
        dops = ()
    if not dops or any(d <= 0 or d & (d - 1) for d in dops):
        raise ServiceError(
            f"{directory}: parameter tangram_dops={raw!r}: give powers of two, e.g. 1,2,4"
        )
    return dops
