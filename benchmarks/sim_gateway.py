"""The gateway in front of fixed replica URLs, in a process of its own (for the routing and
gateway-capacity benchmarks), and the small readers those benchmarks share.

    with GatewayProcess(urls, model="sim", policy="prefix", cpu=3) as gateway:
        gateway.url             # http://127.0.0.1:<port>, once /health answers
        gateway.pid             # for psutil's cpu_times
        gateway.cpu_s()         # its CPU seconds, worker processes included
    GatewayProcess(urls, "sim", "least_load", workers=4, worker_cpus=[0, 1, 2, 3])
        gateway.metrics()       # its /metrics as text
    with sim_fleets(spec, num_replicas=64, num_processes=4) as fleets: ...
    python benchmarks/sim_gateway.py URLS_JSON MODEL POLICY   # prints the port, serves

The gateway process takes the URLs as a static replica source (registry-style entries,
``pid`` the replica's index) and the model's ``routing`` from POLICY: a policy's name, or
a name and options, ``prefix:load_factor=100,alpha=2`` (``routing_options``; the option
``workers=N`` serves it through gateway.workers' N processes instead); it runs on
uvloop, as ``rayfleet up`` serves it, pinned to ``cpu`` when given. With ``workers``
above 1, or ``pool``, it runs gateway.workers' pool instead (the process is their
control), each worker pinned to one of ``worker_cpus``. ``max_in_flight`` sets each
gateway process's gateway.max_in_flight. ``access_log``, a path, writes the request log
there as ``rayfleet up`` writes its ``access.log`` (under gateway.workers every worker
appends to it, as there); without it the gateway keeps none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from child_server import start_server, stop_server

if TYPE_CHECKING:
    from rayfleet.gateway.line_writer import LineWriter
    from rayfleet.sim.fleet import SimFleetProcess
    from rayfleet.sim.spec import EngineSpec

ACCESS_LOG_ENV = "RAYFLEET_BENCH_ACCESS_LOG"  # the gateway process's request log, when set


class GatewayProcess:
    def __init__(
        self,
        urls: list[str],
        model: str,
        policy: str,
        cpu: int | None = None,
        *,
        workers: int = 1,
        worker_cpus: list[int] | None = None,
        pool: bool = False,
        max_in_flight: int | None = None,
        access_log: Path | None = None,
    ):
        self.urls, self.model, self.policy, self.cpu = urls, model, policy, cpu
        self.access_log = access_log
        self.max_in_flight = max_in_flight  # gateway.max_in_flight (None: the default)
        self.workers, self.worker_cpus = workers, worker_cpus or []
        self.pool = pool or workers > 1  # gateway.workers' pool, even of one worker
        self.url = ""
        self.pid = 0

    def __enter__(self) -> GatewayProcess:
        argv = [sys.executable, __file__, json.dumps(self.urls), self.model, self.policy]
        argv.append(str(self.cpu) if self.cpu is not None else "")
        argv += [str(self.workers), ",".join(map(str, self.worker_cpus)), str(int(self.pool))]
        argv.append(str(self.max_in_flight or ""))
        env = dict(os.environ)
        if self.access_log is not None:
            env[ACCESS_LOG_ENV] = str(self.access_log)
        self.proc, line = start_server(argv, "the gateway process", env)
        self.url = f"http://127.0.0.1:{int(line)}"
        self.pid = self.proc.pid
        return self

    def __exit__(self, *exc: object) -> None:
        stop_server(self.proc)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the gateway and its worker processes so far."""
        return sum(self.cpu_times())

    def cpu_times(self) -> tuple[float, float]:
        """(user, system) CPU seconds of the gateway and its worker processes so far."""
        return self._summed(_user_and_system)

    def syscalls(self) -> tuple[int, int]:
        """(read, write) system calls of the gateway and its worker processes so far (Linux's
        /proc/PID/io: read() and write() of every kind, sockets included; not epoll)."""
        reads, writes = self._summed(_reads_and_writes)
        return int(reads), int(writes)

    def _summed(self, pair: Callable[[Any], tuple[float, float]]) -> tuple[float, float]:
        """``pair`` of the gateway process and of each of its workers, added up."""
        import psutil

        main = psutil.Process(self.pid)
        first = second = 0.0
        for process in [main, *main.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                a, b = pair(process)
                first, second = first + a, second + b
        return first, second

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            return str(response.read().decode())


def _user_and_system(process: Any) -> tuple[float, float]:
    times = process.cpu_times()
    return times.user, times.system


def _reads_and_writes(process: Any) -> tuple[float, float]:
    counts = process.io_counters()
    return counts.read_count, counts.write_count


@contextlib.contextmanager
def sim_fleets(
    spec: EngineSpec, num_replicas: int, num_processes: int
) -> Iterator[list[SimFleetProcess]]:
    """``num_replicas`` simulated replicas spread over ``num_processes`` simulator
    processes (the first ones one more where they do not divide), all stopped on exit."""
    from rayfleet.sim.fleet import SimFleetProcess

    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(SimFleetProcess(spec, n))
            for n in shares(num_replicas, num_processes)
        ]


