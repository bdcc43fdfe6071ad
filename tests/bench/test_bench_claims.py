"""The claims table that opens results.md: read back from the sections, never typed."""

from __future__ import annotations

from pathlib import Path

from tangram_bench import claims, report
from tangram_bench.summary import Summary

ROOT = Path(__file__).resolve().parents[2]

SECTION = """## coding-sim-batch

Command: `tangram bench coding --mode sim --sweep batch --out docs`

Simulated; durations told to the policies: `learned`; points [...].

### Headline ratios (batch 1280, cores 1280, gpus 40)

| baseline | metric | ratio: scheduling effects alone | ratio: cp | over the batch points |
| --- | --- | --- | --- | --- |
| static | external time per trajectory | 1.44x (1.42-1.48) | 3.10x (2.96-3.32) | 0.50x-2.00x |
| static | exec ACT | 1.00x (1.00-1.00) | 0.96x (0.95-0.97) | 0.50x-2.00x |
| fixed-dop-4 | external time per trajectory | 0.94x (0.92-0.97) | 0.90x (0.88-0.93) | 0.50x-2.00x |
| fixed-dop-4 | exec ACT | 1.02x (1.00-1.03) | 1.01x (1.00-1.04) | 0.50x-2.00x |
| best fixed DoP | external time per trajectory | 0.10x (0.10-0.10), x | 0.10x, x | n/a |
| best baseline | external time per trajectory | 0.10x (0.10-0.10), x | 0.10x, x | n/a |
"""

REAL = """## coding-real

Command: `tangram bench coding --mode real --batch 24 --out docs`

Real stack on this machine; seed 1.

### Headline ratios (batch 24, cores 8)

| baseline | metric | ratio: real stack |
| --- | --- | --- |
| celery | external time per trajectory | 1.10x |
"""

ABLATION = """## coding-sim-oracle

Command: `tangram bench coding --mode sim --durations oracle --tag oracle --out docs`

Simulated; durations told to the policies: `oracle` (an ablation: ...).

### Headline ratios (batch 1280, cores 1280, gpus 40)

| baseline | metric | ratio: scheduling effects alone |
| --- | --- | --- |
| fixed-dop-4 | external time per trajectory | 1.01x (1.00-1.02) |
"""


def summary(system: str, batch: int, external: float, costs: str = "sched") -> Summary:
    return Summary(system=system, costs=costs, point={"batch": batch, "cores": 1280},
                   kinds=(), external=external, trajectory=external, makespan=1.0,
                   step=external, reserved=0.0, used=0.0, decide_calls=0, decide_ms=0.0,
                   sched_share=0.0, seed=1)


def test_a_claim_is_the_sections_headline_with_its_command() -> None:
    found = claims.claim("coding-sim-batch", SECTION)
    assert found is not None
    assert (found.headline.baseline, found.headline.ratio) == ("fixed-dop-4", "0.94x (0.92-0.97)")
    assert found.command == "tangram bench coding --mode sim --sweep batch --out docs"


def test_losses_are_every_ratio_below_one_first_in_the_claims_column() -> None:
    losses = claims.headline_losses(SECTION, "scheduling effects alone")
    assert losses == [
        claims.Loss("fixed-dop-4", "external time per trajectory", "0.94x"),
        claims.Loss("static", "exec ACT", "0.96x", "(cp)")]
    assert claims.where_it_loses(losses) == (
        "**fixed-dop-4**: external time per trajectory 0.94x; "
        "**static**: exec ACT 0.96x (cp)")
    assert claims.where_it_loses([]) == "nowhere in this section"


def test_a_1_00x_ratio_is_not_a_loss_and_summary_rows_are_skipped() -> None:
    losses = claims.headline_losses(SECTION, "scheduling effects alone")
    assert all(x.baseline not in ("best fixed DoP", "best baseline") for x in losses)
    assert all(x.ratio != "1.00x" for x in losses)


def test_sweep_points_where_a_baseline_wins_are_losses_the_headline_point_left_out() -> None:
    found = [summary("tangram", 256, 10.0), summary("fixed-dop-4", 256, 8.0),
             summary("tangram", 1280, 10.0), summary("fixed-dop-4", 1280, 9.0),
             summary("tangram", 2048, 10.0), summary("fixed-dop-4", 2048, 13.0),
             summary("tangram", 256, 10.0, "cp"), summary("fixed-dop-4", 256, 1.0, "cp")]
    losses = claims.point_losses(found, "batch", "sched", 1280.0)
    assert {(x.metric, x.ratio, x.where) for x in losses} == {
        ("external time per trajectory", "0.80x", "at batch 256"),
        ("makespan / step time", "0.80x", "at batch 256")}
    claim = claims.claim("coding-sim-batch", SECTION, found)
    assert claim is not None and claims.Loss(
        "fixed-dop-4", "external time per trajectory", "0.80x", "at batch 256") in claim.losses


def test_the_closest_baseline_of_each_metric_is_named() -> None:
    assert claims.closest_per_metric(SECTION, "scheduling effects alone") == [
        ("external time per trajectory", "fixed-dop-4", "0.94x"),
        ("exec ACT", "static", "1.00x")]
    assert claims.closest_per_metric(SECTION, "cp") == [
        ("external time per trajectory", "fixed-dop-4", "0.90x"),
        ("exec ACT", "static", "0.96x")]


def test_the_table_has_a_row_per_claim_and_lists_the_ablations_apart() -> None:
    sections = {"coding-sim-batch": SECTION, "coding-real": REAL, "coding-sim-oracle": ABLATION}
    lines = claims.claims_table(sections, ["coding-real", "coding-sim-batch", "coding-sim-oracle"])
    rows = [line for line in lines if line.startswith("| [")]
    assert [row.split("]")[0] for row in rows] == ["| [coding-real", "| [coding-sim-batch"]
    assert "| celery | 1.10x (one seed) |" in rows[0]
    assert claims.UNSTATED in rows[0], "an unstated durations mode is read as an oracle figure"
    assert "`tangram bench coding --mode real --batch 24 --out docs`" in rows[0]
    assert "durations `learned`" in rows[1] and "| fixed-dop-4 | 0.94x (0.92-0.97) |" in rows[1]
    assert not any("coding-sim-oracle" in row for row in rows)
    assert lines[-2] == ("Ablations, not claims (each says so in its setup): "
                         "[coding-sim-oracle](#coding-sim-oracle).")


def test_results_md_opens_with_the_claims_table_the_readme_sections_first() -> None:
    text = report.index({"coding-sim-oracle": ABLATION, "coding-real": REAL,
                         "coding-sim-batch": SECTION})
    claims_at = text.index(claims.CLAIMS_TITLE)
    assert claims_at < text.index("## coding-sim-batch\n") < text.index("## coding-real\n")
    table = text[claims_at:text.index("## coding-sim-batch\n")]
    assert table.index("[coding-sim-batch]") < table.index("[coding-real]")


def test_the_oracle_appears_in_results_md_only_in_ablations_and_notes_that_say_so() -> None:
    text = (ROOT / "docs" / "results.md").read_text()
    heading = ""
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line
        if "oracle" not in line:
            continue
        if heading == claims.CLAIMS_TITLE:
            assert claims.UNSTATED in line or line.startswith("Ablations, not claims"), line
        else:
            section = text[text.index(heading):].split("\n## ", 1)[0]
            assert claims.is_ablation(section), (heading, line)
