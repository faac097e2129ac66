"""VictoriaMetrics single node, vmagent and vmalert (Debian's `victoria-metrics` package) run with the shipped flags.

The flags are read from deploy/victoriametrics/*.flags; only what a user must change is changed (listen addresses,
data paths, the URLs between the servers, where the target files are and how often they are scraped). The rules
file is whatever `rules` says: deploy/prometheus/rules/*.yml by default, as the shipped vmalert.flags has it.

    vm = VictoriaMetrics(scratch)
    vm.store()                                   # victoria-metrics on a free port
    vm.vmagent(targets_dir, scrape_interval="1s")  # vmagent.yml's jobs, file_sd pointed at targets_dir
    vm.vmalert(f"http://127.0.0.1:{am_port}")    # the shipped rules, notifying that Alertmanager
    vm.query("up")                               # an instant query against the store
    vm.rules()                                   # vmalert's /api/v1/rules, every rule of every group
    vm.stop()
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.support.servers import Servers
from tests.support.waiting import free_port
from tests.support.webhook import Webhook

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "victoriametrics"
VMAGENT_CONFIG = DEPLOY / "vmagent.yml"


def routing_to(webhook: Webhook, group_wait: str | None = None) -> dict[str, Any]:
    """deploy/alertmanager/alertmanager.yml with its webhook URLs pointed at `webhook` (same paths), and every
    route's group_wait set to `group_wait` when given (a test that need not wait 10 s for a page)."""
    routing: dict[str, Any] = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    for receiver in routing["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"http://127.0.0.1:{webhook.port}{urllib.parse.urlparse(hook['url']).path}"
    if group_wait is not None:
        for route in [routing["route"], *routing["route"]["routes"]]:
            route["group_wait"] = group_wait
    return routing


def shipped_flags(binary: str) -> list[tuple[str, str]]:
    """(name, value) of each flag in deploy/victoriametrics/<binary>.flags, in order ("-a=b" -> ("a", "b"))."""
    flags = []
    for line in (DEPLOY / f"{binary}.flags").read_text(encoding="utf-8").splitlines():
        word = line.split("#", 1)[0].strip()
        if word:
            name, _, value = word.lstrip("-").partition("=")
            flags.append((name, value))
    return flags


def _command(binary: str, changed: dict[str, str]) -> list[str]:
    """The shipped flags of `binary`, each of `changed` replacing its value (every one must be a shipped flag: a
    renamed flag fails here instead of silently running with two)."""
    flags = shipped_flags(binary)
    unknown = set(changed) - {name for name, _ in flags}
    if unknown:
        raise AssertionError(f"deploy/victoriametrics/{binary}.flags has no {sorted(unknown)}")
    return [f"-{name}={changed.get(name, value)}" for name, value in flags]


class VictoriaMetrics:
    """The three servers of the remote-write path, each logging to `<scratch>/<binary>.log`; stop() ends them."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.store_port = free_port()
        self.vmagent_port = free_port()
        self.vmalert_port = free_port()
        self._servers = Servers(scratch)

    @property
    def store_url(self) -> str:
        return f"http://127.0.0.1:{self.store_port}"

    def _start(self, binary: str, port: int, command: list[str], ready_within: float = 60) -> None:
        # From the repository root: the shipped flags name deploy/ paths relative to it.
        self._servers.run(binary, command, f"http://127.0.0.1:{port}/health", ready_within, every=0.2, cwd=ROOT)

    def store(self) -> None:
        """victoria-metrics with the shipped flags, its data in the scratch directory."""
        changed = {"httpListenAddr": f"127.0.0.1:{self.store_port}", "storageDataPath": str(self.scratch / "vm-data")}
        self._start("victoria-metrics", self.store_port, _command("victoria-metrics", changed))

    def vmagent(self, targets: Path, scrape_interval: str | None = None, config: Path = VMAGENT_CONFIG) -> None:
        """vmagent with the shipped flags, scraping `config`'s `mindspore` job (its file_sd files moved into
        `targets`, every `scrape_interval` if given, else as `config` says) and writing to the store."""
        scrape = yaml.safe_load(config.read_text(encoding="utf-8"))
        if scrape_interval is not None:
            scrape["global"]["scrape_interval"] = scrape_interval
        scrape["scrape_configs"] = [job for job in scrape["scrape_configs"] if job["job_name"] == "mindspore"]
        scrape["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(targets / "ms-exporter-*.json")]
        (self.scratch / "vmagent.yml").write_text(yaml.safe_dump(scrape), encoding="utf-8")
        changed = {
            "httpListenAddr": f"127.0.0.1:{self.vmagent_port}",
            "promscrape.config": str(self.scratch / "vmagent.yml"),
            "remoteWrite.url": f"{self.store_url}/api/v1/write",
            "remoteWrite.tmpDataPath": str(self.scratch / "vmagent-remotewrite-data"),
        }
        self._start("vmagent", self.vmagent_port, _command("vmagent", changed))

    def vmalert(self, alertmanager_url: str, rules: str | None = None) -> None:
        """vmalert with the shipped flags (the shipped rules unless `rules` names other files), reading from and
        writing to the store, notifying `alertmanager_url`."""
        changed = {
            "httpListenAddr": f"127.0.0.1:{self.vmalert_port}",
            "datasource.url": self.store_url,
            "remoteWrite.url": self.store_url,
            "remoteRead.url": self.store_url,
            "notifier.url": alertmanager_url,
            **({"rule": rules} if rules is not None else {}),
        }
        self._start("vmalert", self.vmalert_port, _command("vmalert", changed))

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result of an instant query against the store, as a list."""
        url = f"{self.store_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        result = body["data"]["result"]
        return result if isinstance(result, list) else [result]

    def rules(self) -> list[dict[str, Any]]:
        """Every rule vmalert loaded (its /api/v1/rules, the groups flattened), each with its `group` name."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.vmalert_port}/api/v1/rules", timeout=10) as response:
            body = json.loads(response.read())
        return [{**rule, "group": group["name"]} for group in body["data"]["groups"] for rule in group["rules"]]

    def stop(self) -> None:
        self._servers.stop()
