"""docs/settings.md (and the README's table, when it has the markers) is generated from the
Settings fields and kept up to date."""

from __future__ import annotations

from tangram_celery.settings import VARIABLES
from tangram_celery.settings_doc import (
    BEGIN,
    END,
    missing_descriptions,
    settings_table,
    stale_files,
    with_readme_table,
)


def test_every_setting_has_a_description() -> None:
    assert missing_descriptions() == [], (
        "describe these settings in tangram_celery/settings_doc.py DESCRIPTIONS, then run "
        "python -m tangram_celery.settings_doc --write"
    )


def test_table_lists_every_setting_with_its_field_and_default() -> None:
    table = settings_table()
    for key, (section, name) in VARIABLES.items():
        assert f"`TANGRAM_{key.upper()}` | `{name}` |" in table
        assert f"## `settings.{section}`" in table
    assert "| `TANGRAM_REDIS_URL` | `redis_url` | `str` | `redis://127.0.0.1:6379/0` |" in table
    assert "| `TANGRAM_RESULT_URL` | `result_url` | `str` | (empty) |" in table
    assert "| `TANGRAM_SANDBOX_MEMORY_MB` | `memory_mb` | `int` | `512` |" in table
    sandbox = table.split("## `settings.sandbox`")[1].split("## ")[0]
    assert "`TANGRAM_OUTPUT_CAP_BYTES`" in sandbox and "`TANGRAM_REDIS_URL`" not in sandbox


def test_generated_docs_are_up_to_date() -> None:
    assert stale_files() == [], "run: python -m tangram_celery.settings_doc --write"


def test_readme_markers_get_the_table() -> None:
    readme = f"intro\n{BEGIN}\nold\n{END}\nrest\n"
    assert with_readme_table(readme) == f"intro\n{BEGIN}\n{settings_table()}{END}\nrest\n"
    assert with_readme_table("no markers") == "no markers"
