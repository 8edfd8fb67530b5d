"""Every error a caller can catch is in one tree, under ``CriogenaiError`` (or a tool's ``ToolError``)."""

from __future__ import annotations

import importlib

import pytest

import criogenai
from criogenai import CriogenaiError, RemoteToolException, ToolError

PACKAGES = ["criogenai", "criogenai.agent", "criogenai.dispatcher", "criogenai.tools", "criogenai.documents",
            "criogenai.memory"]


def _errors(package: str) -> dict[str, type[BaseException]]:
    module = importlib.import_module(package)
    found = {name: getattr(module, name) for name in getattr(module, "__all__", [])}
    return {n: v for n, v in found.items() if isinstance(v, type) and issubclass(v, BaseException)}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_error_is_a_criogenai_error_defined_in_one_module(package: str) -> None:
    errors = _errors(package)
    assert errors
    for name, error in errors.items():
        assert issubclass(error, CriogenaiError) or error in (ToolError, RemoteToolException), name
        assert error is getattr(criogenai._errors, name), f"{package}.{name} is defined outside _errors"


def test_the_errors_of_each_package_are_the_ones_criogenai_exports() -> None:
    top = _errors("criogenai")
    for package in PACKAGES[1:]:
        for name, error in _errors(package).items():
            assert top.get(name) is error, f"{package}.{name} is not criogenai.{name}"


def test_lookup_and_value_errors_can_be_caught_as_such() -> None:
    assert issubclass(criogenai.RunNotFound, LookupError)
    assert issubclass(criogenai.ApprovalNotFound, LookupError)
    assert issubclass(criogenai.InvalidQuery, ValueError)
    assert issubclass(criogenai.InvalidApprovalArguments, ValueError)


def test_the_command_says_in_one_line_that_redis_did_not_answer(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from criogenai._cli import main

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("CRIOGENAI_REDIS_URL", f"redis://127.0.0.1:{port}/0")
    monkeypatch.delenv("CRIOGENAI_BROKER_URL", raising=False)
    assert main(["approvals", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("criogenai: ") and err.count("\n") == 1 and "Traceback" not in err
