"""answer_match: a rule-based verifier reward for Triton's python backend.

Each row is one (``response``, ``reference``) pair; the reward is 1.0 when the final answer of the
response is equivalent to the reference and 0.0 otherwise:

1. the final answer is taken from the last ``\\boxed{...}``, else a GSM8K ``#### x`` line, else the
   last "answer is x" / "answer: x", else the whole text (the reference goes through the same);
2. both are normalised: TeX wrappers (``$``, ``\\text{}``, ``\\left``, spacing commands) removed,
   ``\\frac{a}{b}`` -> ``a/b``, case and whitespace folded, a trailing period, a percent sign, a
   leading ``x =`` and thousands separators dropped;
3. if both read as numbers (integer, decimal, scientific or ``a/b``) they are compared exactly as
   fractions, with a relative tolerance of 1e-6 for rounded decimals; otherwise as strings.

All rows of all requests of one dynamic batch are scored in one pass, each distinct text parsed
once (the responses of one prompt share their reference). The model is self-contained (numpy and
the standard library only), so the GPU manager can upload
this file as-is under another model name. Its tensor names and dtypes come from ``config.pbtxt``,
which ``initialize`` checks. A malformed request (a row that is not UTF-8, too long, or mismatched
batch sizes) gets an error response of its own; the other requests of the batch are answered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

INPUTS = {"response": "TYPE_STRING", "reference": "TYPE_STRING"}
OUTPUTS = {"reward": "TYPE_FP32"}
TOLERANCE = 1e-6

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_GSM8K = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?\s*([^\n]+)", re.IGNORECASE)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
_FRAC = re.compile(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_DIGITS = re.compile(r"\\frac\s*(\d)\s*(\d)")
_SPACING = re.compile(r"\\(?:left|right|!|,|;|:|quad|qquad)|\\ ")
_ASSIGNMENT = re.compile(r"^[a-z]\s*=\s*")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DECIMAL = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?$")
_RATIO = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")


class RequestError(ValueError):
    """A request that this model rejects on its own (the batch goes on)."""


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (balanced braces), or None."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    depth = 1
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[start:index]
    return None


def final_answer(text: str) -> str:
    """The part of ``text`` that states its final answer (see the module docstring)."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    for pattern in (_GSM8K, _ANSWER_IS):
        found = pattern.findall(text)
        if found:
            return str(found[-1])
    return text


def normalise(answer: str) -> str:
    """Fold the surface forms of one answer into a canonical string."""
    text = answer.strip().strip("$").strip()
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _TEXT_WRAPPER.sub(r"\1", text)
    text = _SPACING.sub("", text)
    text = _FRAC.sub(r"\1/\2", text)
    text = _FRAC_DIGITS.sub(r"\1/\2", text)
    text = re.sub(r"\s+", "", text.lower())
    text = text.rstrip(".").replace("\\%", "%").rstrip("%")
    text = _ASSIGNMENT.sub("", text)
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    return text


def as_number(text: str) -> Fraction | None:
    """``text`` as an exact fraction when it is a plain number or ``a/b``, else None."""
    if _DECIMAL.match(text):
        return Fraction(text)
    ratio = _RATIO.match(text)
    if ratio and int(ratio.group(2)) != 0:
        return Fraction(int(ratio.group(1)), int(ratio.group(2)))
    return None


Form = tuple[str, Fraction | None]
"""A text's final answer, normalised, and its value when it is a number."""


def canonical(text: str) -> Form:
    """The :data:`Form` of the final answer of ``text``."""
    answer = normalise(final_answer(text))
    return answer, as_number(answer) if answer else None


def matches(got: Form, want: Form) -> bool:
    """Whether two final answers are equivalent (see the module docstring)."""
    if not got[0] or not want[0]:
        return False
    if got[1] is not None and want[1] is not None:
        if got[1] == want[1]:
            return True
        scale = max(Fraction(1), abs(want[1]))
        return abs(got[1] - want[1]) <= Fraction(TOLERANCE) * scale
    return got[0] == want[0]


def equivalent(response: str, reference: str) -> bool:
    """Whether the response's final answer matches the reference's."""
    return matches(canonical(response), canonical(reference))


def score_rows(pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """The rewards of the (response, reference) rows of a whole batch, as float32.

    Each distinct text is parsed once per batch: the responses of one prompt (a GRPO group)
    share their reference.
    """
    forms: dict[str, Form] = {}

    def form(text: str) -> Form:
        found = forms.get(text)
        if found is None:
            found = forms[text] = canonical(text)
        return found

    return np.fromiter((matches(form(r), form(ref)) for r, ref in pairs), dtype=np.float32,
                       count=len(pairs))


def check_tensors(config: dict[str, Any]) -> None:
    """Fail the load unless the config declares exactly the tensors this code reads and writes."""
    for section, wanted in (("input", INPUTS), ("output", OUTPUTS)):
        declared = {t["name"]: t["data_type"] for t in config.get(section, [])}
        if declared != wanted:
            raise ValueError(
                f"{config.get('name')}: config {section} tensors are {declared}, this model.py "
                f"needs {wanted}; fix config.pbtxt or the load's config override"
            )


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


class TritonPythonModel:
    """The python-backend entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        """Check the config's tensors and read the row-length limit."""
        config = json.loads(args["model_config"])
        check_tensors(config)
        parameters = config.get("parameters", {})
        raw = parameters.get("max_chars", {}).get("string_value", "100000")
        self.max_chars = int(raw)
        if self.max_chars <= 0:
            raise ValueError(f"parameter max_chars={raw!r} must be a positive integer")

    def execute(self, requests: list[Any]) -> list[Any]:
        """Score the rows of every request of the batch in one pass; one response per request,
        and a bad request gets an error response of its own."""
        read: list[list[tuple[str, str]] | str] = []
        for request in requests:
            try:
                read.append(self._read(request))
            except RequestError as exc:
                read.append(f"invalid request: {exc}")
        rewards = score_rows([pair for rows in read if not isinstance(rows, str) for pair in rows])
        responses, offset = [], 0
        for rows in read:
            if isinstance(rows, str):
                error = pb_utils.TritonError(rows, pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            chunk = rewards[offset:offset + len(rows)].reshape(-1, 1)
            offset += len(rows)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("reward", chunk)]))
        return responses

    def _read(self, request: Any) -> list[tuple[str, str]]:
        responses = read_rows(request, "response", self.max_chars)
        references = read_rows(request, "reference", self.max_chars)
        if len(responses) != len(references):
            raise RequestError(
                f"response has {len(responses)} rows but reference has {len(references)}"
            )
        return list(zip(responses, references, strict=True))

    def finalize(self) -> None:
        """Nothing to release."""
