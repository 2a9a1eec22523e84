"""deploy/kubernetes (issue 27, point 2): rendered as ``kubectl kustomize`` would (tests/deploy/kustomize.py),
every built-in object validated against the Kubernetes API's schemas in strict mode (kubernetes-validate, offline),
the Prometheus Operator's two custom resources checked by structure (kubernetes-validate has no schemas for them;
the PrometheusRule's groups must equal deploy/prometheus/alerts.yml's), and the documents checked against each
other and against kvgate itself: selectors select the pods they are meant to and no others, every ConfigMap,
Secret, key and file referenced exists, the probes reach /kvgate/health on the port kvgate listens on, and the
ConfigMap's configuration and the Secret's tenants file, the two files kvgate serve reads, load with kvgate's own
settings loader under the container's real environment (the image's ENV included) and points the
shared ledger at the Redis Service. ``pytest tests/deploy -s`` prints the matrix. A broken manifest fails: each
mutation at the end breaks one thing and must be caught."""

from __future__ import annotations

import copy
import re
import secrets
import shlex
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from gateway import __version__
from gateway.config.settings import ConfigError, Settings, load_settings
from tests.deploy.kustomize import Document, Unsupported, render
from tests.support.container_env import environment, image_environment

ROOT = Path(__file__).parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
VERSIONS = ("1.34", "1.37")
"""The oldest Kubernetes minor still in support when this was written, and the newest kubernetes-validate knows."""
CUSTOM_KINDS = frozenset({("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1",
                                                                         "PrometheusRule")})
OPERATOR_SECRET = "kvgate-secrets"
"""Created by the operator, never committed (README: Kubernetes, the kubectl create secret command)."""
Row = tuple[str, str, str]


class Rendered:
    """The rendered documents, looked up by kind and name."""

    def __init__(self, documents: list[Document]) -> None:
        self.documents = documents

    def of_kind(self, kind: str) -> list[Document]:
        return [document for document in self.documents if document["kind"] == kind]

    def get(self, kind: str, name: str) -> Document:
        found = [document for document in self.of_kind(kind) if document["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind} {name}: {len(found)} in the render"
        return found[0]

    def workloads(self) -> list[Document]:
        return self.of_kind("Deployment") + self.of_kind("StatefulSet")


def pod_spec(workload: Document) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: Document) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    every: list[dict[str, Any]] = spec.get("initContainers", []) + spec["containers"]
    return every


def container(workload: Document, name: str) -> dict[str, Any]:
    return next(item for item in containers(workload) if item["name"] == name)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def selected_workloads(rendered: Rendered, selector: dict[str, str]) -> list[str]:
    return sorted(workload["metadata"]["name"] for workload in rendered.workloads()
                  if selects(selector, workload["spec"]["template"]["metadata"]["labels"]))


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def flags(command: list[str], name: str) -> list[str]:
    """Every value of a repeatable flag, in order."""
    return [command[index + 1] for index, word in enumerate(command[:-1]) if word == name]


# -- the checks: each returns rows of the matrix, and fails on what it finds broken -------------------------------


def check_schemas(rendered: Rendered) -> list[Row]:
    rows = []
    for document in rendered.documents:
        name = f"{document['kind']}/{document['metadata']['name']}"
        if (document["apiVersion"], document["kind"]) in CUSTOM_KINDS:
            continue
        for version in VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)
        rows.append(("schema (strict)", name, "valid on " + ", ".join(VERSIONS)))
    return rows


def check_custom_resources(rendered: Rendered) -> list[Row]:
    monitor = rendered.get("ServiceMonitor", "kvgate")
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(monitor["spec"]) <= {"selector", "endpoints", "jobLabel", "namespaceSelector"}
    assert monitor["spec"]["endpoints"], "a ServiceMonitor scrapes at least one endpoint"
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme", "authorization"}
        assert re.fullmatch(r"\d+s", endpoint["interval"])
    rule = rendered.get("PrometheusRule", "kvgate")
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"} and set(rule["spec"]) == {"groups"}
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert rule["spec"]["groups"] == groups, "prometheusrule.yaml's spec.groups must be deploy/prometheus/alerts.yml's"
    alerts = sum(len(group["rules"]) for group in groups)
    return [("custom resource", "ServiceMonitor/kvgate", "spec fields known, endpoints set"),
            ("custom resource", "PrometheusRule/kvgate", f"groups == alerts.yml ({alerts} alerts)")]


