"""The engine applies the step planner's decisions: in plan order, and safely when a
request ends on another thread between planning and applying."""

from __future__ import annotations

from sluice.engine.request import RequestStatus
from sluice.policy.step.step_planner import plan_step
from tests.engine.test_continuous import engine, request, run_to_idle


def test_the_engine_applies_its_planners_admissions_in_order() -> None:
    eng, _ = engine()
    reqs = [request(n_prompt=4, max_tokens=4) for _ in range(3)]
    for r in reqs:
        eng.add(r)
    plan = plan_step(eng.config, eng.view(0.0))
    assert [a.request_id for a in plan.admissions] == [r.request_id for r in reqs]
    eng.step()
    assert {s.req.request_id: slot for slot, s in eng.running.items()} == {
        a.request_id: a.slot for a in plan.admissions}
    assert eng.kv.used_blocks == sum(eng.kv.blocks_needed(a.reserve_tokens)
                                     for a in plan.admissions)
    assert eng.last_batch_size == len(plan.chunks)


def test_a_request_cancelled_after_planning_is_left_for_the_sweep() -> None:
    eng, retired = engine()
    first, second = request(), request()
    for r in (first, second):
        eng.add(r)
    plan = plan_step(eng.config, eng.view(0.0))
    assert len(plan.admissions) == 2
    first.cancel_requested = True  # as the HTTP thread would, after the plan was made
    batch = eng._apply(plan, 0.0)
    # Nothing started: the later admission counted on the first one's slot.
    assert not batch.chunks and not eng.running and list(eng.waiting) == [first, second]
    assert eng.kv.free_blocks == eng.kv.total_blocks
    eng.step()
    assert first.status == RequestStatus.CANCELLED and retired == [first]
    assert second.status == RequestStatus.RUNNING
    run_to_idle(eng)
    assert second.status == RequestStatus.COMPLETED
    eng.kv.check_integrity()
