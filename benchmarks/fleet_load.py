"""What load.py and soak.py share: a 2-replica fleet of the tiny model, mixed chat prompts,
and readings of the fleet process (where the gateway runs) from outside.

    with tiny_fleet(num_replicas=2) as fleet:          # rayfleet up ... down
        probe = ProcessProbe(fleet_pid(fleet), fleet.port)
        probe.sample()        # RSS, open fds, threads, TCP connections by kind, CPU s
        gateway_counters(fleet.url)   # the gateway's /metrics: answers by status, errors
        prompts = mixed_chat_prompts(tokenizer, 400, long_fraction=0.2, seed=0)

The fleet is elasticity.py's ``Fleet`` (``rayfleet up`` in this session, in a temporary
RAYFLEET_HOME, ``rayfleet down`` and a kill of the fleet process at the end, whatever
happens). The requests are ``rayfleet bench``'s (rayfleet/bench/client.py). The fleet
process runs the gateway, and also Ray's driver (its gRPC channels and threads), so its
RSS and its TCP connections include those; the probe splits the connections by port.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from elasticity import Fleet

from rayfleet.bench.datasets import DatasetSpec, Prompt, Tokenizer, make_prompts
from rayfleet.control.engine import free_port
from rayfleet.models import make_tiny

MODEL = "tiny"
ENGINE_ARGS = {"enforce_eager": True, "max_model_len": 1024, "dtype": "float32"}
# Mixed lengths: short chat turns and long ones (input, output tokens; each +-50% / +-25%),
# the long ones well inside max_model_len 1024 with the chat template's tokens added.
SHORT = DatasetSpec(random_input_len=32, random_output_len=16, random_range_ratio=0.5)
LONG = DatasetSpec(random_input_len=512, random_output_len=128, random_range_ratio=0.25)
CHAT_ENDPOINT = "/v1/chat/completions"


@contextlib.contextmanager
def tiny_fleet(num_replicas: int = 2) -> Iterator[Fleet]:
    """A fleet of ``num_replicas`` replicas of the tiny model, up on entry (every
    replica serving), stopped on exit."""
    model = {
        "name": MODEL,
        "source": str(make_tiny()),
        "engine_args": ENGINE_ARGS,
        "replicas": num_replicas,
    }
    fleet = start_fleet({"models": [model]})
    try:
        yield fleet
    finally:
        fleet.down()


def start_fleet(config: dict[str, Any], attempts: int = 3) -> Fleet:
    """``rayfleet up`` of ``config`` on a free port, in a new RAYFLEET_HOME (``Fleet.up``).

    The port is free when chosen but the gateway binds it after Ray has started, some 20 s
    later, and a connection made meanwhile can take it as its local port (seen once here:
    "address already in use"); then the fleet has stopped, and it is tried on another."""
    for attempt in range(attempts):
        home = Path(tempfile.mkdtemp(prefix="rayfleet-load-"))
        gateway = {**config.get("gateway", {}), "port": free_port()}
        fleet = Fleet(home, {**config, "gateway": gateway})
        started = time.perf_counter()
        try:
            fleet.up()
        except RuntimeError as exc:
            fleet.down()
            if "already in use" not in str(exc) or attempt == attempts - 1:
                raise
            print(f"gateway port taken meanwhile; again on another ({exc})", flush=True)
            continue
        print(f"fleet up in {time.perf_counter() - started:.1f}s ({home})", flush=True)
        return fleet
    raise AssertionError("unreachable")


def fleet_pid(fleet: Fleet) -> int:
    """The fleet process's pid, from its run-state file."""
    return int(json.loads((fleet.home / "run" / "fleet.json").read_text())["pid"])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def replica_urls(fleet: Fleet) -> list[str]:
    """The serving replicas' vLLM server URLs, as the gateway knows them."""
    status = get_json(fleet.url + "/rayfleet/status")
    return sorted(r["url"] for r in status["replicas"] if r["model"] == MODEL)