def check_selectors(rendered: Rendered) -> list[Row]:
    rows = []
    for workload in rendered.workloads():
        name, labels = workload["metadata"]["name"], workload["spec"]["template"]["metadata"]["labels"]
        assert selects(workload["spec"]["selector"]["matchLabels"], labels), f"{name}: selector misses its pods"
        for spread in pod_spec(workload).get("topologySpreadConstraints", []):
            assert selected_workloads(rendered, spread["labelSelector"]["matchLabels"]) == [name]
        rows.append(("selector", f"Deployment/{name}", "matches its own pod template"))
    expected = {("Service", "kvgate"): ["kvgate"], ("Service", "kvgate-redis"): ["kvgate-redis"],
                ("PodDisruptionBudget", "kvgate"): ["kvgate"], ("NetworkPolicy", "kvgate-redis"): ["kvgate-redis"]}
    found = {(kind, document["metadata"]["name"]) for kind in ("Service", "PodDisruptionBudget", "NetworkPolicy")
             for document in rendered.of_kind(kind)}
    assert found == set(expected), f"selectors to check: {sorted(found)}"
    for (kind, name), pods in expected.items():
        spec = rendered.get(kind, name)["spec"]
        selector = spec["selector"] if kind == "Service" else spec.get("selector", spec.get("podSelector"))
        selector = selector.get("matchLabels", selector) if kind != "Service" else selector
        assert selected_workloads(rendered, selector) == pods, f"{kind} {name} selects the wrong pods"
        rows.append(("selector", f"{kind}/{name}", f"pods of {', '.join(pods)} only"))
    policy = rendered.get("NetworkPolicy", "kvgate-redis")["spec"]
    peers = [peer["podSelector"]["matchLabels"] for rule in policy["ingress"] for peer in rule["from"]]
    assert [selected_workloads(rendered, peer) for peer in peers] == [["kvgate"]], "Redis admits kvgate's pods only"
    redis_ports = {port["name"] for port in container(rendered.get("Deployment", "kvgate-redis"), "redis")["ports"]}
    assert {port["port"] for rule in policy["ingress"] for port in rule["ports"]} <= redis_ports
    rows.append(("network policy", "NetworkPolicy/kvgate-redis", "ingress from kvgate's pods, on port redis"))
    monitor = rendered.get("ServiceMonitor", "kvgate")["spec"]["selector"]["matchLabels"]
    services = sorted(service["metadata"]["name"] for service in rendered.of_kind("Service")
                      if selects(monitor, service["metadata"]["labels"]))
    assert services == ["kvgate"], f"the ServiceMonitor selects the Services {services}"
    rows.append(("selector", "ServiceMonitor/kvgate", "Service kvgate only"))
    return rows


def operator_secret_keys() -> tuple[set[str], set[str]]:
    """The keys of the Secret the README's ``kubectl create secret`` makes, and those it names as optional (the
    command's own, and any in a comment beside it)."""
    readme = (ROOT / "README.md").read_text()
    blocks = [block for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
              if f"create secret generic {OPERATOR_SECRET}" in block]
    assert len(blocks) == 1, "README: one bash block creates the Secret"
    command = re.search(rf"^[^#\n]*create secret generic {OPERATOR_SECRET}(?:[^\n]*\\\n)*[^\n]*", blocks[0], re.M)
    assert command is not None
    made = {match for word in shlex.split(command.group().replace("\\\n", " "))
            for match in re.findall(r"^--from-(?:literal|file)=([^=]+)=", word)}
    named = set(re.findall(r"--from-(?:literal|file)=([\w.-]+)=", blocks[0]))
    return made, named


