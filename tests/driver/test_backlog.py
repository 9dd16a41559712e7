"""driver.backlog: writes held in order while the tracking server is away, the outage limit (a real
server killed mid-grid is commands/test_grid_outage.py's)."""

import http.server
import signal
import threading

import pytest
import requests
from mlflow.exceptions import MlflowException

from raystudy.driver import backlog
from raystudy.errors import ConfigError
from tests.helpers import free_port


class Clock:
    """A clock the test moves; ``sleep`` moves it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


class Server:
    """Writes that fail as a server that is away fails them, until it is ``up``."""

    def __init__(self):
        self.up, self.written = False, []

    def write(self, name):
        def op(cl):
            if not self.up:
                raise MlflowException(f"API request to http://x/api/2.0/mlflow/{name} failed with exception refused")
            self.written.append(name)

        return op


@pytest.fixture()
def health():
    """A real HTTP server answering /health (MLflow's tracking server answers it so)."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


def test_the_limit_is_an_environment_variable_with_a_default_and_bad_values_say_what_is_allowed(monkeypatch):
    monkeypatch.delenv(backlog.LIMIT_ENV, raising=False)
    assert backlog.limit_s() == backlog.DEFAULT_LIMIT_S == 600
    monkeypatch.setenv(backlog.LIMIT_ENV, "12.5")
    assert backlog.limit_s() == 12.5
    for bad in ("0", "-3", "nan", "inf", "ten"):
        monkeypatch.setenv(backlog.LIMIT_ENV, bad)
        with pytest.raises(ConfigError, match=rf"RAYSTUDY_TRACKING_OUTAGE_S must be a number of seconds > 0.*{bad}"):
            backlog.limit_s()


def test_only_a_server_that_cannot_be_reached_is_away():
    assert backlog.is_away(requests.exceptions.ConnectionError("refused"))
    assert backlog.is_away(MlflowException("API request to http://h/api/2.0/mlflow/runs/get failed with exception x"))
    try:
        try:
            raise requests.exceptions.ReadTimeout("slow")
        except requests.exceptions.ReadTimeout:
            raise RuntimeError("wrapped") from None
    except RuntimeError as e:
        assert backlog.is_away(e)  # by what it happened during
    assert not backlog.is_away(MlflowException("RESOURCE_DOES_NOT_EXIST: run 'x' not found"))
    assert not backlog.is_away(ValueError("bad"))


def test_writes_wait_in_order_while_the_server_is_away_and_are_written_once_it_answers(health, capsys):
    clock, server = Clock(), Server()
    held = backlog.Backlog(health, limit=30, clock=clock)
    held.put(server.write("a"), None)
    held.put(server.write("b"), None)
    assert server.written == [] and len(held.pending) == 2 and held.away_since == 0
    clock.now = 10
    held.put(server.write("c"), None)  # /health answers, yet the write fails: still away
    assert not held.expired() and len(held.pending) == 3
    server.up = True
    clock.now = 12
    held.flush(None)
    assert server.written == ["a", "b", "c"] and not held.pending and held.away_for() == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"tracking server {health} unreachable: keeping what the trials report in memory")
    assert out[1] == f"tracking server {health} back after 12 s; what was held is written"


def test_past_the_limit_it_has_expired_and_settling_waits_as_long_again_then_gives_up():
    clock, server = Clock(), Server()
    held = backlog.Backlog(f"http://127.0.0.1:{free_port()}", limit=30, clock=clock)  # nothing listens there
    held.put(server.write("a"), None)
    clock.now = 31
    held.flush(None)
    assert held.expired() and len(held.pending) == 1
    with pytest.raises(
        backlog.TrackingOutage,
        match=r"still unreachable after 6\d s: 1 write\(s\) of the grid's trials were not recorded",
    ):
        held.settle(None, wait=30, sleep=clock.sleep)
    assert server.written == []


def test_settling_writes_what_waits_once_the_server_answers(health):
    clock, server = Clock(), Server()
    held = backlog.Backlog(health, limit=30, clock=clock)
    held.put(server.write("a"), None)

    def sleep(s):
        clock.sleep(s)
        server.up = clock.now > 20

    held.settle(None, wait=30, sleep=sleep)
    assert server.written == ["a"] and not held.pending


def test_errors_of_a_server_that_answers_and_of_a_local_store_are_not_held():
    held = backlog.Backlog("sqlite:////tmp/x.db", limit=30)
    with pytest.raises(MlflowException):
        held.put(Server().write("a"), None)  # a database store has no server to wait for
    held = backlog.Backlog("http://127.0.0.1:1", limit=30)

    def refused(cl):
        raise MlflowException("INVALID_PARAMETER_VALUE: bad metric")

    with pytest.raises(MlflowException, match="bad metric"):
        held.put(refused, None)


def test_one_backlog_per_grid_in_the_process(monkeypatch):
    monkeypatch.setenv(backlog.LIMIT_ENV, "7")
    a = backlog.of("http://h:1", "exp", "parent-a")
    assert backlog.of("http://h:1", "exp", "parent-a") is a and a.limit == 7
    assert backlog.of("http://h:1", "exp", "parent-b") is not a


def test_ctrl_c_ends_the_wait_for_the_server_even_where_the_closing_ignores_it():
    clock = Clock()
    held = backlog.Backlog(f"http://127.0.0.1:{free_port()}", limit=30, clock=clock)
    held.put(Server().write("a"), None)

    def sleep(s):
        clock.sleep(s)
        signal.raise_signal(signal.SIGINT)  # the user, 2 s into the wait

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the driver's closing has it
    try:
        with pytest.raises(backlog.TrackingOutage, match=r"after 2 s \(Ctrl-C ended the wait\): 1 write"):
            held.settle(None, wait=600, sleep=sleep)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("command", ["grid", "search"])
def test_a_bad_limit_is_one_line_exit_2_before_any_work(command, tmp_path, monkeypatch, capsys):
    import importlib

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(backlog.LIMIT_ENV, "soon")
    assert importlib.import_module(f"raystudy.commands.{command}").main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {backlog.LIMIT_ENV} must be a number of seconds > 0 (default 600), got 'soon'"]
    assert list(tmp_path.iterdir()) == []
