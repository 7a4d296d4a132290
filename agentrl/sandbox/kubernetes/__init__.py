"""The `kubernetes` sandbox backend: sandboxes as pods, from a warm pool shared by every rollout worker.

    backend.py   KubernetesBackend and its config (the backend protocol; bootstrap; handles; waiting for the agent)
    pods.py      what a sandbox pod is: manifests, labels, ownership, tokens, rules over pod state (pure, no I/O)
    template.py  what of a user's pod template the config may set (checked at config validation)
    pool.py      the `pods` control plane: warm pool, claims by conditional update, refill, sweep
    claims.py    the `agent-sandbox` control plane: one SandboxClaim per sandbox
    api.py       raw REST access to the API server, retries, the watch-backed informer

Importing this package does not import the kubernetes client (config validation needs only the model).
"""

from agentrl.sandbox.kubernetes.backend import AgentSandboxOptions, KubernetesBackend, KubernetesSandboxConfig

__all__ = ["AgentSandboxOptions", "KubernetesBackend", "KubernetesSandboxConfig"]
