"""The credentials file: tenants' tokens, namespaces, rights and quotas; every other input refused clearly."""

from __future__ import annotations

import hashlib
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool_server.tenants.credentials import (
    CLUSTER,
    MAX_FILE_BYTES,
    Credentials,
    CredentialsError,
    Quotas,
    Right,
    Tenant,
    load_credentials,
    parse_credentials,
)
from kvpool_server.tenants.rates import Bucket
from kvpool_server.tenants.reload import CredentialsFile

TOKEN_A, TOKEN_B, CLUSTER_TOKEN = b"a" * 24, b"team-b-token-0123456789", b"cluster-token-0123456789"
TWO_TENANTS = f"""
tenants:
  team-a:
    token: {TOKEN_A.decode()}
    namespaces: ["team-a.*@*", "shared@bf16@*"]
    rights: [read, write, delete]
    quotas: {{dram: 8GiB, ssd: 100GiB, connections: 64}}
  team-b:
    token_sha256: {hashlib.sha256(TOKEN_B).hexdigest()}
    namespaces: ["team-b.llama@*"]
    rights: [read]
"""


def test_two_tenants_and_the_cluster_token() -> None:
    credentials = parse_credentials(TWO_TENANTS, CLUSTER_TOKEN)
    a, b, cluster = (credentials.tenant_of(t) for t in (TOKEN_A, TOKEN_B, CLUSTER_TOKEN))
    assert a is not None and b is not None and cluster is not None, credentials
    assert (a.name, b.name, cluster.name) == ("team-a", "team-b", CLUSTER)
    assert a.quotas == Quotas(8 << 30, 100 << 30, 64) and b.quotas == Quotas()
    assert a.may(Right.WRITE, "team-a.qwen@bf16@hnd@tp0of1") and a.may(Right.READ, "shared@bf16@nhd@tp0of1")
    assert not a.may(Right.READ, "team-b.llama@bf16@nhd@tp0of1") and not a.may(Right.ADMIN, "team-a.x@a@b@tp0of1")
    assert b.may(Right.READ, "team-b.llama@fp8@x@tp1of2") and not b.may(Right.WRITE, "team-b.llama@fp8@x@tp1of2")
    assert not b.covers("team-b.llamaX") and not b.covers("xteam-b.llama@a")  # patterns match whole ids
    assert cluster.rights == frozenset(Right) and cluster.covers("anything@at@all@tp0of1")
    assert credentials.tenant_of(b"not-a-token-of-anyone") is None
    assert [t.name for t in credentials.tenants] == [CLUSTER, "team-a", "team-b"]


def test_without_a_cluster_token_only_the_file_s_tenants_exist() -> None:
    credentials = parse_credentials(TWO_TENANTS)
    assert credentials.tenant_of(CLUSTER_TOKEN) is None and len(credentials.tenants) == 2
    assert parse_credentials("").tenants == [] and parse_credentials("tenants:\n").tenants == []


