"""`vidtune mcp`: the product over the Model Context Protocol, driven by the MCP SDK's own client over stdio
against a tiny campaign the server starts (no mock: the real server process, the real campaign)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

SMALL = ["model=tiny", "request.height=128", "request.width=192", "request.frames=9", "families=[caching]",
         "budget.trials_per_family=2", "eval.repeats=1", "eval.warmup=0", "eval.paired=false",
         "integrator.final_repeats=2", "integrator.max_p_value=1", "gate.psnr_db=0", "gate.ssim=0",
         "gate.audio_snr_db=-100"]


def _data(result) -> dict:
    """A tool's answer as the client receives it (structured content, else the JSON text)."""
    assert not result.is_error, result.content
    if result.structured_content is not None:
        data = result.structured_content
        return data.get("result", data) if set(data) == {"result"} else data
    return json.loads(result.content[0].text)


async def _session(results: Path) -> dict:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    seen: dict = {}
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "vidtune.cli", "mcp", "--results-dir", str(results)])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            seen["tools"] = sorted(t.name for t in (await session.list_tools()).tools)
            knobs = _data(await session.call_tool("list_knobs", {}))
            seen["knobs"] = knobs
            bad = _data(await session.call_tool("start_campaign", {"name": "bad", "overrides": ["model=nope"]}))
            seen["bad_start"] = bad
            refused = await session.call_tool("start_campaign", {"name": "x", "overrides": ["results_dir=/tmp"]})
            seen["refused"] = refused
            seen["start"] = _data(await session.call_tool("start_campaign", {"name": "agent", "overrides": SMALL}))
            seen["again"] = _data(await session.call_tool("start_campaign", {"name": "agent", "overrides": SMALL}))
            deadline = time.time() + 240
            status = {}
            while time.time() < deadline:
                status = _data(await session.call_tool("campaign_status", {"name": "agent"}))
                if not status["running"]:
                    break
                await asyncio.sleep(1.0)
            seen["status"] = status
            seen["bad_status"] = _data(await session.call_tool("campaign_status", {"name": "bad"}))
            seen["report"] = _data(await session.call_tool("report", {"name": "agent"}))
            seen["signoff"] = _data(await session.call_tool(
                "signoff", {"name": "agent", "by": "an agent", "verdict": "approve", "note": "read the report"}))
            seen["stop"] = _data(await session.call_tool("stop_campaign", {"name": "agent"}))
    return seen


def test_an_agent_runs_a_campaign_through_the_mcp_server(tmp_path):
    seen = asyncio.run(_session(tmp_path))
    assert {"list_knobs", "start_campaign", "stop_campaign", "campaign_status", "report", "ask", "tell", "evaluate",
            "bench", "signoff"} <= set(seen["tools"])
    knobs = seen["knobs"]
    assert knobs["exit_status"] == 0 and any(t.startswith("caching.") for t in json.dumps(knobs["result"]).split('"'))
    # a bad override is the command's own error, read from the campaign's log once it has exited
    assert seen["bad_start"]["started"] is True
    assert seen["bad_status"]["running"] is False and seen["bad_status"]["exit_status"] == 2
    assert any("model" in line for line in seen["bad_status"]["log_tail"])
    assert seen["refused"].is_error and "results_dir" in seen["refused"].content[0].text
    assert seen["start"]["started"] is True and seen["again"]["started"] is False  # (one run at a time)
    status = seen["status"]
    assert status["finished"] and status["exit_status"] == 0, status
    assert status["records"].get("caching:ok", 0) >= 1
    # (the default campaign: one tuned config per tier)
    assert set(status["summary"]["tiers"]) == {"lossless", "high", "balanced"}
    assert all(t["speedup"] > 0 for t in status["summary"]["tiers"].values())
    report = seen["report"]
    assert report["exit_status"] == 0 and Path(report["report"]).is_file()
    assert report["summary"]["tiers"]["high"]["knobs"] == status["summary"]["tiers"]["high"]["knobs"]
    made = json.loads((tmp_path / "agent" / "campaign.json").read_text())["provenance"]
    assert made["command"].startswith("vidtune campaign name=agent") and made["request"]["frames"] == 9
    assert seen["signoff"]["exit_status"] == 0
    assert "approve" in (tmp_path / "agent" / "tuned.yaml").read_text()
    assert seen["stop"]["stopped"] is False  # (it had finished)
