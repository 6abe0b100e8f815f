"""One attempt to serve a request from one upstream, and all of its accounting.

``Attempts.run(journey, upstream, target, body, headers, limits)`` is the one wrapper
around any ``Upstream`` (upstream.py): it counts the request in flight on the replica
and in metrics, opens the exchange, relays the answer, and records time to first byte,
latency and status, and success or failure against the replica (``ReplicaSet.failed``
takes it out of rotation after N failures in a row). It returns the response, or
``Unanswered`` when the upstream failed before a byte of the response went to the client
(the caller may try elsewhere): no connection, a 5xx, or a body that is not streamed and
broke off before its end (the relay sends such a body only whole). A timeout before that
is a 408 of the gateway's own, counted against the replica when the limit was the
gateway's own (not a priority class's tighter one): a replica that accepts requests and
never answers is then passed over. A response cut off after the first byte ends with an
error event (a stream) and is never replayed.

A response that ended whole is read for its usage once the relay has it all, when the
access log or the model's replica policy wants it: the prompt, cached and completion
tokens of ``usage`` are found once in the end of the body (``Exchange.end``: a whole body,
or a stream's usage chunk before ``[DONE]``) by a byte search, and handed to both; the
policy also gets the ``RequestInfo`` it placed the request with (``Target.request``) and,
when it asks, the answer's text from the body the exchange kept (policy_feedback.py). The
relay itself pays one attribute write per piece for this; a request nothing wants it
for, nothing more.

When the client goes away, its handler is cancelled (front.py; aiohttp's
``handler_cancellation`` for a connection aiohttp serves): the
exchange is finished uncompleted, which closes the upstream connection whatever ``run``
was waiting for (the head, the first piece, a whole body, a paused stream), and vLLM
aborts the request. A client that leaves after a stream's ``data: [DONE]`` (the openai
client closes there, often before the response's last chunk) had its answer whole: it is
counted as answered (status, latency, the replica's success, usage), not as a disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.hdrs import CONTENT_TYPE

from rayfleet.gateway.access_log import note_answer, note_delivered, wants_usage
from rayfleet.gateway.admission import Admission
from rayfleet.gateway.errors import (
    GATEWAY_REPLICA,
    REPLICA_HEADER,
    RequestError,
    sse_error_event,
)
from rayfleet.gateway.metrics import GatewayMetrics
from rayfleet.gateway.policy_feedback import PolicyFeedback
from rayfleet.gateway.replica_policy import RequestInfo
from rayfleet.gateway.replicas import Replica, ReplicaSet
from rayfleet.gateway.response_end import Usage, delivered_whole, event_boundary
from rayfleet.gateway.upstream import (
    Exchange,
    Outcome,
    TimeLimits,
    Upstream,
    UpstreamConnectError,
)

log = logging.getLogger("rayfleet.gateway")

CLIENT_CLOSED = 499  # the status access logs show for a client that left (nginx's usage)


@dataclass(frozen=True)
class Unanswered:
    """An attempt that failed before the first byte of a response: try elsewhere."""

    reason: str  # upstream_connect, upstream_status, or stream_broken (a whole body's)


Attempt = web.StreamResponse | Unanswered


@dataclass(frozen=True)
class Journey:
    """One admitted request, as every attempt to serve it needs it."""

    request: web.Request
    path: str
    raw: bytes
    admission: Admission
    started: float  # time.perf_counter() when the request came in
    extra: Mapping[str, str]  # headers every response to it carries


@dataclass(frozen=True)
class Target:
    """Where one attempt goes, and the names it is counted under."""

    url: str
    label: str  # x-rayfleet-replica: the replica id or fallback:<provider>
    model: str  # the model label of the metrics
    replica: Replica | None = None
    request: RequestInfo | None = None  # what the replica's policy was given to pick it


class Attempts:
    def __init__(
        self,
        replica_set: ReplicaSet,
        metrics: GatewayMetrics,
        replica_policies: Mapping[str, object] | None = None,
    ):
        self.replica_set = replica_set
        self.metrics = metrics
        self.feedback = PolicyFeedback(replica_policies if replica_policies is not None else {})

    def refuse(self, error: RequestError, model: str) -> web.Response:
        """Answer with ``error`` from the gateway itself, counted."""
        self.metrics.errors.labels(model, error.reason).inc()
        self.metrics.requests.labels(model, GATEWAY_REPLICA, str(error.status)).inc()
        return error.response()

    async def run(
        self,
        journey: Journey,
        upstream: Upstream,
        target: Target,
        body: bytes,
        headers: Mapping[str, str],
        limits: TimeLimits,
    ) -> Attempt:
        """Send the request to ``target`` and relay the answer; ``Unanswered`` when it
        failed before the response's first byte."""
        inflight = self.metrics.series(target.model, target.label).inflight
        if target.replica is not None:
            self.replica_set.begin(target.replica)
        inflight.inc()
        exchange: Exchange | None = None
        completed = False
        try:
            try:
                exchange = await upstream.open(target.url, body, headers, limits)
            except TimeoutError:
                return self._no_answer_in_time(journey, target, limits)
            except UpstreamConnectError as exc:
                log.warning("%s unreachable: %r", target.label, exc)
                return self._unanswered(target, "upstream_connect")
            if exchange.status >= 500:
                log.warning("%s answered %s", target.label, exchange.status)
                return self._unanswered(target, "upstream_status")
            response = _response_like(exchange, target.label, journey.extra)
            self.feedback.prepare(target.model, target.request, exchange)
            outcome = await exchange.relay(journey.request, response)
            if outcome is Outcome.BROKEN and not response.prepared:
                return self._unanswered(target, "stream_broken")  # nothing went out yet
            completed = outcome is Outcome.DONE
            if outcome is Outcome.CLIENT_GONE and delivered_whole(exchange):
                outcome = Outcome.DONE  # the client had it all: [DONE], then it closed
            self._observe_ttfb(journey, target, exchange)
            usage = self._usage(journey, target, exchange) if outcome is Outcome.DONE else None
            note_answer(journey.request, exchange, journey.started, usage)
            return await self._conclude(journey, target, exchange, response, outcome, limits, usage)
        except asyncio.CancelledError:
            # The client went away: closing the upstream connection makes vLLM abort.
            # The openai client closes at a stream's [DONE], which may come before the
            # end of the response: that client had its answer whole.
            if exchange is not None and delivered_whole(exchange):
                self._observe_ttfb(journey, target, exchange)
                usage = self._usage(journey, target, exchange)
                note_answer(journey.request, exchange, journey.started, usage)
                note_delivered(journey.request, exchange.status, target.label)
                self._answered(journey, target, exchange, usage)
            else:
                self.metrics.errors.labels(target.model, "client_disconnect").inc()
            raise
        except ConnectionResetError:
            return self._client_gone(target.model, web.Response(status=CLIENT_CLOSED))
        finally:
            if target.replica is not None:
                self.replica_set.end(target.replica)
            inflight.dec()
            if exchange is not None:
                exchange.finish(completed)

    async def _conclude(
        self,
        journey: Journey,
        target: Target,
        exchange: Exchange,
        response: web.StreamResponse,
        outcome: Outcome,
        limits: TimeLimits,
        usage: Usage | None,
    ) -> web.StreamResponse:
        """Account for how the relay ended and end the response to the client."""
        if outcome is Outcome.CLIENT_GONE:
            return self._client_gone(target.model, response)
        if outcome is not Outcome.DONE:
            # Unprepared here means a time limit before anything was sent: a break then
            # was already handed back to ``run``'s caller as Unanswered, to try elsewhere.
            if not response.prepared:
                return self._no_answer_in_time(journey, target, limits)
            await self._end_cut_off(response, outcome, exchange.tail(), target, journey, limits)
        try:
            await response.write_eof()
        except ConnectionResetError:  # the client left just before the end
            if not delivered_whole(exchange):
                return self._client_gone(target.model, response)
        if outcome is Outcome.DONE:
            self._answered(journey, target, exchange, usage)
        else:
            self._counted(target, exchange, journey.started)
        return response

    def _observe_ttfb(self, journey: Journey, target: Target, exchange: Exchange) -> None:
        if exchange.first_byte_at:
            self.metrics.series(target.model, target.label).ttfb.observe(
                exchange.first_byte_at - journey.started
            )

    def _answered(
        self, journey: Journey, target: Target, exchange: Exchange, usage: Usage | None
    ) -> None:
        """Account for a response the client had whole: its replica did its job."""
        self._counted(target, exchange, journey.started)
        if target.replica is not None:
            self.replica_set.succeeded(target.replica)
            self.feedback.report(target.model, target.replica, target.request, exchange, usage)

    def _counted(self, target: Target, exchange: Exchange, started: float) -> None:
        elapsed = time.perf_counter() - started
        series = self.metrics.series(target.model, target.label)
        series.latency.observe(elapsed)
        series.answered(exchange.status)

    def _client_gone(self, model: str, response: web.StreamResponse) -> web.StreamResponse:
        """Count a client that went away; what is returned goes nowhere, and aiohttp ends
        it quietly (closing the upstream connection has already made vLLM abort)."""
        self.metrics.errors.labels(model, "client_disconnect").inc()
        return response

    def _usage(self, journey: Journey, target: Target, exchange: Exchange) -> Usage | None:
        """The usage of a response that ended whole, read once for the access log and the
        policy that placed the request, when either wants it."""
        return self.feedback.usage(target.model, exchange, also=wants_usage(journey.request))

    async def _end_cut_off(
        self,
        response: web.StreamResponse,
        outcome: Outcome,
        tail: bytes | None,
        target: Target,
        journey: Journey,
        limits: TimeLimits,
    ) -> None:
        """Account for a response cut off by a timeout or a broken upstream; a stream
        (``tail`` not None) gets an error event of its own to end with."""
        if outcome is Outcome.TIMEOUT:
            error = self.timed_out(journey.admission, limits)
            self.metrics.errors.labels(target.model, error.reason).inc()
            event = sse_error_event(error.message, "timeout", 408)
        else:
            self._replica_failed(target, "stream_broken")
            event = sse_error_event(f"{target.label} failed mid-stream; the response is incomplete")
        if tail is not None:
            await response.write(event_boundary(tail) + event)

    @staticmethod
    def timed_out(admission: Admission, limits: TimeLimits) -> RequestError:
        priority_class = admission.priority_class
        limit = f" of priority class '{priority_class.name}'" if priority_class else ""
        if limits.idle_s and priority_class and priority_class.stream_idle_timeout_s:
            detail = f"{limits.total_s:g} s total, {limits.idle_s:g} s without output"
        else:
            detail = f"{limits.total_s:g} s"
        return RequestError(
            408,
            f"The request exceeded the time limit{limit} ({detail}); "
            "the upstream request was aborted.",
            code="timeout",
            reason="timeout",
        )

    def _unanswered(self, target: Target, reason: str) -> Unanswered:
        self._replica_failed(target, reason)
        return Unanswered(reason)

    def _no_answer_in_time(
        self, journey: Journey, target: Target, limits: TimeLimits
    ) -> web.Response:
        """A 408 for a response that did not come within the time limit. Under the
        gateway's own limit (no priority class narrowed it) it counts against the
        replica, so one that accepts requests and never answers is passed over by the
        next ones; a class's tighter limit says nothing about the replica."""
        if not narrowed_by_class(journey.admission):
            self._count_failure(target)
        return self.refuse(self.timed_out(journey.admission, limits), target.model)

    def _replica_failed(self, target: Target, reason: str) -> None:
        self.metrics.errors.labels(target.model, reason).inc()
        self._count_failure(target)

    def _count_failure(self, target: Target) -> None:
        replica = target.replica
        if replica is not None and self.replica_set.failed(replica):
            self.metrics.cooldowns.labels(replica.model, replica.replica_id).inc()


def _response_like(exchange: Exchange, label: str, extra: Mapping[str, str]) -> web.StreamResponse:
    """The response to the client, with the upstream's status and type and our headers."""
    response = web.StreamResponse(status=exchange.status)
    headers = response.headers
    # The header as aiohttp's content_type and charset setters write it, at a fifth of
    # their cost (they parse the header back each time).
    kind, charset = exchange.content_type, exchange.charset
    headers[CONTENT_TYPE] = f"{kind}; charset={charset}" if charset else kind
    headers[REPLICA_HEADER] = label
    if extra:
        headers.update(extra)
    return response


def narrowed_by_class(admission: Admission) -> bool:
    """Whether the request's priority class sets time limits of its own."""
    priority_class = admission.priority_class
    return priority_class is not None and (
        priority_class.timeout_s is not None or priority_class.stream_idle_timeout_s is not None
    )
