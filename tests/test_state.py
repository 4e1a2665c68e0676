from __future__ import annotations

import itertools

import pytest

from agentlife import InvalidTransition, State
from agentlife._state import TRANSITIONS, StateMachine, Transition

# A shortest path from BOOTING to each state, to put a fresh machine in any source state.
PATHS = {
    State.BOOTING: [],
    State.HYDRATING: [State.HYDRATING],
    State.READY: [State.HYDRATING, State.READY],
    State.EXECUTING: [State.HYDRATING, State.READY, State.EXECUTING],
    State.DRAINING: [State.DRAINING],
    State.TERMINATED: [State.TERMINATED],
}

ALLOWED = {
    (State.BOOTING, State.HYDRATING),
    (State.BOOTING, State.TERMINATED),
    (State.BOOTING, State.DRAINING),
    (State.HYDRATING, State.READY),
    (State.HYDRATING, State.TERMINATED),
    (State.HYDRATING, State.DRAINING),
    (State.READY, State.EXECUTING),
    (State.READY, State.DRAINING),
    (State.EXECUTING, State.DRAINING),
    (State.EXECUTING, State.TERMINATED),
    (State.DRAINING, State.TERMINATED),
}


def machine_in(state: State) -> StateMachine:
    machine = StateMachine()
    for target in PATHS[state]:
        machine.move(target)
    assert machine.state is state
    return machine


def test_table_is_exactly_the_design() -> None:
    assert ALLOWED == TRANSITIONS


@pytest.mark.parametrize(("source", "target"), sorted(ALLOWED, key=str))
def test_allowed_transition(source: State, target: State) -> None:
    machine = machine_in(source)
    seen: list[Transition] = []
    machine.add_listener(seen.append)
    machine.move(target, "why")
    assert machine.state is target
    assert [(t.source, t.target, t.reason) for t in seen] == [(source, target, "why")]


ILLEGAL = [p for p in itertools.product(State, State) if p not in ALLOWED]


@pytest.mark.parametrize(("source", "target"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_illegal_transition_raises_and_changes_nothing(source: State, target: State) -> None:
    machine = machine_in(source)
    seen: list[Transition] = []
    machine.add_listener(seen.append)
    with pytest.raises(InvalidTransition) as info:
        machine.move(target)
    assert machine.state is source
    assert seen == []
    assert str(source) in str(info.value) and str(target) in str(info.value)


def test_a_failing_listener_does_not_break_the_lifecycle() -> None:
    errors: list[BaseException] = []
    machine = StateMachine(on_listener_error=lambda listener, exc: errors.append(exc))
    later: list[State] = []

    def broken(t: Transition) -> None:
        raise RuntimeError("listener bug")

    machine.add_listener(broken)
    machine.add_listener(lambda t: later.append(t.target))
    machine.move(State.HYDRATING)
    assert machine.state is State.HYDRATING
    assert later == [State.HYDRATING]
    assert [str(e) for e in errors] == ["listener bug"]
