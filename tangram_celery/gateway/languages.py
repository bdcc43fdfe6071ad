"""The languages the gateway runs: where each one's source goes and how it is compiled and run.

Pure table and lookups. The commands follow SandboxFusion's runners (``python FILE``,
``pytest FILE``, ``/bin/bash FILE``, ``g++ -std=c++17 FILE -o test`` then ``./test``, ...). A
language is offered when its tools are present (:func:`available`, given the set of tools
found), or when ``TANGRAM_GATEWAY_LANGUAGES`` names it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tangram_celery.errors import ConfigError


@dataclass(frozen=True)
class Language:
    """One language: its tools, its source file name and its commands.

    ``source`` and the commands hold ``{src}`` (the source file) where needed; ``compile`` is
    None for interpreted languages. ``elastic`` languages run as test runs over a range of
    cores (``pytest`` gets ``-n k``)."""

    name: str
    tools: tuple[str, ...]
    source: str
    run: str
    compile: str | None = None
    elastic: bool = False

    def source_name(self, action_id: str) -> str:
        """The source file's name in the work dir for one request."""
        return self.source.format(id=action_id)


LANGUAGES: dict[str, Language] = {lang.name: lang for lang in (
    Language("python", ("python3",), ".tangram-{id}.py", "python3 {src}"),
    Language("pytest", ("python3",), "test_tangram_{id}.py",
             "python3 -m pytest -q -p no:cacheprovider {src}", elastic=True),
    Language("bash", ("bash",), ".tangram-{id}.sh", "/bin/bash {src}"),
    Language("cpp", ("g++",), ".tangram-{id}.cpp", "./test",
             compile="g++ -std=c++17 {src} -o test -lpthread"),
    Language("nodejs", ("node",), ".tangram-{id}.js", "node {src}"),
    Language("perl", ("perl",), ".tangram-{id}.pl", "perl {src}"),
)}
"""Every language the gateway knows how to run; which of them it offers depends on the tools."""


def available(tools_found: Callable[[str], bool], wanted: Iterable[str] = ()) -> tuple[str, ...]:
    """The languages offered: those named in ``wanted`` (each must be known), else every known
    language whose tools ``tools_found`` reports present. Raises :class:`ConfigError` for an
    unknown name."""
    names = tuple(wanted)
    unknown = sorted(set(names) - set(LANGUAGES))
    if unknown:
        raise ConfigError(f"TANGRAM_GATEWAY_LANGUAGES: unknown language(s) {', '.join(unknown)}; "
                          f"known: {', '.join(LANGUAGES)}")
    if names:
        return names
    return tuple(n for n, lang in LANGUAGES.items() if all(tools_found(t) for t in lang.tools))


def on_path(tool: str) -> bool:
    """Whether ``tool`` is on this host's ``PATH`` (the sandbox binds the host's ``/usr``)."""
    return shutil.which(tool) is not None


def unsupported(language: str, offered: Iterable[str]) -> str:
    """The message of a request in a language the gateway does not run."""
    return (f"language {language[:40]!r} is not supported by this tangram gateway; supported: "
            f"{', '.join(offered)} (SandboxFusion's other languages need their toolchains on the "
            "CPU nodes: install them, or name them in TANGRAM_GATEWAY_LANGUAGES)")
