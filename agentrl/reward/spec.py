"""`reward:` entries: which source, its weight, its options. Parsed from the YAML shorthand, validated against the
source's own options model at config load time (so a typo fails before any rollout).

Accepted forms of one list entry (YAML):

    - unit_tests                                   # weight 1.0, default options
    - {unit_tests: 1.0}                            # {name: weight}
    - {length_penalty: {weight: 1.0, expected_tokens: 256, alpha: 0.001}}
    - {http: {url: "http://127.0.0.1:8088/score", weight: 0.5, label: rm}}   # label: the component's name
    - {source: http, weight: 0.5, label: rm, options: {url: ...}}             # the canonical form (config.json)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentrl.errors import ConfigError
from agentrl.reward.registry import reward_class

SHORTHAND_HELP = ("each reward entry names one source: `name`, `{name: weight}` or `{name: {weight: W, <option>: "
                  "...}}`")


def _shorthand(value: Any) -> Any:
    if isinstance(value, str):
        return {"source": value}
    if not isinstance(value, dict) or "source" in value:
        return value
    if len(value) != 1:
        raise ValueError(f"{SHORTHAND_HELP}; got the keys {sorted(value)}")
    (name, body), = value.items()
    if body is None:
        return {"source": name}
    if isinstance(body, (int, float)) and not isinstance(body, bool):
        return {"source": name, "weight": body}
    if isinstance(body, dict):
        rest = {k: v for k, v in body.items() if k not in ("weight", "label")}
        out: dict[str, Any] = {"source": name, "options": rest}
        out.update({k: body[k] for k in ("weight", "label") if k in body})
        return out
    raise ValueError(f"{SHORTHAND_HELP}; {name!r} has {body!r}")


class RewardSpec(BaseModel):
    """One weighted source. `options` are validated by (and normalized to) the source's `Options` model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    weight: float = 1.0
    label: str | None = Field(default=None, min_length=1)
    options: dict[str, Any] = Field(default_factory=dict)

    _shorthand = model_validator(mode="before")(_shorthand)

    @model_validator(mode="after")
    def _check(self) -> RewardSpec:
        if not math.isfinite(self.weight):
            raise ValueError(f"reward source {self.source!r}: weight must be a finite number")
        try:
            cls = reward_class(self.source)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        try:
            normalized = cls.Options.model_validate(self.options).model_dump(mode="json")
        except ValidationError as exc:
            problems = "; ".join(f"field '{'.'.join(str(p) for p in e['loc'])}': "
                                 f"{'unknown option' if e['type'] == 'extra_forbidden' else e['msg']}"
                                 for e in exc.errors())
            raise ValueError(f"reward source {self.source!r}: {problems}") from None
        object.__setattr__(self, "options", normalized)
        return self

    @property
    def key(self) -> str:
        """The name of this source's entry in `reward_components`."""
        return self.label or self.source


DEFAULT_REWARD: tuple[RewardSpec, ...] = (RewardSpec(source="unit_tests"),)


def check_reward_list(specs: Sequence[RewardSpec]) -> Sequence[RewardSpec]:
    """Reject an empty list and two sources that would store under the same component name."""
    if not specs:
        raise ValueError("reward: give at least one source, e.g. [{unit_tests: 1.0}]")
    seen: set[str] = set()
    for spec in specs:
        if spec.key in seen:
            raise ValueError(f"reward: two sources are named {spec.key!r}; give one of them a `label`")
        seen.add(spec.key)
    return specs


def parse_reward_list(data: Any, source: str) -> list[RewardSpec]:
    """A `reward:` list from YAML data (a list, or a mapping holding `reward:`), as ConfigError on bad input."""
    if isinstance(data, dict):
        if "reward" not in data:
            raise ConfigError(f"{source}: no `reward:` list in it (give a YAML list of sources or a config with "
                              f"`reward:`)")
        data = data["reward"]
    if not isinstance(data, list):
        raise ConfigError(f"{source}: `reward` must be a list of sources; {SHORTHAND_HELP}")
    specs = []
    for i, item in enumerate(data):
        try:
            specs.append(RewardSpec.model_validate(item))
        except ValidationError as exc:
            msgs = "; ".join(e["msg"] for e in exc.errors())
            raise ConfigError(f"{source}: reward[{i}]: {msgs}") from None
    try:
        return list(check_reward_list(specs))
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
