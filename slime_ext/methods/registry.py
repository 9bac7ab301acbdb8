"""The method registry: one line per method, its manifest: the method class, the config sections it reads,
the modules that register its engine-side samplers, and the extra evaluations and metrics it reports.

Entries are import paths, so reading the registry (the config loader does, to compose a run's config schema;
servers do, to know which sampler modules they may import) imports no method code. A method package
holds `method.py` (its hooks) and, if it has settings of its own, `config.py` (its section); an engine-side
sampler is a module of `sglang_patches` named in `samplers`. The server, the engines and evaluation learn about
a method only from here. A run's config holds the run-wide sections and its own entry's `sections` only, so an
entry declares every section its method, samplers and evaluations read: composition stays composition (DUET on
Tandem declares both sections and both samplers), and an entry that lists Tandem's axes evaluation declares its
`tandem_axes` section.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class MethodEntry:
    method: str  # "package.module:Class"
    # config key -> "package.module:SectionModel": every section this method's code, samplers and evaluations read
    # (a run's config holds the run-wide sections and these only; another method's section is an error)
    sections: dict[str, str] = field(default_factory=dict)
    # modules whose import registers the method's engine-side samplers (`@register_sampler`): engines and
    # servers import them by these names, and a server imports no module a request names unless it is here
    samplers: tuple[str, ...] = ()
    # evaluations after training: "module:function", called as function(method, final_dir, start_dir, run_dir,
    # eval_rows, load_engine); each decides from the run's config whether it applies
    evaluations: tuple[str, ...] = ()
    # per-response metrics of the evaluation: "module:function", function(tokenizer, output_ids) -> {name: value}
    response_metrics: Optional[str] = None
    # request extensions the engine server offers on its OpenAI routes: body field -> "module:Class", built as
    # Class(tokenizer) (SxS's `speak_only` stream); the server knows them only from here
    serving: dict[str, str] = field(default_factory=dict)
    # extra evaluations of `tools/eval_checkpoint.py`: flag name -> "module:function", each a `--NAME ARG` option
    # called as function(checkpoint, ARG, tokenizer, rows, config, out_path, load_engine) (Tandem's axes)
    checkpoint_evaluations: dict[str, str] = field(default_factory=dict)
    # tools the method lends to the `tools` environment (docs/environments.md): tool name -> "module:Class" (a
    # slime_ext.envs.toolbox.Tool built as Class(method) by `Method.env_tools`, so it shares the method's state:
    # DA-GRPO's cloud client and its calls of the step); `rollout.env_settings.tools` may name it in this
    # method's runs only
    tools: dict[str, str] = field(default_factory=dict)


_TANDEM = {"tandem": "slime_ext.methods.tandem.config:TandemConfig"}
_DUET = {"duet": "slime_ext.methods.duet.config:DuetConfig"}
_DAGRPO = {"dagrpo": "slime_ext.methods.dagrpo.config:DAGRPOConfig"}
_SXS = {"sxs": "slime_ext.methods.sxs.config:SxSConfig"}
# handoff robustness, drift and legibility against the junior, when `tandem_axes.enabled` is on (the Tandem study
# turns it on for its GRPO arm too, so every GRPO-family method offers it, and declares the section it reads)
_AXES = ("slime_ext.methods.tandem.eval_axes:final_evaluation",)
_AXES_SECTION = {"tandem_axes": "slime_ext.methods.tandem.config:TandemAxesConfig"}
_JUNIOR = {"tandem-junior": "slime_ext.methods.tandem.eval_axes:checkpoint_evaluation"}
_SPEAK = {"speak_only": "slime_ext.methods.sxs.serving:SpeakOnlyStream"}
_CLOUD = {"cloud": "slime_ext.methods.dagrpo.cloud_tool:CloudTool"}
# the per-prompt ask probability from K sampled answers (eval_checkpoint --dagrpo-ask-samples K)
_ASK = {"dagrpo-ask-samples": "slime_ext.methods.dagrpo.ask_probability:checkpoint_evaluation"}

METHODS: dict[str, MethodEntry] = {
    # plain GRPO reports the SxS latency metrics of its chain of thought (the SxS study's CoT arm)
    "grpo": MethodEntry("slime_ext.methods.grpo.method:GRPO", _AXES_SECTION, evaluations=_AXES,
                        response_metrics="slime_ext.methods.sxs.metrics:cot_response_metrics"),
    "dapo": MethodEntry("slime_ext.methods.dapo.method:DAPO",
                        {"dapo": "slime_ext.methods.dapo.config:DapoConfig"} | _AXES_SECTION, evaluations=_AXES),
    "tandem": MethodEntry("slime_ext.methods.tandem.method:Tandem", _TANDEM | _AXES_SECTION, ("sglang_patches.tandem",),
                          _AXES, checkpoint_evaluations=_JUNIOR),
    "tandem_klreg": MethodEntry("slime_ext.methods.tandem.method:TandemKLReg", _TANDEM | _AXES_SECTION,
                                evaluations=_AXES, checkpoint_evaluations=_JUNIOR),
    "duet": MethodEntry("slime_ext.methods.duet.method:Duet", _DUET | _AXES_SECTION, ("sglang_patches.duet",), _AXES),
    "duet_tandem": MethodEntry("slime_ext.methods.duet_tandem.method:DuetTandem", _DUET | _TANDEM | _AXES_SECTION,
                               ("sglang_patches.duet", "sglang_patches.tandem"), _AXES),
    "sxs_sft": MethodEntry("slime_ext.methods.sxs.method:SxS", _SXS | _AXES_SECTION, ("sglang_patches.sxs",), _AXES,
                           serving=_SPEAK),
    "sxs_rl": MethodEntry("slime_ext.methods.sxs.method:SxS", _SXS | _AXES_SECTION, ("sglang_patches.sxs",), _AXES,
                          serving=_SPEAK),
    "dagrpo": MethodEntry("slime_ext.methods.dagrpo.method:DAGRPO", _DAGRPO | _AXES_SECTION, ("sglang_patches.dagrpo",),
                          _AXES, checkpoint_evaluations=_ASK, tools=_CLOUD),
    "opd": MethodEntry("slime_ext.methods.opd.method:OPD", {"opd": "slime_ext.methods.opd.config:OPDConfig"}
                       | _AXES_SECTION, evaluations=_AXES),
    "collab_grpo": MethodEntry("slime_ext.methods.dagrpo.method:CollabGRPO", _DAGRPO | _AXES_SECTION,
                               ("sglang_patches.dagrpo",), _AXES, checkpoint_evaluations=_ASK, tools=_CLOUD),
}


def load_object(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def register_method(name: str, entry: MethodEntry) -> None:
    """Add a method at run time (tests, plugins); `slime_ext.config.schema.config_model(name)` then composes its
    config and `load_config` accepts `method: name`."""
    METHODS[name] = entry


def all_sections_paths() -> dict[str, str]:
    """Every registered config section: key -> "module:Model" (a key shared by methods must name one model)."""
    paths: dict[str, str] = {}
    for name, entry in METHODS.items():
        for key, path in entry.sections.items():
            if paths.setdefault(key, path) != path:
                raise ValueError(f"config section {key!r}: method {name!r} registers {path}, another {paths[key]}")
    return paths


def all_sections() -> dict[str, type]:
    """Every registered config section: key -> pydantic model (imported now)."""
    return {key: load_object(path) for key, path in all_sections_paths().items()}


def sampler_modules() -> list[str]:
    """Every registered method's sampler modules (the only modules engines and servers import for samplers)."""
    return sorted({module for entry in METHODS.values() for module in entry.samplers})


