"""`python -m slime_ext.config --check CONFIG [key=value ...]`: validate and print the resolved config."""

from __future__ import annotations

import argparse
import sys

from slime_ext.config.loader import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slime_ext.config", description=__doc__)
    parser.add_argument("--check", metavar="CONFIG", required=True, help="YAML config to validate")
    parser.add_argument("overrides", nargs="*", help="a.b.c=value overrides")
    args = parser.parse_args(argv)
    try:
        resolved = load_config(args.check, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(resolved.to_yaml())
    print(f"# OK: {args.check} is valid (method={resolved.config.method})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