def spec(**fields: object) -> str:
    entry = {"token": TOKEN_A.decode(), "namespaces": ["a@*"], "rights": ["read"], **fields}
    return yaml.safe_dump({"tenants": {"t": {k: v for k, v in entry.items() if v is not None}}})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("tenants: [a, b]", "tenants: expected a mapping, got list"),
        ("tennants: {}", "unknown key 'tennants' (did you mean 'tenants'?)"),
        ("- a", "expected a mapping, got list"),
        ("tenants: {t: {", "not YAML"),
        ("tenants:\n  cluster: {}", "'cluster' is the cluster token's"),
        ("tenants:\n  -bad: {}", "is not a tenant name"),
        ("tenants:\n  1: {}", "1 is not a tenant name"),
        (
            spec(rights=["read", "wirte"]),
            "rights[1]: 'wirte' is not a right (read, write, delete, admin) (did you mean 'write'?)",
        ),
        (spec(rights=[]), "rights: expected a non-empty list"),
        (spec(namespaces="a@*"), "namespaces: expected a non-empty list"),
        (spec(namespaces=["a b"]), "namespaces[0]: a pattern is printable, without spaces"),
        (spec(namespaces=[3]), "namespaces[0]: expected a string, got int"),
        (spec(token=None), "exactly one of token and token_sha256"),
        (spec(token_sha256="ab" * 32), "exactly one of token and token_sha256"),
        (spec(token="short"), "token: a token is 16..1024 printable ASCII"),
        (spec(token="with space in the token"), "printable ASCII characters without spaces"),
        (spec(token=None, token_sha256="AB" * 32), "token_sha256: not 64 lowercase hex digits"),
        (spec(quotas={"dram": "lots"}), "quotas.dram: not a byte size"),
        (spec(quotas={"dram": -1}), "quotas.dram: a byte size must be >= 0"),
        (spec(quotas={"connections": "64"}), "quotas.connections: a whole number >= 0"),
        (spec(quotas={"dramm": 1}), "unknown key 'dramm' (did you mean 'dram'?)"),
        (spec(rigths=["read"]), "unknown key 'rigths' (did you mean 'rights'?)"),
        ("tenants:\n" + "".join(f"  t{i}: {{}}\n" for i in range(257)), "257 tenants, at most 256"),
    ],
)
def test_bad_files_are_refused_with_where_and_why(text: str, problem: str) -> None:
    with pytest.raises(CredentialsError) as refused:
        parse_credentials(text)
    assert problem in str(refused.value), str(refused.value)


def test_two_tenants_with_one_token_are_refused() -> None:
    twice = {"token": TOKEN_A.decode(), "namespaces": ["*"], "rights": ["read"]}
    with pytest.raises(CredentialsError, match=r"tenants\.y: the same token as x"):
        parse_credentials(yaml.safe_dump({"tenants": {"x": twice, "y": twice}}))
    with pytest.raises(CredentialsError, match="the same token as cluster"):
        parse_credentials(yaml.safe_dump({"tenants": {"x": twice}}), TOKEN_A)


def test_the_file_is_read_whole_or_refused(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(TWO_TENANTS)
    assert [t.name for t in load_credentials(path).tenants] == ["team-a", "team-b"]
    with pytest.raises(CredentialsError, match="cannot read the credentials file"):
        load_credentials(tmp_path / "absent.yaml")
    path.write_bytes(b"tenants: {\xff: 1}")
    with pytest.raises(CredentialsError, match="is not UTF-8"):
        load_credentials(path)
    path.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(CredentialsError, match="is over"):
        load_credentials(path)


# -- fuzzed ------------------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30)
documents = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
)
keywords = st.sampled_from(["tenants", "token", "token_sha256", "namespaces", "rights", "quotas", "dram", "read"])
near_valid = st.recursive(
    scalars | keywords,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keywords | st.text(max_size=8), inner, max_size=5),
)


def parses_or_refuses(text: str) -> Credentials | None:
    """The one promise about any input: tenants, or :class:`CredentialsError`; nothing else escapes."""
    try:
        return parse_credentials(text)
    except CredentialsError as exc:
        assert str(exc)
        return None


yaml_pieces = st.sampled_from(
    [
        "tenants:",
        "\n  t:",
        " {token: ",
        "2020-13-01",
        "!!int ",
        "!!float ",
        "!!binary ",
        "!!timestamp ",
        "&a ",
        "*a",
        "- ",
        "[",
        "{",
        "}",
        "]",
        ": ",
        "0x",
        "1e999",
        "!!python/name:os.system",
        "? ",
        "|\n",
        "'",
        '"',
        "\t",
        "#",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.printable + "{}[]:-'\"&*!|>%@`\u00e9\u2028", max_size=200))
def test_any_text_parses_or_is_refused(text: str) -> None:
    parses_or_refuses(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(yaml_pieces | st.text(max_size=5), max_size=30))
def test_any_yaml_shaped_text_parses_or_is_refused(pieces: list[str]) -> None:
    parses_or_refuses("".join(pieces))


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({"tenants": near_valid}) | documents)
def test_any_document_parses_or_is_refused(document: object) -> None:
    parses_or_refuses(yaml.safe_dump(document))


