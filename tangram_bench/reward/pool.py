"""The fixed pool of one-row requests the benchmark sends, varied as a rollout's responses are."""

from __future__ import annotations

import random
from collections.abc import Callable

POOL_SIZE = 128


SENTENCES = (
    "The cat sat quietly on the warm windowsill.",
    "A cat was resting on the window ledge in the sun.",
    "The function returns the sum of the two numbers.",
    "We first sort the list and then remove the duplicates.",
    "The train to the city leaves every twenty minutes in the morning.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The answer follows from applying the triangle inequality twice.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "The committee postponed its decision until the next meeting.",
    "Each test case checks one edge of the input range.",
    "She planted tomatoes, beans and a row of sunflowers along the fence.",
    "The algorithm runs in linear time because every element is visited once.",
    "Heavy rain flooded several streets near the river overnight.",
    "Multiply both sides by the denominator to clear the fraction.",
    "The library opens at nine and closes at six on weekdays.",
    "A binary search halves the remaining interval at every step.",
    "The recipe needs two cups of flour, one egg and a pinch of salt.",
    "Our model predicts the next token from the previous ones.",
    "The bridge was closed for repairs during the summer.",
    "Dividing by zero is undefined, so that case is excluded.",
    "Several birds gathered around the feeder in the garden.",
    "The proof proceeds by induction on the length of the sequence.",
    "He forgot his umbrella and got soaked on the way home.",
    "The server answers each request with a single reward value.",
)
REASONING = (
    "Let us compute this step by step.",
    "First we add the two partial results.",
    "Then we simplify the fraction.",
    "Checking the units, the result is consistent.",
    "We substitute the value back into the equation.",
    "The remaining terms cancel out.",
    "This matches the condition given in the problem.",
    "Rounding is not needed here.",
)
GENERIC_SAMPLE = {"response": "42", "reference": "42"}


def _answer_pair(rng: random.Random) -> dict[str, str]:
    """One (response, reference) pair for answer_match: a reasoning prefix, a final answer in one
    of the forms the model reads, right about two times in three."""
    numerator, denominator = rng.randint(1, 9), rng.choice((2, 4, 5, 8))
    value = rng.randint(2, 99_999)
    forms = [
        (f"\\boxed{{\\frac{{{numerator}}}{{{denominator}}}}}", f"{numerator / denominator:g}"),
        (f"\\boxed{{{value:,}}}", str(value)),
        (f"#### {value}", f"{value}"),
        (f"The answer is {value}.", f"${value}$"),
        (f"so the answer: \\boxed{{x = {value}}}", str(value)),
    ]
    answer, reference = rng.choice(forms)
    if rng.random() < 0.35:
        reference = str(value + rng.randint(1, 9))
    steps = " ".join(rng.choice(REASONING) for _ in range(rng.randint(0, 12)))
    return {"response": f"{steps} {answer}".strip(), "reference": reference}


def _similarity_pair(rng: random.Random) -> dict[str, str]:
    """One pair for semantic_similarity: a response of 1-6 sentences, a reference of 1-2."""
    response = " ".join(rng.choice(SENTENCES) for _ in range(rng.randint(1, 6)))
    reference = " ".join(rng.choice(SENTENCES) for _ in range(rng.randint(1, 2)))
    return {"response": response, "reference": reference}


PAIR_MAKERS: dict[str, Callable[[random.Random], dict[str, str]]] = {
    "answer_match": _answer_pair,
    "semantic_similarity": _similarity_pair,
}


def samples(model: str, size: int = POOL_SIZE, seed: int = 0) -> list[dict[str, str]]:
    """The fixed pool of one-row requests for ``model`` (deterministic for a seed).

    Responses differ in length and form, as a rollout's do; a model without a generator gets
    one generic pair repeated.
    """
    maker = PAIR_MAKERS.get(model)
    if maker is None:
        return [dict(GENERIC_SAMPLE) for _ in range(size)]
    rng = random.Random(f"{model}:{seed}")
    return [maker(rng) for _ in range(size)]
