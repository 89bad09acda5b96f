"""Who a token proves to be, for every path that checks one: data connections and gRPC calls.

Without a credentials file the cluster's token is the one tenant (every right over every
namespace), as before tenants existed; with one, its tenants join it. A node without a token
requires none, and every caller is that tenant.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpool_server.tenants.credentials import Credentials, Right, Tenant, cluster_tenant, digest
from kvpool_server.tenants.reload import CredentialsFile
from kvpool_server.tiers.quotas import GroupQuotas, QuotaGroup


class Access:
    """The tokens a node accepts, and each one's tenant.

    Args:
        cluster_token: the cluster's token; None: the node requires no token.
        tenants_file: the credentials file (needs ``cluster_token``); empty: none.

    Raises:
        CredentialsError: the credentials file cannot be read or parsed.
    """

    def __init__(self, cluster_token: bytes | None, tenants_file: str = "") -> None:
        self.cluster_token = cluster_token
        self._fixed = Credentials({} if cluster_token is None else {digest(cluster_token): cluster_tenant()})
        self._file = CredentialsFile(tenants_file, cluster_token) if tenants_file else None

    @property
    def required(self) -> bool:
        """Whether callers must prove a token."""
        return self.cluster_token is not None

    def credentials(self) -> Credentials:
        """The tenants in force now."""
        return self._file.current() if self._file is not None else self._fixed

    def tenant_of(self, token: bytes) -> Tenant | None:
        """The tenant ``token`` proves; None: no tenant's."""
        return self.credentials().tenant_of(token)

    def quotas(self, tier: str) -> GroupQuotas:
        """The tenants' quotas in ``tier`` (``dram`` or ``ssd``) a block of a namespace counts against:
        those of every tenant that may write there. Asked under a tier's lock: the file is not
        looked at (the tokens' checks read it again), and each namespace's answer is kept until
        the credentials change."""
        kept: dict[str, list[QuotaGroup]] = {}
        kept_for: list[Credentials] = []  # the version the answers kept are of

        def groups(namespace: str) -> list[QuotaGroup]:
            credentials = self._file.loaded if self._file is not None else self._fixed
            if not kept_for or kept_for[0] is not credentials:  # another version: every answer asked again
                kept.clear()
                kept_for[:] = [credentials]
            found = kept.get(namespace)
            if found is None:
                found = kept[namespace] = [
                    QuotaGroup(f"tenant {t.name}", getattr(t.quotas, tier), t.covers)
                    for t in credentials.tenants
                    if getattr(t.quotas, tier) and t.may(Right.WRITE, namespace)
                ]
            return found

        return groups

    @property
    def has_tenants(self) -> bool:
        return self._file is not None

    def verifier(self) -> Callable[[bytes], Tenant | None] | None:
        """What a data connection checks its HELLO's token with; None: no token is required."""
        return self.tenant_of if self.required else None