names = st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,20}", fullmatch=True).filter(lambda n: n != CLUSTER)
tokens = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=16, max_size=64)
tenant_specs = st.fixed_dictionaries(
    {
        "token": tokens,
        "namespaces": st.lists(st.from_regex(r"[a-z0-9.*?@-]{1,20}", fullmatch=True), min_size=1, max_size=3),
        "rights": st.lists(st.sampled_from([r.value for r in Right]), min_size=1, max_size=4),
        "quotas": st.fixed_dictionaries(
            {
                "dram": st.integers(0, 1 << 40),
                "ssd": st.integers(0, 1 << 44),
                "connections": st.integers(0, 1000),
                "rate": st.integers(0, 1 << 34),
            }
        ),
    }
)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(names, tenant_specs, max_size=5).filter(lambda t: len({s["token"] for s in t.values()}) == len(t))
)
def test_written_tenants_are_read_back(tenants: dict[str, dict[str, object]]) -> None:
    credentials = parse_credentials(yaml.safe_dump({"tenants": tenants}))
    for name, entry in tenants.items():
        tenant = credentials.tenant_of(str(entry["token"]).encode())
        expected = Tenant(
            name,
            tuple(entry["namespaces"]),  # type: ignore[arg-type]
            frozenset(Right(r) for r in entry["rights"]),  # type: ignore[attr-defined]
            Quotas(**entry["quotas"]),  # type: ignore[arg-type]
        )
        assert tenant == expected, (tenant, expected)


# -- reloading ---------------------------------------------------------------------------------


def test_a_rotated_file_takes_effect_and_a_bad_one_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(TWO_TENANTS)
    held = CredentialsFile(path, CLUSTER_TOKEN, recheck_s=0.0)

    def refusals() -> int:
        return sum("was refused" in r.getMessage() for r in caplog.records)

    assert held.current().tenant_of(TOKEN_A) is not None and held.version == 1
    rotated = TWO_TENANTS.replace(TOKEN_A.decode(), "a-new-token-for-team-a")
    path.write_text(rotated)
    credentials = held.current()
    assert credentials.tenant_of(TOKEN_A) is None, "the old token no longer works"
    new = credentials.tenant_of(b"a-new-token-for-team-a")
    assert new is not None and new.name == "team-a" and held.version == 2
    for bad in ("tenants: [", "tenants: ["):  # refused, and said once per version
        path.write_text(bad)
        assert held.current() is credentials
    assert refusals() == 1
    path.unlink()
    assert held.current() is credentials and refusals() == 2, "an unreadable file keeps the loaded one too"
    path.write_text(rotated)
    assert held.current() is credentials, "the same bytes as in force: nothing to do"
    assert held.version == 2


def test_the_file_is_read_again_at_most_every_recheck_s(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(TWO_TENANTS)
    now = [100.0]
    held = CredentialsFile(path, None, recheck_s=1.0, clock=lambda: now[0])
    path.write_text("tenants: {}")
    assert len(held.current().tenants) == 2, "checked less than recheck_s ago"
    now[0] += 1.0
    assert held.current().tenants == []


def test_a_daemon_cannot_start_on_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants: {t: {token: short}}")
    with pytest.raises(CredentialsError, match="a token is 16"):
        CredentialsFile(path, None)


# -- byte rates --------------------------------------------------------------------------------


def test_a_bucket_lets_its_burst_through_then_asks_for_waits_at_its_rate() -> None:
    now = [0.0]
    bucket = Bucket(1000, clock=lambda: now[0])  # 1000 bytes/s: a burst of 100
    assert bucket.charge(100) == 0.0, "the burst goes at once"
    assert bucket.charge(50) == pytest.approx(0.05), "50 bytes in debt: 50 ms"
    now[0] += 0.05
    assert bucket.charge(0) == 0.0, "repaid"
    now[0] += 10.0
    assert bucket.charge(300) == pytest.approx(0.2), "idle time fills it to its burst, no more"
