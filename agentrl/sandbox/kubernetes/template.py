"""The user's pod template of the kubernetes backend: what of it a config may set.

Owns: `check_template`, which refuses (at config validation) every part of `sandbox.backend.pod_template` that the
backend owns or that would weaken the sandbox: only scheduling fields, extra volumes (never hostPath, never the
backend's own volume names) and, for the `sandbox` container, its image, pull policy, env, resources and extra
mounts. Does not own how an accepted template merges into the pod (`pods.merge_template`, which keeps every
security-relevant field the backend's).
"""

from __future__ import annotations

from typing import Any

from agentrl.errors import ConfigError
from agentrl.sandbox.kubernetes.pods import CONTAINER

# pod-template keys a user may set (the rest is ours); containers/volumes are merged, see pods.merge_template()
TEMPLATE_SPEC_KEYS = frozenset({"nodeSelector", "affinity", "tolerations", "priorityClassName", "imagePullSecrets",
                                "runtimeClassName", "schedulerName", "topologySpreadConstraints", "dnsPolicy",
                                "dnsConfig", "volumes", "containers", "terminationGracePeriodSeconds"})
TEMPLATE_CONTAINER_KEYS = frozenset({"name", "image", "imagePullPolicy", "env", "envFrom", "resources",
                                     "volumeMounts"})
FORBIDDEN_VOLUMES = ("hostPath",)


def check_template(template: Any) -> None:
    """Refuse pod-template content that would weaken the sandbox or that the backend owns. Raises ConfigError."""
    if template is None:
        return
    if not isinstance(template, dict) or set(template) - {"metadata", "spec"}:
        raise ConfigError("sandbox.backend.pod_template: use a pod template with only `metadata` and `spec`")
    spec = template.get("spec") or {}
    extra = sorted(set(spec) - TEMPLATE_SPEC_KEYS)
    if extra:
        raise ConfigError(f"sandbox.backend.pod_template.spec: {', '.join(extra)} cannot be set (the backend owns "
                          f"them or they would weaken isolation); allowed: {', '.join(sorted(TEMPLATE_SPEC_KEYS))}")
    for c in spec.get("containers") or []:
        if c.get("name") != CONTAINER or set(c) - TEMPLATE_CONTAINER_KEYS:
            raise ConfigError(f"sandbox.backend.pod_template.spec.containers: only one container named {CONTAINER!r} "
                              f"with {', '.join(sorted(TEMPLATE_CONTAINER_KEYS))} may be given")
    for v in spec.get("volumes") or []:
        if any(k in v for k in FORBIDDEN_VOLUMES) or v.get("name") in ("agentrl", "workspace", "tmp", "agent-src",
                                                                      "agent-key") \
                or str(v.get("name", "")).startswith("writable-"):
            raise ConfigError(f"sandbox.backend.pod_template.spec.volumes: volume {v.get('name')!r} is not allowed "
                              "(hostPath volumes and the backend's own volume names are refused)")
    meta = template.get("metadata") or {}
    if set(meta) - {"labels", "annotations"}:
        raise ConfigError("sandbox.backend.pod_template.metadata: only labels and annotations may be given")
