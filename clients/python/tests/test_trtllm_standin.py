"""The stand-ins of TensorRT-LLM's connector base classes against the pinned table, and against
the real classes wherever tensorrt_llm is importable."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

from kvctl_engine.trtllm import base, pinned, standin


def signature(fn) -> tuple:
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out.append(p.name + ("=" if p.default is not p.empty else ""))
    return tuple(out)


def fields(cls) -> tuple:
    return tuple(
        f.name + ("=" if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING else "")
        for f in dataclasses.fields(cls)
    )


CLASSES = {pinned.SCHEDULER: standin.KvCacheConnectorScheduler, pinned.WORKER: standin.KvCacheConnectorWorker}


@pytest.mark.parametrize("name", [pinned.SCHEDULER, pinned.WORKER])
def test_standin_methods_match_the_pinned_table(name):
    cls = CLASSES[name]
    for method, (sig, abstract) in pinned.BASE_METHODS[name].items():
        fn = getattr(cls, method)
        assert signature(fn) == tuple(s for s in sig), f"{name}.{method}"
        assert getattr(fn, "__isabstractmethod__", False) == abstract, f"{name}.{method} abstract"
    assert set(cls.__abstractmethods__) == {m for m, (_, a) in pinned.BASE_METHODS[name].items() if a}
    for method, sig in pinned.SEED_METHODS[name].items():
        assert signature(getattr(cls, method)) == sig, f"{name}.{method} (seed)"
    for attrs in (pinned.BASE_ATTRIBUTES[name], pinned.SEED_ATTRIBUTES[name]):
        for attr, default in attrs.items():
            assert getattr(cls, attr) is default, f"{name}.{attr}"


def test_standin_dataclasses_match_the_pinned_table():
    assert fields(standin.RequestData) == pinned.BASE_DATACLASSES["RequestData"]
    assert fields(standin.SchedulerOutput) == pinned.BASE_DATACLASSES["SchedulerOutput"]


def test_table_names_its_sources():
    for key in ("BASE", "BASE_OLDER", "SEED"):
        path, rev = pinned.SOURCES[key]
        assert path and rev
    assert pinned.SOURCES["BASE"][0] == "tensorrt_llm/_torch/pyexecutor/connectors/kv_cache_connector.py"
    assert len(pinned.SOURCES["BASE"][1]) == 40


def test_per_group_override_stands_in_for_the_flat_form():
    class Scheduler(standin.KvCacheConnectorScheduler):
        def build_connector_meta(self, scheduler_output):
            return None

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return 0, False

        def request_finished_by_layer_group(self, request, cache_block_ids_by_layer_group):
            return True

        def update_state_after_alloc_by_layer_group(self, request, block_ids_by_layer_group):
            self.seen = block_ids_by_layer_group

    s = Scheduler(llm_args=None)
    with pytest.raises(NotImplementedError, match="request_finished_by_layer_group"):
        s.request_finished(None, [1])

    class Flat(standin.KvCacheConnectorScheduler):
        def build_connector_meta(self, scheduler_output):
            return None

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return 0, False

        def request_finished(self, request, cache_block_ids):
            return bool(cache_block_ids)

        def update_state_after_alloc(self, request, block_ids):
            self.seen = block_ids

    f = Flat(llm_args=None)
    f.update_state_after_alloc_by_layer_group(None, [[3, 4]])
    assert f.seen == [3, 4]
    with pytest.raises(NotImplementedError):
        f.update_state_after_alloc_by_layer_group(None, [[3], [4]])
    # A class implementing neither form cannot be built.
    with pytest.raises(TypeError):

        class Neither(standin.KvCacheConnectorScheduler):
            def build_connector_meta(self, scheduler_output):
                return None

        Neither(llm_args=None)


def _real_module():
    for path in pinned.BASE_MODULES:
        try:
            return importlib.import_module(path), path
        except ModuleNotFoundError:
            continue
    return None, None


def test_base_selects_the_standins_without_tensorrt_llm():
    mod, _ = _real_module()
    if mod is not None:
        assert base.SOURCE in pinned.BASE_MODULES and not base.STANDIN
    else:
        assert base.SOURCE == "stand-in" and base.STANDIN
        assert base.KvCacheConnectorWorker is standin.KvCacheConnectorWorker


@pytest.mark.parametrize("name", [pinned.SCHEDULER, pinned.WORKER])
def test_standin_signatures_equal_the_real_ones(name):
    mod, path = _real_module()
    if mod is None:
        pytest.skip(
            "tensorrt_llm is not importable here (PyPI serves a placeholder and it needs CUDA); "
            "the stand-ins are checked against the pinned table only"
        )
    real = getattr(mod, name)
    ours = CLASSES[name]
    for method in pinned.BASE_METHODS[name]:
        if path == pinned.BASE_MODULES[0] or hasattr(real, method):
            assert signature(getattr(real, method)) == signature(getattr(ours, method)), f"{path}:{name}.{method}"
    for method in pinned.SEED_METHODS[name]:
        if hasattr(real, method):
            assert signature(getattr(real, method)) == signature(getattr(ours, method)), f"{path}:{name}.{method}"
    for attr, default in {**pinned.BASE_ATTRIBUTES[name], **pinned.SEED_ATTRIBUTES[name]}.items():
        if hasattr(real, attr):
            assert getattr(real, attr) is default, f"{path}:{name}.{attr}"


def test_standin_dataclasses_equal_the_real_ones():
    mod, _ = _real_module()
    if mod is None:
        pytest.skip("tensorrt_llm is not importable here; the dataclasses are checked against the pinned table only")
    want = (
        pinned.BASE_DATACLASSES
        if hasattr(mod.RequestData, "__dataclass_fields__") and "cache_salt" in mod.RequestData.__dataclass_fields__
        else pinned.BASE_OLDER_DATACLASSES
    )
    assert fields(mod.RequestData) == want["RequestData"]
    assert fields(mod.SchedulerOutput) == want["SchedulerOutput"]
