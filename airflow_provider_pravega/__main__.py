"""``python -m airflow_provider_pravega <command>``: the provider's own command line.

Commands: ``state`` (list, inspect and reset the ingest and export state kept in Pravega, find
orphans: :mod:`airflow_provider_pravega.state_admin`)."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {"state": "airflow_provider_pravega.state_admin"}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        print(f"usage: python -m airflow_provider_pravega {{{','.join(COMMANDS)}}} ...\n"
              f"  state   list, inspect and reset the ingest and export state in Pravega; find orphans",
              file=sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    return importlib.import_module(COMMANDS[args[0]]).main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
