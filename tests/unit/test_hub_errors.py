"""A hub model (or an adapter to merge) that cannot be read is one line, and its exit code says whose move it is
(docs/sweeps.md): a model the hub says does not exist is bad input (exit 2), a hub that cannot
be reached is a runtime failure (exit 1). The hub here is a local HTTP server that answers as
the Hugging Face hub does for a missing repository, or a port nothing listens on."""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from huggingface_hub import constants

from conftest import free_port
from evora.errors import ConfigError, RunError
from evora.models import check_hub_model
from evora.strategies.merge.sources import resolve_source

MODEL = "someone/no-such-model"


class MissingRepository(BaseHTTPRequestHandler):
    """The hub's answer to a repository that does not exist (or is not the caller's to read)."""

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "Repository not found"}')

    def log_message(self, *args) -> None:  # no request lines in the test's output
        pass


@pytest.fixture
def hub_at(monkeypatch, tmp_path):
    """Points the hub's client at `endpoint`, online, with an empty cache."""

    def point(endpoint: str) -> None:
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))

    return point


@pytest.fixture
def missing_hub(hub_at):
    """A hub that has no repository at all."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), MissingRepository)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hub_at(f"http://127.0.0.1:{server.server_address[1]}")
    yield
    server.shutdown()
    server.server_close()


def test_a_model_the_hub_does_not_have_is_bad_input(missing_hub):
    with pytest.raises(ConfigError, match=f'model.path="{MODEL}": no such model on the hub') as raised:
        check_hub_model(MODEL)
    assert raised.value.exit_code == 2


def test_an_adapter_to_merge_the_hub_does_not_have_is_bad_input(missing_hub):
    key = "strategy.adapters[0]"
    with pytest.raises(
        ConfigError, match=re.escape(f'{key}="{MODEL}": not a local folder, and the hub gave no adapter')
    ):
        resolve_source(MODEL, key)


def test_an_adapter_to_merge_from_a_hub_out_of_reach_is_a_runtime_failure(hub_at):
    hub_at(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(RunError, match="the hub gave no adapter") as raised:
        resolve_source(MODEL, "strategy.adapters[0]")
    assert raised.value.exit_code == 1 and "\n" not in str(raised.value)


def test_a_hub_out_of_reach_is_a_runtime_failure(hub_at):
    hub_at(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(RunError, match=f'model.path="{MODEL}": the Hugging Face hub .* cannot be reached') as raised:
        check_hub_model(MODEL)
    assert raised.value.exit_code == 1
    assert "HF_HUB_OFFLINE=1" in str(raised.value) and "\n" not in str(raised.value)
