"""docs/settings.md (and the README's table, when it has the markers) is generated from the
Settings fields and kept up to date."""

from __future__ import annotations

from dataclasses import fields

from tangram_celery.settings import Settings
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


def test_table_lists_every_setting_with_its_default() -> None:
    table = settings_table()
    for f in fields(Settings):
        assert f"`TANGRAM_{f.name.upper()}`" in table
    assert "| `TANGRAM_REDIS_URL` | `str` | `redis://127.0.0.1:6379/0` |" in table
    assert "| `TANGRAM_RESULT_URL` | `str` | (empty) |" in table


def test_generated_docs_are_up_to_date() -> None:
    assert stale_files() == [], "run: python -m tangram_celery.settings_doc --write"


def test_readme_markers_get_the_table() -> None:
    readme = f"intro\n{BEGIN}\nold\n{END}\nrest\n"
    assert with_readme_table(readme) == f"intro\n{BEGIN}\n{settings_table()}{END}\nrest\n"
    assert with_readme_table("no markers") == "no markers"
