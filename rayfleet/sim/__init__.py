"""``rayfleet sim``: a simulated vLLM engine, many replicas to a process.

- ``spec``: ``EngineSpec``, the latency model ``a + b * prefill_tokens + c * decode_seqs``
  per step, batch limits and KV capacity; read from and written to JSON.
- ``tokens``: the simulator's tokenizer (4 characters a token), chat rendering and
  chained block hashes.
- ``cache``: ``KVCache``, blocks with a prefix cache and LRU eviction.
- ``engine``: ``Engine``, continuous batching stepped in real time on the event loop.
- ``stats``, ``metrics``: counters, and ``/metrics`` with vLLM's metric names.
- ``server``: ``Replica``, one OpenAI-compatible aiohttp app over one engine.
- ``fleet``: ``SimFleet`` (thread), ``SimFleetProcess`` and ``run_fleet`` (the CLI).
- ``calibrate``: fit a, b, c against a real vLLM server.
- ``command``: the ``rayfleet sim`` typer app (``serve``, ``calibrate``).

Data flow: HTTP request -> ``server`` (text to tokens and block hashes) -> ``engine``
(cache match at admission, steps) -> per-request event queue -> SSE chunks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayfleet.sim.fleet import SimFleet, SimFleetProcess
    from rayfleet.sim.spec import EngineSpec

__all__ = ["EngineSpec", "SimFleet", "SimFleetProcess"]


def __getattr__(name: str) -> Any:
    # Lazy, so ``rayfleet --help`` does not import aiohttp through this package.
    if name == "EngineSpec":
        from rayfleet.sim.spec import EngineSpec

        return EngineSpec
    if name in ("SimFleet", "SimFleetProcess"):
        from rayfleet.sim import fleet

        return getattr(fleet, name)
    raise AttributeError(name)
