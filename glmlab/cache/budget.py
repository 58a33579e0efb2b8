"""Memory budget: bytes in, pool sizes and max running requests out, with the reason for every cap.

A pure function (``plan_budget``) of a frozen ``BudgetInputs``; the engine prints the result at
start-up, ``glmlab budget`` prints it for any model, TP degree and dtypes, and notebook 01 turns
it into a widget. Accounting (per GPU), after SGLang's pool configurator (docs/techniques.md 3.2):

1. pool bytes = ``byte_budget``, or device bytes x mem fraction - weight bytes;
2. state slots = explicit ``state_slots``, else ``slots_per_request`` x (running + in-flight)
   (running from the request, else the most that fit with their full-context KV); one more state
   row and one more page are padding (scratch for padded batch rows, never handed out);
3. speculative workspace = ``spec_slots`` x ``spec_bytes_per_slot``;
4. whatever remains is KV: pages of ``page_size`` tokens, each token costing target + draft bytes
   (draft KV uses the target's slot ids, so both pools have the same number of slots);
5. running requests = min(requested, state-bound, KV-bound); KV-bound counts requests at the full
   context length, with ``shared_prefix_len`` tokens shared by all of them (Lp + N x Ls). A request
   limit above the KV bound is honoured but flagged: decode may then preempt (and recompute).

GiB throughout: the reference deployment's "GB" figures (1.96, 7.37, 14.00, 11.96, 46.72) are GiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from glmlab.cache.footprint import CacheFootprint

GIB = 1 << 30
PADDING_SLOTS = 1
PADDING_PAGES = 1


class BudgetError(ValueError):
    pass


@dataclass(frozen=True)
class BudgetInputs:
    footprint: CacheFootprint
    context_len: int  # longest prompt + output a request may reach
    page_size: int = 64
    byte_budget: int | None = None  # static bytes for every pool
    device_bytes: int | None = None  # ... or device memory x mem_fraction - weight_bytes
    mem_fraction: float = 0.9
    weight_bytes: int = 0
    graph_bytes: int = 0  # CUDA graphs' memory (estimated before capture), off a device budget
    max_running_requests: int | None = None  # requested
    state_slots: int | None = None  # explicit state slots (SGLang --max-mamba-cache-size)
    extra_slots: int = 0  # in-flight requests that hold state slots (PD decode preallocation)
    slots_per_request: int = 1  # > 1 when the radix tree keeps state checkpoints
    spec_slots: int = 0  # slots with a speculative workspace (e.g. ReplaySSM ring)
    spec_bytes_per_slot: int = 0
    max_pages: int | None = None  # cap on KV pages (SGLang --max-total-tokens / page size)
    shared_prefix_len: int = 0  # tokens every request shares (the KV-bound's Lp)
    label: str = ""

    def pool_bytes(self) -> int:
        if self.byte_budget is not None:
            return self.byte_budget
        if self.device_bytes is None:
            raise BudgetError("give a byte budget, or device bytes (with mem fraction and weights)")
        return int(self.device_bytes * self.mem_fraction) - self.weight_bytes - self.graph_bytes


@dataclass(frozen=True)
class Cap:
    kind: str  # "requested" | "state-bound" | "KV-bound"
    value: int
    reason: str


@dataclass(frozen=True)
class Budget:
    inputs: BudgetInputs
    pool_bytes: int
    num_pages: int  # including the padding page
    num_state_slots: int  # including the padding slot
    max_running_requests: int
    caps: tuple[Cap, ...]
    kv_bytes: int
    draft_kv_bytes: int
    state_bytes: int  # KDA recurrent + conv
    tail_bytes: int  # DSA index tails
    spec_bytes: int
    overcommitted: bool  # requested more running requests than full-context KV holds

    @property
    def token_slots(self) -> int:
        return (self.num_pages - PADDING_PAGES) * self.inputs.page_size

    @property
    def unused_bytes(self) -> int:
        used = self.kv_bytes + self.draft_kv_bytes + self.state_bytes + self.tail_bytes
        return self.pool_bytes - used - self.spec_bytes

    @property
    def binding(self) -> tuple[Cap, ...]:
        return tuple(c for c in self.caps if c.value == self.max_running_requests)

    def table(self) -> str:
        from glmlab.cache.budget_report import budget_table

        return budget_table(self)


def _pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def kv_bound(token_pages: int, context_len: int, shared_prefix_len: int, page_size: int) -> int:
    """Requests of ``context_len`` tokens whose first ``shared_prefix_len`` are shared that fit in
    ``token_pages`` pages: Lp + N x Ls, page-rounded (a shared page must be whole)."""
    shared = min(shared_prefix_len, context_len) // page_size
    own = _pages_for(context_len - shared * page_size, page_size)
    return max(0, (token_pages - shared) // own) if token_pages >= shared else 0


def plan_budget(x: BudgetInputs) -> Budget:
    s, ps = x.footprint, x.page_size
    pool = x.pool_bytes()
    per_slot = s.state_bytes_per_slot
    page_bytes = ps * (s.kv_bytes_per_token + s.draft_bytes_per_token)
    spec = x.spec_slots * x.spec_bytes_per_slot
    ratio, extra = x.slots_per_request, x.extra_slots
    if x.state_slots is not None:
        slots = x.state_slots
    elif x.max_running_requests is not None:
        slots = ratio * (x.max_running_requests + extra)
    else:  # as many requests as fit with their state and full-context KV
        shared = min(x.shared_prefix_len, x.context_len) // ps
        own = _pages_for(x.context_len - shared * ps, ps)
        fixed = (spec + (ratio * extra + PADDING_SLOTS) * per_slot
                 + (shared + PADDING_PAGES) * page_bytes)
        n = int((pool - fixed) // (ratio * per_slot + own * page_bytes))
        if n < 1:
            need = _fmt_need(x, own, page_bytes)
            raise BudgetError(f"{pool / GIB:.2f} GiB cannot hold one request of "
                              f"{x.context_len} tokens and its state ({need})")
        slots = ratio * (n + extra)
    rows = slots + PADDING_SLOTS
    left = pool - spec - rows * per_slot
    num_pages = int(left // page_bytes) if page_bytes else 0
    if x.max_pages is not None:
        num_pages = min(num_pages, x.max_pages + PADDING_PAGES)
    if num_pages < PADDING_PAGES + 1 or left < 0:
        raise BudgetError(f"{pool / GIB:.2f} GiB leaves no room for KV after {rows} state slots "
                          f"({rows * per_slot / GIB:.2f} GiB) and {spec / GIB:.2f} GiB of "
                          "speculative workspace")
    token_pages = num_pages - PADDING_PAGES
    caps = [Cap("state-bound", max(0, slots // ratio - extra),
                f"{slots} slots / {ratio} per request - {extra} in flight")]
    kv_cap = kv_bound(token_pages, x.context_len, x.shared_prefix_len, ps)
    shared_note = (f" with {x.shared_prefix_len:,} shared (no sharing: "
                   f"{kv_bound(token_pages, x.context_len, 0, ps)})" if x.shared_prefix_len else "")
    caps.append(Cap("KV-bound", kv_cap, f"{token_pages * ps:,} token slots / requests of "
                                        f"{x.context_len:,} tokens{shared_note}"))
    if x.max_running_requests is not None:
        caps.insert(0, Cap("requested", x.max_running_requests, "max running requests"))
        running = min(x.max_running_requests, caps[1].value)
    else:
        running = min(caps[0].value, kv_cap)
    if running < 1:
        raise BudgetError("no request fits: " + "; ".join(f"{c.kind} {c.value} ({c.reason})"
                                                          for c in caps))
    return Budget(
        inputs=x, pool_bytes=pool, num_pages=num_pages, num_state_slots=rows,
        max_running_requests=running, caps=tuple(caps),
        kv_bytes=int(num_pages * ps * s.kv_bytes_per_token),
        draft_kv_bytes=num_pages * ps * s.draft_bytes_per_token,
        state_bytes=rows * s.kda_state_bytes_per_slot, tail_bytes=rows * s.tail_bytes_per_slot,
        spec_bytes=spec, overcommitted=running > kv_cap)


def _fmt_need(x: BudgetInputs, own_pages: int, page_bytes: float) -> str:
    need = x.slots_per_request * x.footprint.state_bytes_per_slot + own_pages * page_bytes
    return f"{need / GIB:.3f} GiB each"
