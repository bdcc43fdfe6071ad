"""A worker of a malleable test run: a whole pytest session that collects, then runs the test ids
its controller hands out, one at a time, and sends back every report.

It holds one id ahead (so module- and session-scoped fixtures are torn down only when the next
test does not need them, as in a plain run). After each test one round trip reports it done and
either brings the next id to hold or tells it to retire; then it gives the id it holds back and
ends its session, whose finish tears its fixtures down.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

from tangram_celery.sandbox.malleable.protocol import Channel, Message, connect


def warning_as_data(warning: warnings.WarningMessage, when: str, nodeid: str) -> Message:
    """A recorded warning as plain data (its category by name)."""
    return {"op": "warning", "message": str(warning.message), "category":
            warning.category.__name__, "filename": warning.filename, "lineno": warning.lineno,
            "when": when, "nodeid": nodeid}


class WorkerPlugin:
    """The worker's side, registered in a pytest session started with ``--malleable-connect``."""

    def __init__(self, config: pytest.Config, address: str) -> None:
        self.config = config
        self.channel: Channel = connect(address)
        self.channel.send({"op": "hello", "role": "worker", "pid": os.getpid()})
        self.collect_reports: list[dict[str, Any]] = []
        self.collect_warnings: list[Message] = []
        self.deselected: list[str] = []

    def _serial(self, report: pytest.TestReport | pytest.CollectReport) -> dict[str, Any]:
        data: dict[str, Any] = self.config.hook.pytest_report_to_serializable(
            config=self.config, report=report)
        return data

    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """Keep the collection reports a plain run would count (errors and skipped modules)."""
        if report.failed or report.skipped:
            self.collect_reports.append(self._serial(report))

    @pytest.hookimpl
    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        """Keep the ids ``-k``/``-m`` deselected."""
        self.deselected += [item.nodeid for item in items]

    @pytest.hookimpl
    def pytest_warning_recorded(self, warning_message: warnings.WarningMessage, when: str,
                                nodeid: str) -> None:
        """Collection warnings go with the collection; a test's are sent at once."""
        message = warning_as_data(warning_message, when, nodeid)
        if when == "collect":
            self.collect_warnings.append(message)
        elif when == "runtest":
            self.channel.send(message)

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        """Forward the start of a test."""
        self.channel.send({"op": "logstart", "nodeid": nodeid, "location": list(location)})

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Forward one phase's report."""
        self.channel.send({"op": "report", "report": self._serial(report)})

    @pytest.hookimpl
    def pytest_runtest_logfinish(self, nodeid: str,
                                 location: tuple[str, int | None, str]) -> None:
        """Forward the end of a test."""
        self.channel.send({"op": "logfinish", "nodeid": nodeid, "location": list(location)})

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        """Send the collection, then run what the controller hands out until told to stop."""
        items = {item.nodeid: item for item in session.items}
        self.channel.send({
            "op": "collected", "ids": list(items), "reports": self.collect_reports,
            "warnings": self.collect_warnings, "deselected": self.deselected})
        current = self._next()
        held = self._next() if current is not None else None
        while current is not None:
            nextitem = items[held] if held is not None else None
            items[current].config.hook.pytest_runtest_protocol(
                item=items[current], nextitem=nextitem)
            answer = self.channel.request(
                {"op": "done", "id": current, "next": held is not None})
            if answer.get("retire") or session.shouldfail or session.shouldstop:
                if held is not None:
                    self.channel.send({"op": "return", "id": held})
                break
            found = answer.get("id")
            current, held = held, found if isinstance(found, str) else None
        self.channel.send({"op": "bye"})
        return True

    def _next(self) -> str | None:
        answer = self.channel.request({"op": "next"})
        found = answer.get("id")
        return found if isinstance(found, str) else None

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self) -> None:
        """Close the connection."""
        self.channel.close()
