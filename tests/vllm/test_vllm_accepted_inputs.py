"""Two inputs vLLM accepts, checked against vLLM itself: the model accepts them with vLLM's resulting state.

* ``finish_requests`` of a WAITING request with a stop status (vLLM's own
  ``test_get_num_unfinished_requests`` does it): not expressible in the
  protocol, so the same calls run on vLLM's Scheduler inside its environment
  (through our driver's scheduler construction) and on the model.
* an empty sampled list for a request with drafts scheduled (vLLM's
  ``test_spec_decoding_stats_empty_output``): through the protocol, step by
  step, on vLLM 0.33.0 and 0.32.0 and on the reference.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from vllm_drivers import vllm_sut

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.engines.vllm_env import driver_env, ensure_vllm_env, vllm_python
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.request import RequestStatus
from schedconf.spec.v1.scheduler import Scheduler

pytestmark = pytest.mark.vllm

ADD = {
    "kind": "add_request",
    "prompt_token_ids": [1, 2, 3, 4],
    "max_tokens": 8,
    "priority": 0,
    "arrival_time": 0,
    "eos_token_id": None,
    "ignore_eos": False,
    "stop_token_ids": [],
    "min_tokens": 0,
}
SPEC_CONFIG = SchedulerConfig(
    block_size=4,
    num_gpu_blocks=17,
    max_num_batched_tokens=32,
    max_num_seqs=4,
    max_model_len=32,
    num_spec_tokens=2,
    enable_prefix_caching=False,
).to_dict()
# (sampled, drafts) per step: a and b prefill; a decodes with 2 drafts and samples nothing; b goes on
OUTPUTS = [
    ({"a": [5], "b": [5]}, {"a": [6, 7], "b": [6, 7]}),
    ({"a": [], "b": [6, 7, 8]}, {"b": [9, 9]}),
    ({"b": [9, 9, 9]}, {}),
    ({"b": [1]}, {}),
    ({}, {}),
]


def run_steps(sut, profile: str) -> list:  # noqa: ANN001
    """Every step's SchedulerOutput and request outputs, then the step after a's abort."""
    sut.start(SPEC_CONFIG, profile)
    sut.add_request({**ADD, "request_id": "a"})
    sut.add_request({**ADD, "request_id": "b"})
    steps = []
    for sampled, drafts in OUTPUTS:
        out = sut.schedule()
        scheduled = out["num_scheduled_tokens"]
        steps.append(
            (
                out,
                sut.update_from_output(
                    {k: v for k, v in sampled.items() if k in scheduled},
                    {k: v for k, v in drafts.items() if k in scheduled},
                ),
            )
        )
    sut.abort("a")
    steps.append((sut.schedule(), None))
    return steps


@pytest.mark.parametrize("version,profile", [("0.33.0", "vllm-0.33"), ("0.32.0", "vllm-0.32")])
def test_an_empty_output_with_drafts_wedges_the_request_as_in_vllm(version, profile):
    expected = run_steps(vllm_sut(version), profile)
    actual = run_steps(ReferenceSut(), profile)
    assert actual == expected
    # what vLLM does, stated: a is never scheduled after its empty output, until aborted
    assert all("a" not in out["num_scheduled_tokens"] for out, _ in expected[2:])
    assert "a" in expected[-1][0]["finished_req_ids"]


FINISH_SCRIPT = """
import json, sys
from schedconf.conformance.engines.vllm_driver import VllmSchedulerSut
config, status, ids = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
sut = VllmSchedulerSut()
sut.start(config, sys.argv[4])
add = json.loads(sys.argv[5])
sut.add_request({**add, "request_id": "a"})
out = sut.schedule()
sut.update_from_output({"a": [5]}, {})
sut.add_request({**add, "request_id": "w"})
s = sut.scheduler
finished = s.finish_requests(ids, getattr(sut.v.RequestStatus, status))
state = {"finished": sorted(r.request_id for r in finished), "waiting": [r.request_id for r in s.waiting],
         "running": [r.request_id for r in s.running], "unfinished": s.get_num_unfinished_requests(),
         "next": sut.schedule(), "free": sut.observe()["num_free_blocks"]}
print(json.dumps(state, sort_keys=True))
"""


def finish_on_model(profile: str, status: str, ids) -> dict:  # noqa: ANN001
    sched = Scheduler(SchedulerConfig.from_dict(FINISH_CONFIG), profile)
    sched.add_request("a", ADD["prompt_token_ids"], max_tokens=ADD["max_tokens"])
    sched.update_from_output(sched.schedule(), ModelRunnerOutput({"a": (5,)}))
    sched.add_request("w", ADD["prompt_token_ids"], max_tokens=ADD["max_tokens"])
    finished = sched.finish_requests(ids, getattr(RequestStatus, status))
    return {
        "finished": sorted(finished),
        "waiting": [r.request_id for r in sched.waiting],
        "running": [r.request_id for r in sched.running],
        "unfinished": sched.get_num_unfinished_requests(),
        "next": sched.schedule().to_canonical(),
        "free": sched.observe()["num_free_blocks"],
    }


FINISH_CONFIG = {**SPEC_CONFIG, "num_spec_tokens": 0, "max_num_seqs": 1}


@pytest.mark.parametrize(
    "status,ids", [("FINISHED_STOPPED", ["w"]), ("FINISHED_LENGTH_CAPPED", "w"), ("FINISHED_STOPPED", ["a", "w"])]
)
def test_a_waiting_request_stopped_from_outside_as_in_vllm(status, ids):
    ensure_vllm_env("0.33.0")
    proc = subprocess.run(
        [
            str(vllm_python("0.33.0")),
            "-c",
            FINISH_SCRIPT,
            json.dumps(FINISH_CONFIG),
            status,
            json.dumps(ids),
            "vllm-0.33",
            json.dumps({k: v for k, v in ADD.items() if k != "kind"} | {"kind": "add_request"}),
        ],
        env={**os.environ, **driver_env("0.33.0")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    vllm = json.loads(proc.stdout.strip().splitlines()[-1])
    assert finish_on_model("vllm-0.33", status, ids) == vllm
    assert "w" in vllm["finished"] and vllm["waiting"] == []
