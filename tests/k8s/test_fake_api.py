"""The fake API edge behaves like the real API server where the backend depends on it (a fake that is wrong here
would let a broken claim protocol pass): optimistic concurrency on patch/update/delete, watches resuming from a
resourceVersion with selector transitions, 410 after compaction, pod update rules, garbage collection."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.sandbox.kubernetes.api import MERGE_PATCH, ApiError, KubeApi, load_client_configuration, watch_events
from fake_k8s import FakeKubernetes

NS = "/api/v1/namespaces/t"


@pytest.fixture
async def api() -> Any:
    async with FakeKubernetes() as fake:
        kube = KubeApi(load_client_configuration(None, None, fake.url), threads=4)
        kube.fake = fake  # type: ignore[attr-defined]
        yield kube
        await kube.close()


def _pod(name: str, **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"activeDeadlineSeconds": 100, "containers": [{"name": "c", "image": "i"}]}}


async def test_stale_resource_version_is_a_conflict_for_patch_put_and_delete(api: Any) -> None:
    pod = await api.request("POST", f"{NS}/pods", body=_pod("a", state="warm"))
    rv = pod["metadata"]["resourceVersion"]
    won = await api.request("PATCH", f"{NS}/pods/a", content_type=MERGE_PATCH,
                            body={"metadata": {"resourceVersion": rv, "labels": {"state": "claimed"}}})
    assert won["metadata"]["labels"]["state"] == "claimed" and won["metadata"]["resourceVersion"] != rv
    for method, body in (("PATCH", {"metadata": {"resourceVersion": rv, "labels": {"state": "mine"}}}),
                         ("PUT", {**pod, "metadata": {**pod["metadata"], "resourceVersion": rv}}),
                         ("DELETE", {"preconditions": {"resourceVersion": rv}})):
        with pytest.raises(ApiError) as err:
            await api.request(method, f"{NS}/pods/a", body=body, content_type=MERGE_PATCH if method == "PATCH"
                              else "application/json")
        assert err.value.status == 409
    assert (await api.request("GET", f"{NS}/pods/a"))["metadata"]["labels"]["state"] == "claimed"
    with pytest.raises(ApiError) as err:
        await api.request("POST", f"{NS}/pods", body=_pod("a"))
    assert err.value.status == 409 and err.value.reason == "AlreadyExists"


async def test_pod_updates_follow_the_api_rules(api: Any) -> None:
    await api.request("POST", f"{NS}/pods", body=_pod("a"))
    await api.request("PATCH", f"{NS}/pods/a", content_type=MERGE_PATCH, body={"spec": {"activeDeadlineSeconds": 50}})
    for spec in ({"activeDeadlineSeconds": 60}, {"restartPolicy": "Always"}):
        with pytest.raises(ApiError) as err:
            await api.request("PATCH", f"{NS}/pods/a", content_type=MERGE_PATCH, body={"spec": spec})
        assert err.value.status == 422


async def test_watch_resumes_from_a_version_and_reports_selector_transitions(api: Any) -> None:
    await api.request("POST", f"{NS}/pods", body=_pod("before", pool="p"))
    listing = await api.request("GET", f"{NS}/pods", query={"labelSelector": "pool=p"})
    await api.request("POST", f"{NS}/pods", body=_pod("a", pool="p"))
    await api.request("POST", f"{NS}/pods", body=_pod("b", pool="q"))
    await api.request("PATCH", f"{NS}/pods/a", content_type=MERGE_PATCH, body={"metadata": {"labels": {"pool": "x"}}})
    await api.request("PATCH", f"{NS}/pods/b", content_type=MERGE_PATCH, body={"metadata": {"labels": {"pool": "p"}}})

    def read() -> list[tuple[str, str]]:
        resp = api.open_watch(f"{NS}/pods", {"labelSelector": "pool=p",
                                             "resourceVersion": listing["metadata"]["resourceVersion"]})
        out = []
        for ev in watch_events(resp):
            out.append((ev["type"], ev["object"]["metadata"]["name"]))
            if len(out) == 3:
                resp.shutdown()
                break
        return out

    assert await asyncio.wait_for(asyncio.to_thread(read), 10) == [("ADDED", "a"), ("DELETED", "a"), ("ADDED", "b")]
    api.fake.create_object("configmaps", "t", {"metadata": {"name": "c"}})
    api.fake.compact()

    def expired() -> dict:
        resp = api.open_watch(f"{NS}/pods", {"resourceVersion": listing["metadata"]["resourceVersion"]})
        return next(watch_events(resp))

    ev = await asyncio.wait_for(asyncio.to_thread(expired), 10)
    assert ev["type"] == "ERROR" and ev["object"]["code"] == 410


async def test_garbage_collection_by_owner_reference(api: Any) -> None:
    owner = await api.request("POST", f"{NS}/pods", body=_pod("owner"))
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": owner["metadata"]["uid"]}
    dep = _pod("dep")
    dep["metadata"]["ownerReferences"] = [ref]
    await api.request("POST", f"{NS}/pods", body=dep)
    orphan = _pod("orphan")
    orphan["metadata"]["ownerReferences"] = [{**ref, "uid": "not-a-live-uid"}]
    await api.request("POST", f"{NS}/pods", body=orphan)
    await asyncio.sleep(0)
    await api.request("DELETE", f"{NS}/pods/owner")
    names = [p["metadata"]["name"] for p in (await api.request("GET", f"{NS}/pods"))["items"]]
    assert names == [], "dependents of a deleted or absent owner are collected"


async def test_scripted_faults_and_call_counts(api: Any) -> None:
    api.fake.inject("create", "pods", 429, retry_after=2)  # (idempotent verbs are retried by urllib3 itself)
    with pytest.raises(ApiError) as err:
        await api.request("POST", f"{NS}/pods", body=_pod("x"))
    assert err.value.status == 429 and err.value.retry_after == 2 and err.value.retryable
    with pytest.raises(ApiError) as err:
        await api.request("GET", f"{NS}/pods/x")
    assert err.value.status == 404 and not err.value.retryable
    with pytest.raises(ApiError) as err:
        await api.request("POST", f"{NS}/pods/x/exec")
    assert err.value.status == 403
    assert api.fake.calls["create pods"] == 1 and api.calls["get pods"] == 1 and api.fake.calls["create pods/exec"] == 1
