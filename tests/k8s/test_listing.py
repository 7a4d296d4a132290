"""Lists in pages (limit + continue), on the fake API edge and on a real cluster: what every list of the backend (the
informer's first list and relist, the sweep, close) relies on at thousands of pods. Unpaged, a list of 2,000 pods is one
answer holding every full object, which the API server builds in memory at once."""

from __future__ import annotations

import os
from typing import Any

import pytest

from agentrl.sandbox.kubernetes.api import ApiError, Informer, KubeApi, _Pages

NAMESPACE = os.environ.get("AGENTRL_K8S_NAMESPACE", "agentrl")  # as conftest.py
Cluster = Any  # conftest.Cluster: `kube`, `pool`, `fake`
CM = f"/api/v1/namespaces/{NAMESPACE}/configmaps"


async def _configmaps(cluster: Cluster, n: int) -> list[str]:
    names = [f"{cluster.pool}-{i}" for i in range(n)]
    for name in names:
        await cluster.kube.request("POST", CM, body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": name, "labels": {"agentrl.io/pool": cluster.pool}}, "data": {"i": name}})
    return names


async def _drop(kube: KubeApi, names: list[str]) -> None:
    for name in names:
        try:
            await kube.request("DELETE", f"{CM}/{name}")
        except ApiError:
            pass


async def test_a_list_longer_than_a_page_comes_whole_in_pages(cluster: Cluster) -> None:
    names = await _configmaps(cluster, 7)
    try:
        kube = cluster.kube
        kube.page = 3
        before = kube.calls["list configmaps"]
        listing = await kube.list(CM, f"agentrl.io/pool={cluster.pool}")
        assert sorted(o["metadata"]["name"] for o in listing["items"]) == sorted(names)
        assert kube.calls["list configmaps"] - before == 3  # 3 + 3 + 1
        assert listing["metadata"]["resourceVersion"]
    finally:
        await _drop(cluster.kube, names)


async def test_the_informer_sees_every_object_past_its_first_page(cluster: Cluster) -> None:
    names = await _configmaps(cluster, 5)
    informer = Informer(cluster.kube, CM, f"agentrl.io/pool={cluster.pool}")
    try:
        cluster.kube.page = 2
        before = cluster.kube.calls["list configmaps"]
        await informer.start()
        assert sorted(informer.objects) == sorted(names)
        assert cluster.kube.calls["list configmaps"] - before == 3  # 2 + 2 + 1
    finally:
        await informer.stop()
        await _drop(cluster.kube, names)


async def test_a_continue_token_from_before_a_compaction_is_gone_and_the_list_starts_again(
        fake_cluster: Cluster) -> None:
    """The real server answers 410 Expired to a continue token whose snapshot was compacted (about 5 minutes); the
    fake does too (its compaction is on demand). A list that meets it starts again from its first page."""
    fake, kube = fake_cluster.fake, fake_cluster.kube
    assert fake is not None
    names = await _configmaps(fake_cluster, 4)
    first = await kube.request("GET", CM, query={"labelSelector": f"agentrl.io/pool={fake_cluster.pool}",
                                                 "limit": "2"})
    token = first["metadata"]["continue"]
    fake.create_object("configmaps", NAMESPACE, {"metadata": {"name": "unrelated-0"}, "data": {}})
    fake.compact()
    with pytest.raises(ApiError) as e:
        await kube.request("GET", CM, query={"labelSelector": f"agentrl.io/pool={fake_cluster.pool}",
                                             "limit": "2", "continue": token})
    assert e.value.status == 410

    compactions = iter([True])  # compact once, between the first page and the second

    async def request(method: str, path: str, **kwargs: Any) -> Any:
        if kwargs["query"].get("continue") and next(compactions, False):
            fake.create_object("configmaps", NAMESPACE, {"metadata": {"name": "unrelated-1"}, "data": {}})
            fake.compact()
        return await KubeApi.request(kube, method, path, **kwargs)

    kube.page = 2
    kube.request = request  # type: ignore[method-assign]
    listing = await kube.list(CM, f"agentrl.io/pool={fake_cluster.pool}")
    assert sorted(o["metadata"]["name"] for o in listing["items"]) == sorted(names)


def test_pages_restart_on_an_expired_token_a_bounded_number_of_times() -> None:
    pages = _Pages("a=b", 2)
    assert pages.next_query() == {"labelSelector": "a=b", "limit": "2"}
    pages.add({"items": [{"n": 1}, {"n": 2}], "metadata": {"resourceVersion": "10", "continue": "t1"}})
    assert pages.next_query() == {"labelSelector": "a=b", "limit": "2", "continue": "t1"}
    for _ in range(3):
        pages.failed(ApiError(410, "Expired", "too old"))
        assert pages.items == [] and pages.next_query() == {"labelSelector": "a=b", "limit": "2"}
        pages.add({"items": [{"n": 1}], "metadata": {"resourceVersion": "11", "continue": "t2"}})
    with pytest.raises(ApiError):  # a fourth expiry: the server compacts faster than we read; say so
        pages.failed(ApiError(410, "Expired", "too old"))
    with pytest.raises(ApiError):  # any other error is the caller's
        _Pages("", 5).failed(ApiError(500, "", "boom"))
    pages = _Pages("", 5)
    pages.add({"items": [{"n": 1}], "metadata": {"resourceVersion": "12"}})
    assert pages.next_query() is None and pages.listing() == {"items": [{"n": 1}],
                                                              "metadata": {"resourceVersion": "12"}}
