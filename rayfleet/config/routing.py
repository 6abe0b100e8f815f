"""How the gateway picks a replica of one model: ``models[].routing`` in fleet.yaml.

    routing:
      policy: prefix            # least_load (default) | round_robin | prefix | session
      block_chars: 64           # prefix: characters per hashed block (about one KV block)
      alpha: 1.0                # prefix: weight of a block to prefill against queued work
      index_blocks: 16384       # prefix: blocks remembered per replica (LRU)
      max_inflight: 64          # prefix: replicas with this many in flight are skipped
      request_cost_blocks: 2    # prefix: one in-flight request's weight, in blocks (null: learned)
      chars_per_token: null     # prefix: sizes the index from the KV cache (null: learned)
      answer_text: true         # prefix: read each answer's text into the index
      session_header: x-session-id   # session: the header that names a conversation
      load_factor: 1.0          # session, prefix: a replica over (1 + load_factor) x mean
                                # load in flight passes the request on (0.25, 0.5 by default)

Options apply to one policy each; giving one that the chosen policy does not read a value
other than its default is an error naming both, so that a typo in ``policy`` does not
silently drop the options.
The gateway builds the policy from this (rayfleet/gateway/routing.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rayfleet.config.base import StrictModel

RoutingPolicyName = Literal["least_load", "round_robin", "prefix", "session"]

# Which policies read each option; every other option applies to all.
_OPTION_POLICIES: dict[str, tuple[RoutingPolicyName, ...]] = {
    "block_chars": ("prefix",),
    "alpha": ("prefix",),
    "index_blocks": ("prefix",),
    "max_inflight": ("prefix",),
    "request_cost_blocks": ("prefix",),
    "chars_per_token": ("prefix",),
    "answer_text": ("prefix",),
    "session_header": ("session",),
    "load_factor": ("session", "prefix"),
}


_DEFAULT_LOAD_FACTOR: dict[RoutingPolicyName, float] = {"session": 0.25, "prefix": 0.5}


class RoutingConfig(StrictModel):
    """The replica policy of one model and its options."""

    policy: RoutingPolicyName = Field(
        default="least_load",
        description="least_load: fewest in flight; round_robin: in turn; prefix: the replica "
        "that holds the longest part of the prompt, weighed against its queued work; session: "
        "a conversation (session_header) stays on one replica while its load is bounded.",
    )
    block_chars: int = Field(
        default=64,
        ge=8,
        le=4096,
        description="prefix: characters of prompt text per hashed block; 64 is about one "
        "16-token KV block of vLLM at about 4 characters per token.",
    )
    alpha: float = Field(
        default=1.0,
        ge=0,
        description="prefix: the cost of one block to prefill, in the units of queued work "
        "(a block); 0 ignores the cache and routes on load alone.",
    )
    index_blocks: int = Field(
        default=16384,
        ge=1,
        description="prefix: blocks remembered per replica at most, least recently used "
        "forgotten first. Each replica's own bound follows its KV cache as its vLLM reports it "
        "(cache_config_info's kv_cache_size_tokens, times chars_per_token), up to this.",
    )
    chars_per_token: float | None = Field(
        default=None,
        gt=0,
        description="prefix: characters of prompt text per token, by which a replica's KV "
        "cache (in tokens) becomes the index's bound (in blocks of block_chars). null learns "
        "it from the replicas' usage (prompt characters sent over prompt_tokens reported), "
        "starting at 4, so the index holds what the cache holds whatever the tokenizer.",
    )
    answer_text: bool = Field(
        default=True,
        description="prefix: read the text of each single answer (n of 1) at the response's "
        "end, so that the index records it after the prompt as the next request will repeat "
        "it: a chat's next turn is then predicted to hit through the answer, as vLLM hits. "
        "Costs 0.26-0.4 us of gateway CPU per streamed token (a byte search of the stream); "
        "false charges only the room the answer's tokens take.",
    )
    max_inflight: int | None = Field(
        default=None,
        ge=1,
        description="prefix: a replica with this many requests in flight gets no more while "
        "another has fewer (a hard limit; none by default).",
    )
    request_cost_blocks: float | None = Field(
        default=2.0,
        gt=0,
        description="prefix: what one request in flight adds to a newcomer's wait, in blocks "
        "to prefill. Most requests in flight are decoding, and a decoding sequence adds about "
        "a fifth of a block's prefill to each engine step, so the default is small (2); null "
        "learns it as the recent mean of blocks each request had to prefill, which at "
        "saturation broke affinity: 1.44x least load's throughput against 3.8x at 2 "
        "(benchmarks/routing.py, 8 replicas).",
    )
    session_header: str = Field(
        default="x-session-id",
        min_length=1,
        description="session: the request header naming the conversation.",
    )
    load_factor: float | None = Field(
        default=None,
        gt=0,
        description="session, prefix: the bound on a replica's requests in flight, "
        "ceil((1 + load_factor) x (all in flight + 1) / replicas) and at least 2; a replica "
        "at the bound passes the request on (session: to the next replica on the hash ring; "
        "prefix: to the cheapest replica under it), so that no prefix or conversation makes "
        "one replica hot. Default: 0.25 for session, 0.5 for prefix (benchmarks/routing.py, "
        "8 replicas, one prefix taking half the requests: its holders' busy time 1.2x the "
        "mean at 0.5, 1.31-1.38x at 1.0).",
    )

    @property
    def bounded_load_factor(self) -> float:
        """``load_factor``, or the chosen policy's default."""
        if self.load_factor is not None:
            return self.load_factor
        return _DEFAULT_LOAD_FACTOR.get(self.policy, 0.25)

    @model_validator(mode="after")
    def _options_of_the_policy(self) -> RoutingConfig:
        # Compared with the default, not with what was set: a config dumped whole and
        # validated again (a replica receiving its model) must pass as it did.
        for option, owners in _OPTION_POLICIES.items():
            default = type(self).model_fields[option].default
            if self.policy not in owners and getattr(self, option) != default:
                named = " or ".join(f"'{owner}'" for owner in owners)
                raise ValueError(
                    f"{option} is an option of policy {named}, but policy is "
                    f"'{self.policy}'; remove {option} or set policy: {owners[0]}"
                )
        return self
