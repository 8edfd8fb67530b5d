"""The README's "Memory and collections" examples run as written (embedded) and print what they say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def examples() -> list[str]:
    text = README.read_text()
    start = text.index("## Memory and collections")
    section = text[start:text.index("\n## ", start + 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CRIOGENAI_BROKER_URL", raising=False)
    blocks = examples()
    assert len(blocks) == 2
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "refunds.md"
    assert out[1].startswith("[1] hours.html (part 1") and "The clinic opens at eight." in out
    assert out[-2:] == ["Prefers mornings", "[]"]