def _named_extensions(field_name: str) -> dict[str, str]:
    """Every registered entry's `field_name` extensions, name -> path (one path per name)."""
    out: dict[str, str] = {}
    for method, entry in METHODS.items():
        for name, path in getattr(entry, field_name).items():
            if out.setdefault(name, path) != path:
                raise ValueError(f"{field_name} {name!r}: method {method!r} registers {path}, another {out[name]}")
    return out


def serving_extensions() -> dict[str, str]:
    """Request extensions of the engine server's OpenAI routes, body field -> "module:Class"."""
    return _named_extensions("serving")


def checkpoint_evaluations() -> dict[str, str]:
    """Extra evaluations of `eval_checkpoint`, flag name -> "module:function"."""
    return _named_extensions("checkpoint_evaluations")


def lent_tools() -> dict[str, str]:
    """Tools the registered methods lend to the `tools` environment, tool name -> "module:Class"."""
    return _named_extensions("tools")


def method_tools(name: str) -> dict[str, str]:
    """The tools method `name` lends (none for an unregistered name)."""
    entry = METHODS.get(name)
    return dict(entry.tools) if entry is not None else {}


def run_method_tools(config: Any) -> dict[str, str]:
    """The tools the configured method lends (what a run's environment offers beside its own)."""
    return dict(_entry(config).tools)


def run_sampler_modules(config: Any) -> list[str]:
    """The configured method's sampler modules (what the driver declares to the engines it starts)."""
    return list(_entry(config).samplers)


def evaluations(name: str) -> list[Any]:
    """The registered method `name`'s evaluation functions after training (imported now)."""
    return [load_object(path) for path in METHODS[name].evaluations] if name in METHODS else []


def response_metrics(name: str) -> Optional[Any]:
    """The registered method `name`'s per-response metric function, or None."""
    entry = METHODS.get(name)
    return load_object(entry.response_metrics) if entry is not None and entry.response_metrics else None


def method_name(config: Any) -> str:
    return config.method


def _entry(config: Any) -> MethodEntry:
    if config.method not in METHODS:
        raise ValueError(f"method {config.method!r} is not registered (registered: {sorted(METHODS)})")
    return METHODS[config.method]


def method_sections(config: Any) -> list[str]:
    """The config sections the configured method reads."""
    return list(_entry(config).sections)


def method_class(config: Any) -> type:
    """The configured method's class, a `slime_ext.methods.base.Method` (class-level facts such as the engine's
    models need no instance). Typed loosely on purpose: base.py imports this module, and this one imports no
    method code, not even for types (tests/test_import_rules.py: no import cycles)."""
    return load_object(_entry(config).method)


def data_transform(config: Any) -> Any:
    """The synthetic-row transform one of the configured method's sections asks for (at most one), or None."""
    found = [(key, fn) for key in method_sections(config)
             if (fn := getattr(config, key).data_transform(config)) is not None]
    if len(found) > 1:
        raise ValueError(f"config sections {[k for k, _ in found]} each rewrite the data rows; enable one")
    return found[0][1] if found else None


def build_method(config: Any, tokenizer: Optional[Any] = None) -> Any:
    """The configured method (a `slime_ext.methods.base.Method`); its `name` is the registered name (one class may
    serve several names)."""
    method = method_class(config)(config, tokenizer)
    method.name = config.method
    return method
