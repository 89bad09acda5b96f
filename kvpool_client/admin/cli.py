"""kvpoolctl: inspect a kvpool cluster and move single blocks in and out of it.

Commands:
  status                      one row per node: id, state, endpoints, DRAM use, hit rate, uptime
  stats [NODE]                every counter and tier of each node (NODE: address or node id)
  put FILE --key HEX|--name TEXT --namespace NS
                              store a file's bytes as one block
  get --key HEX|--name TEXT --namespace NS -o FILE|-
                              fetch one block into a file, or stdout with -o -
  rm --key HEX|--name TEXT --namespace NS
                              delete one block
  lookup TOKEN_FILE --namespace-model M --dtype D --layout L --block-size N
                              how many leading blocks of a token sequence are in the pool

Every command takes --nodes, --timeout and --json (machine-readable output on stdout).
Errors are one line on stderr that says what to do.

Exit codes:
  0  success
  1  unexpected error (rerun with --debug for a traceback)
  2  usage error: bad arguments or an unreadable input file
  3  a node is unreachable or did not answer within --timeout
  4  not found: no such block (get, rm) or node id (stats)

Environment:
  KVPOOL_NODES              default for --nodes (host:port[,host:port])
  KVPOOL_REQUEST_TIMEOUT_S  default for --timeout, in seconds
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from kvpool_client.admin import blocks, nodes
from kvpool_client.admin.exits import CliError, ExitCode, from_kvpool_error
from kvpool_client.admin.inputs import (
    hex_key_arg,
    non_negative_int_arg,
    nodes_arg,
    positive_float_arg,
    positive_int_arg,
)
from kvpool_client.errors import KVPoolError

PROG = "kvpoolctl"
DEFAULT_NODES = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = "5"
_EPILOG = __doc__[__doc__.index("Exit codes:"):]


def _add_common(parser: argparse.ArgumentParser, top: bool) -> None:
    """The options every command takes, before or after the command name.

    On subcommands the defaults are SUPPRESS, so an option given before the
    command is not overwritten by the subcommand's default.
    """
    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    env = os.environ
    parser.add_argument("--nodes", type=nodes_arg, metavar="HOST:PORT[,...]",
                        default=default(env.get("KVPOOL_NODES") or DEFAULT_NODES),
                        help=f"control addresses of the nodes (default: $KVPOOL_NODES or {DEFAULT_NODES})")
    parser.add_argument("--timeout", type=positive_float_arg, metavar="SECONDS",
                        default=default(env.get("KVPOOL_REQUEST_TIMEOUT_S") or DEFAULT_TIMEOUT_S),
                        help=f"most seconds to wait for a node (default: {DEFAULT_TIMEOUT_S})")
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print machine-readable JSON on stdout")
    parser.add_argument("--debug", action="store_true", default=default(False),
                        help="print a traceback on unexpected errors")


def _add_key(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", type=hex_key_arg, metavar="HEX", help="the block hash in hex")
    which.add_argument("--name", metavar="TEXT", help="use the sha256 of TEXT as the block hash")
    parser.add_argument("--namespace", required=True, metavar="NS", help="the namespace the block is stored under")


def build_parser() -> argparse.ArgumentParser:
    """The kvpoolctl argument parser; each command sets ``run`` to its handler."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Inspect a kvpool cluster and move single blocks in and out of it.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(parser, top=True)
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, top=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[common], help=help_text, description=help_text + ".",
                                   epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)

    status = command("status", "show one row per node; exit 3 if any node is unreachable")
    status.set_defaults(run=nodes.run_status)

    stats = command("stats", "show every counter and tier of each node")
    stats.add_argument("node", nargs="?", metavar="NODE", help="only this node: an address or a node id")
    stats.set_defaults(run=nodes.run_stats)

    put = command("put", "store a file's bytes as one block (for debugging)")
    put.add_argument("file", metavar="FILE", help="the file to store; - for stdin")
    _add_key(put)
    put.set_defaults(run=blocks.run_put)

    get = command("get", "fetch one block; exit 4 if it is not stored")
    _add_key(get)
    get.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the block; - for stdout")
    get.set_defaults(run=blocks.run_get)

    rm = command("rm", "delete one block; exit 4 if it is not stored")
    _add_key(rm)
    rm.set_defaults(run=blocks.run_rm)

    _add_lookup(command("lookup", "count the leading blocks of a token sequence that are in the pool"))
    return parser


def _add_lookup(lookup: argparse.ArgumentParser) -> None:
    lookup.add_argument("token_file", metavar="TOKEN_FILE",
                        help="token ids: a JSON list, or integers separated by whitespace or commas; - for stdin")
    lookup.add_argument("--namespace-model", required=True, metavar="M", help="model of the namespace")
    lookup.add_argument("--dtype", required=True, metavar="D", help="KV cache dtype of the namespace, e.g. fp16")
    lookup.add_argument("--layout", required=True, metavar="L", help="KV layout of the namespace")
    lookup.add_argument("--tp-rank", type=non_negative_int_arg, default=0, metavar="R", help="tensor-parallel rank")
    lookup.add_argument("--tp-size", type=positive_int_arg, default=1, metavar="S", help="tensor-parallel size")
    lookup.add_argument("--block-size", type=positive_int_arg, required=True, metavar="N", help="tokens per block")
    lookup.add_argument("--seed", default="0", help="vLLM's PYTHONHASHSEED (default: 0)")
    lookup.add_argument("--scheme", choices=("vllm", "sglang"), default="vllm", help="hash scheme (default: vllm)")
    lookup.add_argument("-v", "--verbose", action="store_true", help="also show each block's hash and presence")
    lookup.set_defaults(run=blocks.run_lookup)


def main(argv: Sequence[str] | None = None) -> int:
    """Run kvpoolctl; returns the exit code (argparse exits 2 itself on bad arguments)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except CliError as exc:
        return _fail(exc)
    except KVPoolError as exc:
        return _fail(from_kvpool_error(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); point stdout at /dev/null so the final flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.ERROR
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, exit 1
        if args.debug:
            traceback.print_exc()
        hint = "" if args.debug else " (rerun with --debug for a traceback)"
        return _fail(CliError(ExitCode.ERROR, f"unexpected error: {type(exc).__name__}: {exc}{hint}"))


def _fail(error: CliError) -> int:
    print(f"{PROG}: error: {error.message}", file=sys.stderr)
    return int(error.code)


if __name__ == "__main__":
    sys.exit(main())
