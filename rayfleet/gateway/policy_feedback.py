"""What a replica policy learns from the responses to the requests it placed.

    feedback = PolicyFeedback(replica_policies)         # model -> policy, as dispatched
    feedback.prepare(model, request, exchange)          # before the relay
    usage = feedback.usage(model, exchange, also=...)   # a response that ended whole
    feedback.report(model, replica, request, exchange, usage)

A policy asks by having the optional hooks of replica_policy.py: ``observe_usage`` gets
the usage of every response to a request it placed (with the ``RequestInfo`` its pick
was given), and, when its ``wants_answer(request)`` says so, the answer's text too. The
usage is found once at the end of the body (response_end.py's ``usage_tokens``) for the
policy and for whoever else wants it (``also``: the access log), and the text from the
body the exchange kept (``answer_text``): a stream's first ``MAX_KEPT_BYTES`` at most, so
that a long stream holds no more memory than that (about 7,000 tokens of vLLM's chat
chunks; the index then learns the answer's beginning, and its room for the rest). A
policy with neither hook costs a lookup.
"""

from __future__ import annotations

from collections.abc import Mapping

from rayfleet.gateway.replica_policy import AnswerWanted, RequestInfo, UsageObserver
from rayfleet.gateway.replicas import Replica
from rayfleet.gateway.response_end import Usage, answer_text, usage_tokens
from rayfleet.gateway.upstream import Exchange

MAX_KEPT_BYTES = 1 << 20


class PolicyFeedback:
    def __init__(self, policies: Mapping[str, object]):
        self.policies = policies  # replaced whole when the fleet is reconfigured

    def observer(self, model: str) -> UsageObserver | None:
        """The ``observe_usage`` of ``model``'s policy, when it has one."""
        observe: UsageObserver | None = getattr(self.policies.get(model), "observe_usage", None)
        return observe

    def wants_answer(self, model: str, request: RequestInfo | None) -> bool:
        """Whether ``model``'s policy asks for the answer's text of ``request``."""
        wants: AnswerWanted | None = getattr(self.policies.get(model), "wants_answer", None)
        return wants is not None and request is not None and wants(request)

    def prepare(self, model: str, request: RequestInfo | None, exchange: Exchange) -> None:
        """Before the relay: have ``exchange`` keep the body when the answer's text is
        wanted."""
        if self.wants_answer(model, request):
            exchange.keep_body(MAX_KEPT_BYTES)

    def usage(self, model: str, exchange: Exchange, also: bool = False) -> Usage | None:
        """The usage at the end of a response that ended whole, when ``model``'s policy
        observes usage or ``also`` another reader wants it; else None, unread."""
        if also or self.observer(model) is not None:
            return usage_tokens(exchange.end())
        return None

    def report(
        self,
        model: str,
        replica: Replica,
        request: RequestInfo | None,
        exchange: Exchange,
        usage: Usage | None,
    ) -> None:
        """Tell ``model``'s policy what ``replica`` did with ``request``: its usage, and
        the answer's text when the policy asked for it (the body was kept)."""
        observe = self.observer(model)
        if observe is None or usage is None or request is None:
            return
        answer = None
        if self.wants_answer(model, request):
            streamed = exchange.content_type == "text/event-stream"
            chat = request.path.endswith("/chat/completions")
            answer = answer_text(exchange.body(), streamed, chat)
        observe(replica, request, *usage, answer)