def mixed_chat_prompts(
    tokenizer: Tokenizer, num_prompts: int, long_fraction: float, seed: int
) -> list[Prompt]:
    """``num_prompts`` chat prompts, each long with probability ``long_fraction``, else short."""
    rng = np.random.default_rng(seed)
    is_long = rng.random(num_prompts) < long_fraction
    num_long = int(is_long.sum())
    pools = {
        kind: iter(make_prompts(replace(spec, num_prompts=max(count, 1), seed=seed + n), tokenizer))
        for n, (kind, spec, count) in enumerate(
            (("long", LONG, num_long), ("short", SHORT, num_prompts - num_long))
        )
    }
    return [next(pools["long" if long else "short"]) for long in is_long]


class ProcessProbe:
    """Readings of one process: memory, descriptors, threads, TCP connections, CPU time.

    Connections are split by kind: ``clients`` (accepted on the gateway's port),
    ``upstream`` (to a replica's port, given with ``upstream_ports``), ``other`` (Ray's)."""

    def __init__(self, pid: int, gateway_port: int, upstream_ports: Sequence[int] = ()):
        self.process = psutil.Process(pid)
        self.gateway_port = gateway_port
        self.upstream_ports = set(upstream_ports)

    def sample(self) -> dict[str, float]:
        with self.process.oneshot():
            memory = self.process.memory_info()
            cpu = self.process.cpu_times()
            num_fds = self.process.num_fds()
            num_threads = self.process.num_threads()
        connections = self.process.net_connections(kind="tcp")
        clients = upstream = other = 0
        for c in connections:
            if c.status == psutil.CONN_LISTEN:
                continue
            if c.laddr and c.laddr.port == self.gateway_port:
                clients += 1
            elif c.raddr and c.raddr.port in self.upstream_ports:
                upstream += 1
            else:
                other += 1
        return {
            "rss_mb": memory.rss / 2**20,
            "num_fds": num_fds,
            "num_threads": num_threads,
            "tcp_total": len(connections),
            "tcp_clients": clients,
            "tcp_upstream": upstream,
            "tcp_other": other,
            "cpu_s": cpu.user + cpu.system,
        }


class Sampler:
    """A thread that records ``read()`` (a reading: name -> number) every ``period_s``
    until stopped, each with ``t_s``, the seconds since the first."""

    def __init__(self, read: Callable[[], dict[str, float]], period_s: float):
        self.read = read
        self.period_s = period_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        started = time.perf_counter()
        while True:
            with contextlib.suppress(psutil.Error, OSError):
                sample = self.read()
                self.samples.append({"t_s": time.perf_counter() - started, **sample})
            if self._stop.wait(self.period_s):
                return

    def peak(self, key: str) -> float:
        return max((s[key] for s in self.samples), default=float("nan"))


def gateway_counters(url: str) -> dict[str, dict[str, float]]:
    """From the gateway's /metrics: answers by HTTP status and by replica, errors by reason,
    requests in flight (each summed over the other labels), and the loop's tasks."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    wanted = {
        "rayfleet_requests": "status",
        "rayfleet_request_errors": "reason",
        "rayfleet_inflight_requests": "",
        "rayfleet_gateway_asyncio_tasks": "",
    }
    out: dict[str, dict[str, float]] = {name: {} for name in (*wanted, "answers_by_replica")}
    for family in text_string_to_metric_families(text):
        if family.name not in wanted:
            continue
        label = wanted[family.name]
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            key = sample.labels.get(label, "all") if label else "all"
            out[family.name][key] = out[family.name].get(key, 0.0) + sample.value
            if family.name == "rayfleet_requests":
                replica = sample.labels.get("replica", "")
                by_replica = out["answers_by_replica"]
                by_replica[replica] = by_replica.get(replica, 0.0) + sample.value
    return out


def counter_delta(
    after: dict[str, dict[str, float]], before: dict[str, dict[str, float]], name: str
) -> dict[str, int]:
    """How much each label of counter ``name`` grew between two readings."""
    grown = {k: v - before[name].get(k, 0.0) for k, v in after[name].items()}
    return {k: round(v) for k, v in sorted(grown.items()) if v}


def percentile_ms(values_s: Sequence[float], q: float) -> float:
    return float(np.percentile(values_s, q) * 1e3) if len(values_s) else float("nan")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row))
    Console(width=200).print(table)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"wrote {path}", flush=True)
