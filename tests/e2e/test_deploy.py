"""deploy/: the Prometheus alert rules, the scrape configuration and the Grafana dashboard use only metrics kvgate
exports, and are well-formed (issue 15, point 3). promtool is not needed: the rule files are checked structurally,
and every metric an expression names is looked up in a real kvgate's /kvgate/metrics after a request went through."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway
from tests.support.redis_server import running_redis

DEPLOY = Path(__file__).parents[2] / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "kvgate-dashboard.json"
PROMETHEUS_OWN = frozenset({"up"})
"""Series Prometheus makes itself for every target."""
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                       "offset", "inf", "nan"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers, less functions (a name before a "("),
    label matchers, label lists of by/without/on/ignoring, ranges, strings, numbers and keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = re.findall(r"(?<![\w.:])([A-Za-z_:][\w:]*)\b(?!\s*\()", expr)
    return {name for name in names if name.lower() not in _KEYWORDS}


@pytest.mark.parametrize(
    ("expr", "names"),
    [('sum by (backend) (rate(kvgate_requests_total{status=~"5.."}[5m])) / 1e-9', {"kvgate_requests_total"}),
     ("histogram_quantile(0.95, sum by (le) (rate(x_bucket[5m])))", {"x_bucket"}),
     ('up{job="kvgate"} == 0 and on(instance) y offset 5m', {"up", "y"}),
     ("min by (backend) (a / b) < 0.05", {"a", "b"})],
)
def test_metric_names_reads_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def test_alert_rules_are_well_formed() -> None:
    document = yaml.safe_load(ALERTS.read_text())
    assert set(document) == {"groups"}
    names = [group["name"] for group in document["groups"]]
    assert len(names) == len(set(names)) and all(group["rules"] for group in document["groups"])
    alerts = [rule["alert"] for rule in _rules()]
    assert len(alerts) == len(set(alerts))
    for rule in _rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule["alert"]
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", rule["alert"])
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 80  # it names the fix
        assert rule["expr"].count("(") == rule["expr"].count(")")
    wanted = {"KvgateDown", "KvgateBackendErrors", "KvgateRefusalsHigh", "KvgateQueueTimeouts",
              "KvgateGpuOvercommitted", "KvgateSilentTruncation", "KvgateVramFreeLow", "KvgateConfigReloadRefused",
              "KvgateRateLimited"}
    assert wanted <= set(alerts)


def test_prometheus_scrapes_kvgate_with_the_admin_key_and_loads_the_rules() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "kvgate"]
    assert job["metrics_path"] == "/kvgate/metrics"
    assert job["authorization"]["type"] == "Bearer" and job["authorization"]["credentials_file"]
    assert "credentials" not in job["authorization"]  # never the key itself in a file under version control
    assert job["static_configs"][0]["targets"] == ["kvgate:11435"]
    assert [Path(path).name for path in config["rule_files"]] == [ALERTS.name]


def test_dashboard_is_a_grafana_dashboard_with_the_panels_asked_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    for panel in panels:
        assert panel["targets"] and all(target["expr"] and target["refId"] for target in panel["targets"])
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
    used = set().union(*(metric_names(expr) for expr in _dashboard_exprs()))
    for metric in ("kvgate_gpu_free_bytes", "kvgate_pool_reserved_tokens", "kvgate_pool_capacity_tokens",
                   "kvgate_queue_length", "kvgate_queue_wait_seconds_total", "kvgate_decisions_total",
                   "kvgate_tenant_refusals_total", "kvgate_tenant_prompt_tokens_total",
                   "kvgate_request_duration_seconds_bucket"):
        assert metric in used


def _exported(exposition: str) -> set[str]:
    """Every series name the exposition has or would have: its samples, and each family's names by its type (a
    family with no samples yet, such as a pool gauge before any pool, still has its # TYPE line)."""
    names = {line.split("{")[0].split(" ")[0] for line in exposition.splitlines() if line and line[0] != "#"}
    suffixes = {"counter": ("_total", ""), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
                "summary": ("_sum", "_count", ""), "untyped": ("",)}
    for family, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.MULTILINE):
        base = family.removesuffix("_total") if kind == "counter" else family
        names |= {base + suffix for suffix in suffixes[kind]}
    return names


async def test_every_metric_in_alerts_and_dashboard_is_one_kvgate_exports() -> None:
    with running_redis() as redis:  # the shared ledger's metrics exist only with one
        exposition = await _exposition_with_a_shared_ledger(redis.url)
    exported = _exported(exposition)
    used = {name: source for source, exprs in (("alerts.yml", [rule["expr"] for rule in _rules()]),
                                               ("kvgate-dashboard.json", _dashboard_exprs()))
            for expr in exprs for name in metric_names(expr)}
    assert len(used) > 15
    unknown = sorted(f"{name} ({source})" for name, source in used.items()
                     if name not in exported and name not in PROMETHEUS_OWN)
    assert unknown == []


async def _exposition_with_a_shared_ledger(redis_url: str) -> str:
    shared = {"redis_url": redis_url}
    async with running(FakeLLM()) as fake, \
            running_gateway([{"name": "gpu0", "url": fake.url}, {"name": "gpu1", "url": fake.url}],
                            shared_ledger=shared) as gateway, \
            aiohttp.ClientSession() as http:
        chat = {"model": "llama3.1:8b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{gateway}/api/chat", json=chat) as response:
            assert response.status == 200
        async with http.get(f"{gateway}/kvgate/metrics") as response:
            return await response.text()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules_and_the_configuration() -> None:
    subprocess.run(["promtool", "check", "rules", str(ALERTS)], check=True, capture_output=True)
