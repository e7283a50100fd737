"""Pieces that need no daemon: error mapping, parsing, models."""

import builtins
from datetime import timezone

import pytest

import glovebox
from fake_daemon import FakeDaemon
from glovebox import errors
from glovebox.models import CommandResult, Execution, FileInfo, Result, parse_time


@pytest.mark.parametrize("status,code,cls", [
    (400, "invalid_request", glovebox.InvalidArgumentError),
    (400, "invalid_path", glovebox.InvalidArgumentError),
    (401, "unauthorized", glovebox.AuthError),
    (404, "sandbox_not_found", glovebox.NotFoundError),
    (404, "file_not_found", glovebox.NotFoundError),
    (409, "directory_not_empty", glovebox.ConflictError),
    (429, "too_many_sandboxes", glovebox.QuotaError),
    (413, "invalid_request", glovebox.InvalidArgumentError),
    (500, "internal", glovebox.GloveboxError),
    (502, "agent_error", glovebox.GloveboxError),
])
def test_error_mapping(status, code, cls):
    e = errors.error_from_body(status, {"error": {"code": code, "message": "m"}})
    assert type(e) is cls and e.code == code and e.status == status and e.message.startswith("m")


def test_gone_carries_reason():
    e = errors.error_from_body(410, {"error": {"code": "sandbox_gone", "message": "gone", "reason": "oom"}})
    assert isinstance(e, glovebox.SandboxGoneError) and e.reason == "oom"


def test_non_json_error_body():
    e = errors.error_from_body(502, b"Bad Gateway")
    assert type(e) is glovebox.GloveboxError and e.status == 502 and "Bad Gateway" in e.message


def test_timeout_error_is_builtin_too():
    assert issubclass(glovebox.TimeoutError, builtins.TimeoutError)
    assert issubclass(glovebox.TimeoutError, glovebox.GloveboxError)


def test_parse_time():
    d = parse_time("2026-12-01T07:55:06.650Z")
    assert d.tzinfo == timezone.utc and d.microsecond == 650000
    assert parse_time("2026-12-01T07:55:06Z").second == 6
    assert parse_time("2026-12-01T07:55:06.123456789Z").microsecond == 123456
    assert parse_time(None) is None and parse_time("garbage") is None


def test_command_result_decoding():
    r = CommandResult.from_json({"id": 1, "exit_code": 0, "stdout": "/w==", "stderr": "", "encoding": "base64",
                                 "stdout_bytes": 10})
    assert r.stdout_raw == b"\xff" and r.stdout == "\ufffd" and r.stdout_total_bytes == 10
    r = CommandResult.from_json({"id": 1, "exit_code": 0, "stdout": "hi", "stderr": "", "encoding": "utf8"})
    assert r.stdout_raw == b"hi"


def test_result_accessors():
    r = Result.from_json({"is_main_result": True, "data": {"text/plain": "t", "image/png": "iVBORw0KGgo=",
                                                           "application/json": {"a": 1}}})
    assert r.text == "t" and r.json == {"a": 1} and r.png_bytes.startswith(b"\x89PNG")
    assert r.html is None and set(r.formats()) == {"text", "png", "json"} and str(r) == "t"
    ex = Execution.from_json({"results": [{"is_main_result": False, "data": {"text/plain": "x"}},
                                          {"is_main_result": True, "data": {"text/plain": "y"}}],
                              "logs": {"stdout": ["o"], "stderr": []}, "execution_count": 3,
                              "error": {"name": "E", "value": "v", "traceback": "tb"}, "extra": 1})
    assert ex.text == "y" and ex.error.name == "E" and ex.logs.stdout == ["o"] and ex.execution_count == 3


def test_file_info_mtime_seconds():
    f = FileInfo.from_json({"path": "/a", "name": "a", "type": "file", "size": 1, "mode": 420, "uid": 0, "gid": 0,
                            "mtime": 0})
    assert f.mtime.year == 1970 and f.is_file


def test_bad_url():
    with pytest.raises(glovebox.InvalidArgumentError):
        glovebox.Sandbox.list(url="ftp://example", api_key="x")


def test_stale_keep_alive_connection_is_retried():
    with FakeDaemon(drop_idle=True) as fake:
        sb = glovebox.Sandbox.create(url=fake.url, api_key="k")
        for _ in range(3):  # each call finds the previous connection closed by the server
            assert sb.info().id == "fake123"
        assert fake.server.requests == 4


def test_keep_alive_connection_is_reused():
    with FakeDaemon() as fake:
        sb = glovebox.Sandbox.create(url=fake.url, api_key="k")
        conn = sb._t._pooled()
        sb.info()
        sb.info()
        assert sb._t._pooled() is conn and conn.sock is not None
