"""/metrics: the record's figures as Prometheus reads them (equal to the database's), who may scrape,
and a real scrape by Debian's Prometheus queried back over its HTTP API."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest
from django.db.models import Count, Sum
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from routing import engine
from routing.models import Attempt, Run, Task
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def two_runs(live_pool):
    """Two runs by the engine: alpha answers a 429 then succeeds, beta (the same vendor) succeeds."""
    server = live_pool["server"]
    for text in ("first", "second"):
        server.program("conductor", [Reply(plan_json(("alpha", "One", []), ("beta", "Two", [0])))])
        server.program(
            "alpha", [Reply(status=429, headers={"Retry-After": "0"}), Reply("a", prompt_tokens=100)]
        )
        server.program("beta", [Reply("b", prompt_tokens=300, completion_tokens=20, delay_s=0.3)])
        task, _ = task_submit(submission=TaskSubmission(text=text), source=Task.Source.API)
        engine.execute_run(task.runs.get().pk)
    return live_pool


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_the_metrics_equal_the_record(client: Client, two_runs):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    found = families(response.content.decode())

    calls = {
        (s.labels["worker"], s.labels["vendor"], s.labels["status"]): s.value
        for s in found["conductor_attempts"]
        if s.name == "conductor_attempts_total"
    }
    expected = {
        (r["step__worker_slug"], r["step__vendor"], r["status"]): r["n"]
        for r in Attempt.objects.values("step__worker_slug", "step__vendor", "status").annotate(n=Count("pk"))
    }
    assert calls == expected
    assert calls[("alpha", "acme", "rate_limited")] == 2 and calls[("beta", "acme", "succeeded")] == 2

    spend = {(s.labels["worker"], s.labels["vendor"]): s.value for s in found["conductor_spend_usd"]}
    for worker in ("alpha", "beta"):
        usd = Attempt.objects.filter(step__worker_slug=worker).aggregate(c=Sum("cost_usd"))["c"]
        assert Decimal(str(spend[(worker, "acme")])).quantize(Decimal("0.00000001")) == usd.quantize(
            Decimal("0.00000001")
        )

    latency = [s for s in found["conductor_attempt_latency_seconds"] if s.labels["worker"] == "beta"]
    buckets = {s.labels["le"]: s.value for s in latency if s.name.endswith("_bucket")}
    count = next(s.value for s in latency if s.name.endswith("_count"))
    assert count == buckets["+Inf"] == Attempt.objects.filter(step__worker_slug="beta").count() == 2
    assert buckets["0.25"] == 0 and buckets["1.0"] == 2  # beta answers after 0.3 s
    values = [buckets[k] for k in sorted(buckets, key=lambda k: float(k))]
    assert values == sorted(values)

    runs = {
        (s.labels["status"], s.labels["conductor_version"], s.labels["kind"]): s.value
        for s in found["conductor_runs"]
    }
    assert runs == {("succeeded", "llm-test", "live"): Run.objects.filter(status="succeeded").count()}
    plans = {
        (s.labels["version"], s.labels["valid"]): s.value
        for s in found["conductor_plans"]
        if s.name.endswith("_total")
    }
    assert plans == {("llm-test", "true"): 2}
    assert {s.labels["queue"] for s in found["conductor_queue_depth"]} >= {"runs", "resume"}
    # django-prometheus' request metrics of this process are served beside them
    assert "django_http_requests_before_middlewares" in found


def test_only_loopback_or_the_token_may_scrape(client: Client, settings, db):
    assert client.get("/metrics").status_code == 200  # the test client is 127.0.0.1
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403
    settings.METRICS_TOKEN = "s3cret-token"
    refused = client.get("/metrics", REMOTE_ADDR="10.1.2.3")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401  # loopback too
    ok = client.get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert ok.status_code == 200 and b"conductor_runs" in ok.content
    assert client.post("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 405


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.slow
def test_prometheus_scrapes_the_app_and_its_series_add_up(live_server, two_runs, settings, tmp_path):
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    assert shutil.which(binary), "Prometheus is not installed: make prometheus (apt-get install prometheus)"
    settings.METRICS_TOKEN = "scrape-token"
    target = urllib.parse.urlparse(live_server.url).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: conductor\n"
        "    authorization: {type: Bearer, credentials: scrape-token}\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        calls = Attempt.objects.count()
        deadline = time.monotonic() + 60
        up: list[dict] = []
        total: list[dict] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                up = query(base, 'up{job="conductor"}')
                total = query(base, "sum(conductor_attempts_total)")
                if up and up[0]["value"][1] == "1" and total and float(total[0]["value"][1]) == calls:
                    break
            time.sleep(0.5)
        else:
            raise AssertionError(
                f"no scrape with {calls} calls in 60 s: up={up if 'up' in dir() else None} sum={total}"
            )
        by_status = {
            r["metric"]["status"]: float(r["value"][1])
            for r in query(base, "sum by (status) (conductor_attempts_total)")
        }
        assert by_status == {"rate_limited": 2.0, "succeeded": 4.0}
        spend = float(query(base, "sum(conductor_spend_usd_total)")[0]["value"][1])
        assert spend == pytest.approx(float(Attempt.objects.aggregate(c=Sum("cost_usd"))["c"]), rel=1e-9)
        p = query(
            base,
            'histogram_quantile(0.5, sum by (le) (conductor_attempt_latency_seconds_bucket{worker="beta"}))',
        )
        assert 0.25 < float(p[0]["value"][1]) <= 1.0  # beta answers after 0.3 s
        # Every panel of the Grafana dashboard is a query Prometheus accepts (query() asserts success).
        dashboard = json.loads((ROOT / "deploy" / "grafana" / "conductor-web.json").read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                assert query(base, target["expr"]) is not None, panel["title"]
        assert (
            query(base, "conductor_runs")
            and query(base, "conductor_audit_checkpoint_age_seconds") is not None
        )
        assert query(base, 'django_http_requests_total_by_view_transport_method_total{view="metrics"}')
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
def test_the_alert_rules_pass_promtool():
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    done = subprocess.run(
        [promtool, "check", "rules", str(ROOT / "deploy" / "prometheus" / "alerts.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 rules found" in done.stdout
