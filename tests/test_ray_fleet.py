"""A fleet placed by Ray (`exec --fleet ... --ray-address`): every model's replicas actors on one
cluster, each with GPUs of its own, a mixed file routed by model, everything gone afterwards."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest
from batchutil import read_results
from standins.harness import Standins, wait_no_survivors

pytest.importorskip("ray", reason="Ray is not installed: pip install 'jsonlbatch[ray]'")

from test_ray import _all_gpus_free, cluster, standins, token  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300, method="thread")]


def test_a_fleet_on_ray_routes_a_mixed_file_on_disjoint_gpus(
    cluster: str,  # noqa: F811
    standins: Standins,  # noqa: F811
) -> None:
    fleet = standins.tmp / "fleet.yaml"
    fleet.write_text(
        "models:\n"
        "  - {backend: vllm, model_path: /m/a, served_model_name: agent, dp_size: 2,"
        " dp_mode: replicas}\n"
        "  - {backend: vllm, model_path: /m/e, served_model_name: expert, tp_size: 2}\n"
    )
    requests, output = standins.tmp / "req.jsonl", standins.tmp / "resp.jsonl"
    asked = {}
    with open(requests, "wb") as f:
        for i in range(30):
            model = ("agent", "expert")[i % 2]
            asked[f"r{i}"] = model
            body = {"model": model, "messages": [{"role": "user", "content": f"q {i}"}]}
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": body}  # fmt: skip
            f.write(orjson.dumps(line) + b"\n")
    done = subprocess.run(
        [sys.executable, "-m", "jsonlbatch", "exec", str(requests), "-o", str(output),
         "--fleet", str(fleet), "--ray-address", cluster, "-q"],
        capture_output=True, text=True, timeout=240, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(output)
    assert set(results) == set(asked)
    for cid, line in results.items():
        assert line["response"]["body"]["model"] == asked[cid]
        assert line["metrics"]["endpoint"].split("/")[0] == asked[cid]
    gpus = [r["env"]["CUDA_VISIBLE_DEVICES"].split(",") for r in standins.records()]
    assert sorted(len(g) for g in gpus) == [1, 1, 2]  # agent's two replicas, expert's TP 2
    assert sorted(g for group in gpus for g in group) == ["0", "1", "2", "3"]  # no overlap
    assert wait_no_survivors(standins.tag) == []
    assert _all_gpus_free(cluster)
