"""The dashboard page in a real headless Chromium, fed by a real monitoring server scraping real memcached."""

from __future__ import annotations

import json
import shutil
import socket
import time
import urllib.request
from pathlib import Path

import router_config
from ops.harness import MonitoringServer, free_port, wait_until
from tests.binaries import needs_binary
from tests.monitoring.browser import chromium

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local.toml"

pytestmark = needs_binary(shutil.which("chromedriver") is not None, "chromium-driver not installed")


def _load(address: tuple[str, int], seconds: float) -> None:
    """Some gets (half hits) so the hit-rate panel has data."""
    end = time.monotonic() + seconds
    with socket.create_connection(address) as s:
        s.sendall(b"set present 0 0 1\r\nx\r\n")
        s.recv(100)
        while time.monotonic() < end:
            s.sendall(b"get present\r\nget absent\r\n")
            s.recv(1000)
            time.sleep(0.01)


def test_dashboard_renders_live_charts(tmp_path, memcached_factory):
    from selenium.webdriver.support.ui import WebDriverWait

    cache = memcached_factory()
    state = tmp_path / "state"
    state.mkdir()
    (state / "components.json").write_text(
        json.dumps(
            {
                "topology": "x",
                "components": [
                    {
                        "role": "memcached",
                        "region": "east",
                        "cluster": "east-a",
                        "pool": "wildcard",
                        "pid": cache.pid,
                        "address": cache.address,
                        "log": "",
                        "cmdline": [],
                        "metrics": None,
                    }
                ],
            }
        )
    )
    topo = router_config.reassign_ports(router_config.load(EXAMPLE), free_port)
    topo_file = tmp_path / "topo.toml"
    topo_file.write_text(router_config.dumps(topo))
    monitor = MonitoringServer(topo_file, state, workdir=tmp_path / "monitoring", extra_args=("--no-prober",))
    with monitor:
        _load((cache.host, cache.port), 4.0)
        driver = chromium(tmp_path / "chrome")
        try:
            driver.get(f"http://{monitor.address}/")

            def hit_rate_panel_has_points(d):
                return d.execute_script(
                    "return [...document.querySelectorAll('.panel')].filter(p => "
                    "p.querySelector('h2').textContent.includes('hit rate') && +p.dataset.points > 0).length"
                )

            # record the axis labels each canvas draws (canvas text is not in the DOM), then wait for a redraw
            driver.execute_script(
                "window.axisLabels = new Map();"
                "const fill = CanvasRenderingContext2D.prototype.fillText;"
                "CanvasRenderingContext2D.prototype.fillText = function (text, ...rest) {"
                "  const c = this.canvas, seen = window.axisLabels.get(c) || new Set();"
                "  seen.add(String(text)); window.axisLabels.set(c, seen); return fill.call(this, text, ...rest); };"
            )
            WebDriverWait(driver, 20).until(hit_rate_panel_has_points)

            def hit_rate_axis(d):
                return d.execute_script(
                    "const p = [...document.querySelectorAll('.panel')].find(p => "
                    "p.querySelector('h2').textContent.includes('hit rate'));"
                    "const seen = window.axisLabels.get(p.querySelector('canvas'));"
                    "return seen ? [...seen].filter(t => t.endsWith('%')) : null"
                )

            percents = WebDriverWait(driver, 20).until(hit_rate_axis)
            # a ratio's axis ends at 100 % (it ran to 108 %: the headroom other panels get)
            assert max(int(t.rstrip("%")) for t in percents) == 100, percents
            assert "live" in driver.find_element("id", "status").text
            legend = driver.execute_script(
                "return [...document.querySelectorAll('.panel')].find(p => "
                "p.querySelector('h2').textContent.includes('hit rate')).querySelector('.legend').textContent"
            )
            assert "east-a: 50%" in legend
            shot = Path(__file__).resolve().parents[2] / "reports" / "dashboard-test.png"
            shot.parent.mkdir(exist_ok=True)
            driver.save_screenshot(str(shot))
            assert shot.stat().st_size > 10_000
        finally:
            driver.quit()


def test_dashboard_shows_who_owns_each_shard_of_a_pooled_region(tmp_path, two_worker_deployment):
    """The deployment's own monitoring server (`squealctl up` of a topology whose east has two workers): the worker
    that owns east's shard and the one owning nothing, as the workers' /healthz say; west (a single daemon) has no
    pool to show."""
    from selenium.webdriver.support.ui import WebDriverWait

    rows = two_worker_deployment.status()
    workers = [r for r in rows.values() if r.get("state") == "worker" and r["region"] == "east"]
    owner = next(r["instance"] for r in workers if r.get("owns"))
    idle = next(r["instance"] for r in workers if not r.get("owns"))
    (shard,) = next(r["owns"] for r in workers if r.get("owns"))
    address = rows["monitoring"]["address"]
    with urllib.request.urlopen(f"http://{address}/api/owners", timeout=5) as resp:
        api = json.loads(resp.read())
    assert [r["region"] for r in api] in ([], ["east"])  # [] until its first poll

    driver = chromium(tmp_path / "chrome")
    try:
        driver.get(f"http://{address}/")
        row = "document.querySelector('#owners tr[data-region=east]')"
        WebDriverWait(driver, 20).until(lambda d: d.execute_script(f"return {row} !== null"))
        shown = driver.execute_script(
            f"const r = {row}; return [r.querySelector('.owners').textContent, r.querySelector('.idle').textContent]"
        )
        assert shown == [f"{shard} → {owner}", idle], shown
        assert driver.execute_script("return document.querySelector('#owners tr[data-region=west]')") is None
    finally:
        driver.quit()
    with urllib.request.urlopen(f"http://{address}/api/owners", timeout=5) as resp:
        (east,) = json.loads(resp.read())
    assert (east["owners"], east["idle"], east["unowned"]) == ({shard: owner}, [idle], [])


def test_dashboard_shows_each_links_tls_state(tmp_path, two_worker_deployment):
    """The links table (monitoring/links.py): a plaintext deployment's every link is PLAINTEXT, one row per
    server, as /api/links says (the TLS deployment's links are checked in tests/ops/test_tls_deployment.py)."""
    from selenium.webdriver.support.ui import WebDriverWait

    address = two_worker_deployment.status()["monitoring"]["address"]

    def links() -> list[dict]:
        with urllib.request.urlopen(f"http://{address}/api/links", timeout=5) as resp:
            return json.loads(resp.read())

    found = wait_until(links, 30, "the monitoring server's first round of link checks")
    assert found and all(link["tls"] is False and link["detail"].startswith("plaintext") for link in found), found
    routers = {str(a) for c in two_worker_deployment.topo.clusters for a in c.routers}
    assert routers <= {link["address"] for link in found if link["server"].startswith("router ")}

    driver = chromium(tmp_path / "chrome")
    try:
        driver.get(f"http://{address}/")
        rows = "[...document.querySelectorAll('#links tr[data-server]')]"
        WebDriverWait(driver, 20).until(lambda d: d.execute_script(f"return {rows}.length") == len(found))
        states = driver.execute_script(f"return {rows}.map(r => r.querySelector('.state').textContent)")
        assert set(states) == {"PLAINTEXT"}, states
        summary = driver.execute_script("return document.querySelector('#links summary').textContent")
        assert summary == f"links: 0 of {len(found)} over TLS", summary
    finally:
        driver.quit()
