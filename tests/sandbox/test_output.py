"""Output caps keep the head and the tail: plain-data tables for the buffer, and real bwrap and
docker actions printing past the cap with a last line that must survive."""

from __future__ import annotations

import pytest
from conftest import SMALL_LIMITS, Run

from tangram_celery.sandbox.output import CappedBuffer


def cut(n: int) -> str:
    """The marker between head and tail, as the issue specifies it."""
    return f"\n[... tangram: {n} bytes cut ...]\n"


EURO = "€".encode()  # 3 bytes: e2 82 ac
BUFFERS = [
    ("under the cap: everything, no marker", 10, [b"hello"], "hello", False, 0),
    ("exactly the cap", 4, [b"ab", b"cd"], "abcd", False, 0),
    ("over the cap: head, marker, tail", 4, [b"abcdefgh"], "ab" + cut(4) + "gh", True, 4),
    ("the tail is the newest bytes across chunks", 6,
     [b"0123", b"4567", b"89", b"AB"], "012" + cut(6) + "9AB", True, 6),
    ("small chunks wrap the ring", 4, [bytes([c]) for c in b"abcdefghij"],
     "ab" + cut(6) + "ij", True, 6),
    ("a chunk larger than the ring replaces it", 4, [b"ab", b"c", b"0123456789"],
     "ab" + cut(9) + "89", True, 9),
    ("odd cap: the tail takes the extra byte", 5, [b"abcdefg"], "ab" + cut(2) + "efg", True, 2),
    ("cap 0 keeps only the marker", 0, [b"abc"], cut(3), True, 3),
    ("a character split at the head's end is cut whole", 6, [b"ab" + EURO + b"zzzzzz" + b"end"],
     "ab" + cut(9) + "end", True, 9),
    ("a character split at the tail's start is cut whole", 6,
     [b"abc" + b"x" * 10 + EURO + b"yz"], "abc" + cut(13) + "yz", True, 13),
    ("whole characters on both sides are kept", 8, [EURO + b"-" * 20 + EURO], "€-" + cut(18) + "-€",
     True, 18),
    ("invalid bytes are replaced, not dropped, under the cap", 10, [b"\xff\xfeok"],
     "\ufffd\ufffdok", False, 0),
    ("a marker-looking line in the output is just output", 100, [b"[... tangram: 5 bytes cut ...]"],
     "[... tangram: 5 bytes cut ...]", False, 0),
]


@pytest.mark.parametrize(("name", "cap", "chunks", "text", "truncated", "cut_bytes"), BUFFERS,
                         ids=[b[0] for b in BUFFERS])
def test_capped_buffer(name: str, cap: int, chunks: list[bytes], text: str, truncated: bool,
                       cut_bytes: int) -> None:
    buf = CappedBuffer(cap)
    for chunk in chunks:
        buf.feed(chunk, 0.0)
    assert buf.text() == text
    assert buf.truncated is truncated and buf.cut == cut_bytes
    assert buf.total == sum(len(c) for c in chunks)
    assert len(buf.data) == min(cap, buf.total)


def test_memory_stays_bounded_while_a_large_stream_is_fed() -> None:
    buf = CappedBuffer(1000)
    line = b"0123456789" * 6 + b"\n"
    for _ in range(50_000):
        buf.feed(line, 0.0)
        assert len(buf.head) + len(buf.tail) <= 1000
    buf.feed(b"FINAL ANSWER: 42\n", 0.0)
    assert buf.text().endswith("FINAL ANSWER: 42\n")
    assert buf.text().startswith("0123456789")
    assert buf.cut == buf.total - 1000


LAST_LINE = "=== 7 passed, 1 failed in 0.42s ==="


def test_a_chatty_action_keeps_its_last_line(sandbox_run: Run) -> None:
    cap = SMALL_LIMITS.output_cap_bytes
    out = sandbox_run(
        "python3 -c \"import sys; [print('line', i) for i in range(20000)]; "
        f"print('{LAST_LINE}'); print('err', 'x' * 9000, file=sys.stderr); "
        "print('STDERR-END', file=sys.stderr)\"",
        timeout_s=60)
    assert out.exit_code == 0, out.stderr
    assert out.stdout_truncated and out.stderr_truncated
    assert out.stdout.startswith("line 0\nline 1\n")
    assert out.stdout.endswith(f"line 19999\n{LAST_LINE}\n")
    printed = sum(len(f"line {i}\n") for i in range(20000)) + len(LAST_LINE) + 1
    assert cut(printed - cap) in out.stdout and out.stdout_cut_bytes == printed - cap
    assert out.stderr_cut_bytes == len("err ") + 9000 + 1 + len("STDERR-END\n") - cap
    assert out.stderr.startswith("err xxx") and out.stderr.endswith("x\nSTDERR-END\n")
    assert "bytes cut ...]" in out.stderr
    assert len(out.stdout.encode()) == cap + len(cut(printed - cap).encode())
