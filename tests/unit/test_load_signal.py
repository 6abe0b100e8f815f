"""A replica's load from its vLLM /metrics: a text captured from a real vLLM 0.32 server.

tests/unit/data/vllm_metrics.txt is the tiny model's /metrics while it ran six
completions (tests/integration/fleet.py's serving_engine, captured once).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from rayfleet.control.load_signal import (
    EngineLoad,
    LoadUnavailable,
    fetch_load,
    parse_engine_load,
    parse_engine_stats,
    read_spread,
)

METRICS = (Path(__file__).parent / "data" / "vllm_metrics.txt").read_text()


def test_a_real_vllm_metrics_text():
    load = parse_engine_load(METRICS)
    assert load == EngineLoad(
        running=6.0, waiting=0.0, kv_cache_usage=pytest.approx(0.000733, abs=1e-6)
    )
    assert load.requests == 6.0


def test_filtering_the_lines_reads_what_the_whole_text_says():
    whole = {
        family.name: [s.value for s in family.samples]
        for family in text_string_to_metric_families(METRICS)
    }
    load = parse_engine_load(METRICS)
    assert [load.running] == whole["vllm:num_requests_running"]
    assert [load.waiting] == whole["vllm:num_requests_waiting"]
    assert [load.kv_cache_usage] == whole["vllm:kv_cache_usage_perc"]


def with_second_engine(text: str) -> str:
    """The same server with a second data-parallel engine (engine="1") beside the first."""
    extra = {
        "vllm:num_requests_running": "3.0",
        "vllm:num_requests_waiting": "5.0",
        "vllm:kv_cache_usage_perc": "0.5",
    }
    lines = []
    for line in text.splitlines():
        lines.append(line)
        name = line.split("{", 1)[0]
        if name in extra:
            lines.append(f'{name}{{engine="1",model_name="tiny"}} {extra[name]}')
    return "\n".join(lines) + "\n"


def test_engines_of_one_server_sum_their_requests_and_average_their_cache():
    load = parse_engine_load(with_second_engine(METRICS))
    assert (load.running, load.waiting) == (9.0, 5.0)
    assert load.kv_cache_usage == pytest.approx((0.000733 + 0.5) / 2, abs=1e-6)


def test_a_gauge_that_only_shares_a_prefix_is_not_counted():
    # vllm:num_requests_waiting_by_reason sits right after vllm:num_requests_waiting
    assert "vllm:num_requests_waiting_by_reason{" in METRICS
    text = METRICS.replace('reason="capacity"} 0.0', 'reason="capacity"} 7.0')
    assert parse_engine_load(text).waiting == 0.0


@pytest.mark.parametrize(
    "text, missing",
    [
        ("", "vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc"),
        (
            "\n".join(
                line for line in METRICS.splitlines() if "vllm:kv_cache_usage_perc" not in line
            ),
            "vllm:kv_cache_usage_perc",
        ),
        ("<html>not found</html>", "vllm:num_requests_running"),
    ],
)
def test_missing_gauges_are_load_unavailable(text, missing):
    with pytest.raises(LoadUnavailable, match=f"/metrics has no {missing}"):
        parse_engine_load(text)


def test_a_malformed_sample_is_load_unavailable():
    with pytest.raises(LoadUnavailable, match="unreadable /metrics text"):
        parse_engine_load('vllm:num_requests_running{engine="0"} six\n')


async def serve(handler) -> tuple[web.AppRunner, str]:
    """An HTTP server on a free port whose /metrics is ``handler``; its runner and url."""
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def answer(body: str, status: int = 200):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=body, status=status)

    return handler


def test_fetch_load_reads_metrics_of_the_server_url():
    async def main() -> EngineLoad:
        runner, url = await serve(answer(METRICS))
        try:
            async with aiohttp.ClientSession() as session:
                return await fetch_load(session, url, timeout_s=5)
        finally:
            await runner.cleanup()

    assert asyncio.run(main()).running == 6.0


def test_fetch_load_error_status_and_refused_connection_are_load_unavailable():
    async def main() -> list[str]:
        runner, url = await serve(answer("oops", status=500))
        messages = []
        try:
            async with aiohttp.ClientSession() as session:
                for target in (url, "http://127.0.0.1:1"):
                    with pytest.raises(LoadUnavailable) as err:
                        await fetch_load(session, target, timeout_s=5)
                    messages.append(str(err.value))
        finally:
            await runner.cleanup()
        return messages

    status, refused = asyncio.run(main())
    assert status.endswith("/metrics answered HTTP 500")
    assert refused.startswith("http://127.0.0.1:1/metrics: ClientConnectorError")


def test_fetch_load_times_out_as_load_unavailable():
    async def main() -> str:
        release = asyncio.Event()

        async def stuck(request: web.Request) -> web.Response:
            await release.wait()
            return web.Response(text=METRICS)

        runner, url = await serve(stuck)
        try:
            async with aiohttp.ClientSession() as session:
                with pytest.raises(LoadUnavailable) as err:
                    await fetch_load(session, url, timeout_s=0.2)
                return str(err.value)
        finally:
            release.set()
            await runner.cleanup()

    assert asyncio.run(main()).startswith("http://127.0.0.1:")


def test_the_kv_cache_size_comes_from_cache_config_info():
    assert parse_engine_stats(METRICS).kv_cache_tokens == 1_048_576  # kv_cache_size_tokens
    info = 'vllm:cache_config_info{block_size="16",engine="%d",num_gpu_blocks="%d"} 1.0\n'
    blocks_only = METRICS.replace("vllm:cache_config_info{", "ignored{") + info % (0, 100)
    assert parse_engine_stats(blocks_only).kv_cache_tokens == 1600  # num_gpu_blocks x block_size
    two_engines = blocks_only + info % (1, 50)
    assert parse_engine_stats(two_engines).kv_cache_tokens == 2400
    assert (
        parse_engine_stats(METRICS.replace("vllm:cache_config_info{", "x{")).kv_cache_tokens is None
    )


def test_the_start_time_is_the_servers_process_start_time():
    assert parse_engine_stats(METRICS).start_time == 1.79605935853e09
    unsaid = METRICS.replace("process_start_time_seconds ", "other_seconds ")
    assert parse_engine_stats(unsaid).start_time is None


def test_read_spread_starts_the_reads_over_the_time_given_and_keeps_their_order():
    async def main() -> list[tuple[int, float]]:
        loop = asyncio.get_running_loop()
        first = loop.time()

        async def read(n: int) -> tuple[int, float]:
            return n, loop.time() - first

        return await read_spread(range(4), read, over_s=0.4)

    results = asyncio.run(main())
    assert [n for n, _ in results] == [0, 1, 2, 3]
    starts = [at for _, at in results]
    # The n-th of 4 starts n/4 of the time after the first, never sooner.
    assert all(at >= n * 0.1 - 0.005 for n, at in enumerate(starts)), starts
    assert starts[0] < 0.1, starts


def test_every_sample_read_is_what_a_prometheus_parser_reads():
    whole: dict[str, float] = {}
    for family in text_string_to_metric_families(with_second_engine(METRICS)):
        for sample in family.samples:
            whole[sample.name] = whole.get(sample.name, 0.0) + sample.value
    stats = parse_engine_stats(with_second_engine(METRICS))
    assert stats.load.running == whole["vllm:num_requests_running"]
    assert stats.load.waiting == whole["vllm:num_requests_waiting"]
    assert stats.prefix_cache_hits == whole["vllm:prefix_cache_hits_total"]
    assert stats.prefix_cache_queries == whole["vllm:prefix_cache_queries_total"]
    assert stats.generation_tokens == whole["vllm:generation_tokens_total"]
    assert stats.start_time == whole["process_start_time_seconds"]


def test_labels_holding_braces_and_quotes_and_a_timestamp_are_read():
    text = (
        "# HELP vllm:num_requests_running Requests running.\n"
        'vllm:num_requests_running{note="a } and a \\" inside",engine="0"} 2.0\n'
        'vllm:num_requests_running{engine="1"} 3 1700000000000\r\n'
        'vllm:num_requests_waiting{engine="0"} +Inf\n'
        "vllm:kv_cache_usage_perc 0.25\n"
    )
    load = parse_engine_load(text)
    assert (load.running, load.waiting, load.kv_cache_usage) == (5.0, float("inf"), 0.25)
