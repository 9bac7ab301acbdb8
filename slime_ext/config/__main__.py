"""`python -m slime_ext.config --check CONFIG [key=value ...]`: validate and print the resolved config; a cluster
layout that cannot be built or does not fit in memory (slime_ext.orchestration.plan) is an error too."""

from __future__ import annotations

import argparse
import sys

from slime_ext.config.loader import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slime_ext.config", description=__doc__)
    parser.add_argument("--check", metavar="CONFIG", required=True, help="YAML config to validate")
    parser.add_argument("overrides", nargs="*", help="a.b.c=value overrides")
    args = parser.parse_args(argv)
    from slime_ext.orchestration.plan import build_plan
    from slime_ext.orchestration.plan_layout import PlanError

    from slime_ext.engine.sync_requirements import missing_sync_package

    try:
        resolved = load_config(args.check, args.overrides)
        plan = build_plan(resolved.config)
    except (ConfigError, PlanError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = missing_sync_package(resolved.config)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    if plan.memory_problems:
        print("error: the layout does not fit (python -m slime_ext.orchestration.plan prints every term):\n  "
              + "\n  ".join(plan.memory_problems), file=sys.stderr)
        return 3
    sys.stdout.write(resolved.to_yaml())
    if resolved.config.rollout.engine == "sglang":
        sglang = resolved.config.sglang
        print(f"# weight sync: {sglang.weight_sync} ({sglang.weight_sync_reason(resolved.config.cluster.colocate)})", file=sys.stderr)
    print(f"# OK: {args.check} is valid (method={resolved.config.method})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
