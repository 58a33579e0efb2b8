"""Grammar accepts told late: the scheduler leaves a constrained request's token pending and the
sampler tells the matcher at the next mask fill, while that step's forward runs (the host work
overlaps the GPU). Tokens that can end the grammar are still told at once, so a grammar ends on the
step it ends, and a refusal told late ends the request without the token it no longer allows."""

from __future__ import annotations

from glmlab.core import FinishReason, SamplingParams


class Ladder:
    """A grammar of ``length`` tokens: step i allows only ``allowed[i]``; then its stop token.
    Records every call, so a test can see when it was told what."""

    def __init__(self, allowed: list[int], stop: int, refuse_at: int | None = None):
        self.allowed, self.stop, self.refuse_at = allowed, stop, refuse_at
        self.stop_token_ids = frozenset({stop})
        self.pos, self.done, self.calls = 0, False, []

    def next_token(self) -> int:
        return self.allowed[self.pos] if self.pos < len(self.allowed) else self.stop

    def fill_mask(self, bitmask, row: int) -> None:
        self.calls.append(("fill", self.pos))
        bitmask[row] = 0
        t = self.next_token()
        bitmask[row, t // 32] |= (1 << (t % 32)) if t % 32 < 31 else -(2 ** 31)

    def accept(self, token: int) -> bool:
        self.calls.append(("accept", token))
        if token != self.next_token() or self.pos == self.refuse_at:
            return False
        if token == self.stop:
            self.done = True
        self.pos += 1
        return True

    def is_terminated(self) -> bool:
        return self.done


def _run(engine, rid):
    outs = []
    while engine.has_work:
        outs += [o for o in engine.step() if o.rid == rid]
    return outs


def test_a_grammar_is_told_each_token_at_the_next_fill_and_ends_on_its_stop(make_engine):
    engine = make_engine()
    stop = 3  # not an EOS of the tiny model: only the grammar ends the request
    g = Ladder([11, 12, 13], stop)
    rid = engine.add_request([5, 6, 7, 8], SamplingParams(max_new_tokens=20, ignore_eos=True),
                             grammar=g)
    first = engine.step()
    assert [o.new_token_ids for o in first if o.rid == rid] == [(11,)]
    assert g.calls == [("fill", 0)]  # 11 is pending: not told yet
    engine.step()
    assert g.calls[1:] == [("accept", 11), ("fill", 1)]  # told first, then the mask
    outs = _run(engine, rid)
    emitted = [t for o in outs for t in o.new_token_ids]
    assert [11, 12] + emitted == [11, 12, 13, stop]
    assert outs[-1].finish_reason is FinishReason.STOP and g.done
    # the stop token was told at once (it ends the grammar), every other one a step later
    assert g.calls[-1] == ("accept", stop) and g.calls.count(("accept", stop)) == 1
    engine.assert_idle()


def test_a_refusal_told_late_ends_the_request_before_its_next_token(make_engine):
    engine = make_engine()
    g = Ladder([11, 12, 13, 14], stop=3, refuse_at=1)  # refuses 12, which its own mask allowed
    rid = engine.add_request([5, 6, 7, 8], SamplingParams(max_new_tokens=20, ignore_eos=True),
                             grammar=g)
    outs = _run(engine, rid)
    emitted = [t for o in outs for t in o.new_token_ids]
    assert emitted == [11, 12]  # 12 was emitted, then refused when told; nothing after it
    req = engine.request(rid)
    assert req.finish_reason is FinishReason.STOP and req.matched_stop == 12
    assert req.output_ids == [11, 12]
    engine.assert_idle()  # pages and slots back
