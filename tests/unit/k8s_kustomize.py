"""A small renderer of the kustomize subset k8s/ uses, so manifests are rendered and checked where `kubectl` is not
installed (the test also compares it with `kubectl kustomize` where it is).

Supported: `resources` (files and directories with a kustomization), `components`, `configMapGenerator` (files,
`key=path` files, literals, `behavior: create|merge|replace`, `namespace`) with `generatorOptions.
disableNameSuffixHash: true` (required), `patches` (strategic-merge patch files or inline patches, matched by the
patch's kind/name/namespace or an explicit `target`;
`key: null` deletes the key), and `images` (newName / newTag / digest). Anything else is an
error, so a kustomization that grows beyond the subset fails loudly here instead of rendering wrongly.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KNOWN = {"apiVersion", "kind", "resources", "components", "configMapGenerator", "generatorOptions", "patches",
         "images"}
Obj = dict[str, Any]


def _key(obj: Obj) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")


def strategic_merge(base: Any, patch: Any) -> Any:
    """Maps merge recursively (a key patched to null is deleted); lists of maps that all have a `name` merge by name
    (new items first, as kustomize does);
    other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = strategic_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if (isinstance(base, list) and isinstance(patch, list) and base and patch
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        out = [copy.deepcopy(x) for x in base]
        index = {x["name"]: i for i, x in enumerate(out)}
        added = []
        for item in patch:
            if item["name"] in index:
                out[index[item["name"]]] = strategic_merge(out[index[item["name"]]], item)
            else:
                added.append(copy.deepcopy(item))
        return added + out  # kustomize puts items new to the list first
    return copy.deepcopy(patch)


def _load_docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _generate(root: Path, gen: Obj, options: Obj) -> Obj:
    if not options.get("disableNameSuffixHash"):
        raise ValueError(f"{root}: configMapGenerator without disableNameSuffixHash is outside the supported subset")
    data: dict[str, str] = {}
    for entry in gen.get("files") or []:
        key, _, rel = entry.partition("=") if "=" in entry else (Path(entry).name, "", entry)
        data[key] = (root / rel).read_text()
    for lit in gen.get("literals") or []:
        k, _, v = lit.partition("=")
        data[k] = v
    meta = {"name": gen["name"]}
    if gen.get("namespace"):
        meta["namespace"] = gen["namespace"]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def _set_images(objs: list[Obj], images: list[Obj]) -> None:
    def fix(container: Obj) -> None:
        image = container.get("image", "")
        name = image.split("@")[0].rsplit(":", 1)[0] if ":" in image.split("/")[-1] else image.split("@")[0]
        for rule in images:
            if name == rule["name"]:
                new = rule.get("newName", name)
                container["image"] = f"{new}@{rule['digest']}" if "digest" in rule else \
                    f"{new}:{rule['newTag']}" if "newTag" in rule else new + image[len(name):]

    for obj in objs:
        spec = obj.get("spec") or {}
        pod = (spec.get("template") or {}).get("spec") if "template" in spec else spec if obj["kind"] == "Pod" else None
        for c in (pod or {}).get("containers", []) + (pod or {}).get("initContainers", []):
            fix(c)


def render(root: str | Path) -> list[Obj]:
    """The objects `kubectl kustomize root` would print (order aside)."""
    root = Path(root)
    k = yaml.safe_load((root / "kustomization.yaml").read_text())
    unknown = set(k) - KNOWN
    if unknown:
        raise ValueError(f"{root}/kustomization.yaml: {sorted(unknown)} are outside the supported subset")
    objs: list[Obj] = []
    for res in (k.get("resources") or []) + (k.get("components") or []):
        path = root / res
        objs += render(path) if path.is_dir() else _load_docs(path)
    for gen in k.get("configMapGenerator") or []:
        made = _generate(root, gen, k.get("generatorOptions") or {})
        behavior = gen.get("behavior", "create")
        existing = [i for i, o in enumerate(objs) if _key(o) == _key(made)]
        if behavior == "create":
            if existing:
                raise ValueError(f"{root}: ConfigMap {gen['name']} already exists; use behavior: merge")
            objs.append(made)
        elif not existing:
            raise ValueError(f"{root}: ConfigMap {gen['name']} to {behavior} does not exist")
        else:
            i = existing[0]
            objs[i]["data"] = {**objs[i]["data"], **made["data"]} if behavior == "merge" else made["data"]
    for p in k.get("patches") or []:
        patch = yaml.safe_load((root / p["path"]).read_text()) if "path" in p else yaml.safe_load(p["patch"])
        target = p.get("target") or {"kind": patch["kind"], "name": patch["metadata"]["name"]}
        hits = [i for i, o in enumerate(objs)
                if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]]
        if len(hits) != 1:
            raise ValueError(f"{root}: patch {p} matches {len(hits)} objects")
        objs[hits[0]] = strategic_merge(objs[hits[0]], patch)
    _set_images(objs, k.get("images") or [])
    return objs