def check_references(rendered: Rendered) -> list[Row]:
    rows = []
    made, optional = operator_secret_keys()
    config_maps = {document["metadata"]["name"]: document["data"] for document in rendered.of_kind("ConfigMap")}
    accounts = {document["metadata"]["name"] for document in rendered.of_kind("ServiceAccount")}

    rendered_secrets = {document["metadata"]["name"]: {*document.get("data", {}), *document.get("stringData", {})}
                        for document in rendered.of_kind("Secret")}

    def secret_key(name: str, key: str, is_optional: bool, where: str) -> None:
        if name in rendered_secrets:
            assert is_optional or key in rendered_secrets[name], f"{where}: Secret {name} has no key {key}"
        else:
            assert name == OPERATOR_SECRET, f"{where}: Secret {name} is neither in the render nor the README's"
            assert key in (optional if is_optional else made), f"{where}: key {key} is not made by the README's command"
        rows.append(("secret key", where, f"{name}[{key}]" + (" (optional)" if is_optional else "")))

    for workload in rendered.workloads():
        spec, name = pod_spec(workload), workload["metadata"]["name"]
        account = spec.get("serviceAccountName")
        assert account is None or account in accounts, f"{name}: no ServiceAccount {account}"
        if account:
            rows.append(("service account", f"Deployment/{name}", f"ServiceAccount/{account} exists"))
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, f"{name}: no ConfigMap {volume['configMap']}"
                rows.append(("config map", f"{name} volume {volume['name']}", volume["configMap"]["name"]))
            if "secret" in volume:
                for item in volume["secret"]["items"]:
                    secret_key(volume["secret"]["secretName"], item["key"], False, f"{name} volume {volume['name']}")
        for item in containers(workload):
            for variable in item.get("env", []):
                reference = variable.get("valueFrom", {}).get("secretKeyRef")
                if reference:
                    secret_key(reference["name"], reference["key"], reference.get("optional", False),
                               f"{name}/{item['name']} ${variable['name']}")
            rows += check_paths(workload, item, config_maps)
    credentials = rendered.get("ServiceMonitor", "kvgate")["spec"]["endpoints"][0]["authorization"]["credentials"]
    secret_key(credentials["name"], credentials["key"], False, "ServiceMonitor/kvgate bearer")
    return rows


def check_paths(workload: Document, item: dict[str, Any], config_maps: dict[str, dict[str, str]]) -> list[Row]:
    """Every absolute path a container's command names lies on one of its mounts and exists there: a ConfigMap's
    key or a Secret's item."""
    volumes = {volume["name"]: volume for volume in pod_spec(workload)["volumes"]}
    rows = []
    for word in item.get("command", []) + item.get("args", []):
        if not word.startswith("/") or word.startswith("/kvgate/"):
            continue
        mounts = [mount for mount in item.get("volumeMounts", []) if word.startswith(mount["mountPath"] + "/")]
        assert len(mounts) == 1, f"{item['name']}: {word} is on no mount"
        volume, file = volumes[mounts[0]["name"]], word[len(mounts[0]["mountPath"]) + 1:]
        if "configMap" in volume:
            assert file in config_maps[volume["configMap"]["name"]], f"{item['name']}: {word} is not in the ConfigMap"
        else:
            assert "secret" in volume, f"{item['name']}: {word} is on neither a ConfigMap nor a Secret"
            assert file in {entry["path"] for entry in volume["secret"]["items"]}, f"{item['name']}: {word}"
        rows.append(("file", f"{item['name']} {word}", f"volume {mounts[0]['name']}"))
    return rows


