"""kvpoolctl: inspect a kvpool cluster, drain its nodes, and move single blocks in and out of it.

Commands:
  status                      one row per node: id, state, endpoints, DRAM use, hit rate, uptime;
                              with --etcd, every node registered in etcd and the cluster config
  stats [NODE]                every counter and tier of each node (NODE: address or node id)
  drain NODE [--handoff] [--wait]
                              stop NODE taking writes (it keeps serving reads); --handoff copies
                              its blocks to their next owners; --wait returns when that is done
  undrain NODE                let a draining NODE take writes again
  config get                  the cluster config in etcd
  config set KEY=VALUE ...    change replicas, write_quorum or block_size (compare-and-swap)
  watch [--count N]           print membership changes as they happen, until Ctrl-C, N changes,
                              or --timeout seconds; --json: one object a line, the first a snapshot
  put FILE --key HEX|--name TEXT --namespace NS
                              store a file's bytes as one block
  get --key HEX|--name TEXT --namespace NS -o FILE|-
                              fetch one block into a file, or stdout with -o -
  rm --key HEX|--name TEXT --namespace NS
                              delete one block
  flush --namespace NS|--model M  delete every block of a namespace, or of a model, on every node
  namespaces                  blocks and bytes of each namespace, per tier, over the nodes
  tenants                     each tenant's namespaces, rights, quotas and use, over the nodes
  lookup TOKEN_FILE --namespace-model M --dtype D --layout L --block-size N
                              how many leading blocks of a token sequence are in the pool
  top [--interval S] [--count N]
                              live per-node view: use, hit rate, requests/s, bytes/s
  completion bash|zsh         print a shell completion script

Every command takes --nodes or --etcd/--cluster, --timeout and --json (machine-readable
output on stdout). With --etcd the nodes are those registered in etcd, and --nodes is
ignored; config and watch need --etcd. Errors are one line on stderr that says what to do.
Nodes that require the cluster's token get it from --auth-token-file (or $KVPOOL_AUTH_TOKEN_FILE);
a TLS gRPC port is trusted through $KVPOOL_TLS_CA_FILE (and $KVPOOL_TLS_CLIENT_CERT_FILE,
$KVPOOL_TLS_CLIENT_KEY_FILE for mTLS); etcd over TLS (https:// endpoints) through
$KVPOOL_ETCD_CA_FILE (and $KVPOOL_ETCD_CERT_FILE, $KVPOOL_ETCD_KEY_FILE).

Exit codes:
  0  success
  1  unexpected error (rerun with --debug for a traceback)
  2  usage error: bad arguments, an unreadable input file, an invalid config,
     or a state change the node refuses
  3  a node is unreachable or did not answer within --timeout (or etcd is)
  4  not found: no such block (get, rm), node id (stats, drain) or config
  5  timed out: drain --wait or watch --count did not finish in time

Environment:
  KVPOOL_NODES              default for --nodes (host:port[,host:port])
  KVPOOL_ETCD_ENDPOINTS     default for --etcd (host:port[,host:port])
  KVPOOL_CLUSTER            default for --cluster (default: default)
  KVPOOL_REQUEST_TIMEOUT_S  default for --timeout, in seconds
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from kvpool_client.admin import blocks, cluster, completion, drain, top, watch
from kvpool_client.admin.exits import CliError, ExitCode, from_kvpool_error
from kvpool_client.admin.inputs import (
    cluster_arg,
    etcd_arg,
    hex_key_arg,
    nodes_arg,
    non_negative_int_arg,
    positive_float_arg,
    positive_int_arg,
    setting_arg,
)
from kvpool_client.core.auth import Credentials, read_token
from kvpool_client.core.config import CLIENT_SCHEMA, etcd_tls_from_env, tls_from_env
from kvpool_client.core.errors import KVPoolError
from kvpool_client.core.version import package_version

PROG = "kvpoolctl"
DEFAULT_NODES = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = "5"
DEFAULT_CLUSTER = "default"
DEFAULT_WAIT_S = 60.0
_EPILOG = __doc__[__doc__.index("Exit codes:") :]


def _add_common(parser: argparse.ArgumentParser, top: bool) -> None:
    """The options every command takes, before or after the command name.

    On subcommands the defaults are SUPPRESS, so an option given before the
    command is not overwritten by the subcommand's default.
    """

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    def help_text(key: str, fallback: object = None) -> str:
        spec = CLIENT_SCHEMA.settings[key]
        return f"{spec.help} (default: ${spec.env_name}{f' or {fallback}' if fallback else ''})"

    parser.add_argument(
        "--nodes",
        type=nodes_arg,
        metavar="HOST:PORT[,...]",
        default=default(_env_text("nodes") or DEFAULT_NODES),
        help=help_text("nodes", DEFAULT_NODES),
    )
    parser.add_argument(
        "--etcd",
        type=etcd_arg,
        metavar="HOST:PORT[,...]",
        default=default(_env_text("etcd_endpoints")),
        help=help_text("etcd_endpoints") + "; --nodes is then ignored",
    )
    parser.add_argument(
        "--cluster",
        type=cluster_arg,
        metavar="NAME",
        default=default(_env_text("cluster") or DEFAULT_CLUSTER),
        help=help_text("cluster", DEFAULT_CLUSTER),
    )
    # None until resolved in main(): watch reads an explicit --timeout as how long to watch.
    parser.add_argument(
        "--timeout",
        type=positive_float_arg,
        metavar="SECONDS",
        default=default(None),
        help=f"most seconds to wait for a node or etcd (default: ${_env_name('request_timeout_s')} or "
        f"{DEFAULT_TIMEOUT_S}); for watch: stop after this many seconds",
    )
    parser.add_argument(
        "--auth-token-file",
        metavar="PATH",
        default=default(_env_text("auth_token_file")),
        help=help_text("auth_token_file"),
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="print machine-readable JSON on stdout"
    )
    parser.add_argument(
        "--debug", action="store_true", default=default(False), help="print a traceback on unexpected errors"
    )


def _env_name(key: str) -> str:
    return CLIENT_SCHEMA.settings[key].env_name


def _env_text(key: str) -> str | None:
    """The text of client setting ``key``'s variable, if set: the flag's type checks it as it checks the flag."""
    return os.environ.get(_env_name(key), "").strip() or None


def _add_key(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", type=hex_key_arg, metavar="HEX", help="the block hash in hex")
    which.add_argument("--name", metavar="TEXT", help="use the sha256 of TEXT as the block hash")
    parser.add_argument("--namespace", required=True, metavar="NS", help="the namespace the block is stored under")


def build_parser() -> argparse.ArgumentParser:
    """The kvpoolctl argument parser; each command sets ``run`` to its handler."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect a kvpool cluster, drain its nodes, and move single blocks in and out of it.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}")
    _add_common(parser, top=True)
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, top=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            parents=[common],
            help=help_text,
            description=help_text + ".",
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    status = command(
        "status",
        "show one row per node (with --etcd: every registered node and the config); exit 3 if any node is unreachable",
    )
    status.set_defaults(run=cluster.run_status)

    stats = command("stats", "show every counter and tier of each node")
    stats.add_argument("node", nargs="?", metavar="NODE", help="only this node: an address or a node id")
    stats.set_defaults(run=cluster.run_stats)

    names = command("namespaces", "show the blocks and bytes of each namespace, per tier, over the nodes")
    names.set_defaults(run=cluster.run_namespaces)

    tenants = command("tenants", "show each tenant's rights, quotas and use, over the nodes (an admin call)")
    tenants.set_defaults(run=cluster.run_tenants)

    _add_cluster_commands(command, common)

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

    flush = command("flush", "delete every block of a namespace, or of every namespace of a model, on every node")
    which = flush.add_mutually_exclusive_group(required=True)
    which.add_argument("--namespace", metavar="NS", help="the namespace id to empty (model@dtype@layout@tpRofS)")
    which.add_argument("--model", metavar="M", help="empty every namespace of this model (every dtype, layout, rank)")
    flush.set_defaults(run=blocks.run_flush)

    _add_lookup(command("lookup", "count the leading blocks of a token sequence that are in the pool"))

    top_cmd = command("top", "live per-node view (use, hit rate, requests/s), refreshed until Ctrl-C")
    top.add_arguments(top_cmd)
    top_cmd.set_defaults(run=top.run_top)

    completion_cmd = command("completion", "print a shell completion script: source <(kvpoolctl completion bash)")
    completion.add_arguments(completion_cmd)
    completion_cmd.set_defaults(run=completion.run_completion, parser=parser)
    return parser


