"""The registry entry is a method's manifest (issue 29, item 1): its sampler modules are the only ones engines
and servers import for samplers, and its evaluations and per-response metrics are what evaluation runs."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_patches.request_sampler import SAMPLER_REGISTRY, build_sampler, import_sampler_modules
from slime_ext.methods import registry
from slime_ext.methods.base import Method
from slime_ext.methods.registry import MethodEntry
from slime_ext.serving.errors import APIError
from slime_ext.serving.native_routes import _register_samplers


def test_the_sampler_modules_are_the_ones_the_entries_declare():
    assert registry.sampler_modules() == ["sglang_patches.dagrpo", "sglang_patches.duet", "sglang_patches.sxs",
                                          "sglang_patches.tandem"]
    assert registry.METHODS["duet_tandem"].samplers == ("sglang_patches.duet", "sglang_patches.tandem")
    assert registry.METHODS["grpo"].samplers == ()


@pytest.mark.parametrize("name", ["os", "sglang_patches.decoding", "slime_ext.orchestration.driver"])
def test_a_module_no_method_declares_is_never_imported(name):
    with pytest.raises(ValueError, match=f"sampler module '{name}' is not declared by any registered method"):
        import_sampler_modules([name])
    with pytest.raises(APIError) as err:  # the server's /generate: a 400 naming the module
        _register_samplers([{"kind": "no_such_kind"}], [name])
    assert err.value.status == 400 and name in err.value.message


@pytest.fixture
def plugin_method(tmp_path, monkeypatch):
    """A method registered at run time whose sampler lives in a module of its own (not yet imported)."""
    module = "plugin_sampler_for_manifest_test"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent('''
        from sglang_patches.request_sampler import Sampler, register_sampler

        @register_sampler
        class PluginSampler(Sampler):
            kind = "plugin_kind_for_manifest_test"
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.METHODS, "plugin", MethodEntry("slime_ext.methods.grpo.method:GRPO",
                                                                samplers=(module,)))
    yield module
    SAMPLER_REGISTRY.pop("plugin_kind_for_manifest_test", None)
    sys.modules.pop(module, None)


def test_a_registered_methods_sampler_module_is_imported_by_name(plugin_method):
    assert plugin_method in registry.sampler_modules() and plugin_method not in sys.modules
    _register_samplers([{"kind": "plugin_kind_for_manifest_test"}], [plugin_method])
    assert type(build_sampler({"kind": "plugin_kind_for_manifest_test"}, 0)).__name__ == "PluginSampler"


def test_building_an_unknown_kind_imports_every_registered_sampler_module(plugin_method):
    """An engine process that never imported the method code builds its samplers from specs."""
    assert plugin_method not in sys.modules
    assert type(build_sampler({"kind": "plugin_kind_for_manifest_test"}, 0)).__name__ == "PluginSampler"


calls: list[tuple] = []


def recording_evaluation(method, final_dir, start_dir, run_dir, eval_rows, load_engine):
    calls.append((method.name, final_dir, start_dir, run_dir, len(eval_rows), load_engine))


def token_count_metrics(tokenizer, output_ids):
    return {"tokens": float(len(output_ids)), "tokenizer_given": float(tokenizer == "tok")}


def test_evaluation_and_metrics_come_from_the_entry(monkeypatch):
    here = __name__
    monkeypatch.setitem(registry.METHODS, "plugin", MethodEntry(
        "slime_ext.methods.grpo.method:GRPO", evaluations=(f"{here}:recording_evaluation",) * 2,
        response_metrics=f"{here}:token_count_metrics"))
    method = Method(SimpleNamespace(), tokenizer="tok")
    method.name = "plugin"
    calls.clear()
    method.final_evaluations(Path("f"), Path("s"), Path("r"), [{}, {}, {}], print)
    assert calls == [("plugin", Path("f"), Path("s"), Path("r"), 3, print)] * 2
    metrics = method.eval_options()["response_metrics"]
    assert metrics(SimpleNamespace(output_ids=[4, 5, 6])) == {"tokens": 3.0, "tokenizer_given": 1.0}
    method.name = "dapo"  # an entry without metrics or with the default evaluations only
    assert method.eval_options() == {}
    assert registry.response_metrics("grpo").__name__ == "cot_response_metrics"
    assert [f.__name__ for f in registry.evaluations("tandem")] == ["final_evaluation"]


def test_tools_learn_method_extensions_from_the_registry(monkeypatch):
    """eval_checkpoint's --tandem-junior, --dagrpo-ask-samples and the server's speak_only come from the Tandem,
    DA-GRPO and SxS entries."""
    from slime_ext.serving.state import BadRequest, ServerState
    from slime_ext.tools.eval_checkpoint import build_parser
    from tests.serving.serve_stub import StubEngine

    assert registry.checkpoint_evaluations() == {
        "tandem-junior": "slime_ext.methods.tandem.eval_axes:checkpoint_evaluation",
        "dagrpo-ask-samples": "slime_ext.methods.dagrpo.ask_probability:checkpoint_evaluation"}
    assert registry.serving_extensions() == {"speak_only": "slime_ext.methods.sxs.serving:SpeakOnlyStream"}
    assert build_parser().parse_args(["ckpt", "--tandem-junior", "J"]).extra_tandem_junior == "J"
    assert build_parser().parse_args(["ckpt", "--dagrpo-ask-samples", "8"]).extra_dagrpo_ask_samples == "8"
    monkeypatch.setitem(registry.METHODS, "plugin", MethodEntry("slime_ext.methods.grpo.method:GRPO",
                                                                checkpoint_evaluations={"my-eval": f"{__name__}:f"}))
    assert build_parser().parse_args(["ckpt", "--my-eval", "x"]).extra_my_eval == "x"
    engine = StubEngine()
    state = ServerState(engine, engine.tokenizer, "stub", max_tokens=8)
    try:
        with pytest.raises(BadRequest, match="no_such_field: no registered method offers this extension"):
            state.extension("no_such_field")
    finally:
        state.batcher.close()
