"""Task output routed by the scheduler core: to the clients that want the key, else to
the client that submitted the task's group (an intermediate task), never to a client
that opted out or has left; the bytes pass unchanged, with the worker's address."""

from __future__ import annotations

from scheduler_harness import W1, Sim

from shoal.protocol.messages import ForwardOutput, TaskOutput

DATA = b"\x91\x92\xa6stdout\xa2hi"


def outputs(sim: Sim, client: str) -> list[TaskOutput]:
    return [msg for msg in sim.to_client(client) if isinstance(msg, TaskOutput)]


def test_output_goes_to_the_clients_that_want_the_key():
    sim = Sim(clients=("c", "d"))
    sim.submit({"a": []}, client="c")
    sim.submit({"a": []}, client="d")
    sim.clear()
    sim.s.handle_worker(W1, TaskOutput("a", "", DATA))
    for client in ("c", "d"):
        assert outputs(sim, client) == [TaskOutput("a", W1, DATA)]


def test_an_intermediate_tasks_output_goes_to_its_graphs_client():
    sim = Sim(clients=("c", "d"))
    sim.submit({"x-1": [], "y-1": ["x-1"]}, wanted=["y-1"], client="c")
    sim.clear()
    sim.s.handle_worker(W1, TaskOutput("x-1", "", DATA))
    assert outputs(sim, "c") == [TaskOutput("x-1", W1, DATA)]
    assert outputs(sim, "d") == []


def test_no_output_to_a_client_that_opted_out_or_left():
    sim = Sim(clients=("c", "d"))
    sim.s.handle_client("c", ForwardOutput(False))
    sim.submit({"a": []}, client="c")
    sim.clear()
    sim.s.handle_worker(W1, TaskOutput("a", "", DATA))
    assert outputs(sim, "c") == []
    # "d" submitted the graph and left; "c" wants its result too, not its intermediates
    sim.s.handle_client("c", ForwardOutput(True))
    sim.submit({"x-1": [], "y-1": ["x-1"]}, wanted=["y-1"], client="d")
    sim.submit({"x-1": [], "y-1": ["x-1"]}, wanted=["y-1"], client="c")
    sim.s.remove_client("d", "d-left")
    sim.clear()
    sim.s.handle_worker(W1, TaskOutput("x-1", "", DATA))
    assert outputs(sim, "c") == []
    sim.s.handle_worker(W1, TaskOutput("y-1", "", DATA))
    assert outputs(sim, "c") == [TaskOutput("y-1", W1, DATA)]
    sim.s.handle_worker(W1, TaskOutput("unknown", "", DATA))  # forgotten: dropped
    assert sim.comm.clients == {}