def _add_cluster_commands(
    command: Callable[[str, str], argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    node_help = "a node id (looked up in etcd, or among --nodes) or a control address host:port"
    drain_cmd = command("drain", "stop a node taking writes; it keeps serving reads")
    drain_cmd.add_argument("node", metavar="NODE", help=node_help)
    drain_cmd.add_argument(
        "--handoff", action="store_true", help="copy the node's blocks to the nodes that own them next"
    )
    _add_wait(drain_cmd, "until etcd shows the node draining and the hand-off is done")
    drain_cmd.set_defaults(run=drain.run_drain)

    undrain = command("undrain", "let a draining node take writes again")
    undrain.add_argument("node", metavar="NODE", help=node_help)
    _add_wait(undrain, "until etcd shows the node active")
    undrain.set_defaults(run=drain.run_undrain)

    config = command("config", "read or change the cluster config in etcd")
    actions = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    get = actions.add_parser("get", parents=[common], help="print the config; exit 4 if none is stored")
    get.set_defaults(run=cluster.run_config_get)
    set_ = actions.add_parser("set", parents=[common], help="change settings; exit 2 if the result is invalid")
    set_.add_argument(
        "settings",
        nargs="+",
        type=setting_arg,
        metavar="KEY=VALUE",
        help="replicas, write_quorum or block_size, e.g. replicas=2 write_quorum=1",
    )
    set_.set_defaults(run=cluster.run_config_set)

    watch_cmd = command("watch", "print membership changes as they happen (stop with Ctrl-C)")
    watch_cmd.add_argument(
        "--count", type=positive_int_arg, metavar="N", help="stop after N changes (exit 5 if --timeout ends first)"
    )
    watch_cmd.set_defaults(run=watch.run_watch)


def _add_wait(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--wait", action="store_true", help=f"wait {what}")
    parser.add_argument(
        "--wait-timeout",
        type=positive_float_arg,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"with --wait, give up (exit 5) after this long (default: {DEFAULT_WAIT_S:g})",
    )


def _add_lookup(lookup: argparse.ArgumentParser) -> None:
    lookup.add_argument(
        "token_file",
        metavar="TOKEN_FILE",
        help="token ids: a JSON list, or integers separated by whitespace or commas; - for stdin",
    )
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
    # Library warnings (an etcd outage, a retry) would interleave with the output; --debug shows them.
    logging.getLogger("kvpool").setLevel(logging.DEBUG if args.debug else logging.ERROR)
    try:
        _settle_timeout(args)
        token = read_token(args.auth_token_file) if args.auth_token_file else None
        args.credentials = Credentials(token, tls_from_env(os.environ))
        args.etcd_tls = etcd_tls_from_env(os.environ)
        return int(args.run(args))
    except (CliError, KVPoolError) as exc:
        error = exc if isinstance(exc, CliError) else from_kvpool_error(exc)
        return _fail(error.with_token_sent(args.auth_token_file) if args.auth_token_file else error)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); point stdout at /dev/null so the final flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.ERROR
    except Exception as exc:  # the last line of defence: one line, exit 1
        if args.debug:
            traceback.print_exc()
        hint = "" if args.debug else " (rerun with --debug for a traceback)"
        return _fail(CliError(ExitCode.ERROR, f"unexpected error: {type(exc).__name__}: {exc}{hint}"))


def _settle_timeout(args: argparse.Namespace) -> None:
    """Set ``args.timeout`` (per request) and, for watch, ``args.duration`` (None: until Ctrl-C).

    Raises:
        CliError: USAGE if KVPOOL_REQUEST_TIMEOUT_S is not a positive number.
    """
    given = args.timeout
    if args.command == "watch":
        args.duration, given = given, None
    if given is None:
        text = _env_text("request_timeout_s") or DEFAULT_TIMEOUT_S
        try:
            given = positive_float_arg(text)
        except argparse.ArgumentTypeError as exc:
            raise CliError(ExitCode.USAGE, f"{_env_name('request_timeout_s')}: {exc}") from None
    args.timeout = given


def _fail(error: CliError) -> int:
    print(f"{PROG}: error: {error.message}", file=sys.stderr)
    return int(error.code)


if __name__ == "__main__":
    sys.exit(main())