def check_workloads(rendered: Rendered) -> list[Row]:
    rows = []
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version == __version__
    for workload in rendered.workloads():
        spec, name = pod_spec(workload), workload["metadata"]["name"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        for item in containers(workload):
            where = f"{name}/{item['name']}"
            requests, limits = item["resources"].get("requests", {}), item["resources"].get("limits", {})
            assert {"cpu", "memory"} <= set(requests) and "memory" in limits, f"{where}: requests and a memory limit"
            context = item["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert item["imagePullPolicy"] == "IfNotPresent" and ":" in item["image"], where
            rows.append(("container", where, f"{item['image']}, requests {requests['cpu']}/{requests['memory']}, "
                                             f"limit {limits['memory']}"))
    images = {item["image"] for item in containers(rendered.get("Deployment", "kvgate"))}
    assert images == {f"kvgate:{version}"}, f"kvgate's containers run {sorted(images)}, not kvgate:{version}"
    redis = rendered.get("Deployment", "kvgate-redis")
    assert not container(redis, "redis")["image"].endswith(":latest")
    assert redis["spec"]["replicas"] == 1 and redis["spec"]["strategy"]["type"] == "Recreate", \
        "one Redis, never two behind the Service at once (a rolling update would split the ledger)"
    rows.append(("redis", "Deployment/kvgate-redis", "1 replica, Recreate"))
    gateway = rendered.get("Deployment", "kvgate")["spec"]
    budget = rendered.get("PodDisruptionBudget", "kvgate")["spec"]
    assert gateway["replicas"] >= 2 and 1 <= budget["maxUnavailable"] < gateway["replicas"]
    assert gateway["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    rows.append(("replicas", "Deployment/kvgate", f"{gateway['replicas']}, disruptions at most "
                                                  f"{budget['maxUnavailable']}, rolling with none unavailable"))
    return rows


def container_environment(workload: Document, name: str, secret: dict[str, str]) -> dict[str, str]:
    """What the container's process sees: the image's ENV plus its env (Secret values from ``secret``; an optional
    key it lacks is no variable)."""
    item = container(workload, name)
    variables = image_environment()
    for variable in item.get("env", []):
        if "value" in variable:
            variables[variable["name"]] = variable["value"]
        elif variable["valueFrom"]["secretKeyRef"]["key"] in secret:
            variables[variable["name"]] = secret[variable["valueFrom"]["secretKeyRef"]["key"]]
    return variables


def running_settings(rendered: Rendered, directory: Path, secret: dict[str, str]) -> Settings:
    """The settings a kvgate pod runs with: the files its ``--config`` flags name, as its mounts hold them (the
    ConfigMap's key, the Secret's item from ``secret``), loaded by kvgate's own loader, in that order, in the
    container's environment."""
    workload = rendered.get("Deployment", "kvgate")
    gateway = container(workload, "kvgate")
    served = gateway["args"]
    assert served[:1] == ["serve"]
    volumes = {volume["name"]: volume for volume in pod_spec(workload)["volumes"]}
    paths = []
    for index, word in enumerate(flags(served, "--config")):
        mount = next(mount for mount in gateway["volumeMounts"] if word.startswith(mount["mountPath"] + "/"))
        volume, name = volumes[mount["name"]], word[len(mount["mountPath"]) + 1:]
        if "configMap" in volume:
            text = rendered.get("ConfigMap", volume["configMap"]["name"])["data"][name]
        else:
            key = next(item["key"] for item in volume["secret"]["items"] if item["path"] == name)
            text = secret[key]
        path = directory / f"{index}-{name}"
        path.write_text(text)
        paths.append(path)
    with environment(container_environment(workload, "kvgate", secret)):
        return load_settings(paths)


def check_settings(rendered: Rendered, directory: Path) -> list[Row]:
    admin = secrets.token_hex(24)
    secret = {"admin-key": admin, "tenants.toml": (KUBERNETES / "tenants.example.toml").read_text()}
    settings = running_settings(rendered, directory, secret)
    workload = rendered.get("Deployment", "kvgate")
    gateway = container(workload, "kvgate")
    port = next(port for port in gateway["ports"] if port["name"] == "http")["containerPort"]
    assert settings.server.port == port and settings.server.host == "0.0.0.0" and settings.server.workers == 1
    assert settings.server.admin_key is not None and settings.server.admin_key.get_secret_value() == admin
    assert settings.server.require_api_key and all(
        settings.tenants[name].digests() for name in tomllib.loads(secret["tenants.toml"])["tenants"])
    own = tomllib.loads(rendered.get("ConfigMap", "kvgate-config")["data"]["kvgate.toml"])
    assert [backend.url for backend in settings.backends] == [backend["url"] for backend in own["backends"]], \
        "a KVGATE_BACKEND__URL (the image's or the pod's) must not replace the first backend's url"
    assert settings.server.watch_config_s > 0, \
        "kvgate must reload a mounted ConfigMap or Secret that changes in place (server.watch_config_s)"
    rows = [("settings", "kvgate-config + tenants.toml", f"load: port {port}, backends "
             + ", ".join(backend.name for backend in settings.backends) + ", tenants with keys "
             + ", ".join(sorted(name for name, tenant in settings.tenants.items() if tenant.digests())))]
    ledger = settings.shared_ledger
    assert ledger.redis_url is not None
    url = urlsplit(ledger.redis_url.get_secret_value())
    redis = rendered.get("Service", "kvgate-redis")
    assert url.hostname in {redis["metadata"]["name"], f"{redis['metadata']['name']}.{redis['metadata']['namespace']}"
                            f".svc"}, f"the shared ledger points at {url.hostname}, not the Redis Service"
    service_port = redis["spec"]["ports"][0]
    redis_port = next(item for item in container(rendered.get("Deployment", "kvgate-redis"), "redis")["ports"]
                      if item["name"] == service_port["targetPort"])
    assert url.port == service_port["port"] and redis_port["containerPort"] == 6379
    rows.append(("shared ledger", "redis_url", f"Service {url.hostname}:{url.port} -> redis container port 6379"))
    replicas = workload["spec"]["replicas"]
    if ledger.on_unreachable == "local_share":
        assert ledger.replicas == replicas, \
            f"shared_ledger.replicas = {ledger.replicas}, the Deployment runs {replicas}"
    rows.append(("shared ledger", "on_unreachable", f"{ledger.on_unreachable}, replicas {ledger.replicas} == "
                                                    f"Deployment {replicas}, lease_ttl_s {ledger.lease_ttl_s:g}"))
    external = "rediss://:pw@redis.example.com:6380/0"
    with_url = running_settings(rendered, directory, {**secret, "redis-url": external})
    assert with_url.shared_ledger.redis_url is not None
    assert with_url.shared_ledger.redis_url.get_secret_value() == external
    rows.append(("shared ledger", "Secret redis-url", "replaces the ConfigMap's redis_url (an external Redis)"))
    return rows + check_endpoints(rendered, port)


def check_endpoints(rendered: Rendered, port: int) -> list[Row]:
    """The probes, the Service and the ServiceMonitor all reach kvgate's port."""
    workload = rendered.get("Deployment", "kvgate")
    gateway = container(workload, "kvgate")
    ports = {item["name"]: item["containerPort"] for item in gateway["ports"]}
    rows = []
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = gateway[probe]["httpGet"]
        assert get["path"] == "/kvgate/health" and ports.get(get["port"], get["port"]) == port, probe
        rows.append(("probe", f"kvgate {probe}", f"GET /kvgate/health on {get['port']} ({port})"))
    service = rendered.get("Service", "kvgate")
    assert {item["targetPort"] for item in service["spec"]["ports"]} <= set(ports)
    endpoint = rendered.get("ServiceMonitor", "kvgate")["spec"]["endpoints"][0]
    assert endpoint["port"] in {item["name"] for item in service["spec"]["ports"]}, "ServiceMonitor port"
    assert endpoint["path"] == "/kvgate/metrics" and endpoint["authorization"]["type"] == "Bearer"
    admin = next(item["valueFrom"]["secretKeyRef"] for item in gateway["env"]
                 if item["name"] == "KVGATE_SERVER__ADMIN_KEY")
    assert endpoint["authorization"]["credentials"] == {"name": admin["name"], "key": admin["key"]}
    rows.append(("metrics", "ServiceMonitor/kvgate", f"port {endpoint['port']}, {endpoint['path']}, Bearer "
                                                     f"{admin['name']}[{admin['key']}] (kvgate's admin key)"))
    jobs = set(re.findall(r'job="([^"]+)"', ALERTS.read_text()))
    assert jobs == {service["metadata"]["name"]} and "jobLabel" not in rendered.get("ServiceMonitor", "kvgate")[
        "spec"], f"the alerts select job {jobs}; the ServiceMonitor's job is the Service's name"
    rows.append(("metrics", "alerts job", f"{service['metadata']['name']} (the Service's name)"))
    return rows


CHECKS: tuple[Callable[[Rendered], list[Row]], ...] = (check_schemas, check_custom_resources, check_selectors,
                                                       check_references, check_workloads)


def check_all(documents: list[Document], directory: Path) -> list[Row]:
    rendered = Rendered(documents)
    return [row for check in CHECKS for row in check(rendered)] + check_settings(rendered, directory)


def print_matrix(rows: list[Row]) -> None:
    widths = [max(len(row[column]) for row in rows) for column in range(2)]
    print(f"\ndeploy/kubernetes: {len(rows)} checks")
    for check, subject, finding in rows:
        print(f"  {check:<{widths[0]}}  {subject:<{widths[1]}}  {finding}")


# -- the tests ------------------------------------------------------------------------------------------------------


def test_the_render_is_valid_and_consistent(tmp_path: Path) -> None:
    documents = render(KUBERNETES)
    rows = check_all(documents, tmp_path)
    print_matrix(rows)
    kinds = sorted(f"{document['kind']}/{document['metadata']['name']}" for document in documents)
    assert kinds == ["ConfigMap/kvgate-config", "Deployment/kvgate",
                     "Deployment/kvgate-redis", "NetworkPolicy/kvgate-redis", "PodDisruptionBudget/kvgate",
                     "PrometheusRule/kvgate", "Service/kvgate", "Service/kvgate-redis", "ServiceAccount/kvgate",
                     "ServiceMonitor/kvgate"]
    assert all(document["metadata"]["namespace"] == "kvgate" for document in documents)


def _spec(name: str) -> Callable[[Rendered], dict[str, Any]]:
    return lambda rendered: rendered.get("Deployment", name)["spec"]


def _gateway(rendered: Rendered, name: str = "kvgate") -> dict[str, Any]:
    return container(rendered.get("Deployment", "kvgate"), name)


def _set(path: Callable[[Rendered], dict[str, Any]], key: str, value: Any) -> Callable[[Rendered], None]:
    return lambda rendered: path(rendered).__setitem__(key, value)


MUTATIONS: dict[str, tuple[Callable[[Rendered], None], str]] = {
    "service selects redis": (lambda r: r.get("Service", "kvgate")["spec"]["selector"].__setitem__(
        "app.kubernetes.io/component", "redis"), "Service kvgate selects the wrong pods"),
    "pdb selects nothing": (lambda r: r.get("PodDisruptionBudget", "kvgate")["spec"]["selector"]["matchLabels"]
                            .__setitem__("app.kubernetes.io/component", "gateways"), "PodDisruptionBudget kvgate"),
    "replicas differ from shared_ledger.replicas": (_set(_spec("kvgate"), "replicas", 4),
                                                    "shared_ledger.replicas = 3, the Deployment runs 4"),
    "redis rolls": (_set(_spec("kvgate-redis"), "strategy", {"type": "RollingUpdate"}), "split the ledger"),
    "probe on another path": (lambda r: _gateway(r)["livenessProbe"]["httpGet"].__setitem__("path", "/health"),
                              "livenessProbe"),
    "misspelled field": (lambda r: _gateway(r).__setitem__("readinesProbe", _gateway(r).pop("readinessProbe")),
                         "'readinesProbe' was unexpected"),
    "kvgate without requests": (lambda r: _gateway(r)["resources"].pop("requests"), "kvgate/kvgate: requests"),
    "monitor on a port the Service lacks": (lambda r: r.get("ServiceMonitor", "kvgate")["spec"]["endpoints"][0]
                                            .__setitem__("port", "metrics"), "ServiceMonitor port"),
    "monitor without the admin key": (lambda r: r.get("ServiceMonitor", "kvgate")["spec"]["endpoints"][0]
                                      .__setitem__("authorization", {"type": "Bearer", "credentials": {
                                          "name": "kvgate-secrets", "key": "token"}}), "key token is not made"),
    "alert rules drift": (lambda r: r.get("PrometheusRule", "kvgate")["spec"]["groups"][0]["rules"].pop(),
                          "alerts.yml"),
    "a ConfigMap that is not rendered": (lambda r: pod_spec(r.get("Deployment", "kvgate"))["volumes"][0]
                                         .__setitem__("configMap", {"name": "kvgate-conf"}), "no ConfigMap"),
    "a backend url in the pod's environment": (lambda r: _gateway(r)["env"].append(
        {"name": "KVGATE_BACKEND__URL", "value": "http://ollama:11434"}), "KVGATE_BACKEND__URL (the image's or"),
    "ledger pointed elsewhere": (lambda r: r.get("ConfigMap", "kvgate-config")["data"].__setitem__(
        "kvgate.toml", r.get("ConfigMap", "kvgate-config")["data"]["kvgate.toml"].replace(
            "redis://kvgate-redis:6379", "redis://redis:6379")), "points at redis, not the Redis Service"),
    "no reload on change": (lambda r: r.get("ConfigMap", "kvgate-config")["data"].__setitem__(
        "kvgate.toml", r.get("ConfigMap", "kvgate-config")["data"]["kvgate.toml"].replace(
            "watch_config_s = 10.0", "watch_config_s = 0")), "server.watch_config_s"),
    "the Secret's file not read": (lambda r: _gateway(r).__setitem__("args", _gateway(r)["args"][:3]),
                                   "no tenant has api_keys"),
    "the Secret's file on no mount": (lambda r: _gateway(r)["volumeMounts"].pop(1), "is on no mount"),
    "image drifts": (lambda r: _gateway(r).__setitem__("image", "kvgate:0.0.9"), "kvgate's containers run"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_broken_manifest_fails(mutation: str, tmp_path: Path) -> None:
    documents = copy.deepcopy(render(KUBERNETES))
    mutate, message = MUTATIONS[mutation]
    mutate(Rendered(documents))
    with pytest.raises((AssertionError, kubernetes_validate.ValidationError, ConfigError), match=re.escape(message)):
        check_all(documents, tmp_path)


def _kustomization(directory: Path, text: str, **files: str) -> Path:
    (directory / "kustomization.yaml").write_text(text)
    for name, content in files.items():
        (directory / name.replace("_", ".")).write_text(content)
    return directory


DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {app: web}}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      initContainers: [{name: init, image: "registry.example/web:1"}]
      containers: [{name: web, image: web}, {name: other, image: nginx:1.27}]
"""


def test_the_renderer_applies_each_field_it_knows(tmp_path: Path) -> None:
    root = _kustomization(tmp_path, """apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: shop
labels: [{pairs: {team: a}}]
resources: [web.yaml]
configMapGenerator: [{name: settings, files: [app.toml, renamed.txt=app.toml]}]
generatorOptions: {disableNameSuffixHash: true}
images: [{name: web, newTag: "2"}, {name: registry.example/web, newName: mirror.example/web}]
""", web_yaml=DEPLOYMENT, app_toml="a = 1\n")
    deployment, config_map = render(root)
    assert deployment["metadata"] == {"name": "web", "namespace": "shop", "labels": {"app": "web", "team": "a"}}
    assert deployment["spec"]["selector"] == {"matchLabels": {"app": "web"}}  # includeSelectors false: untouched
    assert deployment["spec"]["template"]["metadata"]["labels"] == {"app": "web"}
    spec = deployment["spec"]["template"]["spec"]
    assert [item["image"] for item in spec["initContainers"] + spec["containers"]] == [
        "mirror.example/web:1", "web:2", "nginx:1.27"]
    assert config_map == {"apiVersion": "v1", "kind": "ConfigMap", "data": {"app.toml": "a = 1\n",
                          "renamed.txt": "a = 1\n"},
                          "metadata": {"name": "settings", "namespace": "shop", "labels": {"team": "a"}}}


HEADER = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"


@pytest.mark.parametrize(("text", "files"), [
    (HEADER + "commonLabels: {a: b}\nresources: [web.yaml]\n", {}),
    (HEADER + "resources: [web.yaml]\nconfigMapGenerator: [{name: c, files: [app.toml]}]\n", {}),
    (HEADER + "resources: [web.yaml]\nconfigMapGenerator: [{name: c, literals: [a=b]}]\n"
     "generatorOptions: {disableNameSuffixHash: true}\n", {}),
    (HEADER + "resources: [https://example.com/base]\n", {}),
    (HEADER + "resources: [web.yaml]\nlabels: [{pairs: {a: b}, includeSelectors: true}]\n", {}),
    (HEADER + "resources: [web.yaml]\nimages: [{name: web, digest: 'sha256:00'}]\n", {}),
    (HEADER + "resources: [anchored.yaml]\n", {"anchored_yaml": "kind: ConfigMap\nmetadata: &m {name: a}\n"
                                                                "data: {b: *m}\n"}),
    (HEADER + "namespace: x\nresources: [role.yaml]\n", {"role_yaml": "kind: RoleBinding\nmetadata: {name: r}\n"}),
])
def test_the_renderer_refuses_what_it_does_not_reproduce(tmp_path: Path, text: str, files: dict[str, str]) -> None:
    root = _kustomization(tmp_path, text, web_yaml=DEPLOYMENT, app_toml="a = 1\n", **files)
    with pytest.raises(Unsupported):
        render(root)
