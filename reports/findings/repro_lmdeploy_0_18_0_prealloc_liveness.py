"""LMDeploy 0.18.0 (PyTorch engine): a request within the engine's own session length is never admitted
when ``prefill_interval > block_size``. LMDeploy alone, no schedconf; CPU only.

Run it where lmdeploy==0.18.0 is installed (no GPU needed), with or without pytest:

    python THIS_FILE                 # runs every test_* function, exits 1 if one fails
    python -m pytest -q THIS_FILE

It imports only LMDeploy, numpy and the standard library: LMDeploy's own PyTorch-engine ``Scheduler``
(``pytorch/paging/scheduler.py``), fed the ``prealloc_size`` the engine loop passes, for a pool the
engine's own ``_get_max_session_len`` measures.

Why (file:line in lmdeploy 0.18.0):
* ``Engine._get_max_session_len`` (pytorch/engine/engine.py:328-341) admits sessions up to the pool's
  tokens minus ONE block;
* every prefill admission and decode growth asks for ``prefill_interval`` extra tokens of blocks:
  ``AREngineStrategy.get_prealloc_size`` (pytorch/strategies/ar/engine.py:14-16) ->
  ``_ForwardInputsTask._schedule_prefill`` (pytorch/engine/inputs_maker.py:570) ->
  ``DefaultBlockManager.num_required_blocks`` (pytorch/paging/block_manager/default_block_manager.py:26-34,
  adds ``prealloc_size`` to ``num_all_ids``, uncapped by the session length);
* nothing ties ``prefill_interval`` to ``block_size`` (``PytorchEngineConfig.__post_init__``, messages.py:600-636).
So with ``prefill_interval > block_size`` a request near the session length needs more blocks than the whole
pool: the prefill scheduler skips it on every turn and the engine loop only logs "no next prefill running
request, Maybe cache is full" (pytorch/engine/engine_loop.py:451-463) forever.
"""

import importlib
import importlib.util
import sys
import types

import numpy as np


def _bare(name):
    """Register package ``name`` with its real path but without running its ``__init__``."""
    spec = importlib.util.find_spec(name)
    pkg = types.ModuleType(name)
    pkg.__path__, pkg.__file__, pkg.__spec__, pkg.__package__ = list(spec.submodule_search_locations), spec.origin, spec, name
    sys.modules[name] = pkg


_bare("lmdeploy")  # lmdeploy/__init__.py imports the serving pipeline
importlib.import_module("lmdeploy.pytorch")
_bare("lmdeploy.pytorch.engine")  # its __init__ imports the engine's model-runner stack

from lmdeploy.pytorch.config import CacheConfig, SchedulerConfig  # noqa: E402
from lmdeploy.pytorch.engine.engine import Engine  # noqa: E402
from lmdeploy.pytorch.messages import SamplingParam, SequenceMeta  # noqa: E402
from lmdeploy.pytorch.paging import Scheduler  # noqa: E402
from lmdeploy.pytorch.strategies.ar.engine import AREngineStrategy  # noqa: E402
from lmdeploy.pytorch.strategies.ar.sequence import ARSequenceStrategy  # noqa: E402

BLOCK_SIZE, NUM_BLOCKS, PREFILL_INTERVAL = 16, 4, 32  # a 64-token pool; PytorchEngineConfig(prefill_interval=32)
TURNS = 1000


def test_a_request_within_the_session_length_is_admitted():
    cache_config = CacheConfig(max_batches=4, block_size=BLOCK_SIZE, num_cpu_blocks=0, num_gpu_blocks=NUM_BLOCKS)
    scheduler_config = SchedulerConfig(max_batches=4, max_session_len=None, prefill_interval=PREFILL_INTERVAL)
    # what Engine.__init__ computes for this pool (engine.py:328-341): 4 blocks x 16 tokens - one block = 48
    session_len = Engine._get_max_session_len(types.SimpleNamespace(scheduler_config=scheduler_config,
                                                                     cache_config=cache_config))
    scheduler = Scheduler(scheduler_config, cache_config,
                          seq_meta=SequenceMeta(BLOCK_SIZE, strategy=ARSequenceStrategy()))
    # what the engine loop passes to every prefill schedule (inputs_maker.py:570)
    prealloc = AREngineStrategy(scheduler_config, cache_config).get_prealloc_size(True)
    prompt = np.arange(40, dtype=np.int64) + 100
    session = scheduler.add_session(0)
    seq = session.add_sequence(prompt, sampling_param=SamplingParam(max_new_tokens=session_len - len(prompt)))
    assert len(prompt) + seq.sampling_param.max_new_tokens <= session_len  # the engine accepts this request
    admitted = False
    for _ in range(TURNS):  # the engine loop's prefill turns; nothing else runs, nothing is freed
        out = scheduler.schedule(is_prefill=True, prealloc_size=prealloc)
        if out.running:
            admitted = True
            break
    assert admitted, (
        f"a {len(prompt)}-token prompt with max_new_tokens {seq.sampling_param.max_new_tokens} fits the "
        f"engine's session length of {session_len} tokens, yet {TURNS} prefill turns on an idle engine "
        f"admitted nothing: with prefill_interval {PREFILL_INTERVAL} > block_size {BLOCK_SIZE} it needs "
        f"{scheduler.block_manager.num_required_blocks(seq, prealloc)} blocks (prompt + prealloc of {prealloc} "
        f"tokens) of a {NUM_BLOCKS}-block pool, all {scheduler.block_manager.get_num_free_gpu_blocks()} of them "
        "free: it waits forever")


if __name__ == "__main__":  # without pytest: run every test_* function, exit 1 if one fails
    import sys
    import traceback

    failed = 0
    for name, test in [(n, f) for n, f in list(globals().items()) if n.startswith("test_") and callable(f)]:
        try:
            test()
        except AssertionError as exc:
            failed += 1
            print(f"FAIL {name}: {exc}", flush=True)
        except Exception:  # noqa: BLE001 - an error, not the assertion: show where
            failed += 1
            print(f"ERROR {name}:\n{traceback.format_exc()}", flush=True)
        else:
            print(f"PASS {name}", flush=True)
    sys.exit(1 if failed else 0)
