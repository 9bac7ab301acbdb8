"""The `opd` config section (on-policy distillation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field

from slime_ext.config.sections import ConfigCheckError, Section


class OPDConfig(Section):
    # The teacher: an HF checkpoint (a folder with config.json, or a run directory, whose `hf/` is taken). Its
    # vocabulary must be the student's exactly: it scores the student's token ids as they are.
    teacher: str = ""  # required (checked with the run): empty is an error naming the key
    # Per-token advantage: kl_coef x (log p_teacher - log p_student) on every trained response token.
    kl_coef: float = Field(1.0, gt=0)
    # Weight of the task reward's GRPO advantage added to it (0: pure distillation).
    reward_weight: float = Field(0.0, ge=0)

    # rollout.engine: sglang only (the embedded engine holds the teacher beside the student): the teacher's own
    # engine servers, each of teacher_tp_size GPUs, on GPUs of their own ("own": the cluster gives them
    # teacher_engines x teacher_tp_size GPUs beside the trainer and the rollout engines) or on the rollout
    # engines' GPUs ("colocated": the memory plan adds the teacher's weights and KV pool to each engine GPU).
    teacher_engines: int = Field(1, ge=1)
    teacher_tp_size: int = Field(1, ge=1)
    teacher_placement: Literal["own", "colocated"] = "own"
    teacher_mem_fraction_static: float = Field(0.85, gt=0, lt=1)  # SGLang's --mem-fraction-static of a teacher
    # The teacher's architecture for a plan made where its checkpoint is absent (a model YAML fragment, e.g.
    # configs/models/qwen3-32b.yaml); the checkpoint's config.json wins where it exists.
    teacher_model_config: Optional[str] = None

    def check_run(self, config: Any) -> None:
        """A teacher is named; the server-only keys are set only for engine servers; a teacher whose
        vocabulary differs from the student's tokenizer (where both are on this machine) is refused."""
        if not self.teacher.strip():
            raise ConfigCheckError("opd.teacher is empty: name the teacher's HF checkpoint or a run directory (its "
                                   "hf/ is taken), e.g. opd.teacher=runs/<grpo run>", ("opd.teacher",))
        if config.rollout.engine != "sglang":
            defaults = OPDConfig(teacher="x")
            for key in SERVER_KEYS:
                if getattr(self, key) != getattr(defaults, key):
                    raise ConfigCheckError(
                        f"opd.{key} = {getattr(self, key)!r} applies to the teacher's engine servers "
                        f"(rollout.engine: sglang); with rollout.engine = {config.rollout.engine!r} the engine holds "
                        f"the teacher beside the student: leave opd.{key} at its default", (f"opd.{key}",))
        elif self.teacher_placement == "colocated":
            total = config.sglang.mem_fraction_static + self.teacher_mem_fraction_static
            if total > MAX_SHARED_FRACTION:
                raise ConfigCheckError(
                    f"opd.teacher_placement = colocated: sglang.mem_fraction_static + opd.teacher_mem_fraction_static"
                    f" = {config.sglang.mem_fraction_static} + {self.teacher_mem_fraction_static} = {total:.2f} of "
                    f"each engine GPU, above {MAX_SHARED_FRACTION}: lower one of them",
                    ("opd.teacher_mem_fraction_static", "sglang.mem_fraction_static"))
        if self.teacher_model_config is not None and not Path(self.teacher_model_config).is_file():
            raise ConfigCheckError(f"opd.teacher_model_config = {self.teacher_model_config}: no such file",
                                   ("opd.teacher_model_config",))
        problem = teacher_vocabulary_problem(self.teacher, config.tokenizer.path, config.model.hf_path)
        if problem:
            raise ConfigCheckError(problem, ("opd.teacher", "tokenizer.path"))


SERVER_KEYS = ("teacher_engines", "teacher_tp_size", "teacher_placement", "teacher_mem_fraction_static")
MAX_SHARED_FRACTION = 0.9  # two SGLang servers on one GPU: what their static pools may take together


def teacher_vocabulary_problem(teacher: str, tokenizer_path: str, student_hf: Optional[str]) -> Optional[str]:
    """Why the teacher cannot score the student's token ids (its tokenizer's vocabulary is not the student's),
    when both tokenizers are on this machine: the student's is `tokenizer.path` (or the student checkpoint's);
    the embedded tokenizer is trained by the run from its data, so that pair is compared when the run starts."""
    from slime_ext.methods.opd.method import teacher_dir

    student = next((p for p in (tokenizer_path, student_hf) if p and p != "embedded" and Path(p).is_dir()), None)
    teacher_path = Path(teacher_dir(teacher))
    if student is None or not (teacher_path / "config.json").is_file():
        return None
    from sglang_patches.tandem import check_same_vocabulary
    from slime_ext.tokenizer import load_tokenizer

    try:
        check_same_vocabulary(load_tokenizer(student).get_vocab(), load_tokenizer(str(teacher_path)).get_vocab())
    except ValueError as exc:
        return f"opd.teacher = {teacher}: its tokenizer is not the student's ({student}): {exc}"
    return None
