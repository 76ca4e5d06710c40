"""The fakes' checks themselves: ``tests/support/signature_checks.py`` refuses what the real callable refuses, and
``tests/support/sglang_source.py`` reads sglang 0.5.23's signatures and request types from its installed source (read once
against the real classes, imported in a scratch process with torchvision stubbed: every struct, method and function
the fakes use gave the same parameters)."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from tests.support.sglang_fakes import MANAGER, RecordingEngine, RecordingTokenizerManager, SourceSerializer
from tests.support.sglang_source import SGLANG_SOURCE_ENV, SGLangSource, SGLangSourceMissing
from tests.support.signature_checks import bind_like, checked_against


def real(a, b=1, *, c):
    return a, b, c


class Real:
    def method(self, x, *, flag=False):
        return x

    async def coro(self, x):
        return x


def test_checked_against_refuses_what_the_real_callable_refuses():
    class Fake:
        @checked_against(Real.method)
        def method(self, *args, **kwargs):
            return "fake"

        @checked_against(Real.coro)
        async def coro(self, *args, **kwargs):
            return "fake"

    fake = Fake()
    assert fake.method(1, flag=True) == "fake" and asyncio.run(fake.coro(2)) == "fake"
    with pytest.raises(TypeError, match=r"Real.method\(self, x, \*, flag=False\) refuses this call: .*'flg'"):
        fake.method(1, flg=True)
    with pytest.raises(TypeError, match="too many positional arguments"):
        fake.method(1, True)  # flag is keyword-only
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        asyncio.run(fake.coro())
    with pytest.raises(TypeError, match=r"the fake .*<lambda>\(self, x, \*, flag=True\) is not spelled as Real.method"):
        checked_against(Real.method)(lambda self, x, *, flag=True: x)  # a default the real method lacks

    class Recorder:  # a method standing for a plain function: its self is not bound to the function
        @checked_against(real)
        def call(self, a, b=1, *, c):
            return a + b + c

    assert Recorder().call(1, c=2) == 4
    with pytest.raises(TypeError, match="missing a required argument: 'c'"):
        Recorder().call(1)
    assert bind_like(real, 1, c=3).arguments == {"a": 1, "b": 1, "c": 3}  # defaults applied
    with pytest.raises(TypeError, match="missing a required argument: 'c'"):
        bind_like(real, 1, 2)


def test_sglang_signatures_and_request_types_come_from_its_source(sglang_source):
    release = sglang_source.signature(MANAGER, "TokenizerManager.release_memory_occupation")  # from the mixin
    assert list(release.parameters) == ["self", "obj", "request"] and release.parameters["request"].default is None
    assert sglang_source.is_async(MANAGER, "TokenizerManager.release_memory_occupation")
    io = sglang_source.io_struct
    init = io.InitWeightsUpdateGroupReqInput(master_address="h", master_port=1, rank_offset=1, world_size=3)
    assert (init.group_name, init.backend, init.rid) == ("weight_update_group", "nccl", None)  # sglang's defaults
    with pytest.raises(TypeError, match="missing a required argument: 'world_size'"):
        io.InitWeightsUpdateGroupReqInput(master_address="h", master_port=1, rank_offset=1)
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'tag'"):
        io.ReleaseMemoryOccupationReqInput(tag=["weights"])
    with pytest.raises(TypeError, match="too many positional arguments"):
        io.ResumeMemoryOccupationReqInput(["weights"])  # msgspec kw_only: keywords only
    # the real ServerArgs is built in a child process (tests/generation/test_sglang.py); its signature is not read here


def test_the_recording_fakes_stand_for_sglangs_own_methods(sglang_source):
    manager = RecordingTokenizerManager(sglang_source)
    for name, method in inspect.getmembers(RecordingTokenizerManager, inspect.iscoroutinefunction):
        if not name.startswith("_") and not name.startswith("on_"):
            assert sglang_source.is_async(MANAGER, f"TokenizerManager.{name}"), name  # awaited like sglang's
    io = sglang_source.io_struct
    with pytest.raises(TypeError, match="obj must be ReleaseMemoryOccupationReqInput, got ResumeMemoryOccupation"):
        asyncio.run(manager.release_memory_occupation(io.ResumeMemoryOccupationReqInput(tags=None)))
    with pytest.raises(TypeError, match="unexpected keyword argument 'flush'"):
        asyncio.run(manager.flush_cache(flush=True))
    reply = asyncio.run(manager.flush_cache())
    assert reply.success is True and reply.sglang_name == "FlushCacheReqOutput"
    assert asyncio.run(manager.begin_weight_update(io.BeginWeightUpdateReqInput(), None)) == (True, "")
    engine = RecordingEngine(sglang_source, manager)
    with pytest.raises(TypeError, match="unexpected keyword argument 'return_logprobs'"):
        asyncio.run(engine.async_generate(input_ids=[1], return_logprobs=True))
    with pytest.raises(TypeError, match="SamplingParams.*unexpected keyword argument 'max_tokens'"):
        asyncio.run(engine.async_generate(input_ids=[1], sampling_params={"max_tokens": 4}))
    with pytest.raises(TypeError, match="unexpected keyword argument 'binary'"):
        SourceSerializer(sglang_source).serialize([1], binary=True)


def test_a_missing_release_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv(SGLANG_SOURCE_ENV, str(tmp_path))
    with pytest.raises(
        SGLangSourceMissing,
        match=r"sglang 0.5.23's release is not in .*Fix: bash scripts/install.sh "
        r"--dev",
    ):
        SGLangSource.find()
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang-0.5.22.dist-info").mkdir()
    with pytest.raises(SGLangSourceMissing, match="found sglang-0.5.22.dist-info"):
        SGLangSource.find()


def test_the_keyword_ray_adds_to_an_actor_classs_methods_need_not_be_spelled():
    # once Ray has made a class an actor class, its methods (the base class's too: rlinf's Worker.send) carry a
    # keyword-only _ray_trace_ctx for the rest of the process; a fake spelled as the library is still accepted
    import inspect

    class Library:
        def send(self, object, dst_rank, async_op=False):
            pass

    traced = inspect.signature(Library.send)
    traced = traced.replace(
        parameters=[
            *traced.parameters.values(),
            inspect.Parameter("_ray_trace_ctx", inspect.Parameter.KEYWORD_ONLY, default=None),
        ]
    )

    class Fake:
        @checked_against(traced)
        def send(self, object, dst_rank, async_op=False):
            return object

    assert Fake().send("x", 1) == "x"
    with pytest.raises(TypeError, match="is not spelled as"):

        class Misspelled:
            @checked_against(traced)
            def send(self, object, dst, async_op=False):
                pass
