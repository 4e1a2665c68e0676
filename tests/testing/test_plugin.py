"""The pytest plugin: its ``pytest11`` entry point and the ``agent_harness`` fixture, tested with pytester.

The generated test files run in a fresh pytest session (in this process, through ``pytester.runpytest``)
whose directory has no conftest providing ``agent_harness``: the fixture can only come from the plugin the
entry point registers.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
import pytest


@pytest.fixture
def anyio_backend():
    return "asyncio"
"""

AGENT = """
import anyio
import pytest

from agentlife import AgentProcess, Done, StepContext, tool
from agentlife.testing import AgentHarness, DrainAt

pytestmark = pytest.mark.anyio


@tool(side_effects=True)
async def upload(name: str, seconds: float) -> str:
    await anyio.sleep(seconds)
    return name


class Uploader(AgentProcess):
    agent_id = "uploader"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def step(self, ctx: StepContext) -> Done | None:
        ctx.state.setdefault("uploaded", []).append(await ctx.call_tool(upload, name=f"part-{ctx.step}",
                                                                       seconds=self.seconds))
        return Done(result=ctx.state["uploaded"]) if ctx.step == 4 else None
"""


def test_the_entry_point_is_registered_and_provides_the_fixture() -> None:
    (plugin,) = [ep for ep in entry_points(group="pytest11") if ep.name == "agentlife"]
    assert plugin.value == "agentlife.testing._plugin"
    module = plugin.load()
    assert callable(module.agent_harness)


def test_a_drain_during_a_tool_exits_143_with_the_checkpoint(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_drain_during_upload=AGENT
        + """

async def test_drain_during_upload(agent_harness: AgentHarness, request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.has_plugin("agentlife")
    run = await agent_harness.run(Uploader(0.05), drain=DrainAt.during_tool("upload", step=2))
    assert run.exit_code == 143
    assert run.checkpoint is not None and run.checkpoint.next_step == 3  # step 2 finished in time
    assert run.checkpoint.state == {"uploaded": ["part-0", "part-1", "part-2"]}
    assert run.job is not None and run.job.status == "RUNNING" and run.job.attempt == 1
    assert run.journal_types().count("DRAIN_STARTED") == 1


async def test_a_tool_that_outlives_the_deadline_is_cancelled(agent_harness: AgentHarness) -> None:
    # Its own data dir: this is attempt 1 of job-1 again. 10 s of tool against a 0.45 s scaled deadline.
    run = await agent_harness.run(Uploader(10.0), drain=DrainAt.during_tool("upload", step=0))
    assert run.exit_code == 143 and run.duration < 5
    assert run.job is not None and run.job.attempt == 1
    assert run.checkpoint is None  # the only step started was cancelled: nothing checkpointed
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=2)


def test_a_wrong_assertion_in_a_drain_test_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_wrong_expectation=AGENT
        + """

async def test_expects_a_clean_exit(agent_harness: AgentHarness) -> None:
    run = await agent_harness.run(Uploader(0.01), drain=DrainAt.between_steps(after_step=1))
    assert run.exit_code == 0
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*assert 143 == 0*"])
