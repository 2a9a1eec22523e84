"""Render a kustomization as ``kubectl kustomize`` would, for exactly the fields deploy/kubernetes uses.

There is no kustomize binary in CI (and nothing to fetch one from), so the test renders the kustomization itself.
What it does is each field's documented behaviour, and it stops at :class:`Unsupported` on anything else, so an
edit of kustomization.yaml that reaches past this subset fails the test instead of passing unrendered:

    resources              local files only (no directories, remote bases or components); every YAML document in
                           them, in order; YAML anchors and aliases are refused (kustomize's YAML reader and
                           PyYAML disagree about them)
    configMapGenerator     name + files ("path" or "key=path"); UTF-8 text becomes data. No literals, envs,
                           behavior or options
    generatorOptions       disableNameSuffixHash: true only (the content-hash suffix is not reproduced)
    namespace              set on every document (none may name its own, and no cluster-scoped kind or kind whose
                           namespace is also written elsewhere, such as a RoleBinding's subjects)
    labels                 pairs added to each document's metadata.labels (includeSelectors and includeTemplates
                           false, no fields)
    images                 name with newName and/or newTag, on the containers and init containers of pod templates

The output is the same documents as ``kubectl kustomize`` prints; their order is not its (it sorts by kind), so
callers look documents up by kind and name.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Document = dict[str, Any]

SUPPORTED_FIELDS = frozenset({"apiVersion", "kind", "namespace", "labels", "resources", "configMapGenerator",
                              "generatorOptions", "images"})
NAMESPACED_ONLY_IN_METADATA = frozenset({
    "ConfigMap", "Secret", "Service", "ServiceAccount", "Deployment", "StatefulSet", "DaemonSet", "Job",
    "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor", "PrometheusRule", "HorizontalPodAutoscaler",
})
"""Kinds whose namespace lives in metadata.namespace alone: the ones the namespace field is rendered for."""
POD_TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job"})


class Unsupported(ValueError):
    """Raised when a kustomization uses something this renderer does not reproduce."""


def _only(mapping: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(mapping) - allowed)
    if extra:
        raise Unsupported(f"{where}: {', '.join(extra)} not supported by tests/deploy/kustomize.py")


def _documents(path: Path) -> list[Document]:
    text = path.read_text(encoding="utf-8")
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise Unsupported(f"{path.name}: YAML anchors and aliases are not supported")
    documents = [document for document in yaml.safe_load_all(text) if document is not None]
    for document in documents:
        if not isinstance(document, dict) or "kind" not in document or "metadata" not in document:
            raise Unsupported(f"{path.name}: every document must be a Kubernetes object")
    return documents


def _generated_config_maps(root: Path, entries: list[dict[str, Any]]) -> list[Document]:
    maps = []
    for entry in entries:
        _only(entry, {"name", "files"}, f"configMapGenerator {entry.get('name')}")
        data: dict[str, str] = {}
        for item in entry["files"]:
            key, sep, relative = item.partition("=")
            file = root / (relative if sep else key)
            data[key if sep else file.name] = file.read_bytes().decode("utf-8")  # binaryData: not supported
        maps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": entry["name"]}, "data": data})
    return maps


def _has_containers(value: Any) -> bool:
    if isinstance(value, dict):
        return "containers" in value or any(_has_containers(item) for item in value.values())
    return isinstance(value, list) and any(_has_containers(item) for item in value)


def _set_images(document: Document, images: list[dict[str, Any]]) -> None:
    if document["kind"] not in POD_TEMPLATE_KINDS:
        if _has_containers(document):
            raise Unsupported(f"{document['kind']} {document['metadata']['name']}: images are rendered only in pod "
                              "templates of " + ", ".join(sorted(POD_TEMPLATE_KINDS)))
        return
    spec = document["spec"]["template"]["spec"]
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        for image in images:
            _only(image, {"name", "newName", "newTag"}, f"images {image.get('name')}")
            name, tag = container["image"], None
            if "@" in name:
                raise Unsupported(f"image {name}: digests are not supported")
            if ":" in name.rsplit("/", 1)[-1]:
                name, tag = name.rsplit(":", 1)
            if name == image["name"]:
                new_name, new_tag = image.get("newName", name), image.get("newTag", tag)
                container["image"] = new_name if new_tag is None else f"{new_name}:{new_tag}"


def render(root: Path) -> list[Document]:
    """The documents ``kubectl kustomize root`` prints (in another order)."""
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text(encoding="utf-8"))
    _only(kustomization, set(SUPPORTED_FIELDS), "kustomization.yaml")
    if (kustomization.get("apiVersion"), kustomization.get("kind")) != ("kustomize.config.k8s.io/v1beta1",
                                                                        "Kustomization"):
        raise Unsupported("kustomization.yaml: apiVersion kustomize.config.k8s.io/v1beta1, kind Kustomization")
    documents: list[Document] = []
    for resource in kustomization.get("resources", []):
        path = root / resource
        if "://" in resource or not path.is_file():
            raise Unsupported(f"resource {resource}: only local files are supported")
        documents += _documents(path)
    options = kustomization.get("generatorOptions", {})
    generators = kustomization.get("configMapGenerator", [])
    if generators and options != {"disableNameSuffixHash": True}:
        raise Unsupported("configMapGenerator needs generatorOptions {disableNameSuffixHash: true}: the name hash "
                          "kustomize adds otherwise is not reproduced")
    documents += _generated_config_maps(root, generators)
    documents = copy.deepcopy(documents)
    namespace = kustomization.get("namespace")
    for document in documents:
        metadata = document["metadata"]
        if namespace is not None:
            if document["kind"] not in NAMESPACED_ONLY_IN_METADATA or "namespace" in metadata:
                raise Unsupported(f"{document['kind']} {metadata['name']}: the namespace field is rendered only for "
                                  "the kinds in NAMESPACED_ONLY_IN_METADATA, without a namespace of their own")
            metadata["namespace"] = namespace
        for labels in kustomization.get("labels", []):
            _only(labels, {"pairs", "includeSelectors", "includeTemplates"}, "labels")
            if labels.get("includeSelectors") or labels.get("includeTemplates"):
                raise Unsupported("labels: includeSelectors and includeTemplates are not supported")
            metadata["labels"] = {**metadata.get("labels", {}), **labels["pairs"]}
        _set_images(document, kustomization.get("images", []))
    return documents