def shares(num_replicas: int, num_processes: int) -> list[int]:
    """Replicas a process, the first ones one more where they do not divide; no zeros."""
    counts = [len(range(i, num_replicas, num_processes)) for i in range(num_processes)]
    return [n for n in counts if n]


def get_json(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples whose labels include ``labels``."""
    total = 0.0
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in "{ ":
            head, _, value = line.rpartition(" ")
            if all(w in head for w in wanted):
                total += float(value)
    return total


def routing_options(policy: str) -> dict[str, Any]:
    """``"prefix:load_factor=100,alpha=2"`` -> the fields of a RoutingConfig (numbers as
    numbers); a bare name has no options."""
    name, _, options = policy.partition(":")
    fields: dict[str, Any] = {"policy": name}
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        fields[key] = _number_or_text(value)
    return fields


def without_workers(policy: str) -> tuple[str, int | None]:
    """``"prefix:workers=4,alpha=2"`` -> ``("prefix:alpha=2", 4)``; no workers: None."""
    name, _, options = policy.partition(":")
    kept, workers = [], None
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        if key == "workers":
            workers = int(value)
        else:
            kept.append(item)
    return (f"{name}:{','.join(kept)}" if kept else name), workers


def policy_list(text: str) -> list[str]:
    """'least_load,prefix:alpha=2,load_factor=0.5' -> ['least_load',
    'prefix:alpha=2,load_factor=0.5']: an item with '=' and no ':' is one more option of the
    policy before it."""
    policies: list[str] = []
    for item in text.split(","):
        if policies and "=" in item and ":" not in item:
            policies[-1] += "," + item
        else:
            policies.append(item)
    return policies


def _number_or_text(value: str) -> int | float | str | None:
    if value == "null":  # request_cost_blocks=null: the cost learned
        return None
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(value)
    return value


def _serve(
    urls: list[str],
    model: str,
    policy: str,
    workers: int,
    cpus: list[int],
    pool: bool,
    max_in_flight: int | None,
) -> None:
    import uvloop
    from loop_stalls import LoopStalls

    from rayfleet.config import RoutingConfig
    from rayfleet.gateway.app import Gateway
    from rayfleet.gateway.policies import Policies
    from rayfleet.gateway.replica_gauges import PERIOD_S
    from rayfleet.gateway.server import start_gateway

    entries = [
        {"replica_id": f"r{i}", "model": model, "url": url, "pid": i + 1}
        for i, url in enumerate(urls)
    ]

    async def source() -> list[dict[str, Any]]:
        return entries

    async def main() -> None:
        policies = Policies.plain([model])
        policies.routing = {model: RoutingConfig(**routing_options(policy))}
        policies.max_in_flight = max_in_flight
        # The replicas' /metrics read every this many seconds; 0: never.
        period = float(os.environ.get("RAYFLEET_BENCH_REPLICA_METRICS_S", PERIOD_S)) or None
        gateway = Gateway([model], source, policies=policies, replica_metrics_period_s=period)
        request_log = _open_request_log(os.environ.get(ACCESS_LOG_ENV))
        runner = await start_gateway(gateway, "127.0.0.1", 0)
        stalls_path = os.environ.get("RAYFLEET_BENCH_STALLS")  # benchmarks/loop_stalls.py
        stalls = LoopStalls.install(gateway) if stalls_path else None
        print(runner.addresses[0][1], flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        if stalls is not None:
            stalls.write(Path(f"{stalls_path}.{os.getpid()}.json"))
        await runner.cleanup()
        if request_log is not None:
            from rayfleet.gateway.access_log import close_access_log

            close_access_log(request_log)

    policy, asked = without_workers(policy)
    if asked is not None:  # "prefix:workers=4": this policy behind gateway.workers
        workers, pool = asked, True
    if not pool:
        uvloop.run(main())
    else:
        uvloop.run(_serve_workers(entries, model, policy, workers, cpus, max_in_flight))


async def _serve_workers(
    entries: list[dict[str, Any]],
    model: str,
    policy: str,
    workers: int,
    cpus: list[int],
    max_in_flight: int | None,
) -> None:
    """The same replicas behind gateway.workers' processes (rayfleet/gateway/workers.py),
    as ``rayfleet up`` runs them, each worker pinned to a core of ``cpus`` in turn."""
    from rayfleet.config import FleetConfig
    from rayfleet.gateway.app import Gateway
    from rayfleet.gateway.policies import Policies
    from rayfleet.gateway.server import listen, start_gateway
    from rayfleet.gateway.workers import WorkerPool

    held = listen("127.0.0.1", 0, reuse_port=True, accept=False)
    port = held.getsockname()[1]
    config = FleetConfig.model_validate(
        {
            "gateway": {"port": port, "workers": workers, "max_in_flight": max_in_flight},
            "models": [
                {
                    "name": model,
                    "source": "sim",
                    "engine": "sim",
                    "routing": routing_options(policy),
                }
            ],
        }
    )

    async def source() -> list[dict[str, Any]]:
        return entries

    access_log = os.environ.get(ACCESS_LOG_ENV)
    pool = WorkerPool(
        config,
        hold_s={},
        forwarded=[],
        access_log=Path(access_log) if access_log else None,
        log_requests=bool(access_log),
    )
    gateway = Gateway(
        [model],
        pool.slotted(source),
        policies=Policies.from_fleet(config),
        extra_routes=pool.internal_routes(),
    )
    runner = await start_gateway(gateway, "127.0.0.1", port, unix_path=pool.control_path, tcp=False)
    await pool.start(gateway)
    await pool.wait_listening(120)
    for n, pid in enumerate(pool.report()["pids"]):
        if cpus and pid:
            os.sched_setaffinity(pid, {cpus[n % len(cpus)]})
    print(port, flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await pool.stop()
    await runner.cleanup()
    held.close()


def _open_request_log(path: str | None) -> LineWriter | None:
    if not path:
        return None
    from rayfleet.gateway.access_log import open_access_log

    return open_access_log(Path(path))


if __name__ == "__main__":
    _urls, _model, _policy, _cpu, _workers, _worker_cpus, _pool, _max = sys.argv[1:9]
    if _cpu:
        os.sched_setaffinity(0, {int(_cpu)})
    _cpus = [int(c) for c in _worker_cpus.split(",") if c]
    _serve(
        json.loads(_urls),
        _model,
        _policy,
        int(_workers),
        _cpus,
        _pool == "1",
        int(_max) if _max else None,
    )
